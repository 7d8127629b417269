#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# Issue 20 on the H200. First run (session 10, bench/results/nccl-plugin-*.json):
# part 1 did not resolve a trap (the 1-KiB loop is GPU-bound, blocks vary
# 18-32 us per call); part 2 got no data (its loop ended before the agent
# attached the library; it now waits for that).
#  1. cost per collective, one run: ROUNDS rounds, each running every mode once
#     in a rotated order, a tight loop of small all-reduces (world size 1):
#       neither     injection library loaded, no agent, no plugin
#       uprobe      the agent attached (libnccl collective uprobes; device
#                   collection at its default duty), no plugin
#       plugin      NCCL_PROFILER_PLUGIN = the library, forced attach, mask
#                   Coll/P2p/CollApi/P2pApi (no agent: no trap per batch either)
#       plugin_kch  the same plus KernelCh in every operation (duty always)
#     -> nccl-plugin-cost.json: ns per call and ratios against "neither".
#     Session 11 (3 rounds of 500-call blocks): neither 25.7-28.6 us a call,
#     uprobe +2.0 to +2.7 us in each round (entry + return: 1.0-1.35 us a
#     trap), plugin -2.7 to +1.3 us, plugin_kch -0.3 to +2.2 (not resolved
#     against the rounds' own 1-3 us spread).
#  2. clock agreement: the agent attached at full duty with the plugin loaded;
#     the library dumps its batches; plugin GPU start/end per collective minus
#     the overlapping CUPTI NCCL kernel's -> nccl-plugin-clock.json.
#  Both need two ranks on two GPUs (WORLD, default 2 where the machine has
#  them): at world size 1 NCCL runs a collective as ncclLaunchOneRank (an
#  in-place sum is a no-op), so no kernel runs and the plugin sees no Coll or
#  KernelCh event. Session 12's run (1 GPU) showed it: 324 device records,
#  all copies and sets; 0 CUPTI NCCL kernels and 0 plugin kernels. At world
#  size 1 the cost figures say so ("note") and part 2 is skipped.
# Knobs: ROUNDS (5), CALLS (500 per block), BLOCKS (100), WORLD. A block is timed on
# the host only and synchronised after: it must stay shorter than CUDA's
# launch queue, or the host waits for the GPU (each 1-KiB all-reduce takes
# ~20 us there) and a trap of a few us does not show (the first run's
# 20,000-call blocks measured the GPU).
RESULTS=${OUT:-$(pwd)/out}
export OUT=${VAL_WORK:-/var/tmp/slowrank-nccl}
rm -rf "$OUT"
# shellcheck source=common.sh
source "$(dirname "$0")/common.sh"
mkdir -p "$RESULTS"
ROUNDS=${ROUNDS:-5}; CALLS=${CALLS:-500}; BLOCKS=${BLOCKS:-100}
build_lib
PY=bench/gpu/nccl_plugin.py
: >"$OUT/loop.jsonl"
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
WORLD=${WORLD:-$((gpus >= 2 ? 2 : 1))}
echo "nccl_plugin: world size $WORLD ($gpus GPUs)"

# on_ranks VAR=VALUE... CMD...: CMD on WORLD ranks (RANK, LOCAL_RANK and
# WORLD_SIZE set; one GPU each; @RANK@ in an argument becomes the rank);
# rank 0's output is this function's.
on_ranks() {
  local r rc=0 pids=()
  for ((r = 1; r < WORLD; r++)); do
    env RANK=$r LOCAL_RANK=$r WORLD_SIZE="$WORLD" "${@//@RANK@/$r}" >/dev/null &
    pids+=($!)
  done
  env RANK=0 LOCAL_RANK=0 WORLD_SIZE="$WORLD" "${@//@RANK@/0}" || rc=$?
  for r in "${pids[@]}"; do wait "$r" || rc=1; done
  return $rc
}

run_mode() { # MODE PORT
  local mode=$1 port=$2
  case $mode in
    neither) on_ranks MODE=$mode PORT=$port CUDA_INJECTION64_PATH=$LIB python3 $PY loop "$CALLS" "$BLOCKS" ;;
    uprobe) start_agent "u$port" --status-socket "$OUT/agent-$port.sock" --env-key SLOWRANK_NCCL_BENCH
      on_ranks MODE=$mode PORT=$port SLOWRANK_NCCL_BENCH=1 CUDA_INJECTION64_PATH=$LIB python3 $PY loop "$CALLS" "$BLOCKS"
      stop_agent ;;
    plugin) on_ranks MODE=$mode PORT=$port CUDA_INJECTION64_PATH=$LIB NCCL_PROFILER_PLUGIN=$LIB SLOWRANK_CUPTI_FORCE_ATTACH=1 \
      SLOWRANK_CUPTI_MODE=off python3 $PY loop "$CALLS" "$BLOCKS" ;;
    plugin_kch) on_ranks MODE=$mode PORT=$port CUDA_INJECTION64_PATH=$LIB NCCL_PROFILER_PLUGIN=$LIB SLOWRANK_CUPTI_FORCE_ATTACH=1 \
      SLOWRANK_CUPTI_MODE=always python3 $PY loop "$CALLS" "$BLOCKS" ;;
  esac
}

modes=(neither uprobe plugin plugin_kch)
for ((r = 0; r < ROUNDS; r++)); do
  for ((i = 0; i < ${#modes[@]}; i++)); do
    m=${modes[$(((i + r) % ${#modes[@]}))]}
    run_mode "$m" $((29610 + r * 10 + i)) >>"$OUT/loop.jsonl" 2>>"$OUT/loop.err"
  done
done
python3 $PY ratios "$OUT/loop.jsonl" | tee "$RESULTS/nccl-plugin-cost.json"

# 2. clock agreement (CUPTI kernels and plugin kernel channels in one dump).
# 150 blocks of 2000 (~10 s): session 11's 20 blocks ended 3 s after the
# library was attached, with no kernel record in the dump.
# The measured loop takes about a second: it starts only once the agent has
# attached the library and pinned the share (START_FILE), plus 1 s.
if [ "$WORLD" -lt 2 ]; then
  echo '{"skipped": "world size 1: no collective kernel runs (ncclLaunchOneRank), so neither CUPTI nor the plugin has one to compare; needs two GPUs"}' |
    tee "$RESULTS/nccl-plugin-clock.json"
  (cd "$OUT" && tar czf "$RESULTS/nccl-plugin-raw.tgz" --exclude='*.sock' --exclude='*.dump' .)
  exit 0
fi
start_agent clock --status-socket "$OUT/agent.sock" --env-key SLOWRANK_NCCL_BENCH
rm -f "$OUT/clock.start"
(
  for _ in $(seq 300); do
    if grep -q 'kind=cupti_inject' "$OUT/clock-agent.log" 2>/dev/null &&
      "$AGENT" control set --socket "$OUT/agent.sock" --duty-share 1 >"$OUT/clock-control.log" 2>&1; then
      sleep 1; touch "$OUT/clock.start"; exit 0
    fi
    sleep 0.2
  done
  echo "clock: the agent never attached the library (clock-agent.log)" >>"$OUT/clock-control.log"
) &
# A dump per rank: each pairs its own CUPTI and plugin kernels.
on_ranks MODE=clock PORT=29690 SLOWRANK_NCCL_BENCH=1 CUDA_INJECTION64_PATH=$LIB NCCL_PROFILER_PLUGIN=$LIB \
  START_FILE="$OUT/clock.start" SLOWRANK_CUPTI_DUMP="$OUT/clock-@RANK@.dump" python3 $PY loop 2000 150 >"$OUT/clock-loop.json" 2>"$OUT/clock.err"
stop_agent
python3 $PY clock "$OUT"/clock-*.dump | tee "$RESULTS/nccl-plugin-clock.json"
(cd "$OUT" && tar czf "$RESULTS/nccl-plugin-raw.tgz" --exclude='*.sock' --exclude='*.dump' .)
