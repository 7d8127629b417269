# shellcheck shell=bash
# Sourced by bench/latency/run.sh and bench/volume/run.sh: finds the binaries,
# starts and stops the servers (all on free 127.0.0.1 ports), the probe
# (bench/latency: the recording OTLP proxy) and the agent. Sets ROOT, WORK,
# PYTHON and the *_PID variables; cleanup kills what it started, by pid.
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$ROOT" || exit 2
AGENT=${AGENT:-$ROOT/bin/slowrank}
TRAINER=${TRAINER:-$ROOT/bin/fakelibs/faketrainer}
# What the fake trainer runs under: GPU hosts set LD_LIBRARY_PATH to the
# driver's libraries, which the loader searches before the trainer's RUNPATH;
# with the real libcuda.so.1 bound the fake job refuses to start (an H200 run
# of this bench once measured 16 jobs that never ran).
FAKE_ENV=(env -u LD_LIBRARY_PATH -u LD_PRELOAD -u CUDA_INJECTION64_PATH -u NCCL_PROFILER_PLUGIN)
PROBE=${PROBE:-$ROOT/bin/latency-probe}
TOOLS_BIN=${SLOWRANK_TOOLS_BIN:-$ROOT/.cache/tools/bin}
PYTHON=$(command -v python3 || true)
WORK=${WORK:-$(mktemp -d /tmp/slowrank-bench-XXXXXX)}
mkdir -p "$WORK"
chmod 700 "$WORK"
JAEGER_PID='' COL_PID='' PROBE_PID='' AGENT_PID='' AGG_PID=''
TRAINER_PIDS=()

free_port() {
  "$PYTHON" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1]); s.close()'
}

# wait_tcp PORT PID NAME: until something listens on 127.0.0.1:PORT (15 s).
wait_tcp() {
  local _i
  for _i in $(seq 150); do
    if (: </dev/tcp/127.0.0.1/"$1") 2>/dev/null; then return 0; fi
    if ! kill -0 "$2" 2>/dev/null; then echo "$3 exited:" >&2; tail -n 20 "$WORK/$3.log" >&2; return 1; fi
    sleep 0.1
  done
  echo "$3 not listening on 127.0.0.1:$1 after 15 s" >&2
  tail -n 20 "$WORK/$3.log" >&2
  return 1
}

# unpack NAME: a binary from bin/NAME, bin/NAME.xz or bin/NAME.gz (the GPU
# machine gets compressed binaries to fit a call's carry, see
# bench/gpu/c1matrix.sh; unpacked with Python, which has lzma where xz may be
# missing); prints the path.
unpack() {
  local b=$ROOT/bin/$1
  if [ -x "$b" ]; then echo "$b"; return 0; fi
  [ -f "$b.xz" ] || [ -f "$b.gz" ] || return 1
  "$PYTHON" - "$b" "$WORK/$1" <<'PYX' || return 1
import gzip, lzma, os, sys
src, dst = sys.argv[1], sys.argv[2]
opener = (lzma.open, src + ".xz") if os.path.exists(src + ".xz") else (gzip.open, src + ".gz")
with opener[0](opener[1]) as f, open(dst, "wb") as g:
    g.write(f.read())
os.chmod(dst, 0o755)
PYX
  echo "$WORK/$1"
}

# find_tools: COLLECTOR_KIND=full (test/e2e's otelcol with the Prometheus
# exporter, and Jaeger) when both exist in TOOLS_BIN (or bin/otelcol[.xz],
# bin/jaeger[.xz]); built by test/e2e/build-tools.sh when Go is here and
# BUILD_TOOLS is not 0; else mini (bin/otelcol-mini: OTLP in, debug out; no
# Jaeger, no Prometheus).
find_tools() {
  OTELCOL='' JAEGER='' COLLECTOR_KIND=''
  if [ ! -x "$TOOLS_BIN/otelcol" ] || [ ! -x "$TOOLS_BIN/jaeger" ]; then
    if [ "${BUILD_TOOLS:-1}" != 0 ] && command -v go >/dev/null && [ -z "${MINI:-}" ]; then
      echo "building the Collector and Jaeger (test/e2e/build-tools.sh, ~3-8 min on 2 cores) ..."
      bash "$ROOT/test/e2e/build-tools.sh"
    fi
  fi
  if [ -z "${MINI:-}" ] && [ -x "$TOOLS_BIN/otelcol" ] && [ -x "$TOOLS_BIN/jaeger" ]; then
    OTELCOL=$TOOLS_BIN/otelcol JAEGER=$TOOLS_BIN/jaeger COLLECTOR_KIND=full
  elif [ -z "${MINI:-}" ] && OTELCOL=$(unpack otelcol) && JAEGER=$(unpack jaeger); then
    COLLECTOR_KIND=full
  elif OTELCOL=$(unpack otelcol-mini); then
    JAEGER='' COLLECTOR_KIND=mini
  else
    echo "no collector: build it (bash test/e2e/build-tools.sh, or bench/otelcol-mini for bin/otelcol-mini)" >&2
    return 1
  fi
  if [ ! -x "$AGENT" ] && [ "$AGENT" = "$ROOT/bin/slowrank" ] && a=$(unpack slowrank); then AGENT=$a; fi
  if [ ! -x "$PROBE" ] && [ "$PROBE" = "$ROOT/bin/latency-probe" ] && a=$(unpack latency-probe); then PROBE=$a; fi
  if [ ! -x "$PROBE" ]; then
    if command -v go >/dev/null; then
      (cd "$ROOT" && CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o "$PROBE" ./bench/latency)
    else
      echo "no probe at $PROBE and no Go to build it: build it elsewhere (CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o bin/latency-probe ./bench/latency) and carry it" >&2
      return 1
    fi
  fi
}

# start_servers: Jaeger (test/e2e/testdata/jaeger.yaml) and the collector
# (deploy/otelcol.yaml, as shipped) on free ports; for mini, otelcol-mini with
# a debug exporter. Sets OTLP_HTTP, PROM_URL, JAEGER_URL.
start_servers() {
  JAEGER_URL='' PROM_URL=''
  local cg ch
  cg=$(free_port) ch=$(free_port)
  if [ "$COLLECTOR_KIND" = full ]; then
    local jq jqg jog joh cp
    jq=$(free_port) jqg=$(free_port) jog=$(free_port) joh=$(free_port) cp=$(free_port)
    JAEGER_QUERY_HTTP=127.0.0.1:$jq JAEGER_QUERY_GRPC=127.0.0.1:$jqg JAEGER_OTLP_GRPC=127.0.0.1:$jog \
      JAEGER_OTLP_HTTP=127.0.0.1:$joh "$JAEGER" --config "$ROOT/test/e2e/testdata/jaeger.yaml" >"$WORK/jaeger.log" 2>&1 &
    JAEGER_PID=$!
    wait_tcp "$jq" "$JAEGER_PID" jaeger
    wait_tcp "$jog" "$JAEGER_PID" jaeger
    JAEGER_URL=http://127.0.0.1:$jq
    SLOWRANK_OTLP_GRPC=127.0.0.1:$cg SLOWRANK_OTLP_HTTP=127.0.0.1:$ch SLOWRANK_JAEGER_OTLP=127.0.0.1:$jog \
      SLOWRANK_PROM_ENDPOINT=127.0.0.1:$cp SLOWRANK_OTELCOL_LOG_LEVEL=warn \
      "$OTELCOL" --config "$ROOT/deploy/otelcol.yaml" >"$WORK/otelcol.log" 2>&1 &
    COL_PID=$!
    wait_tcp "$cp" "$COL_PID" otelcol
    PROM_URL=http://127.0.0.1:$cp/metrics
  else
    cat >"$WORK/otelcol-mini.yaml" <<YAML
receivers:
  otlp:
    protocols:
      grpc:
        endpoint: 127.0.0.1:$cg
      http:
        endpoint: 127.0.0.1:$ch
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
    "$OTELCOL" --config "$WORK/otelcol-mini.yaml" >"$WORK/otelcol.log" 2>&1 &
    COL_PID=$!
  fi
  wait_tcp "$ch" "$COL_PID" otelcol
  OTLP_HTTP=http://127.0.0.1:$ch
}

# start_probe [extra flags]: the recording proxy in front of the collector.
# Sets PROBE_URL.
start_probe() {
  rm -f "$WORK/probe.addr"
  "$PROBE" probe --listen 127.0.0.1:0 --upstream "$OTLP_HTTP" --ranks "${RANKS:-4}" \
    ${JAEGER_URL:+--jaeger "$JAEGER_URL"} ${PROM_URL:+--prom "$PROM_URL"} \
    --out "$WORK/probe.jsonl" --ready "$WORK/probe.addr" "$@" >"$WORK/probe.log" 2>&1 &
  PROBE_PID=$!
  local _i
  for _i in $(seq 100); do [ -s "$WORK/probe.addr" ] && break; sleep 0.1; done
  [ -s "$WORK/probe.addr" ] || { echo "probe did not start:" >&2; cat "$WORK/probe.log" >&2; return 1; }
  PROBE_URL=http://$(cat "$WORK/probe.addr")
}

# start_agent MARK [agent flags]: the agent on the processes whose
# environment has MARK, OTLP/HTTP to the probe, its own socket and state
# directory under WORK; log in WORK/agent.log.
start_agent() {
  local mark=$1
  shift
  OTEL_EXPORTER_OTLP_ENDPOINT=$PROBE_URL OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf \
    "$AGENT" agent --env-key "$mark" --otel on --status-socket "$WORK/agent.sock" --state-dir "$WORK/state" \
    --verdicts "$WORK/verdicts.jsonl" "$@" >"$WORK/agent.log" 2>&1 &
  AGENT_PID=$!
  local _i
  for _i in $(seq 100); do [ -S "$WORK/agent.sock" ] && return 0; kill -0 "$AGENT_PID" 2>/dev/null || break; sleep 0.1; done
  echo "agent did not start:" >&2
  tail -n 20 "$WORK/agent.log" >&2
  return 1
}

# first_job_runs JOB PID: the first fake job must be running and watched
# within 15 s, or the run stops here with the trainer's and the agent's
# last lines (a run whose jobs never ran or were never seen measures
# nothing, however long it goes on).
first_job_runs() {
  local job=$1 pid=$2 _i
  for _i in $(seq 150); do
    if ! kill -0 "$pid" 2>/dev/null; then
      echo "the first fake job ($job) exited at once:" >&2
      tail -n 20 "$WORK/trainer-$job.log" >&2
      return 1
    fi
    if grep -q "training process found.*job=$job" "$WORK/agent.log"; then return 0; fi
    sleep 0.1
  done
  echo "the agent did not find the first fake job ($job) in 15 s; its log:" >&2
  tail -n 20 "$WORK/agent.log" >&2
  return 1
}

# stop PID [SIGNAL] [SECONDS]: signal, wait up to SECONDS, then SIGKILL.
stop_pid() {
  local pid=$1 sig=${2:-TERM} t=${3:-10} _i
  [ -n "$pid" ] || return 0
  kill -"$sig" "$pid" 2>/dev/null || return 0
  for _i in $(seq $((t * 10))); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
}

cleanup() {
  local p
  for p in "${TRAINER_PIDS[@]}"; do kill -KILL -- "-$p" 2>/dev/null || true; done
  stop_pid "$AGENT_PID" INT 20
  stop_pid "$AGG_PID" TERM 5
  stop_pid "$PROBE_PID" TERM 10
  stop_pid "$COL_PID" TERM 5
  stop_pid "$JAEGER_PID" TERM 5
  AGENT_PID='' AGG_PID='' PROBE_PID='' COL_PID='' JAEGER_PID='' TRAINER_PIDS=()
}

# keep_raw DEST FILE...: gzip copies of FILEs into DEST (raw data for
# commit), with this machine's paths replaced by <repo> and <work>.
keep_raw() {
  local dest=$1 f
  shift
  mkdir -p "$dest"
  for f in "$@"; do
    [ -f "$f" ] && sed -e "s#$ROOT#<repo>#g" -e "s#$WORK#<work>#g" "$f" | gzip -9 >"$dest/$(basename "$f").gz"
  done
}

# truth_digest OUT TRUTH...: one line per job of the fake trainer's truth
# files, what the summaries read: steps per rank, the first slowed step
# (and its start, CLOCK_MONOTONIC ns) of each slowed rank, and rank 0's step
# ends (ns; they give the steps of a time range).
truth_digest() {
  local out=$1
  shift
  "$PYTHON" - "$out" "$@" <<'PY'
import json, sys
jobs = {}
for p in sys.argv[2:]:
    for line in open(p):
        try:
            r = json.loads(line)
        except ValueError:
            continue
        if r.get("kind") != "step":
            continue
        j = jobs.setdefault(r["job"], {"kind": "truth", "job": r["job"], "steps": {}, "slowed": {}, "rank0_end_ns": []})
        rank = str(r["rank"])
        j["steps"][rank] = j["steps"].get(rank, 0) + 1
        if r.get("slowed"):
            s = j["slowed"].get(rank)
            if s is None or r["step"] < s["step"]:
                j["slowed"][rank] = {"step": r["step"], "start_ns": r["start_ns"]}
        if r["rank"] == 0:
            j["rank0_end_ns"].append(r["end_ns"])
with open(sys.argv[1], "w") as o:
    for j in jobs.values():
        j["rank0_end_ns"].sort()
        o.write(json.dumps(j, separators=(",", ":")) + "\n")
PY
}
