# shellcheck shell=bash
# Sourced after common.sh by the do-no-harm scripts of issue 15 (stress.sh,
# coexist.sh, c1matrix.sh, idle_lib.sh). They train bench/gpu/ext_train.py
# (a plain transformers GPT-2, DDP over NCCL with the torchrun environment)
# and start the agent with its default settings.
#
# Layout: the caller sets RESULTS (what comes back: $OUT of the device call)
# and OUT (a work folder outside the working tree, kept while the machine
# stays warm), then sources common.sh and this file.
#
# DRY=1 (a machine without a GPU): ext_train runs on CPU (--device cpu, gloo,
# shape tiny) with DRY_PYTHON (default /usr/bin/python3, Debian's
# python3-torch), and with the transformers stand-in of bench/gpu/drystub
# when that python has no transformers. DRY_AGENT=1 also runs the real agent
# (bin/slowrank, root) but selects the dry trainer by a private variable
# (--env-key SLOWRANK_GPUDRY), so that it never attaches to other processes
# of a shared machine; without DRY_AGENT an agent is a stub process that
# exits DRY_STOP_S seconds after SIGINT. No injection library in dry runs.

PY=python3                 # the training python (the one with torch)
PYA=python3                # the analysis python (standard library only)
EXT_DRY_FLAGS=()
AGENT_SELECT=()            # agent flags that select the training processes (none: RANK, the default)
TRAIN_ENV=()
if [ -n "${DRY:-}" ]; then
  PY=${DRY_PYTHON:-/usr/bin/python3}
  EXT_DRY_FLAGS=(--device cpu --shape tiny --dtype fp32 --threads 1)
  AGENT_SELECT=(--env-key SLOWRANK_GPUDRY --state-dir "$OUT/agent-state")
  TRAIN_ENV=(SLOWRANK_GPUDRY=1)
  if ! "$PY" -c 'import transformers' 2>/dev/null; then
    export PYTHONPATH="$ROOT/bench/gpu/drystub${PYTHONPATH:+:$PYTHONPATH}"
  fi
fi

# mono: CLOCK_MONOTONIC in ns (the clock of ext_train's steps and the agent's facts).
mono() { "$PYA" -c 'import time; print(time.monotonic_ns())'; }

# now_us: sets NOW to the wall clock in microseconds (no subprocess).
now_us() { local t=$EPOCHREALTIME; NOW=$((10#${t/[.,]/})); }

# ext_start NAME PORT LIB|"" [ext_train flags]: one training process in the
# background (EXT_PID), torchrun's environment for world size 1, Python
# fault handler on, the injection library loaded when LIB is not empty.
# Steps go to $OUT/NAME/rank0.jsonl, its output to $OUT/NAME-train.log.
ext_start() {
  local name=$1 port=$2 lib=$3; shift 3
  local inj=()
  if [ -n "$lib" ]; then inj=(CUDA_INJECTION64_PATH="$lib"); fi
  mkdir -p "$OUT/$name"
  env "${TRAIN_ENV[@]}" "${inj[@]}" RANK=0 LOCAL_RANK=0 WORLD_SIZE=1 LOCAL_WORLD_SIZE=1 GROUP_RANK=0 \
    MASTER_ADDR=127.0.0.1 MASTER_PORT="$port" TORCHELASTIC_RUN_ID="$name" PYTHONFAULTHANDLER=1 HF_HUB_OFFLINE=1 \
    "$PY" bench/gpu/ext_train.py --out-dir "$OUT/$name" "$@" "${EXT_DRY_FLAGS[@]}" >"$OUT/$name-train.log" 2>&1 </dev/null &
  EXT_PID=$!
}

# ext_wait_steps NAME N TIMEOUT_S: wait until NAME wrote N steps; fails when
# the trainer died or TIMEOUT_S passed.
ext_wait_steps() {
  local name=$1 n=$2 timeout=$3 t0=$SECONDS have
  while :; do
    have=$(grep -c '"step_ms"' "$OUT/$name/rank0.jsonl" 2>/dev/null || true)
    if [ "${have:-0}" -ge "$n" ]; then return 0; fi
    if [ -n "${EXT_PID:-}" ] && ! kill -0 "$EXT_PID" 2>/dev/null; then
      echo "trainer $name exited before step $n:"; tail -n 25 "$OUT/$name-train.log"; return 1
    fi
    if ((SECONDS - t0 > timeout)); then echo "trainer $name: no step $n after ${timeout} s"; tail -n 25 "$OUT/$name-train.log"; return 1; fi
    sleep 0.5
  done
}

# ext_wait_event NAME EVENT TIMEOUT_S: wait for a marker line ({"event": EVENT}).
ext_wait_event() {
  local name=$1 ev=$2 timeout=$3 t0=$SECONDS
  until grep -q "\"event\": \"$ev\"" "$OUT/$name/rank0.jsonl" 2>/dev/null; do
    if ((SECONDS - t0 > timeout)); then echo "trainer $name: no $ev after ${timeout} s"; return 1; fi
    sleep 0.1
  done
}

# ext_finish PID TIMEOUT_S: wait for a trainer; SIGTERM then SIGKILL after
# TIMEOUT_S. Sets EXT_RC.
ext_finish() {
  local pid=$1 timeout=$2 t0=$SECONDS
  while kill -0 "$pid" 2>/dev/null && ((SECONDS - t0 < timeout)); do sleep 0.5; done
  if kill -0 "$pid" 2>/dev/null; then
    echo "trainer $pid still running after ${timeout} s: SIGTERM"; kill -TERM "$pid" 2>/dev/null || true; sleep 5
    kill -KILL "$pid" 2>/dev/null || true
  fi
  EXT_RC=0
  wait "$pid" || EXT_RC=$?
}

# agent_pin_share SOCK SHARE LOG WHAT: pins a just-spawned agent's on-share
# (`control set --duty-share`), retrying for up to 5 s while its status
# socket comes up; on failure says so with WHAT and the tail of LOG, and
# returns 1. A no-op returning 0 in a dry run without the real agent.
agent_pin_share() {
  local sock=$1 share=$2 log=$3 what=$4 i
  if [ -n "${DRY:-}" ] && [ -z "${DRY_AGENT:-}" ]; then return 0; fi
  for i in $(seq 50); do
    if "$AGENT" control set --socket "$sock" --duty-share "$share" >"$log" 2>&1; then return 0; fi
    sleep 0.1
  done
  echo "$what: control set --duty-share $share failed:"
  tail -n 3 "$log"
  return 1
}

# agent_spawn LOG [agent flags]: the agent in the background with its
# defaults and --host-name h200 (AGENT_PID). The caller adds --otel, --facts,
# --verdicts, --status-socket as it needs.
agent_spawn() {
  local log=$1; shift
  if [ -n "${DRY:-}" ] && [ -z "${DRY_AGENT:-}" ]; then
    # A stub with the agent's signal behaviour: SIGINT -> exit after DRY_STOP_S s
    # (python, because a background job of a script starts with SIGINT ignored,
    # which a bash trap cannot undo; Go's signal.Notify and python's signal can).
    "$PYA" -c 'import os, signal, sys, time
def stop(*_):
    print("time=x level=INFO msg=\"stopping: detaching and settling the last window\"", file=sys.stderr, flush=True)
    time.sleep(float(os.environ.get("DRY_STOP_S", "0.5"))); sys.exit(0)
signal.signal(signal.SIGINT, stop)
print("time=x level=INFO msg=attached library=stub", file=sys.stderr, flush=True)
while True: time.sleep(0.05)' 2>"$log" </dev/null &
    AGENT_PID=$!
    return 0
  fi
  "$AGENT" agent --host-name h200 "${AGENT_SELECT[@]}" "$@" 2>"$log" </dev/null &
  AGENT_PID=$!
}

# agent_stop PID TIMEOUT_S: SIGINT, wait (SIGKILL after TIMEOUT_S). Sets AGENT_RC, AGENT_STOP_MS.
agent_stop() {
  local pid=$1 timeout=${2:-30} t0
  now_us; t0=$NOW
  kill -INT "$pid" 2>/dev/null || true
  while kill -0 "$pid" 2>/dev/null; do
    now_us
    if ((NOW - t0 > timeout * 1000000)); then echo "agent $pid did not exit ${timeout} s after SIGINT: SIGKILL"; kill -KILL "$pid" 2>/dev/null || true; break; fi
    sleep 0.05
  done
  AGENT_RC=0
  wait "$pid" || AGENT_RC=$?
  now_us; AGENT_STOP_MS=$(((NOW - t0) / 1000))
}

# collector_start: bin/otelcol-mini (or bin/otelcol-mini.xz / .gz, unpacked
# into $OUT) on 127.0.0.1:4317 (gRPC) and :4318 (HTTP), debug exporter at
# basic verbosity; log in $OUT/otelcol.log. Sets COL_PID; fails when it does
# not listen within 15 s.
collector_start() {
  local bin=$ROOT/bin/otelcol-mini
  if [ ! -x "$bin" ]; then
    if [ -f "$bin.xz" ] || [ -f "$bin.gz" ]; then
      "$PYA" - "$bin" "$OUT/otelcol-mini" <<'PYX'
import gzip, lzma, os, sys
src, dst = sys.argv[1], sys.argv[2]
opener = (lzma.open, src + ".xz") if os.path.exists(src + ".xz") else (gzip.open, src + ".gz")
with opener[0](opener[1]) as f, open(dst, "wb") as g:
    g.write(f.read())
os.chmod(dst, 0o755)
PYX
      bin=$OUT/otelcol-mini
    else
      echo "no collector at bin/otelcol-mini (or .xz/.gz): build it (bench/otelcol-mini/main.go)"; return 1
    fi
  fi
  cat >"$OUT/otelcol.yaml" <<'YAML'
receivers:
  otlp:
    protocols:
      grpc:
        endpoint: 127.0.0.1:4317
      http:
        endpoint: 127.0.0.1:4318
exporters:
  debug:
    verbosity: basic
service:
  pipelines:
    traces:
      receivers: [otlp]
      exporters: [debug]
    metrics:
      receivers: [otlp]
      exporters: [debug]
YAML
  "$bin" --config "$OUT/otelcol.yaml" >"$OUT/otelcol.log" 2>&1 &
  COL_PID=$!
  local i
  for i in $(seq 150); do
    if (: </dev/tcp/127.0.0.1/4318) 2>/dev/null && (: </dev/tcp/127.0.0.1/4317) 2>/dev/null; then
      echo "collector listening (pid $COL_PID, $("$bin" --version 2>/dev/null | head -1))"; return 0
    fi
    if ! kill -0 "$COL_PID" 2>/dev/null; then echo "collector exited:"; tail -n 20 "$OUT/otelcol.log"; return 1; fi
    sleep 0.1
  done
  echo "collector not listening after 15 s:"; tail -n 20 "$OUT/otelcol.log"; return 1
}

collector_stop() {
  if [ -n "${COL_PID:-}" ]; then kill -TERM "$COL_PID" 2>/dev/null || true; wait "$COL_PID" 2>/dev/null || true; COL_PID=; fi
}

# env_info FILE: machine, GPU, torch, transformers, agent version.
env_info() {
  {
    date -u; uname -a; nproc; free -g 2>/dev/null || true
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>/dev/null || true
    "$PY" -c 'import torch, transformers; print("torch", torch.__version__, "cuda", torch.version.cuda,
"nccl", torch.cuda.nccl.version() if torch.cuda.is_available() else None, "transformers", transformers.__version__)' 2>&1 || true
    "$AGENT" --version 2>/dev/null || true
  } >"$1" 2>&1
}

# gpu_sampler_start FILE: the GPU's SM clock, memory clock, power, temperature
# and utilisation every GPU_SAMPLE_MS (200) ms through nvidia-smi (NVML, as
# dcgm-exporter reads them), each line stamped with CLOCK_MONOTONIC on
# receipt: {"mono_ns", "sm_mhz", "mem_mhz", "power_w", "temp_c", "util_pct",
# "reasons"} per line of FILE. The same sampler runs in every block, so it
# adds no difference between arms; it gives c1m a covariate for the job's own
# drift (the GPU's clock moves with power and temperature). Sets SAMPLER_PID;
# without nvidia-smi (DRY) it writes nothing and returns 0.
gpu_sampler_start() {
  SAMPLER_PID=
  command -v nvidia-smi >/dev/null 2>&1 || { echo "no nvidia-smi: no GPU clock samples"; return 0; }
  local q=timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,utilization.gpu
  if nvidia-smi --query-gpu=clocks_event_reasons.active --format=csv,noheader >/dev/null 2>&1; then
    q=$q,clocks_event_reasons.active
  fi
  # nvidia-smi's pid in SAMPLER_PID: the stamping python ends at its EOF.
  nvidia-smi -i "${GPU_INDEX:-0}" --query-gpu="$q" --format=csv,noheader,nounits -lms "${GPU_SAMPLE_MS:-200}" 2>/dev/null > >(
    "$PYA" -u -c 'import json, sys, time
def num(v):
    try:
        return float(v)
    except ValueError:
        return None
with open(sys.argv[1], "w", buffering=1) as out:
    for line in sys.stdin:
        f = [x.strip() for x in line.split(",")]
        if len(f) < 6:
            continue
        out.write(json.dumps({"mono_ns": time.monotonic_ns(), "sm_mhz": num(f[1]), "mem_mhz": num(f[2]), "power_w": num(f[3]),
                              "temp_c": num(f[4]), "util_pct": num(f[5]), "reasons": f[6] if len(f) > 6 else None}) + "\n")' "$1") &
  SAMPLER_PID=$!
}

gpu_sampler_stop() {
  if [ -n "${SAMPLER_PID:-}" ]; then
    kill -TERM "$SAMPLER_PID" 2>/dev/null || true; wait "$SAMPLER_PID" 2>/dev/null || true; SAMPLER_PID=
  fi
}
