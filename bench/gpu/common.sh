# shellcheck shell=bash
# Sourced by the bench/gpu experiment scripts on the GPU machine. The agent
# binary is built on the development machine and carried in bin/; the
# injection library is built here against the local CUDA headers.
set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT"
OUT=${OUT:-$ROOT/out/gpu}
mkdir -p "$OUT"
# Keep NVLink multicast off (the machine's rules).
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
export PYTHONUNBUFFERED=1
AGENT=$ROOT/bin/slowrank
LIB=$ROOT/bin/libslowrank_cupti.so

build_lib() {
  rm -f "$LIB"  # never reuse a library built against other CUDA headers
  make -s cupti OUT_DIR=bin CUDA_HOME="${CUDA_HOME:-/usr/local/cuda}" >"$OUT/build.log" 2>&1 || { cat "$OUT/build.log"; return 1; }
  echo "built $(stat -c %s "$LIB") bytes: $LIB"
}

# start_agent NAME [flags...]: the agent in the background, logs under $OUT/NAME-*.
start_agent() {
  local name=$1; shift
  "$AGENT" agent --host-name h200 --otel off --facts "$OUT/$name-facts.jsonl" --verdicts "$OUT/$name-verdicts.jsonl" \
    "$@" 2>"$OUT/$name-agent.log" &
  AGENT_PID=$!
  sleep 1
}

stop_agent() {
  kill -INT "$AGENT_PID" 2>/dev/null || true
  wait "$AGENT_PID" 2>/dev/null || true
}

# train NAME [train.py flags...]: a training run with the injection library loaded.
train() {
  local name=$1; shift
  CUDA_INJECTION64_PATH=$LIB python3 bench/gpu/train.py --out-dir "$OUT/$name" "$@" >"$OUT/$name-train.log" 2>&1
}

# DRY=1: a CPU dry run of the scripts (bench/gpu/multigpu.sh) on a machine
# without a GPU: no injection library, no agent; train.py runs CPU gloo ranks.
# DRY_AGENT=1 keeps the real agent (bench/gpu/host_exposure.sh): the script
# must then select its dry trainer by a private --env-key, so that the agent
# never attaches to other processes of a shared machine.
if [ -n "${DRY:-}" ]; then
  LIB=
  build_lib() { echo "dry run: no injection library"; }
  if [ -z "${DRY_AGENT:-}" ]; then
    start_agent() { AGENT_PID=; echo "dry run: no agent for $1" >"$OUT/$1-agent.log"; }
    stop_agent() { :; }
  fi
fi

pack() {
  (cd "$OUT" && tar czf "$OUT/../gpu-$1.tgz" .) && mv "$OUT/../gpu-$1.tgz" "${RESULTS:-$OUT}/"
}
