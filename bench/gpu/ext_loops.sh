#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# Issue 16 item 4 on one H200, one call: external training loops, unmodified,
# with the slowrank agent attached as a user runs it. Loops (bench/gpu/ext_loops.py):
# the transformers Trainer, PyTorch Lightning (DDP strategy), torch.compile
# (nanoGPT recipe under DDP), a CUDA graph of the whole step, FSDP2
# (fully_shard, world size 1 over NCCL) and Megatron-core (local spec, its own
# Timers; the source subset is committed as bench/gpu/vendor/megatron-core-*.tar.xz).
#
# One agent (bin/slowrank, defaults, --otel off, its own --status-socket in
# the work folder) is started before the first job and watches every job,
# as a host agent would; device collection is pinned on (`control set
# --duty-share 1` on that socket, as cupti_validate.sh and coexist.sh do;
# DUTY_SHARE=auto leaves the default duty cycle), so that every step has a
# `compute`. Per loop, in this order:
#   L-agent  the job with the injection library (CUDA_INJECTION64_PATH):
#            WARM iterations, then AGENT_S seconds; its hook writes the loop's
#            own timing (L-agent/steps.jsonl); the agent's facts carry job
#            L-agent (torchrun's TORCHELASTIC_RUN_ID, which the launch sets)
#   L-prof   the same job without the library under torch.profiler: WARM
#            iterations, then 1 + PROF_STEPS profiled ones, a Chrome trace,
#            reduced to L-prof/trace.min.json.gz (the agent watches it too,
#            host probes only: its step count there is reported as well)
# Then bench/gpu/ext_loops_analyze.py writes the summary (criteria in its header).
#
# How to run it (build the agent here first: `make build`; the injection
# library is built there by `make cupti`, as in every bench/gpu script; the
# vendor tarball and the scripts are tracked files and travel by themselves):
#
#   run(kind="nvidia-h200", carry=["bin/slowrank"], timeout_s=600,
#       command="bash bench/gpu/ext_loops.sh")
#
# Expected wall time ~6 min (measured locally only as a CPU dry run; the
# estimates below are guesses): lib build ~10 s, per loop ~30 s with the
# agent + ~15 s profiled, torch.compile ~60 s more for its first compile;
# agent stop and analysis ~30 s. A budget guard (BUDGET_S, default 500 s)
# skips runs that would not fit and says so in runs.jsonl and the summary;
# every run has its own time limit, so one hung loop cannot take the call.
# What comes back in $OUT: gpu-ext-loops.json (one row per loop),
# gpu-ext-loops.md (rows for the README "works with" table), console.log,
# ext-loops-raw.tgz (facts, verdicts, agent log and status, steps, reduced
# traces, training logs). Unpack the raw tarball into
# bench/results/raw/ext-loops/ and re-run the analysis there:
#   python3 bench/gpu/ext_loops_analyze.py summarize bench/results/raw/ext-loops \
#       --md /tmp/rows.md > bench/results/gpu-ext-loops.json
#
# DUMP=1: the agent also writes its capture (--dump-events); its host calls
# come back as dump-host.jsonl.gz, for replays in correlate
# (correlate/testdata/dump2records.py --job).
# Knobs: LOOPS (default: all six, in this order), AGENT_S (20), WARM (10),
# PROF_STEPS (8), DUTY_SHARE (1 | auto), BUDGET_S (500), SKIP_BUILD=1 (use a
# carried bin/libslowrank_cupti.so), SKIP_PROF=1 (agent runs only: a rerun of
# the step counts; analyse with --prof-from an earlier run's folder for the
# profiler's compute). DRY=1: CPU dry run on a machine without
# a GPU (Debian's python3-torch; tiny shapes, gloo; the Trainer and Lightning
# from bench/gpu/drystub when missing; no injection library; an agent stub,
# or with DRY_AGENT=1 the real agent selecting by a private variable).
# Megatron has no dry run (torch >= 2.6 and CUDA).
source "$(dirname "$0")/dnh_begin.sh" gpu-ext-loops ext-loops
LOOPS=${LOOPS:-trainer lightning compile fsdp2 cudagraph megatron}
AGENT_S=${AGENT_S:-20}
WARM=${WARM:-10}
PROF_STEPS=${PROF_STEPS:-8}
DUTY_SHARE=${DUTY_SHARE:-1}
BUDGET_S=${BUDGET_S:-500}
RESERVE_S=40 # agent stop, analysis, packing
MCORE_TGZ=
for f in "$ROOT"/bench/gpu/vendor/megatron-core-*.tar.xz; do [ -f "$f" ] && MCORE_TGZ=$f; done
LOOP_FLAGS=()
if [ -n "${DRY:-}" ]; then
  LOOP_FLAGS=(--device cpu --shape tiny --threads 1)
  if ! "$PY" -c 'import lightning.pytorch' 2>/dev/null && [[ ":${PYTHONPATH:-}:" != *":$ROOT/bench/gpu/drystub:"* ]]; then
    export PYTHONPATH="$ROOT/bench/gpu/drystub${PYTHONPATH:+:$PYTHONPATH}"
  fi
fi
for l in $LOOPS; do
  case $l in trainer | lightning | compile | cudagraph | fsdp2 | megatron) ;; *) echo "unknown loop $l"; exit 2 ;; esac
done

# estimate LOOP PHASE: seconds one run is expected to take (the budget guard's unit).
estimate() {
  local a=$((AGENT_S + 20)) p=20
  case $1 in
    compile) a=$((a + 60)); p=$((p + 30)) ;;
    megatron) a=$((a + 10)); p=$((p + 10)) ;;
  esac
  if [ "$2" = agent ]; then echo "$a"; else echo "$p"; fi
}

# skip_run LOOP PHASE WHY [LEFT EST]: a run that is not made, in runs.jsonl.
skip_run() {
  echo "skip $1-$2: $3"
  printf '{"loop":"%s","phase":"%s","name":"%s","skipped":true,"why":"%s","left_s":%d,"estimate_s":%d}\n' \
    "$1" "$2" "$1-$2" "$3" "${4:-0}" "${5:-0}" >>"$OUT/runs.jsonl"
}

RUN_IDX=0
# run_one LOOP PHASE: one job, started like torchrun starts rank 0 of a world
# of 1; returns 3 when the budget had no room for it.
run_one() {
  local loop=$1 phase=$2 name=$1-$2 est left limit t0 t1 start wall timed_out=false
  local inj=() extra=() pyp=()
  est=$(estimate "$loop" "$phase")
  left=$((BUDGET_S - SECONDS - RESERVE_S))
  RUN_IDX=$((RUN_IDX + 1))
  if ((left < est)); then
    skip_run "$loop" "$phase" "${left} s left of the budget, estimate ${est} s" "$left" "$est"
    return 3
  fi
  limit=$((est * 2)); ((limit > left)) && limit=$left
  if [ "$phase" = agent ]; then
    if [ -n "$LIB" ]; then inj=(CUDA_INJECTION64_PATH="$LIB"); fi
    extra=(--duration "$AGENT_S")
  else
    extra=(--profile-steps "$PROF_STEPS" --trace "$OUT/$name/trace.json")
  fi
  if [ "$loop" = megatron ]; then pyp=(PYTHONPATH="$OUT/vendor${PYTHONPATH:+:$PYTHONPATH}"); fi
  mkdir -p "$OUT/$name"
  t0=$(mono); start=$SECONDS
  env "${TRAIN_ENV[@]}" "${inj[@]}" "${pyp[@]}" RANK=0 LOCAL_RANK=0 WORLD_SIZE=1 LOCAL_WORLD_SIZE=1 GROUP_RANK=0 \
    ROLE_RANK=0 ROLE_WORLD_SIZE=1 MASTER_ADDR=127.0.0.1 MASTER_PORT=$((29600 + RUN_IDX)) TORCHELASTIC_RUN_ID="$name" \
    PYTHONFAULTHANDLER=1 HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 TOKENIZERS_PARALLELISM=false \
    "$PY" bench/gpu/ext_loops.py --loop "$loop" --out-dir "$OUT/$name" --warm "$WARM" "${extra[@]}" "${LOOP_FLAGS[@]}" \
    >"$OUT/$name.log" 2>&1 </dev/null &
  EXT_PID=$!
  ext_finish "$EXT_PID" "$limit"
  wall=$((SECONDS - start)); t1=$(mono)
  if ((wall >= limit)); then timed_out=true; fi
  printf '{"loop":"%s","phase":"%s","name":"%s","pid":%d,"rc":%d,"wall_s":%d,"estimate_s":%d,"limit_s":%d,"timed_out":%s,"t0_ns":%s,"t1_ns":%s}\n' \
    "$loop" "$phase" "$name" "$EXT_PID" "$EXT_RC" "$wall" "$est" "$limit" "$timed_out" "$t0" "$t1" >>"$OUT/runs.jsonl"
  echo "$name: rc $EXT_RC, ${wall} s (estimate ${est} s), $(grep -c '"step_ms"' "$OUT/$name/steps.jsonl" 2>/dev/null || true) iterations, t=${SECONDS} s"
  if [ "$EXT_RC" != 0 ]; then tail -n 15 "$OUT/$name.log"; fi
  if [ "$phase" = prof ] && [ -f "$OUT/$name/trace.json" ]; then
    "$PYA" bench/gpu/ext_loops_analyze.py reduce "$OUT/$name/trace.json" "$OUT/$name/trace.min.json.gz" || true
  fi
}

echo "ext_loops: loops '$LOOPS', AGENT_S=$AGENT_S WARM=$WARM PROF_STEPS=$PROF_STEPS DUTY_SHARE=$DUTY_SHARE BUDGET_S=$BUDGET_S${DRY:+ (dry run)}"
if [ -n "${SKIP_BUILD:-}" ] && [ -f "$LIB" ]; then echo "using the carried $LIB"; else build_lib; fi
env_info "$OUT/env.txt"
if [[ " $LOOPS " == *" megatron "* ]]; then
  if [ -z "$MCORE_TGZ" ]; then echo "no bench/gpu/vendor/megatron-core-*.tar.xz"; exit 2; fi
  mkdir -p "$OUT/vendor"
  "$PYA" - "$MCORE_TGZ" "$OUT/vendor" <<'PYX'
import sys, tarfile
with tarfile.open(sys.argv[1]) as t:
    kw = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
    t.extractall(sys.argv[2], **kw)
PYX
  echo "megatron-core: $(head -1 "$OUT/vendor/MANIFEST")"
fi

DUMP_FLAGS=()
if [ -n "${DUMP:-}" ]; then DUMP_FLAGS=(--dump-events "$OUT/dump.jsonl"); fi
agent_spawn "$OUT/agent.log" --otel off --facts "$OUT/facts.jsonl" --verdicts "$OUT/verdicts.jsonl" \
  --status-socket "$OUT/agent.sock" "${DUMP_FLAGS[@]}"
if [ -z "${DRY:-}" ] || [ -n "${DRY_AGENT:-}" ]; then
  for _ in $(seq 150); do [ -S "$OUT/agent.sock" ] && break; sleep 0.1; done
  if [ "$DUTY_SHARE" != auto ]; then
    "$AGENT" control set --socket "$OUT/agent.sock" --duty-share "$DUTY_SHARE" >"$OUT/control.log" 2>&1 ||
      { echo "control set failed:"; cat "$OUT/control.log"; }
  fi
fi
echo "agent pid $AGENT_PID, t=${SECONDS} s"

for loop in $LOOPS; do
  if ! run_one "$loop" agent; then
    skip_run "$loop" prof "its agent run was skipped"
  elif [ -n "${SKIP_PROF:-}" ]; then
    skip_run "$loop" prof "SKIP_PROF"
  else
    run_one "$loop" prof || true
  fi
done

if [ -z "${DRY:-}" ] || [ -n "${DRY_AGENT:-}" ]; then
  "$AGENT" status --socket "$OUT/agent.sock" --json >"$OUT/agent-status.json" 2>&1 || true
fi
agent_stop "$AGENT_PID" 30
echo "agent stopped: rc $AGENT_RC after ${AGENT_STOP_MS} ms, t=${SECONDS} s"
if [ -f "$OUT/dump.jsonl" ]; then
  # The host calls only: device intervals are ~98 % of the dump and too
  # large to return; step detection replays need only the host calls.
  grep -v '"type":"correlate.DeviceInterval"' "$OUT/dump.jsonl" | gzip -9 >"$RESULTS/dump-host.jsonl.gz" || true
  rm -f "$OUT/dump.jsonl"
  echo "dump: $(du -h "$RESULTS/dump-host.jsonl.gz" | cut -f1) of host calls in dump-host.jsonl.gz"
fi

"$PYA" bench/gpu/ext_loops_analyze.py summarize "$OUT" --md "$RESULTS/gpu-ext-loops.md" >"$RESULTS/gpu-ext-loops.json" ||
  echo "analysis failed"
(cd "$OUT" && tar czf "$RESULTS/ext-loops-raw.tgz" --exclude='*.sock' --exclude='trace.json' --exclude='vendor' \
  --exclude='hf' --exclude='agent-state' --exclude='console.log' .)
"$PYA" - "$RESULTS/gpu-ext-loops.json" <<'PYX'
import json, sys
d = json.load(open(sys.argv[1]))
for r in d["rows"]:
    keys = ("iterations", "steps_found", "first_fact_iteration", "duplicate_iterations", "missed_iterations",
            "step_time_dev_median", "step_time_dev_mean", "gpu_steps", "compute_dev", "compute_dev_by_end",
            "cut_minus_hook_ms_median", "alerts", "error")
    print(r["loop"], {k: r.get(k) for k in keys}, "prof:", {k: r["prof_run"].get(k) for k in ("iterations", "steps_found", "error")})
print(f"{d['passed']} of {d['loops']} loops pass")
print("\n".join(d["markdown"]))
PYX
echo "done at t=${SECONDS} s"
cp "$OUT/console.log" "$RESULTS/console.log" 2>/dev/null || true
ls -l "$RESULTS"
