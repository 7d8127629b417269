#!/usr/bin/env bash
# Issue 4 on the H200, one call (~8 min): the injection library with the agent.
#  1. clock agreement, latency and counts: 1 rank NCCL, collection pinned full
#     on (control set --duty-share 1), raw records dumped; a kernel interval
#     must end inside the host wait of the synchronisation that waited for it.
#  2. loaded without an agent vs not loaded: ABBA pairs of separate processes.
#  3. overhead in one process: ABBA blocks OFF vs ON at full collection and
#     OFF vs ON at the default duty cycle (like c1.sh).
source "$(dirname "$0")/common.sh"
MODEL="--launch 1 --backend nccl --dim 1024 --layers 8 --seq 512 --batch 8"
build_lib

# 1. clock, latency, counts
start_agent val-full --dump-events "$OUT/val-full-dump.jsonl" --status-socket "$OUT/agent.sock"
( sleep 3; "$AGENT" control set --socket "$OUT/agent.sock" --duty-share 1 >"$OUT/val-control.log" 2>&1 ) &
train val-full $MODEL --duration 40 --port 29530
sleep 1
"$AGENT" status --socket "$OUT/agent.sock" --json >"$OUT/val-full-status.json" 2>&1 || true
stop_agent

# 2. library loaded without an agent vs not loaded (4 ABBA pairs of 30 s runs)
for p in 0 1 2 3; do
  if ((p % 2 == 0)); then arms="bare lib"; else arms="lib bare"; fi
  for arm in $arms; do
    if [ "$arm" = lib ]; then
      train "val-noagent-p$p-lib" $MODEL --duration 30 --port $((29540 + p))
    else
      python3 bench/gpu/train.py --out-dir "$OUT/val-noagent-p$p-bare" $MODEL --duration 30 --port $((29550 + p)) >"$OUT/val-noagent-p$p-bare-train.log" 2>&1
    fi
  done
done

# 3. in-process overhead: full collection and default duty (3 pairs each)
PAIRS=3 BLOCK=20 SETTLE=4 WARMUP=30 SHARE=1 NAME=val-c1full bash bench/gpu/c1.sh
PAIRS=3 BLOCK=20 SETTLE=4 WARMUP=30 NAME=val-c1duty bash bench/gpu/c1.sh

python3 bench/gpu/analyze.py cupti "$OUT" | tee "$OUT/gpu-cupti-validation.json"
