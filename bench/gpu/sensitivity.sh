#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# Issue 33 item 4, slowrank's half: the sensitivity schedule on one DDP job,
# judged by its truth (bench/gpu/sensitivity.py; bench/results/README.md
# "Sensitivity vs NVRx").
#
# The job: RANKS (4) processes of one DDP job over NCCL (sensitivity.py
# train: train.py's GPT, dim 512 x 4 layers, seq 256, vocab 4096, as
# host_exposure.sh's; its batch scaled before the loop so that a step takes
# about 100 ms, --target-step-ms; MODEL overrides, e.g. "--target-step-ms 0
# --batch 8" keeps the batch). With fewer GPUs than ranks every rank shares GPU 0 with
# its own NCCL_HOSTID; else one rank per GPU. Rank SLOW_RANK (1) is healthy
# for WARMUP_S (15 s), then for each kind in KINDS ("host gpu") and
# magnitude in MAGS ("3 5 10 25", % of the step measured in the warm-up)
# slow for SLOW_S (25 s) and healthy for HEALTHY_S (20 s): 375 s at the
# defaults. host: a sleep before the forward pass; gpu: GPU work ahead of
# it (GPU_MODE sleep: a spin kernel every rank launches, so that the
# workload fingerprint stays common; matmul: extra matmuls). Then, when RUNS
# has "start", a second job with the rank slow from its first step
# (SLOW_FROM_START, host:10, for START_S 45 s), its stall sized from the
# first run's measured step (REF_STEP_MS where the first did not run).
#
# RUNS (default "schedule start") may also name start-ns (the slow-from-start
# job in its own PID namespace, with its own /proc, as a container runs it:
# unshare --pid --fork --mount-proc), start-nolib (the same job without the
# injection library: no device records, the agent's uprobes alone), and
# nvrx and nvrx-start: the
# same two jobs with NVIDIA's nvidia-resiliency-ext straggler detection in
# the training code instead of the agent (sensitivity.py train --nvrx: its
# sections around data loading, which holds the host stall, and the
# forward pass, which holds the GPU injection; reports every
# NVRX_INTERVAL_S, 5 s; its default thresholds), no agent and no injection
# library in those runs (CUPTI has one subscriber a process). NVRx comes
# exported in .nvrx/ (carry it; bench/gpu/nvrx_export.sh export, which
# names the commit in .nvrx/COMMIT) and its CUPTI extension is built here
# (nvrx_export.sh build). Its 60-s shipped interval is estimated from the
# same run (sensitivity.py nvrx_blocks: section scores by NVRx's formulas
# over the truth's section times, GPU scores the median of 12 reports; the
# analysis says so in its output).
#
# The agent runs as a user runs it: bin/slowrank agent at its defaults,
# the injection library loaded through CUDA_INJECTION64_PATH (built here by
# `make cupti`), OpenTelemetry export on to a collector on this machine
# (bin/otelcol-mini, as c1matrix.sh: OTLP/HTTP through
# OTEL_EXPORTER_OTLP_ENDPOINT; OTLP=0 or no collector binary: --otel off,
# said in the console), --facts and --verdicts to files, its status socket
# sampled every STATUS_EVERY (30) s into NAME-status.jsonl.
#
# How to run it (build the agent and the collector here first:
#   make build
#   (cd bench/otelcol-mini && CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o ../../bin/otelcol-mini .)
#   xz -9 -k -f bin/slowrank bin/otelcol-mini):
#   run(kind="nvidia-h200", carry=["bin/slowrank.xz","bin/otelcol-mini.xz"], timeout_s=600,
#       command="bash bench/gpu/batch.sh sens:585:'bash bench/gpu/sensitivity.sh'")
# and NVRx in a second call (NVRX_SRC=DIR bash bench/gpu/nvrx_export.sh export first):
#   run(kind="nvidia-h200", carry=[".nvrx"], timeout_s=600,
#       command="bash bench/gpu/batch.sh nvrx:585:'RUNS=\"nvrx nvrx-start\" bash bench/gpu/sensitivity.sh'")
# (both kinds in one call only with shorter phases: RUNS="schedule nvrx"
# SLOW_S=15 HEALTHY_S=12 is 15 + 8 x 27 = 231 s a run).
# The ~7-minute part alone: sens:480:'RUNS=schedule BUDGET_S=470 bash
# bench/gpu/sensitivity.sh'; the slow-from-start job then as a part of its
# own, start:140:'RUNS=start SKIP_BUILD=1 BUDGET_S=130 bash
# bench/gpu/sensitivity.sh', sized from the step the first kept on the
# machine. BUDGET_S must stay below the part's limit. Expected wall time (estimates, not measured on a GPU): library build ~20 s,
# schedule run 375 s + ~30 s start + ~10 s agent stop, start run 45 s +
# ~40 s: ~520 s. RUNS=schedule alone: ~440 s. BUDGET_S (570) skips a run
# that would not fit and says so; each trainer is killed at its share.
#
# What comes back in $OUT:
#   sensitivity.json      per run: sensitivity.py analyze (phases, recall,
#                         times, false alerts, targets) of the live verdicts
#   sensitivity.md        the same as markdown tables, and side by side
#                         (merge two calls' with sensitivity.py table A B)
#   sensitivity-raw.tgz   per run the truth (NAME/rank*.jsonl), facts,
#                         verdicts, agent log, status snapshots, train log;
#                         env.txt, the collector's log tail
#   console.log           this script's output
# Re-judge with a changed detector on the development machine:
#   mkdir -p D && tar xzf sensitivity-raw.tgz -C D
#   bin/slowrank replay --input D/sens-schedule-facts.jsonl --output v.jsonl
#   python3 bench/gpu/sensitivity.py analyze D/sens-schedule --verdicts v.jsonl --md v.md
#
# DRY=1: a CPU dry run of the plumbing (DRY_PYTHON with torch, gloo, a tiny
# model, short phases, a stub agent; DRY_AGENT=1: the real agent, selecting
# the dry trainer by SLOWRANK_GPUDRY). It measures nothing.
set -euo pipefail
SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
RESULTS=${OUT:-$SCRIPT_DIR/../../out/sensitivity}   # what comes back
WORK=${SENS_WORK:-/var/tmp/slowrank-sens}           # scratch, outside the working tree
mkdir -p "$RESULTS"
RESULTS=$(cd "$RESULTS" && pwd)
export OUT=$WORK/run
rm -rf "$OUT"
mkdir -p "$OUT"
# shellcheck source=common.sh
source "$SCRIPT_DIR/common.sh"       # cd to the root; AGENT, LIB, build_lib
# shellcheck source=dnh_common.sh
source "$SCRIPT_DIR/dnh_common.sh"   # agent_spawn, agent_stop, collector_start, env_info; PY, TRAIN_ENV
exec > >(tee -a "$OUT/console.log") 2>&1

: "${RANKS:=4}" "${SLOW_RANK:=1}" "${KINDS:=host gpu}" "${MAGS:=3 5 10 25}" "${GPU_MODE:=sleep}"
: "${WARMUP_S:=15}" "${SLOW_S:=25}" "${HEALTHY_S:=20}" "${SLOW_FROM_START:=host:10}" "${START_S:=45}"
: "${RUNS:=schedule start}" "${OTLP:=1}" "${STATUS_EVERY:=30}" "${BUDGET_S:=570}" "${STARTUP:=30}"
: "${MODEL:=}" "${AGENT_FLAGS:=}" "${NVRX_INTERVAL_S:=5}"
DEV_FLAGS=()
if [ -n "${DRY:-}" ]; then
  DEV_FLAGS=(--device cpu --dim 32 --layers 1 --heads 2 --seq 16 --batch 2 --vocab 128 --target-step-ms 30)
  : "${DRY_SCALE:=5}"  # phases DRY_SCALE times shorter
  WARMUP_S=$((WARMUP_S / DRY_SCALE)) SLOW_S=$((SLOW_S / DRY_SCALE)) HEALTHY_S=$((HEALTHY_S / DRY_SCALE)) START_S=$((START_S / DRY_SCALE))
  STARTUP=10
fi
RESERVE=25
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
SHARE=()
if [ -z "${DRY:-}" ] && [ "${gpus:-0}" -lt "$RANKS" ]; then SHARE=(--share-gpu); fi
echo "sensitivity.sh: runs '$RUNS', $RANKS ranks on ${gpus:-0} GPU(s)${SHARE:+ (shared, per-rank NCCL_HOSTID)}, rank $SLOW_RANK slow: kinds '$KINDS' x mags '$MAGS' %, warm-up ${WARMUP_S} s, slow ${SLOW_S} s, healthy ${HEALTHY_S} s; from start $SLOW_FROM_START for ${START_S} s; gpu mode $GPU_MODE; budget ${BUDGET_S} s${DRY:+ (DRY RUN)}"
# The agent, its library and the collector only for slowrank's runs.
SLOWRANK_RUNS=
for r in $RUNS; do case $r in schedule | start*) SLOWRANK_RUNS=1 ;; esac; done
if [ -n "$SLOWRANK_RUNS" ] && { [ -z "${DRY:-}" ] || [ -n "${DRY_AGENT:-}" ]; } && [ ! -x "$AGENT" ]; then
  echo "no agent binary at $AGENT: run 'make build' on the development machine and carry bin/slowrank"; exit 2
fi
env_info "$OUT/env.txt"
INJ=()
if [ -n "$SLOWRANK_RUNS" ]; then
  if [ -n "${SKIP_BUILD:-}" ] && [ -f "$LIB" ]; then echo "using the carried $LIB"; else build_lib; fi
  [ -z "$LIB" ] || INJ=(CUDA_INJECTION64_PATH="$LIB")
fi

AGENT_PID= COL_PID= SAMPLER=
trap '[ -z "$SAMPLER" ] || kill "$SAMPLER" 2>/dev/null; [ -z "$AGENT_PID" ] || kill -KILL "$AGENT_PID" 2>/dev/null || true; collector_stop' EXIT
OTEL_FLAGS=(--otel off)
if [ -n "$SLOWRANK_RUNS" ] && [ "$OTLP" = 1 ] && { [ -z "${DRY:-}" ] || [ -n "${DRY_AGENT:-}" ]; }; then
  if collector_start; then
    OTEL_FLAGS=()  # the default --otel auto: on, through OTEL_EXPORTER_OTLP_ENDPOINT below
  else
    echo "OTLP: no collector, the agent runs with --otel off"
  fi
fi

# status_loop NAME: the agent's status every STATUS_EVERY s, one JSON object a line.
status_loop() {
  while sleep "$STATUS_EVERY"; do
    "$AGENT" status --socket "$OUT/$1.sock" --json 2>/dev/null | tr -d '\n' >>"$OUT/$1-status.jsonl" && echo >>"$OUT/$1-status.jsonl"
  done
}

# one_run NAME EST_S [sensitivity.py train flags]: agent, job, analysis.
# A name with "nvrx" in it runs NVRx instead (train --nvrx, its CUPTI
# extension built by nvrx_export.sh build): no agent and no injection
# library, since CUPTI takes one subscriber a process.
one_run() {
  local name=$1 est=$2 rc=0 left inj=("${INJ[@]}") judge wrap=()
  shift 2
  case $name in
    *-nolib) inj=() ;;  # no injection library: no device records, the uprobes alone
    *-ns)  # a container's PID namespace (as the agent meets a pod), its own /proc
      if ! command -v unshare >/dev/null; then echo "== $name: skipped (no unshare for a PID namespace)"; return 0; fi
      wrap=(unshare --pid --fork --mount-proc --kill-child) ;;
  esac
  left=$((BUDGET_S - RESERVE - SECONDS))
  if ((est > left)); then echo "== $name: skipped (needs ~${est} s, ${left} s left)"; return 0; fi
  echo "== $name: start at t=${SECONDS} s (estimate ${est} s)"
  if [[ $name == *nvrx* ]]; then
    inj=()
    judge=(--nvrx-reports "$OUT/$name/nvrx-reports.jsonl")
  else
    if [ ${#OTEL_FLAGS[@]} = 0 ]; then export OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4318; fi
    # shellcheck disable=SC2086 # AGENT_FLAGS is a list of flags
    agent_spawn "$OUT/$name-agent.log" "${OTEL_FLAGS[@]}" --facts "$OUT/$name-facts.jsonl" \
      --verdicts "$OUT/$name-verdicts.jsonl" --status-socket "$OUT/$name.sock" $AGENT_FLAGS
    unset OTEL_EXPORTER_OTLP_ENDPOINT
    sleep 1
    if [ -z "${DRY:-}" ] || [ -n "${DRY_AGENT:-}" ]; then status_loop "$name" & SAMPLER=$!; fi
    judge=(--verdicts "$OUT/$name-verdicts.jsonl")
  fi
  # shellcheck disable=SC2086 # MODEL is a list of flags
  "${wrap[@]}" env "${TRAIN_ENV[@]}" "${inj[@]}" TORCHELASTIC_RUN_ID="$name" "$PY" bench/gpu/sensitivity.py train \
    --out-dir "$OUT/$name" --ranks "$RANKS" --slow-rank "$SLOW_RANK" --gpu-mode "$GPU_MODE" \
    --kill-after $((left - 5)) "${SHARE[@]}" "${DEV_FLAGS[@]}" $MODEL "$@" >"$OUT/$name-train.log" 2>&1 || rc=$?
  if [ -n "$SAMPLER" ]; then kill "$SAMPLER" 2>/dev/null || true; wait "$SAMPLER" 2>/dev/null || true; SAMPLER=; fi
  if [ -n "$AGENT_PID" ]; then
    "$AGENT" status --socket "$OUT/$name.sock" --json >"$OUT/$name-status-end.json" 2>/dev/null || true
    agent_stop "$AGENT_PID" 30
    AGENT_PID=
    echo "== $name: agent rc=$AGENT_RC (stopped in ${AGENT_STOP_MS} ms)"
  fi
  echo "== $name: trainer rc=$rc after $((SECONDS - t_run)) s"
  [ "$rc" = 0 ] || tail -n 20 "$OUT/$name-train.log"
  "$PYA" bench/gpu/sensitivity.py analyze "$OUT/$name" "${judge[@]}" \
    --json "$OUT/$name-summary.json" --md "$OUT/$name-summary.md" --title "$name" || echo "$name: analysis failed"
  cat "$OUT/$name-summary.md" 2>/dev/null || true
}

# ref_of NAME: the step the schedule run NAME measured: REF_STEP_MS, else
# its summary, else what an earlier call of this script on this machine
# kept of it ($WORK/NAME.ref_step_ms: a batch part of its own), else 100 ms.
ref_of() {
  if [ -n "${REF_STEP_MS:-}" ]; then echo "$REF_STEP_MS"; return; fi
  "$PYA" -c 'import json, sys
try:
    print(round(json.load(open(sys.argv[1]))["ref_step_ms"] or 100, 2))
except Exception:
    try:
        print(float(open(sys.argv[2]).read()))
    except Exception:
        print(100)' "$OUT/$1-summary.json" "$WORK/$1.ref_step_ms"
}

# keep_ref NAME: keeps the step run NAME measured for a later call (ref_of).
keep_ref() {
  "$PYA" -c 'import json, sys
r = json.load(open(sys.argv[1])).get("ref_step_ms")
if r:
    open(sys.argv[2], "w").write(str(round(r, 3)))' "$OUT/$1-summary.json" "$WORK/$1.ref_step_ms" 2>/dev/null || true
}

# nvrx_ready: NVRx exported (.nvrx, carried) and its CUPTI extension built, once.
NVRX_READY=
nvrx_ready() {
  [ -z "$NVRX_READY" ] || return 0
  if [ -n "${DRY:-}" ]; then echo "dry run: NVRx needs a GPU (its reports synchronise CUDA)"; return 1; fi
  bash bench/gpu/nvrx_export.sh build >"$OUT/nvrx-build.log" 2>&1 || { tail -n 20 "$OUT/nvrx-build.log"; return 1; }
  tail -n 2 "$OUT/nvrx-build.log"
  cp .nvrx/COMMIT "$OUT/nvrx-COMMIT"
  NVRX_COMMIT=$(head -n 1 .nvrx/COMMIT)
  export NVRX_COMMIT
  export PYTHONPATH=$ROOT/.nvrx/src:$ROOT/.nvrx/lib${PYTHONPATH:+:$PYTHONPATH}
  NVRX_READY=1
}

mags=${MAGS// /,} kinds=${KINDS// /,}
n=$(wc -w <<<"$KINDS") m=$(wc -w <<<"$MAGS")
for run in $RUNS; do
  t_run=$SECONDS
  case $run in
    schedule)
      one_run sens-schedule $((STARTUP + WARMUP_S + n * m * (SLOW_S + HEALTHY_S))) --port 29661 \
        --kinds "$kinds" --mags "$mags" --warmup-s "$WARMUP_S" --slow-s "$SLOW_S" --healthy-s "$HEALTHY_S"
      keep_ref sens-schedule ;;
    start)
      ref=$(ref_of sens-schedule)
      echo "from start: the stall is sized from a ${ref} ms step"
      one_run sens-start $((STARTUP + START_S)) --port 29662 --from-start "$SLOW_FROM_START" \
        --start-s "$START_S" --ref-step-ms "$ref" ;;
    start-ns | start-nolib)
      ref=$(ref_of sens-schedule)
      echo "from start ($run): the stall is sized from a ${ref} ms step"
      one_run "sens-$run" $((STARTUP + START_S)) --port $((29665 + ${#run} % 2)) --from-start "$SLOW_FROM_START" \
        --start-s "$START_S" --ref-step-ms "$ref" ;;
    nvrx)
      nvrx_ready || continue
      one_run sens-nvrx $((STARTUP + WARMUP_S + n * m * (SLOW_S + HEALTHY_S))) --port 29663 --nvrx \
        --nvrx-interval-s "$NVRX_INTERVAL_S" --kinds "$kinds" --mags "$mags" --warmup-s "$WARMUP_S" \
        --slow-s "$SLOW_S" --healthy-s "$HEALTHY_S"
      keep_ref sens-nvrx ;;
    nvrx-start)
      nvrx_ready || continue
      ref=$(ref_of sens-nvrx)
      echo "NVRx from start: the stall is sized from a ${ref} ms step"
      one_run sens-nvrx-start $((STARTUP + START_S)) --port 29664 --nvrx --nvrx-interval-s "$NVRX_INTERVAL_S" \
        --from-start "$SLOW_FROM_START" --start-s "$START_S" --ref-step-ms "$ref" ;;
    *) echo "sensitivity.sh: RUNS names '$run' (want schedule, start, start-ns, start-nolib, nvrx, nvrx-start)"; exit 2 ;;
  esac
done

"$PYA" - "$OUT" "$RESULTS" <<'PY' || true
import glob, json, os, sys
out, res = sys.argv[1], sys.argv[2]
runs = {}
for p in sorted(glob.glob(os.path.join(out, "*-summary.json"))):
    runs[os.path.basename(p)[:-len("-summary.json")]] = json.load(open(p))
json.dump({"runs": runs}, open(os.path.join(res, "sensitivity.json"), "w"), indent=1)
with open(os.path.join(res, "sensitivity.md"), "w") as f:
    for p in sorted(glob.glob(os.path.join(out, "*-summary.md"))):
        f.write(open(p).read() + "\n")
PY
{ echo "### side by side"; echo; "$PYA" bench/gpu/sensitivity.py table "$RESULTS/sensitivity.json"; } >>"$RESULTS/sensitivity.md" || true
collector_stop
tail -n 200 "$OUT/otelcol.log" >"$OUT/otelcol.tail.log" 2>/dev/null || true
tar -C "$OUT" -czf "$RESULTS/sensitivity-raw.tgz" --exclude='*.sock' --exclude=console.log --exclude=otelcol-mini --exclude=otelcol.log .
cp "$OUT/console.log" "$RESULTS/console.log"
ls -l "$RESULTS"
