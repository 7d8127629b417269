#!/usr/bin/env bash
# bench/volume/run.sh - bytes slowrank exports per GPU (rank) per step
# (issue 18 item 6): spans, metrics and forwarded facts, in a healthy and an
# anomalous window. Root (uprobes).
#
#   make build fakelibs && bash test/e2e/build-tools.sh   # once
#   bash bench/volume/run.sh              # ~2.5 min; bench/results/volume.json
#   SHORT=1 bash bench/volume/run.sh      # ~1 min, --window 2s (checks the script)
#
# The chain is bench/latency's: the real agent (default settings,
# OTLP/HTTP, uncompressed as by default, and --aggregator http://... so that
# it forwards its step facts) exports to the probe (bench/latency/probe.go, a
# recording proxy), which passes traces and metrics to the collector of
# deploy/otelcol.yaml (or otelcol-mini) and the fact records to a real
# `slowrank aggregate`. The probe decodes every request body and attributes
# its bytes: spans and fact records to (job, step) by their attributes (phase
# spans through their trace), metric data points to their job, the agent's own
# series to the host; each request's envelope is shared in proportion.
# Two fake jobs run one after the other on this host, RANKS ranks each
# (~40 ms steps):
#   healthy:   HEALTHY_S s, no slow rank; measured from its first step + 10 s;
#   anomalous: ANOM_S s, rank 2 gets a 12 ms host stall per step from ~20 s;
#              measured from its first STRAGGLER verdict to its end (every
#              window then holds an alert: all ranks' span trees are kept).
# then IDLE_S s without a job (metric series of finished jobs still exported?).
# Metrics are per export interval (5 s), not per step: bytes per step scale
# with 1/steps per second; volume.json also gives them per export and per
# step at one step per second.
set -euo pipefail
# shellcheck source=../latency/common.sh
source "$(dirname "$0")/../latency/common.sh"
if [ -n "${SHORT:-}" ]; then
  : "${HEALTHY_S:=20}" "${ANOM_S:=30}" "${IDLE_S:=8}" "${WINDOW:=2s}"
fi
HEALTHY_S=${HEALTHY_S:-40} ANOM_S=${ANOM_S:-70} IDLE_S=${IDLE_S:-40} RANKS=${RANKS:-4} WINDOW=${WINDOW:-}
if [ -n "${OUT:-}" ]; then
  RESULTS=${RESULTS:-$OUT} RAW=${RAW:-$OUT/raw/volume}
else
  RESULTS=${RESULTS:-$ROOT/bench/results} RAW=${RAW:-$ROOT/bench/results/raw/volume}
fi
[ -n "$PYTHON" ] || { echo "python3 is needed" >&2; exit 2; }
[ "$(id -u)" = 0 ] || { echo "run as root (uprobes)" >&2; exit 2; }
trap cleanup EXIT
find_tools
[ -x "$AGENT" ] && [ -x "$TRAINER" ] || { echo "build first: make build fakelibs" >&2; exit 2; }
start_servers
JAEGER_URL='' PROM_URL=''  # the probe only counts here
agg=$(free_port)
"$AGENT" aggregate --listen "127.0.0.1:$agg" --otel off ${WINDOW:+--window "$WINDOW"} >"$WORK/aggregate.log" 2>&1 &
AGG_PID=$!
wait_tcp "$agg" "$AGG_PID" aggregate
start_probe --logs-upstream "http://127.0.0.1:$agg"
echo "volume: healthy ${HEALTHY_S}s, anomalous ${ANOM_S}s, idle ${IDLE_S}s, $RANKS ranks, window ${WINDOW:-5s (default)}, collector $COLLECTOR_KIND; work $WORK"
start_agent SLOWRANK_VOL_MARK --aggregator "$PROBE_URL" ${WINDOW:+--window "$WINDOW"}
win_s=${WINDOW%s}
win_s=${win_s:-5}
from=$((4 * win_s * 1000 / 40))
run_id=$(date +%s)
: >"$WORK/jobs.jsonl"
run_job() { # PHASE SECONDS [trainer flags]
  local phase=$1 secs=$2 job=vol-$run_id-$1
  shift 2
  echo "{\"kind\":\"job\",\"job\":\"$job\",\"ranks\":$RANKS,\"phase\":\"$phase\"$([ $# -gt 0 ] && echo ",\"slow_rank\":2,\"slow_from_step\":$from")}" >>"$WORK/jobs.jsonl"
  echo "t=${SECONDS}s job $job ($phase, ${secs}s)"
  SLOWRANK_VOL_MARK=1 SLOWRANK_FAKE_JOB=$job setsid "${FAKE_ENV[@]}" "$TRAINER" --ranks "$RANKS" --duration "$secs" \
    --step-ms 20 --gpu-ms 30 --sleep-before-start 1500 --truth "$WORK/truth-$job.jsonl" "$@" >"$WORK/trainer-$job.log" 2>&1 &
  TRAINER_PIDS=($!)
  wait "${TRAINER_PIDS[0]}" || echo "trainer exited $?"
  TRAINER_PIDS=()
}
run_job healthy "$HEALTHY_S"
sleep 8 # its last windows settle and export before the next job starts
run_job anomalous "$ANOM_S" --slow-rank 2 --slow-from-step "$from" --slow-host-ms 12
echo "t=${SECONDS}s idle ${IDLE_S}s"
sleep "$IDLE_S"
stop_pid "$AGENT_PID" INT 20
AGENT_PID=''
stop_pid "$PROBE_PID" TERM 10
PROBE_PID=''
cleanup
truth_digest "$WORK/truth.jsonl" "$WORK"/truth-*.jsonl
cat >"$WORK/config.json" <<JSON
{"kind":"config","date":"$(date -u +%FT%TZ)","machine":"$(uname -r), $(nproc) cores","collector":"$COLLECTOR_KIND",
 "healthy_s":$HEALTHY_S,"anomalous_s":$ANOM_S,"idle_s":$IDLE_S,"ranks":$RANKS,"step_ms":20,"gpu_ms":30,"slow_host_ms":12,
 "window":"${WINDOW:-5s (default)}","metric_interval_s":5,"otlp":"http/protobuf, uncompressed (the default)",
 "agent":"$("$AGENT" --version 2>/dev/null | head -1)","command":"${SHORT:+SHORT=1 }bash bench/volume/run.sh"}
JSON
rm -rf "$RAW"
keep_raw "$RAW" "$WORK/config.json" "$WORK/jobs.jsonl" "$WORK/truth.jsonl" "$WORK/probe.jsonl" "$WORK/agent.log" "$WORK/aggregate.log"
out=$RESULTS/volume.json
[ -z "${SHORT:-}" ] || out=$RESULTS/volume-short.json
mkdir -p "$RESULTS"
"$PROBE" volume --raw "$RAW" --out "$out" >/dev/null
echo "summary: $out; raw: $RAW; work (not removed): $WORK"
