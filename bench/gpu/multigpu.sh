#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# Issue 9: slowrank on real multi-GPU training, one rank per GPU with NCCL, on
# a machine of 2, 4 or 8 H200s (the number of GPUs is read at run time).
#
#   bash bench/gpu/multigpu.sh smoke   [BUDGET_S]   every scenario, short, in ONE call
#   bash bench/gpu/multigpu.sh main    [BUDGET_S]   the full run, call 1 of 2
#   bash bench/gpu/multigpu.sh collect [BUDGET_S]   the full run, call 2 of 2 (issue it at once)
#
# BUDGET_S (default 570) is the wall time this call may take (a device call
# is cut at 600 s): a scenario whose estimate does not fit is skipped and
# listed in plan.jsonl (main hands it to collect, which runs it if it fits).
#
# Scenarios (train.py --multi-gpu; agent with default settings unless AGENT_FLAGS):
#   ddp-gpu     plain DDP over all GPUs; rank GPU_RANK (default last) gets about
#               GPU_FRAC (10 %) extra GPU work from INJ_AT s on
#   tpdp-mixed  TP=2 x DP=N/2 (N >= 4): +10 % GPU work on rank N-1 and a
#               HOST_MS host stall per step on rank 0 (another TP and DP group),
#               so the agent must find both through the DP communicators
#   mg-c1       C1 overhead: c1.sh's ABBA protocol (agent attached / not) on a
#               DDP job with NCCL gradient all-reduce in every step
#   c2-*        C2 equivalence: deterministic DDP runs OFF, ON, OFF (fixed steps)
#   ddp-host    plain DDP, HOST_MS host stall per step on rank HOST_RANK
#   healthy     plain DDP without injection for HEALTHY s (full run: >= 10 min)
# ONLY="NAME ..." runs only the named scenarios of this call (the detached
# healthy run of main is not a scenario of main and always starts).
# RUN_TAG names the returned files of smoke and main (default: the mode), so
# that two smoke runs in one call do not overwrite each other's results.
# The full run does not fit one call (a call is cut at 10 min): `main` runs
# the injection scenarios and C1, ships them, starts the healthy run detached
# (setsid; it outlives the call while the machine stays warm) and holds the
# call to its budget; `collect` waits for the healthy run, runs what main had
# to skip if it fits, and ships. A machine is given back 30 s after a call, so
# issue `collect` right after `main` returns; on a fresh machine collect runs
# a shorter healthy run in its own call instead (plan.jsonl says so).
#
# What comes back in $OUT (at most 4 files a call, each under 16 MiB):
#   multigpu-TAG-summary.json   analyze.py mg-all over this call's runs
#   multigpu-TAG-raw.tgz        per-step ground truth (rank*.jsonl), layout.json,
#                               training logs, plan.jsonl, env.txt, summary/*.json
#   multigpu-TAG-agent.tgz      the agent's facts, verdicts and logs
#   multigpu-TAG-console.log    this script's output
# Then, on the development machine: python3 bench/gpu/analyze.py mg-all
# bench/results DIR... over the unpacked folders writes bench/results/multigpu-*.json.
#
# DRY=1 runs the same script on CPU (4 gloo ranks, tiny model, short
# durations, no agent, no library): see bench/results/README.md.
set -euo pipefail
MODE=${1:-}
BUDGET=${2:-570}
case $MODE in
  smoke | main | collect | _healthy) ;;
  *) sed -n '3,8p' "$0"; exit 2 ;;
esac
SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
RESULTS=${RESULTS:-${OUT:-$SCRIPT_DIR/../../out/multigpu}}  # what comes back
WORK=${MG_WORK:-/var/tmp/slowrank-mg}                       # scratch, kept while the machine is warm
case $MODE in
  smoke | main) export OUT=$WORK/$MODE ;;
  collect | _healthy) export OUT=$WORK/collect ;;
esac
mkdir -p "$RESULTS" "$WORK"
if [ "$MODE" = smoke ] || [ "$MODE" = main ]; then rm -rf "$OUT"; fi
mkdir -p "$OUT"

if [ -n "${DRY:-}" ]; then
  # CPU dry run: python3 must be one with torch (Debian's python3-torch).
  mkdir -p "$WORK/pybin"
  ln -sf "${DRY_PYTHON:-/usr/bin/python3}" "$WORK/pybin/python3"
  export PATH=$WORK/pybin:$PATH
  : "${NGPU:=4}" "${INJ_DUR:=10}" "${INJ_AT:=4}" "${PAIRS:=2}" "${BLOCK:=3}" "${SETTLE:=1}" "${WARMUP:=6}"
  : "${C2_STEPS:=8}" "${HEALTHY:=12}" "${STARTUP:=8}" "${RESERVE:=10}" "${GAP:=2}" "${HOST_MS:=30}"
  TINY="--device cpu --backend gloo --dim 64 --layers 2 --heads 4 --seq 32 --batch 2 --vocab 256 --slow-gpu-size 64"
  : "${MODEL_INJ:=$TINY}" "${MODEL_C1:=$TINY}" "${MODEL_C2:=$TINY}"
fi
if [ "$MODE" = smoke ]; then
  : "${INJ_DUR:=45}" "${INJ_AT:=15}" "${PAIRS:=2}" "${BLOCK:=8}" "${SETTLE:=3}" "${WARMUP:=25}"
  : "${C2_STEPS:=40}" "${HEALTHY:=60}"
fi
: "${INJ_DUR:=60}"     # seconds of training in an injection scenario
: "${INJ_AT:=25}"      # injection start, seconds after the first step (5 windows of baseline)
: "${GPU_FRAC:=0.10}"  # extra GPU work, share of the injected rank's forward+backward
# contend: a noisy-neighbour process keeps the rank's GPU busy GPU_FRAC of the
# time (same kernels, slower); extra: more kernels in the rank itself, which
# change its workload fingerprint (the detector then finds no comparable peer).
: "${GPU_MODE:=contend}"
: "${HOST_MS:=10}"     # host stall per step
# start: before the forward pass (the GPU idles, the job slows: a straggler);
# end: after the optimizer step (hidden behind queued GPU work: not one).
: "${HOST_AT:=start}"
: "${TP:=2}"           # TP group size of tpdp-mixed
: "${PAIRS:=4}" "${BLOCK:=12}" "${SETTLE:=3}" "${WARMUP:=30}"  # C1
: "${C2_STEPS:=150}"
: "${HEALTHY:=605}"    # healthy training seconds (full run: >= 10 min)
: "${HEALTHY_TP:=1}"
: "${STARTUP:=30}"     # estimate: start of N ranks (imports, NCCL, model) until the first step
: "${RESERVE:=30}"     # kept for analysis and packing at the end of a call
: "${GAP:=5}"          # assumed seconds between the end of main and the start of collect
: "${MODEL_INJ:=--dim 1536 --layers 8 --heads 16 --seq 512 --batch 8 --vocab 8192}"
: "${MODEL_C1:=--dim 2048 --layers 12 --heads 16 --seq 512 --batch 8 --vocab 8192}"
: "${MODEL_C2:=--dim 1024 --layers 8 --heads 16 --seq 512 --batch 8 --vocab 8192}"
: "${AGENT_FLAGS=--emit-ok}"  # agent flags of every scenario but C1 (c1.sh: default settings)

# shellcheck source=common.sh
source "$SCRIPT_DIR/common.sh"  # cd to the repository root; AGENT, LIB, start_agent, stop_agent, train
if [ "$MODE" != _healthy ]; then exec > >(tee -a "$OUT/console.log") 2>&1; fi

for name in ${ONLY:-}; do
  case $name in
    ddp-gpu | tpdp-mixed | mg-c1 | c2 | ddp-host | healthy) ;;
    *) echo "multigpu.sh: ONLY names an unknown scenario '$name' (ddp-gpu tpdp-mixed mg-c1 c2 ddp-host healthy)"; exit 2 ;;
  esac
done
if [ -z "${NGPU:-}" ]; then NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ' || true); fi
if [ "${NGPU:-0}" -lt 2 ]; then
  echo "multigpu.sh: needs a machine with at least 2 GPUs (nvidia-smi lists ${NGPU:-0})"; exit 2
fi
: "${GPU_RANK:=$((NGPU - 1))}" "${HOST_RANK:=1}"
PORT=${PORT:-$([ "$MODE" = main ] || [ "$MODE" = smoke ] && echo 29600 || echo 29700)}

est_inj=$((INJ_DUR + STARTUP + 15))
est_c1=$((WARMUP + PAIRS * 2 * (BLOCK + SETTLE) + 20 + STARTUP + 15))
est_c2=$((3 * (STARTUP + 5 + C2_STEPS / 10)))
est_healthy=$((HEALTHY + STARTUP + 15))

note() {  # note SCENARIO STATUS EST TOOK RC [WHY]
  printf '{"scenario":"%s","status":"%s","est_s":%s,"took_s":%s,"rc":%s,"why":"%s","mode":"%s","gpus":%s,"t_s":%s}\n' \
    "$1" "$2" "$3" "$4" "$5" "${6:-}" "$MODE" "$NGPU" "$SECONDS" >>"$OUT/plan.jsonl"
}

# mg_train NAME KILL_AFTER [train.py flags]: one rank per GPU, NCCL, the injection library loaded.
mg_train() {
  local name=$1 kill=$2; shift 2
  PORT=$((PORT + 1))
  # shellcheck disable=SC2086 # extra flags of dry runs
  TORCHELASTIC_RUN_ID=$name train "$name" --multi-gpu --backend nccl --launch "$NGPU" --port "$PORT" \
    --kill-after "$kill" "$@" ${DRY:+$TINY}
}

# run_inj NAME TP [train.py flags]: the agent and one injected training run.
run_inj() {
  local name=$1 tp=$2 rc=0; shift 2
  # shellcheck disable=SC2086 # AGENT_FLAGS is a list of flags
  start_agent "$name" $AGENT_FLAGS
  # shellcheck disable=SC2086 # MODEL_INJ is a list of flags
  mg_train "$name" $((INJ_DUR + STARTUP + 90)) --tp "$tp" $MODEL_INJ --duration "$INJ_DUR" --slow-from-s "$INJ_AT" "$@" || rc=$?
  stop_agent
  return "$rc"
}

sc_ddp_gpu() { run_inj ddp-gpu 1 --slow-gpu-rank "$GPU_RANK" --slow-gpu-frac "$GPU_FRAC" --slow-gpu-mode "$GPU_MODE"; }
sc_tpdp_mixed() {
  run_inj tpdp-mixed "$TP" --slow-gpu-rank $((NGPU - 1)) --slow-gpu-frac "$GPU_FRAC" --slow-gpu-mode "$GPU_MODE" \
    --slow-host-rank 0 --slow-host-ms "$HOST_MS" --slow-host-at "$HOST_AT"
}
sc_ddp_host() { run_inj ddp-host 1 --slow-host-rank "$HOST_RANK" --slow-host-ms "$HOST_MS" --slow-host-at "$HOST_AT"; }

sc_c1() {
  PORT=$((PORT + 1))
  local total=$((WARMUP + PAIRS * 2 * (BLOCK + SETTLE) + 20))
  C1_TRAIN="--multi-gpu --backend nccl --launch $NGPU --tp 1 $MODEL_C1 --port $PORT --kill-after $((total + STARTUP + 90)) ${DRY:+$TINY}" \
    C1_MODEL="GPT ${MODEL_C1//--/}, DDP over $NGPU GPUs (NCCL gradient all-reduce every step), one process per rank" \
    SKIP_BUILD=1 NAME=mg-c1 PAIRS=$PAIRS BLOCK=$BLOCK SETTLE=$SETTLE WARMUP=$WARMUP bash bench/gpu/c1.sh
}

sc_c2() {
  local rc=0 kill=$((STARTUP + 120 + C2_STEPS))
  # shellcheck disable=SC2086 # MODEL_C2 is a list of flags
  mg_train c2-off1 "$kill" --tp 1 $MODEL_C2 --deterministic --steps "$C2_STEPS" || rc=$?
  # shellcheck disable=SC2086
  start_agent c2-on $AGENT_FLAGS
  # shellcheck disable=SC2086
  mg_train c2-on "$kill" --tp 1 $MODEL_C2 --deterministic --steps "$C2_STEPS" || rc=$?
  stop_agent
  # shellcheck disable=SC2086
  mg_train c2-off2 "$kill" --tp 1 $MODEL_C2 --deterministic --steps "$C2_STEPS" || rc=$?
  return "$rc"
}

sc_healthy() {
  local rc=0
  # shellcheck disable=SC2086
  start_agent healthy $AGENT_FLAGS
  # shellcheck disable=SC2086
  mg_train healthy $((HEALTHY + STARTUP + 120)) --tp "$HEALTHY_TP" $MODEL_INJ --duration "$HEALTHY" \
    --stop-file "$OUT/healthy.stop" || rc=$?
  stop_agent
  return "$rc"
}

# scenario NAME EST DEADLINE FUNCTION: run FUNCTION when it fits before DEADLINE (seconds of this call).
SKIPPED=()
scenario() {
  local name=$1 est=$2 deadline=$3 fn=$4 t0=$SECONDS rc=0
  if [ -n "${ONLY:-}" ] && [[ " $ONLY " != *" $name "* ]]; then
    echo "== $name: not selected (ONLY=$ONLY)"
    note "$name" unselected "$est" 0 0 "only"
    return 0
  fi
  if ((SECONDS + est > deadline)); then
    echo "== $name: skipped (needs ~${est} s, $((deadline - SECONDS)) s left before t=${deadline} s)"
    note "$name" skipped "$est" 0 0 "budget"
    SKIPPED+=("$fn")
    return 0
  fi
  echo "== $name: start at t=${SECONDS} s (estimate ${est} s)"
  "$fn" || rc=$?
  echo "== $name: rc=$rc after $((SECONDS - t0)) s"
  note "$name" "$([ "$rc" = 0 ] && echo ran || echo failed)" "$est" $((SECONDS - t0)) "$rc"
  if [ "$rc" != 0 ]; then tail -n 15 "$OUT/$name-train.log" 2>/dev/null || true; fi
  return 0
}

env_info() {
  {
    date -u; uname -a; nproc; free -g || true
    nvidia-smi || true
    nvidia-smi topo -m || true
    python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda, "gpus", torch.cuda.device_count(),
"nccl", torch.cuda.nccl.version() if torch.cuda.is_available() else None)' || true
    "$AGENT" --version 2>/dev/null || true
  } >"$OUT/env.txt" 2>&1
  grep -E '^(torch|GPU[0-9])' "$OUT/env.txt" || true
}

# ship TAG: analysis, raw data and agent output of $OUT into $RESULTS.
ship() {
  local tag=$1 f
  mkdir -p "$OUT/summary"
  python3 bench/gpu/analyze.py mg-all "$OUT/summary" "$OUT" >"$RESULTS/multigpu-$tag-summary.json" 2>"$OUT/analyze.err" ||
    { echo "analyze.py failed:"; tail -n 5 "$OUT/analyze.err"; }
  (cd "$OUT" && find . -maxdepth 1 \( -name '*-facts.jsonl' -o -name '*-verdicts.jsonl' -o -name '*-agent.log' \) | sort >"$WORK/agentfiles-$tag")
  tar -C "$OUT" -czf "$RESULTS/multigpu-$tag-agent.tgz" -T "$WORK/agentfiles-$tag"
  tar -C "$OUT" -czf "$RESULTS/multigpu-$tag-raw.tgz" --exclude='./*-facts.jsonl' --exclude='./*-verdicts.jsonl' \
    --exclude='./*-agent.log' --exclude='*.sock' --exclude='./healthy.stop' .
  cp "$OUT/console.log" "$RESULTS/multigpu-$tag-console.log" 2>/dev/null || true
  for f in "$RESULTS"/multigpu-"$tag"-*; do
    if [ "$(stat -c %s "$f")" -gt $((15 * 1024 * 1024)) ]; then  # a file over 16 MiB would not come back
      split -b 15M -d "$f" "$f.part" && rm "$f" && echo "split $f (over 15 MiB)"
    fi
  done
  ls -l "$RESULTS"
  head -c 6000 "$RESULTS/multigpu-$tag-summary.json"; echo
}

healthy_state() { cat "$WORK/healthy.state" 2>/dev/null || echo none; }
steps_of() { if [ -f "$1" ]; then grep -c step_ms "$1" || true; else echo 0; fi; }

# The healthy run, detached by main: it runs from a copy of the scripts and
# binaries, so that the next call's copy of the working tree cannot change
# them under it.
start_detached_healthy() {
  rm -rf "$WORK/code" "$WORK/collect"
  mkdir -p "$WORK/code/bench/gpu" "$WORK/code/bin" "$WORK/collect"
  cp bench/gpu/common.sh bench/gpu/multigpu.sh bench/gpu/train.py bench/gpu/analyze.py "$WORK/code/bench/gpu/"
  if [ -z "${DRY:-}" ]; then cp "$AGENT" "$LIB" "$WORK/code/bin/"; fi
  echo starting >"$WORK/healthy.state"
  MG_WORK=$WORK NGPU=$NGPU HEALTHY=$HEALTHY HEALTHY_TP=$HEALTHY_TP STARTUP=$STARTUP PORT=29700 \
    setsid bash "$WORK/code/bench/gpu/multigpu.sh" _healthy >"$WORK/collect/healthy-detached.log" 2>&1 </dev/null &
  echo "healthy run started detached (pid $!, $HEALTHY s of training) at t=${SECONDS} s"
}

case $MODE in
_healthy)
  echo $$ >"$WORK/healthy.pid"  # setsid made it the leader of its own process group
  echo running >"$WORK/healthy.state"
  AGENT_PID=
  trap 'stop_agent; echo "done killed" >"$WORK/healthy.state"; exit 1' INT TERM
  t0=$SECONDS rc=0
  sc_healthy || rc=$?
  note healthy "$([ "$rc" = 0 ] && echo ran || echo failed)" "$est_healthy" $((SECONDS - t0)) "$rc" detached
  echo "done $rc" >"$WORK/healthy.state"
  ;;

smoke | main)
  echo "multigpu.sh $MODE: $NGPU GPUs, budget ${BUDGET} s, work in $WORK, results to $RESULTS${DRY:+ (DRY RUN on CPU)}"
  if [ "$MODE" = main ] && [ "$(healthy_state)" = running ]; then
    echo "a detached healthy run is still going: stopping it"; touch "$WORK/collect/healthy.stop"; sleep 30
  fi
  rm -f "$WORK/healthy.state" "$WORK/pending"
  if [ -z "${DRY:-}" ] && [ ! -x "$AGENT" ]; then
    echo "no agent binary at $AGENT: run 'make build' on the development machine and carry bin/slowrank"; exit 2
  fi
  env_info
  build_lib
  if [ "$MODE" = smoke ]; then
    deadline=$((BUDGET - RESERVE))
  else
    # Scenarios must end early enough for the healthy run, started after
    # them, to end inside collect's budget: 2 budgets + gap - 2 reserves - healthy.
    deadline=$((2 * BUDGET + GAP - 2 * RESERVE - est_healthy))
    ((deadline <= BUDGET - RESERVE)) || deadline=$((BUDGET - RESERVE))
  fi
  echo "scenarios must end by t=${deadline} s; estimates: injection ${est_inj} s, C1 ${est_c1} s, C2 ${est_c2} s, healthy ${est_healthy} s"
  scenario ddp-gpu "$est_inj" "$deadline" sc_ddp_gpu
  if ((NGPU % TP == 0 && NGPU / TP >= 2)); then
    scenario tpdp-mixed "$est_inj" "$deadline" sc_tpdp_mixed
  else
    echo "== tpdp-mixed: skipped (TP=$TP x DP needs a multiple of $TP and at least $((2 * TP)) GPUs)"
    note tpdp-mixed skipped "$est_inj" 0 0 "gpus"
  fi
  scenario mg-c1 "$est_c1" "$deadline" sc_c1
  if [ "$MODE" = smoke ]; then scenario healthy "$est_healthy" "$deadline" sc_healthy; fi
  scenario c2 "$est_c2" "$deadline" sc_c2
  scenario ddp-host "$est_inj" "$deadline" sc_ddp_host
  if [ "$MODE" = main ]; then echo "${SKIPPED[*]}" >"$WORK/pending"; fi
  ship "${RUN_TAG:-$MODE}"
  if [ "$MODE" = main ]; then
    start_detached_healthy
    last=0
    while ((SECONDS < BUDGET - 5)); do  # hold the call: the machine stays ours while it runs
      case $(healthy_state) in done*) break ;; esac
      if ((SECONDS - last >= 60)); then
        last=$SECONDS
        echo "t=${SECONDS} s: healthy $(healthy_state), rank 0 at $(steps_of "$WORK/collect/healthy/rank0.jsonl") steps"
      fi
      sleep 5
    done
    cp "$OUT/console.log" "$RESULTS/multigpu-${RUN_TAG:-$MODE}-console.log" 2>/dev/null || true
    echo "main done at t=${SECONDS} s; healthy $(healthy_state). NOW run: bash bench/gpu/multigpu.sh collect (the machine is given back 30 s after this call)"
  fi
  ;;

collect)
  echo "multigpu.sh collect: $NGPU GPUs, budget ${BUDGET} s${DRY:+ (DRY RUN on CPU)}"
  state=$(healthy_state)
  if [ "$state" = none ]; then
    echo "no healthy run on this machine (a fresh machine, or main did not get to it): running one in this call"
    env_info
    build_lib
    room=$((BUDGET - RESERVE - SECONDS - STARTUP - 15))
    if ((room < HEALTHY)); then HEALTHY=$room; fi
    est_healthy=$((HEALTHY + STARTUP + 15))
    echo "healthy for ${HEALTHY} s"
    scenario healthy "$est_healthy" $((BUDGET - RESERVE)) sc_healthy
  else
    echo "waiting for the detached healthy run ($state)"
    last=0
    while ((SECONDS < BUDGET - RESERVE - 45)); do
      case $(healthy_state) in done*) break ;; esac
      if ((SECONDS - last >= 60)); then
        last=$SECONDS
        echo "t=${SECONDS} s: healthy $(healthy_state), rank 0 at $(steps_of "$OUT/healthy/rank0.jsonl") steps"
      fi
      sleep 5
    done
    case $(healthy_state) in
      done*) ;;
      *)
        echo "the healthy run is late: stopping it early through its stop file"
        touch "$OUT/healthy.stop"
        for _ in $(seq 30); do case $(healthy_state) in done*) break ;; esac; sleep 1; done
        case $(healthy_state) in
          done*) ;;
          *) echo "still running: interrupting it"; kill -INT -- "-$(cat "$WORK/healthy.pid")" 2>/dev/null || true; sleep 10 ;;
        esac
        ;;
    esac
    echo "healthy: $(healthy_state) at t=${SECONDS} s"
    [ -f "$LIB" ] || build_lib
    read -r -a pending 2>/dev/null <"$WORK/pending" || pending=()
    for fn in "${pending[@]}"; do
      case $fn in
        sc_ddp_gpu | sc_ddp_host | sc_tpdp_mixed) est=$est_inj ;;
        sc_c1) est=$est_c1 ;;
        sc_c2) est=$est_c2 ;;
        *) continue ;;
      esac
      name=${fn#sc_}; name=${name//_/-}; [ "$name" = c1 ] && name=mg-c1
      scenario "$name" "$est" $((BUDGET - RESERVE)) "$fn"
    done
  fi
  ship collect
  ;;
esac
