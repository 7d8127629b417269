#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# Issue 20 on one H200 (world size 1 is all the machine lends):
#
#  cost   the cost per NCCL operation, paired and interleaved in ONE process
#         (nccl_plugin.py paired; ~DURATION_S + 40 s):
#           a one-rank NCCL communicator of the process's own, driven through
#           ctypes (no torch process group: its watchdog made 1 block in 7 of
#           the torch loop twice as long), NCCL_PROFILER_PLUGIN = the library,
#           no CUDA injection (no CUPTI: the arms differ by NCCL's mask alone);
#           ops "selfp2p" (a grouped ncclSend+ncclRecv to the own rank: the
#           only world-size-1 operation that reaches the profiler: GroupApi,
#           2 P2pApi, Group, 2 P2p events) and "allreduce" (reaches no
#           profiler site at world size 1, ncclLaunchOneRank: the negative
#           control, its plugin arms must come out at 0);
#           arms neither (mask 0) / plugin (Coll|P2p|CollApi|P2pApi) /
#           plugin_kch (+KernelCh) switched in-process: the bench writes the
#           library's control block as the agent does (agent_flags, duty
#           mode) and waits for the control thread to store NCCL's mask;
#           rounds of one 500-call block per arm in Williams order, each block
#           after a 55-ms gap of synchronised 20-call chunks (the switch takes
#           one poll, <= 50 ms); per round, each arm minus the round's neither;
#           uprobe: the agent's libnccl uprobes cannot be switched in-process
#           (attach/detach takes seconds), so UPROBE_SEGS times the bench asks
#           (files in $OUT/sync) and this script starts the agent, the bench
#           runs uprobe blocks once it attached, then the agent is stopped:
#           per segment, its uprobe blocks minus the neither blocks right
#           before and after it (SEG_BLOCKS each side);
#         -> nccl-plugin-cost.json (medians, bootstrap 95 % CIs of the median
#            and mean difference, ratio table), nccl-plugin-cost-blocks.jsonl.gz
#            (every block), nccl-plugin-cost-table.txt.
#         Sizing (nccl_plugin.py sizing on session 11's raw blocks,
#         raw/nccl-plugin/s11/): adjacent blocks differ with a robust sd of
#         1.44 us (the torch loop, 27 us a call), so the median of n
#         paired differences has a 95 % half-width of 0.32 us at 50 pairs,
#         0.23 at 100, 0.16 at 200 (0.3 us: ~100 pairs; normal approximation
#         139). 170 s make ~3,000 blocks: ~450 rounds per op, 3-4 times that.
#  clock  the plugin's GPU start/end (NCCL_KERNEL, from kernel-channel events)
#         against CUPTI's kernel records of the same collectives, both in one
#         dump per process (agent attached with --nccl-plugin, share pinned to 1):
#           clock-ws1  world size 1, CLOCK_OP=selfp2p: the evidence that no
#                      world-size-1 operation gives kernel channels (NCCL 2.28.9
#                      adds no proxy op for a self send, and KernelCh events come
#                      only from the proxy's profiler op): plugin P2p records and
#                      CUPTI SendRecv kernels, 0 plugin kernel records expected
#           clock      two ranks; with one GPU both on GPU 0, each with its own
#                      NCCL_HOSTID (NCCL then takes them for two nodes and runs
#                      ring kernels over its socket transport on lo, with proxy
#                      ops and so kernel channels), CLOCK_OP=allreduce
#         -> nccl-plugin-clock-ws1.json, nccl-plugin-clock.json (per dump:
#            counts; summary: matched, median and p99 of |d start| and |d end|,
#            share within 50 us), nccl-plugin-clock-pairs.jsonl.gz (per
#            collective: plugin GPU start/end, CUPTI start/end, differences).
#         The first design's clock part ran without --nccl-plugin, so the
#         library never set NCCL's mask (agent_flags): no plugin record could
#         have come even with two GPUs.
#  arrival the device arrival order (item 2) against the truth: two ranks (on
#         one GPU each its own NCCL_HOSTID, as in clock) of nccl_arrival.py's
#         DDP-shaped loop, the agent with --nccl-plugin; even: both ranks
#         alike; slow: rank 1 runs EXTRA_MM more matmuls before each
#         all-reduce (both with the duty share pinned to 1: every step
#         covered); slow-duty: slow at the default duty cycle, as a user runs
#         it. The truth is CUPTI's: each rank's library dump pairs the
#         plugin's kernel records with CUPTI's (nccl_plugin.pair_kernels) and
#         CUPTI's starts say which GPU reached each collective last.
#         trial: even at the default duty cycle, for the kernel-channel
#         trial (ARRIVAL_RUNS=trial ARRIVAL_S=300).
#         -> nccl-arrival-NAME.json (per rank: steps with device evidence,
#            device_last share, median lag and GPU collective time, host
#            evidence beside it; CUPTI's truth; verdicts; the agent's kernel
#            counters; checks), nccl-arrival-NAME-events.jsonl.gz (the
#            agent's --dump-events, for correlate's replays).
# History: sessions 10-12 measured rounds of separate processes (one mode
# each, torch all-reduce at world size 1): not resolved (session 11: plugin
# -2.7..+1.3 us against the rounds' 1-3 us spread); at world size 1 an
# all-reduce never calls the plugin at all, so those plugin figures measured
# nothing of it (docs/nccl-profiler-plugin.md "World size 1").
#
# Knobs: PARTS ("cost clock"), DURATION_S (170), CALLS (500), GAP_MS (55),
# UPROBE_SEGS (6), SEG_BLOCKS (5), OPS ("selfp2p allreduce"), CLOCK_S (15),
# CLOCK_WORLD (2), ARRIVAL_S (45), EXTRA_MM (2), ARRIVAL_RUNS ("even slow slow-duty"),
# SKIP_BUILD=1 (a carried bin/libslowrank_cupti.so).
# Needs bin/slowrank (carried as bin/slowrank.xz: go build -ldflags '-s -w' -o
# bin/slowrank ./cmd/slowrank && xz -k bin/slowrank; batch.sh unpacks it); the
# library is built there. Device call, carry ["bin/slowrank.xz"] (~330 s):
#   bash bench/gpu/batch.sh 'npcost:270:PARTS=cost bash bench/gpu/nccl_plugin.sh' \
#     'npclock:230:PARTS=clock SKIP_BUILD=1 bash bench/gpu/nccl_plugin.sh'
# DRY=1: a CPU dry run: the fake NCCL and CUDA of test/fakelibs (built when
# missing) instead of torch's, the real library when bin/libslowrank_cupti.so
# exists (else the arms are labels only), no agent (its segments are stubs);
# the clock part pairs a synthetic dump. Short defaults (DURATION_S 20).
RESULTS=${OUT:-$(pwd)/out}
export OUT=${VAL_WORK:-/var/tmp/slowrank-nccl}
rm -rf "$OUT"
# shellcheck source=common.sh
source "$(dirname "$0")/common.sh"
mkdir -p "$RESULTS"
PY=bench/gpu/nccl_plugin.py
PYTHON=${PYTHON:-python3}
PARTS=${PARTS:-cost clock}
CLOCK_S=${CLOCK_S:-15}
CLOCK_WORLD=${CLOCK_WORLD:-2}
if [ -n "${DRY:-}" ]; then
  export DURATION_S=${DURATION_S:-20} UPROBE_SEGS=${UPROBE_SEGS:-2} SEG_BLOCKS=${SEG_BLOCKS:-2}
  [ -e bin/fakelibs/libnccl.so.2 ] || make -s -f test/fakelibs/fakelibs.mk fakelibs
  LIB=
  [ -e "$ROOT/bin/libslowrank_cupti.so" ] && LIB=$ROOT/bin/libslowrank_cupti.so
  export FAKELIBS=$ROOT/bin/fakelibs SLOWRANK_FAKE_JOB=nccl-paired-dry-$$
  echo "nccl_plugin: DRY RUN on CPU (fake NCCL; library: ${LIB:-none, arms are labels})"
elif [ -n "${SKIP_BUILD:-}" ] && [ -f "$LIB" ]; then
  echo "using the carried $LIB"
else
  build_lib
fi
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU' || true)
echo "nccl_plugin: parts '$PARTS', $gpus GPU(s)"

# agent_attached LOG KIND SECONDS: the agent's log says it attached a library of KIND.
agent_attached() {
  local i
  [ -n "${DRY:-}" ] && return 0
  for ((i = 0; i < $3 * 10; i++)); do
    grep -q "msg=attached .*kind=$2" "$1" 2>/dev/null && return 0
    kill -0 "$AGENT_PID" 2>/dev/null || return 1
    sleep 0.1
  done
  return 1
}

cost() {
  local sync=$OUT/sync bench i=0 rc=0 running=
  mkdir -p "$sync"
  # RANK: an agent tracks a process selected by its environment only as a
  # rank (one without is a launcher, agent/attach.go).
  env SLOWRANK_NCCL_BENCH=1 RANK=0 LOCAL_RANK=0 WORLD_SIZE=1 NCCL_PROFILER_PLUGIN="${LIB:-none}" LIB="$LIB" SYNC_DIR="$sync" \
    NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,ENV NCCL_DEBUG_FILE="$OUT/cost-nccl.%p.log" \
    "$PYTHON" "$PY" paired "$OUT/paired.jsonl" >"$OUT/paired.log" 2>&1 &
  bench=$!
  # Serve the bench's requests for the agent (uprobe segments).
  while kill -0 "$bench" 2>/dev/null; do
    if [ -e "$sync/agent.want" ] && [ -z "$running" ]; then
      rm -f "$sync/agent.want"
      i=$((i + 1))
      start_agent "u$i" --status-socket "$OUT/agent-u$i.sock" --env-key SLOWRANK_NCCL_BENCH
      running=1
      if agent_attached "$OUT/u$i-agent.log" nccl 45; then
        sleep 1 # the process tracked, not only the file probed
        touch "$sync/agent.ready"
      else
        echo "cost: segment $i: the agent did not attach libnccl (u$i-agent.log)"
        touch "$sync/agent.failed"
      fi
    fi
    if [ -e "$sync/agent.done" ]; then
      rm -f "$sync/agent.done"
      [ -n "$running" ] && stop_agent
      running=
      touch "$sync/agent.gone"
    fi
    sleep 0.05
  done
  wait "$bench" || rc=$?
  [ -n "$running" ] && stop_agent
  echo "cost: bench rc $rc, $i agent segment(s)"
  tail -n 5 "$OUT/paired.log"
  "$PYTHON" "$PY" report "$OUT/paired.jsonl" "$RESULTS/nccl-plugin-cost.json" | tee "$RESULTS/nccl-plugin-cost-table.txt"
  gzip -c "$OUT/paired.jsonl" >"$RESULTS/nccl-plugin-cost-blocks.jsonl.gz"
  return $rc
}

# on_ranks WORLD SHARE VAR=VALUE... CMD...: CMD on WORLD ranks (RANK,
# LOCAL_RANK and WORLD_SIZE set; one GPU each, or all on GPU 0 with SHARE=1
# and an NCCL_HOSTID per rank; @RANK@ in an argument becomes the rank);
# rank 0's output is this function's.
on_ranks() {
  local world=$1 share=$2 r rc=0 pids=() dev hid=()
  shift 2
  for ((r = world - 1; r >= 0; r--)); do
    dev=$r
    hid=()
    if [ "$share" = 1 ]; then
      dev=0
      hid=(NCCL_HOSTID="slowrank-bench-node$r" NCCL_SOCKET_IFNAME=lo NCCL_IB_DISABLE=1)
    fi
    if ((r > 0)); then
      env RANK=$r LOCAL_RANK=$dev WORLD_SIZE="$world" "${hid[@]}" "${@//@RANK@/$r}" >"$OUT/rank$r.log" 2>&1 &
      pids+=($!)
    else
      env RANK=0 LOCAL_RANK=$dev WORLD_SIZE="$world" "${hid[@]}" "${@//@RANK@/0}" || rc=$?
    fi
  done
  for r in "${pids[@]}"; do wait "$r" || rc=1; done
  return $rc
}

# clock_run NAME WORLD SHARE OP LABEL: one run of the clock part.
clock_run() {
  local name=$1 world=$2 share=$3 op=$4 label=$5 rc=0
  start_agent "$name" --status-socket "$OUT/$name.sock" --env-key SLOWRANK_NCCL_BENCH --nccl-plugin
  rm -f "$OUT/$name.start"
  (
    for _ in $(seq 450); do
      if grep -q 'kind=cupti_inject' "$OUT/$name-agent.log" 2>/dev/null &&
        "$AGENT" control set --socket "$OUT/$name.sock" --duty-share 1 >"$OUT/$name-control.log" 2>&1; then
        sleep 1; touch "$OUT/$name.start"; exit 0
      fi
      sleep 0.2
    done
    echo "$name: the agent never attached the library ($name-agent.log)" >>"$OUT/$name-control.log"
  ) &
  on_ranks "$world" "$share" SLOWRANK_NCCL_BENCH=1 CUDA_INJECTION64_PATH="$LIB" NCCL_PROFILER_PLUGIN="$LIB" \
    PORT=$((29690 + world)) CLOCK_OP="$op" CLOCK_S="$CLOCK_S" START_FILE="$OUT/$name.start" \
    NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT,ENV,NET NCCL_DEBUG_FILE="$OUT/$name-nccl.%p.log" \
    SLOWRANK_CUPTI_DUMP="$OUT/$name-@RANK@.dump" "$PYTHON" "$PY" clockloop >"$OUT/$name-loop.json" 2>"$OUT/$name.err" || rc=$?
  stop_agent
  echo "$name: rc $rc; $(cat "$OUT/$name-loop.json" 2>/dev/null)"
  [ "$rc" = 0 ] || tail -n 20 "$OUT/$name.err" "$OUT"/rank*.log 2>/dev/null
  local dumps=()
  for ((r = 0; r < world; r++)); do dumps+=("$OUT/$name-$r.dump"); done
  CLOCK_LABEL=$label "$PYTHON" "$PY" clock "$RESULTS/nccl-plugin-$name.json" "$RESULTS/nccl-plugin-$name-pairs.jsonl.gz" \
    "${dumps[@]}" | cut -c1-1500
}

clock() {
  if [ -n "${DRY:-}" ]; then
    "$PYTHON" "$PY" synthdump "$OUT/clock-0.dump"
    CLOCK_LABEL="DRY RUN: a synthetic dump (nccl_plugin.py synthdump), not a measurement" \
      "$PYTHON" "$PY" clock "$RESULTS/nccl-plugin-clock.json" "$RESULTS/nccl-plugin-clock-pairs.jsonl.gz" \
      "$OUT/clock-0.dump" | cut -c1-1500
    return 0
  fi
  clock_run clock-ws1 1 0 selfp2p "world size 1, a grouped ncclSend+ncclRecv to the own rank: P2p records and CUPTI SendRecv kernels expected, no plugin kernel record (no proxy op for a self send in NCCL 2.28.9)"
  local share=0
  ((gpus < CLOCK_WORLD)) && share=1
  clock_run clock "$CLOCK_WORLD" "$share" allreduce "$CLOCK_WORLD ranks$([ $share = 1 ] && echo ' on one GPU, each its own NCCL_HOSTID (socket transport on lo)'), 1-KiB all-reduces"
}

# arrival_run NAME EXTRA_MM PIN LABEL: one run of the arrival part; PIN=1
# pins the duty share to 1 (every step covered), else the default duty cycle.
arrival_run() {
  local name=$1 extra=$2 pin=$3 label=$4 rc=0 share=0 r truths=() dumps=()
  ((gpus < 2)) && share=1
  start_agent "$name" --status-socket "$OUT/$name.sock" --env-key SLOWRANK_NCCL_BENCH --nccl-plugin \
    --dump-events "$OUT/$name-events.jsonl"
  rm -f "$OUT/$name.start"
  (
    for _ in $(seq 450); do
      if grep -q 'kind=cupti_inject' "$OUT/$name-agent.log" 2>/dev/null &&
        { [ "$pin" != 1 ] || "$AGENT" control set --socket "$OUT/$name.sock" --duty-share 1 >"$OUT/$name-control.log" 2>&1; }; then
        sleep 2; touch "$OUT/$name.start"; exit 0
      fi
      sleep 0.2
    done
    echo "$name: the agent never attached the library" >>"$OUT/$name-agent.log"
  ) &
  on_ranks 2 "$share" SLOWRANK_NCCL_BENCH=1 CUDA_INJECTION64_PATH="$LIB" NCCL_PROFILER_PLUGIN="$LIB" \
    PORT=29640 EXTRA_MM="$extra" SLOW_RANK=1 RUN_S="${ARRIVAL_S:-45}" START_FILE="$OUT/$name.start" \
    SLOWRANK_CUPTI_DUMP="$OUT/$name-@RANK@.dump" TRUTH_FILE="$OUT/$name-truth-@RANK@.json" \
    "$PYTHON" bench/gpu/nccl_arrival.py loop >"$OUT/$name-loop.log" 2>&1 || rc=$?
  "$AGENT" status --socket "$OUT/$name.sock" --json >"$OUT/$name-status.json" 2>&1 || true
  stop_agent
  echo "$name: rc $rc; $(tail -n 1 "$OUT/$name-loop.log")"
  [ "$rc" = 0 ] || tail -n 20 "$OUT/$name-loop.log" "$OUT"/rank*.log 2>/dev/null
  for r in 0 1; do truths+=("$OUT/$name-truth-$r.json") dumps+=("$OUT/$name-$r.dump"); done
  ARRIVAL_LABEL=$label "$PYTHON" bench/gpu/nccl_arrival.py analyze "$OUT/$name-facts.jsonl" "$OUT/$name-verdicts.jsonl" \
    "$OUT/$name-status.json" "$RESULTS/nccl-arrival-$name.json" "${truths[@]}" -- "${dumps[@]}" | cut -c1-2500
  gzip -c "$OUT/$name-events.jsonl" >"$RESULTS/nccl-arrival-$name-events.jsonl.gz" && rm -f "$OUT/$name-events.jsonl"
  return $rc
}

arrival() {
  local run rc=0 x=${EXTRA_MM:-2}
  for run in ${ARRIVAL_RUNS:-even slow slow-duty}; do
    case $run in
      even) arrival_run even 0 1 "two ranks alike, every step covered (duty share pinned to 1)" || rc=1 ;;
      slow) arrival_run slow "$x" 1 "rank 1 runs $x more matmuls before each all-reduce, every step covered" || rc=1 ;;
      slow-duty) arrival_run slow-duty "$x" 0 "rank 1 runs $x more matmuls before each all-reduce, the agent's default duty cycle (as a user runs it)" || rc=1 ;;
      # The kernel-channel trial (--nccl-kernel-channels auto, the default)
      # on real collectives: its state and measurement are in the run's
      # "overhead" (ARRIVAL_S long enough for 8 blocks an arm: ~300 s).
      trial) arrival_run trial 0 0 "two ranks alike at the default duty cycle: the kernel-channel trial" || rc=1 ;;
    esac
  done
  return $rc
}

rc=0
for p in $PARTS; do
  case $p in
    cost) cost || rc=1 ;;
    clock) clock || rc=1 ;;
    arrival) arrival || rc=1 ;;
    *) echo "unknown part $p"; rc=2 ;;
  esac
done
(cd "$OUT" && tar czf "$RESULTS/nccl-plugin-raw.tgz" --exclude='*.sock' --exclude='*.dump' --exclude='paired.jsonl' .)
exit $rc
