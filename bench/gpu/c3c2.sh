#!/usr/bin/env bash
# C3 localisation and C2 equivalence on the H200 (issue 8). 4 ranks share the
# GPU through torch.distributed gloo (NCCL refuses two ranks on one GPU).
#   C3 (a) rank 3 gets ~10 % extra GPU work from step 150,
#      (b) rank 1 a 20 ms host sleep per step from step 150,
#      (c) nothing, for HEALTHY seconds (default 180).
#   C2 deterministic runs: OFF, ON (agent attached), OFF, 120 steps each.
source "$(dirname "$0")/common.sh"
HEALTHY=${HEALTHY:-150}
# gloo: torch c10d probes see no tensor sizes, so the step is cut at the
# timer's device synchronisation (torch.cuda.synchronize).
GLOO_AGENT="--probe-torch --step-marker cudaDeviceSynchronize"
GLOO="--launch 4 --backend gloo --dim 512 --layers 4 --seq 256 --batch 8 --vocab 4096"
build_lib

start_agent c3-gpu $GLOO_AGENT
train c3-gpu $GLOO --duration 80 --slow-gpu-rank 3 --slow-gpu-frac 0.10 --slow-from 150 --port 29512
stop_agent
start_agent c3-host $GLOO_AGENT
train c3-host $GLOO --duration 75 --slow-host-rank 1 --slow-host-ms 20 --slow-from 150 --port 29513
stop_agent
start_agent c3-healthy $GLOO_AGENT
train c3-healthy $GLOO --duration "$HEALTHY" --port 29514
stop_agent

train c2-off1 $GLOO --deterministic --steps 120 --port 29515
start_agent c2-on $GLOO_AGENT
train c2-on $GLOO --deterministic --steps 120 --port 29516
stop_agent
train c2-off2 $GLOO --deterministic --steps 120 --port 29517

python3 bench/gpu/analyze.py c3 "$OUT" > "$OUT/gpu-c3-localisation.json"
python3 bench/gpu/analyze.py c2 "$OUT" > "$OUT/gpu-c2-equivalence.json"
cat "$OUT/gpu-c3-localisation.json" | head -c 3000; echo
python3 - "$OUT/gpu-c2-equivalence.json" <<'PY'
import json, sys
d = json.load(open(sys.argv[1]))
print(json.dumps({k: v for k, v in d.items() if k != "losses"}, indent=1))
PY
