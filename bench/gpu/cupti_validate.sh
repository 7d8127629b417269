#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# Issue 4 on the H200, one call: the injection library with the agent.
#  1. clock agreement, latency and counts: 1 rank NCCL, collection pinned full
#     on (control set --duty-share 1), raw records dumped; a kernel interval
#     must end inside the host wait of the synchronisation that waited for it.
#  2. loaded without an agent vs not loaded: ABBA pairs of separate processes.
#  3. overhead in one process: ABBA blocks OFF vs ON at full collection and
#     OFF vs ON at the default duty cycle (like c1.sh).
# Knobs (environment): NOAGENT_PAIRS (4) and NOAGENT_S (30) size part 2;
# C1FULL=0 / C1DUTY=0 skip the parts of 3 (~3.5 min each).
# What comes back in $OUT: gpu-cupti-validation.json and cupti-validate-raw.tgz
# (everything else stays in the work folder, so that at most 2 files return).
RESULTS=${OUT:-$(pwd)/out}
export OUT=${VAL_WORK:-/var/tmp/slowrank-val}
rm -rf "$OUT"
# shellcheck source=common.sh
source "$(dirname "$0")/common.sh"
mkdir -p "$RESULTS"
NOAGENT_PAIRS=${NOAGENT_PAIRS:-4}; NOAGENT_S=${NOAGENT_S:-30}
MODEL="--launch 1 --backend nccl --dim 1024 --layers 8 --seq 512 --batch 8"
build_lib

# 1. clock, latency, counts
start_agent val-full --dump-events "$OUT/val-full-dump.jsonl" --status-socket "$OUT/agent.sock"
( sleep 3; "$AGENT" control set --socket "$OUT/agent.sock" --duty-share 1 >"$OUT/val-control.log" 2>&1 ) &
# shellcheck disable=SC2086 # MODEL is a list of flags
train val-full $MODEL --duration 40 --port 29530
sleep 1
"$AGENT" status --socket "$OUT/agent.sock" --json >"$OUT/val-full-status.json" 2>&1 || true
stop_agent
echo "part 1 done at t=${SECONDS} s"

# 2. library loaded without an agent vs not loaded (ABBA pairs of separate runs)
for ((p = 0; p < NOAGENT_PAIRS; p++)); do
  if ((p % 2 == 0)); then arms="bare lib"; else arms="lib bare"; fi
  for arm in $arms; do
    if [ "$arm" = lib ]; then
      # shellcheck disable=SC2086
      train "val-noagent-p$p-lib" $MODEL --duration "$NOAGENT_S" --port $((29540 + p))
    else
      # shellcheck disable=SC2086
      python3 bench/gpu/train.py --out-dir "$OUT/val-noagent-p$p-bare" $MODEL --duration "$NOAGENT_S" --port $((29550 + p)) >"$OUT/val-noagent-p$p-bare-train.log" 2>&1
    fi
  done
done
echo "part 2 done at t=${SECONDS} s"

# 3. in-process overhead: full collection and default duty (3 pairs each)
if [ "${C1FULL:-1}" = 1 ]; then PAIRS=3 BLOCK=20 SETTLE=4 WARMUP=30 SHARE=1 SKIP_BUILD=1 NAME=val-c1full bash bench/gpu/c1.sh; fi
if [ "${C1DUTY:-1}" = 1 ]; then PAIRS=3 BLOCK=20 SETTLE=4 WARMUP=30 SKIP_BUILD=1 NAME=val-c1duty bash bench/gpu/c1.sh; fi

python3 bench/gpu/analyze.py cupti "$OUT" | tee "$RESULTS/gpu-cupti-validation.json"
(cd "$OUT" && tar czf "$RESULTS/cupti-validate-raw.tgz" --exclude='*.sock' .)
ls -l "$RESULTS"
