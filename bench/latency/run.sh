#!/usr/bin/env bash
# bench/latency/run.sh - end-to-end latency of slowrank's output (issue 18
# item 4), measured on the real chain: the fake job (real processes on the
# fake NCCL/CUDA libraries, a slow rank from a known step) -> the real agent
# (real uprobes, default detector settings, OTLP/HTTP) -> the probe (a
# recording OTLP proxy, bench/latency/probe.go) -> the OpenTelemetry
# Collector configured by deploy/otelcol.yaml -> Jaeger v2 and the
# collector's Prometheus endpoint. Root (uprobes).
#
#   make build fakelibs && bash test/e2e/build-tools.sh   # once (tools cached in .cache/tools/bin)
#   bash bench/latency/run.sh             # ~5 min: 16 jobs, one every 13 s, ~4 at a time
#   SHORT=1 bash bench/latency/run.sh     # ~1 min: 3 jobs, --window 2s (checks the chain; not the figures)
#   DRY=1 bash bench/latency/run.sh       # servers and probe up and down, no agent, no job (no root)
#
# Each job: RANKS ranks, STEP_MS host + GPU_MS device per step (~40 ms
# steps), rank i % RANKS gets a SLOW_HOST_MS host stall per step from a
# step drawn uniformly from one window's worth of steps after ~20 s (so the
# slowdown falls at every phase of the detector's window), seeded by SEED.
# Measured (summary: bench/results/latency.json; raw, gzip'ed:
# bench/results/raw/latency/):
#   slowdown -> verdict: the slow rank's first slowed step start (truth,
#     CLOCK_MONOTONIC mapped to wall time by the probe's clock samples) to the
#     agent's STRAGGLER log line for that job and rank (slog time, ms);
#   step end -> trace queryable in Jaeger: latest train.step end of a trace to
#     the first GET /api/traces/ID that returns the train.step span of every rank the probe saw for it
#     (polled every 200 ms; the traces whose id starts with a byte divisible by 8 are followed, a sample independent of timing);
#   step end -> collector: the same end to the probe's receipt of the last
#     rank's train.step span (the agent's share of the above);
#   verdict -> Prometheus: STRAGGLER log line to the first scrape (every
#     200 ms) of the collector's :PORT/metrics with slowrank_straggler 1 for
#     that job and rank;
#   verdict -> collector: STRAGGLER log line to the probe's receipt of the
#     slowrank.straggler = 1 data point.
#
# On the GPU machine (no Go there; Jaeger only if carried): build here, then
# compress what travels so that it fits a call's 64 MiB carry (unpacked there
# with Python's lzma):
#   make build fakelibs
#   CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o bin/latency-probe ./bench/latency
#   (cd bench/otelcol-mini && CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o ../../bin/otelcol-mini .)
#   xz -9 -k -f bin/slowrank bin/latency-probe bin/otelcol-mini
#   run(kind="nvidia-h200", carry=["bin/slowrank.xz","bin/latency-probe.xz","bin/fakelibs","bin/otelcol-mini.xz"],
#       timeout_s=600, command="bash bench/latency/run.sh")
# That variant (summary "collector": "mini") runs the same fake job and agent
# with OTLP through the probe to otelcol-mini (OTLP receiver, debug
# exporter) and measures slowdown -> verdict, step end -> collector and
# verdict -> collector; the Jaeger and Prometheus figures are null. It
# measures the agent and the host, not the GPU: the fake job has no device
# records, so on the H200 it shows the agent's latency on that machine's
# CPUs. For the full chain there, carry bin/otelcol.xz and bin/jaeger.xz
# (xz -9 -c .cache/tools/bin/otelcol > bin/otelcol.xz, the same for jaeger)
# in place of bin/otelcol-mini.xz: with slowrank.xz, latency-probe.xz and
# fakelibs about 46 MB (xz -6 sizes: 13.9 + 3.9 + 0.8 + 9.6 + 17.4 MB).
# Checked here: MINI=1 SHORT=1 with only the three .xz files in bin/, and
# with LD_LIBRARY_PATH naming a stand-in libcuda.so.1 as GPU hosts do (the
# fake job runs with it unset: the first H200 run lost all 16 jobs to it).
# Results go to $OUT (latency.json, raw/latency/).
# Knobs: JOBS (16), EVERY (13 s), JOB_S (58 s), RANKS (4), STEP_MS (20),
# GPU_MS (30), SLOW_HOST_MS (12), SEED (1), WINDOW (agent default 5s),
# SETTLE (12 s after the last job), MINI=1 (otelcol-mini even here).
set -euo pipefail
# shellcheck source=common.sh
source "$(dirname "$0")/common.sh"
if [ -n "${SHORT:-}" ]; then
  : "${JOBS:=3}" "${EVERY:=8}" "${JOB_S:=28}" "${WINDOW:=2s}" "${SETTLE:=8}"
fi
JOBS=${JOBS:-16} EVERY=${EVERY:-13} JOB_S=${JOB_S:-58} RANKS=${RANKS:-4}
STEP_MS=${STEP_MS:-20} GPU_MS=${GPU_MS:-30} SLOW_HOST_MS=${SLOW_HOST_MS:-12} SEED=${SEED:-1}
WINDOW=${WINDOW:-} SETTLE=${SETTLE:-12}
if [ -n "${OUT:-}" ]; then
  RESULTS=${RESULTS:-$OUT} RAW=${RAW:-$OUT/raw/latency}
else
  RESULTS=${RESULTS:-$ROOT/bench/results} RAW=${RAW:-$ROOT/bench/results/raw/latency}
fi
[ -n "$PYTHON" ] || { echo "python3 is needed (free ports, truth digest)" >&2; exit 2; }
trap cleanup EXIT
find_tools
if [ -z "${DRY:-}" ]; then
  [ "$(id -u)" = 0 ] || { echo "run as root (uprobes)" >&2; exit 2; }
  [ -x "$AGENT" ] && [ -x "$TRAINER" ] || { echo "build first: make build fakelibs" >&2; exit 2; }
fi
# Steps of one window at ~40 ms per step (the slowdown's phase is drawn from it).
win_s=${WINDOW%s}
win_s=${win_s:-5}
per_win=$((win_s * 1000 / 40))
base_step=$((4 * per_win))  # 3 clean windows (exposure's step-time baseline) after the first
echo "latency: $JOBS jobs of $RANKS ranks, one every ${EVERY}s for ${JOB_S}s, window ${WINDOW:-5s (default)}, collector $COLLECTOR_KIND${DRY:+ (DRY RUN)}; work $WORK"
start_servers
# shellcheck disable=SC2119 # no extra probe flags here
start_probe
echo "servers up: collector $OTLP_HTTP${JAEGER_URL:+, jaeger $JAEGER_URL}${PROM_URL:+, prometheus $PROM_URL}; probe $PROBE_URL"
run_id=$(date +%s)
: >"$WORK/jobs.jsonl"
if [ -n "${DRY:-}" ]; then
  curl -s -o /dev/null -w 'probe -> collector POST /v1/metrics (empty body): HTTP %{http_code}\n' \
    -H 'Content-Type: application/x-protobuf' --data-binary '' "$PROBE_URL/v1/metrics" || true
  sleep 1
  cleanup
  echo "DRY: probe lines:"; cat "$WORK/probe.jsonl"
  exit 0
fi
start_agent SLOWRANK_LAT_MARK ${WINDOW:+--window "$WINDOW"}
RANDOM=$SEED
for i in $(seq "$JOBS"); do
  job=lat-$run_id-$i
  rank=$((i % RANKS))
  from=$((base_step + RANDOM % per_win))
  SLOWRANK_LAT_MARK=1 SLOWRANK_FAKE_JOB=$job setsid "${FAKE_ENV[@]}" "$TRAINER" --ranks "$RANKS" --duration "$JOB_S" \
    --step-ms "$STEP_MS" --gpu-ms "$GPU_MS" --slow-rank "$rank" --slow-from-step "$from" \
    --slow-host-ms "$SLOW_HOST_MS" --seed "$i" --sleep-before-start 1500 --truth "$WORK/truth-$job.jsonl" \
    >"$WORK/trainer-$job.log" 2>&1 &
  TRAINER_PIDS+=($!)
  echo "{\"kind\":\"job\",\"job\":\"$job\",\"ranks\":$RANKS,\"slow_rank\":$rank,\"slow_from_step\":$from,\"slow_host_ms\":$SLOW_HOST_MS}" >>"$WORK/jobs.jsonl"
  echo "t=${SECONDS}s job $job: rank $rank slowed from step $from"
  if [ "$i" = 1 ]; then first_job_runs "$job" "${TRAINER_PIDS[0]}" || exit 1; fi
  [ "$i" = "$JOBS" ] || sleep "$EVERY"
done
failed=0
for p in "${TRAINER_PIDS[@]}"; do wait "$p" || { echo "trainer $p exited $?"; failed=$((failed + 1)); }; done
TRAINER_PIDS=()
echo "t=${SECONDS}s jobs done; settling ${SETTLE}s"
sleep "$SETTLE"
stop_pid "$AGENT_PID" INT 20
AGENT_PID=''
stop_pid "$PROBE_PID" TERM 10
PROBE_PID=''
cleanup
truth_digest "$WORK/truth.jsonl" "$WORK"/truth-*.jsonl
cat >"$WORK/config.json" <<JSON
{"kind":"config","date":"$(date -u +%FT%TZ)","machine":"$(uname -r), $(nproc) cores","collector":"$COLLECTOR_KIND",
 "jobs":$JOBS,"every_s":$EVERY,"job_s":$JOB_S,"ranks":$RANKS,"step_ms":$STEP_MS,"gpu_ms":$GPU_MS,"slow_host_ms":$SLOW_HOST_MS,
 "seed":$SEED,"window":"${WINDOW:-5s (default)}","agent":"$("$AGENT" --version 2>/dev/null | head -1)",
 "command":"${SHORT:+SHORT=1 }bash bench/latency/run.sh"}
JSON
rm -rf "$RAW"
keep_raw "$RAW" "$WORK/config.json" "$WORK/jobs.jsonl" "$WORK/truth.jsonl" "$WORK/probe.jsonl" "$WORK/agent.log" "$WORK/otelcol.log"
[ "$failed" = 0 ] || keep_raw "$RAW" "$WORK"/trainer-*.log
out=$RESULTS/latency.json
[ -z "${SHORT:-}" ] || out=$RESULTS/latency-short.json
mkdir -p "$RESULTS"
"$PROBE" summarize --raw "$RAW" --out "$out"
echo "summary: $out; raw: $RAW; work (not removed): $WORK"
[ "$failed" = 0 ] || { echo "$failed of $JOBS fake jobs failed: their logs are in $RAW" >&2; exit 1; }
