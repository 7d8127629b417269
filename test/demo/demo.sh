#!/usr/bin/env bash
# make demo: a 4-rank fake training job (real processes linked against fake
# NCCL/CUDA libraries with the real symbols), one rank slowed from step 150;
# the real agent attaches real uprobes, prints a live per-rank table and the
# verdict as it happens, then says where the JSONL files are. Needs root.
set -euo pipefail
BIN=${OUT_DIR:-bin}
OUT=${DEMO_OUT:-out/demo}
mkdir -p "$OUT"
rm -f "$OUT"/*.jsonl
if [ "$(id -u)" != 0 ]; then
  echo "make demo attaches eBPF uprobes: run it as root" >&2
  exit 1
fi

# Only this demo's processes: a real deployment selects by RANK (the default).
export SLOWRANK_DEMO=1
"$BIN/slowrank" agent --env-key SLOWRANK_DEMO --live --live-interval 3s --duration 34s --window 2s \
  --facts "$OUT/facts.jsonl" --verdicts "$OUT/verdicts.jsonl" 2>"$OUT/agent.log" &
agent=$!
trap 'kill $agent 2>/dev/null || true' EXIT
sleep 1.5

echo "== fake job: 4 ranks, 20 ms host + 30 ms GPU per step; rank 2 gets a 12 ms host stall per step from step 150"
echo "   no injection library here (fake CUDA, no CUPTI): no device records, so COMPUTE is - and HINT empty; host phases are judged"
# LD_LIBRARY_PATH unset: on GPU hosts it names the driver's libcuda.so.1,
# which the loader would prefer to the fake one beside the trainer.
env -u LD_LIBRARY_PATH -u LD_PRELOAD "$BIN/fakelibs/faketrainer" --ranks 4 --duration 28 --step-ms 20 --gpu-ms 30 \
  --slow-rank 2 --slow-from-step 150 --slow-host-ms 12 --truth "$OUT/truth.jsonl" &
trainer=$!
wait $trainer
wait $agent || true
trap - EXIT

echo
echo "== verdicts as they happened (agent log)"
grep -E 'STRAGGLER|recovered' "$OUT/agent.log" | sed 's/^time=[^ ]* //' || echo "(none)"
echo
echo "== report"
"$BIN/slowrank" replay --input "$OUT/facts.jsonl" --window 2s --report --output "$OUT/replayed-verdicts.jsonl"
echo
echo "facts:    $OUT/facts.jsonl ($(wc -l <"$OUT/facts.jsonl") lines)"
echo "verdicts: $OUT/verdicts.jsonl ($(wc -l <"$OUT/verdicts.jsonl") lines)"
echo "truth:    $OUT/truth.jsonl (the fake trainer's own per-step ground truth)"
echo "agent log: $OUT/agent.log"
