#!/usr/bin/env bash
# Smoke test on the H200: the agent and the injection library on a 1-rank
# NCCL job and a 4-rank gloo job; prints what the agent found.
source "$(dirname "$0")/common.sh"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
uname -r
build_lib
start_agent smoke-nccl --window 2s
train smoke-nccl --launch 1 --backend nccl --duration 25 --dim 1024 --layers 8
stop_agent
start_agent smoke-gloo --window 2s
train smoke-gloo --launch 4 --backend gloo --duration 30 --dim 512 --layers 4 --seq 256 --batch 8 --vocab 4096
stop_agent
python3 bench/gpu/analyze.py smoke "$OUT" | tee "$OUT/smoke-summary.json"
