#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# C1 overhead of the whole stack (agent + injection library) on the H200,
# in one training process (1 rank, NCCL, 12 layers x 2048: ~160 ms steps).
# Design fixed before the first run (written to c1-design.json): ABBA order
# over PAIRS pairs, blocks of BLOCK seconds after SETTLE seconds of
# transition, OFF = agent not running (library loaded, idle), ON = agent
# attached with default settings; delta_i = mean(ON_i)/mean(OFF_i) - 1;
# bootstrap 95 % CI over pairs.
# Multi-GPU use (bench/gpu/multigpu.sh): C1_TRAIN replaces the training
# flags, C1_MODEL its description, SKIP_BUILD=1 keeps the library built.
# shellcheck source=common.sh
source "$(dirname "$0")/common.sh"
PAIRS=${PAIRS:-6}; BLOCK=${BLOCK:-20}; SETTLE=${SETTLE:-4}; WARMUP=${WARMUP:-35}
NAME=${NAME:-c1}   # file prefix
SHARE=${SHARE:-}   # pin the duty share of the ON arm (1: full collection); empty: default budget
C1_TRAIN=${C1_TRAIN:---launch 1 --backend nccl --dim 2048 --layers 12 --seq 512 --batch 8 --port 29520}
C1_MODEL=${C1_MODEL:-GPT 12 layers x 2048, seq 512, batch 8, 1 rank NCCL, one process}
[ -n "${SKIP_BUILD:-}" ] || build_lib
cat >"$OUT/$NAME-design.json" <<JSON
{"order":"ABBA (pair i even: off,on; odd: on,off)","pairs":$PAIRS,"block_s":$BLOCK,"settle_s":$SETTLE,
 "warmup_s":$WARMUP,"model":"$C1_MODEL",
 "on":"slowrank agent attached (uprobes + CUPTI; duty share ${SHARE:-default budget})","off":"no agent (library loaded, idle)",
 "metric":"delta_i = mean(step_ms ON_i)/mean(step_ms OFF_i) - 1 over steps fully inside the block",
 "analysis":"bootstrap 95% CI of the mean delta over pairs, 20000 resamples"}
JSON
total=$((WARMUP + PAIRS * 2 * (BLOCK + SETTLE) + 20))
# shellcheck disable=SC2086 # C1_TRAIN is a list of flags
train "$NAME" $C1_TRAIN --duration "$total" &
trainer=$!
sleep "$WARMUP"
mono() { python3 -c 'import time; print(time.monotonic_ns())'; }
: >"$OUT/$NAME-blocks.jsonl"
for ((p = 0; p < PAIRS; p++)); do
  if ((p % 2 == 0)); then arms="off on"; else arms="on off"; fi
  for arm in $arms; do
    if [ "$arm" = on ]; then
      start_agent "$NAME-p$p" --duration $((BLOCK + SETTLE + 2))s --status-socket "$OUT/$NAME.sock"
      if [ -n "$SHARE" ]; then "$AGENT" control set --socket "$OUT/$NAME.sock" --duty-share "$SHARE" >/dev/null 2>&1 || echo "control set failed"; fi
    fi
    sleep "$SETTLE"
    s=$(mono); sleep "$BLOCK"; e=$(mono)
    echo "{\"pair\":$p,\"arm\":\"$arm\",\"start_ns\":$s,\"end_ns\":$e}" >>"$OUT/$NAME-blocks.jsonl"
    if [ "$arm" = on ]; then stop_agent; fi
  done
done
rc=0
wait $trainer || rc=$?
python3 bench/gpu/analyze.py c1 "$OUT" "$NAME" | tee "$OUT/gpu-$NAME-overhead.json"
grep -h "cost estimate" "$OUT"/"$NAME"-p*-agent.log | head -3 || true
exit $rc
