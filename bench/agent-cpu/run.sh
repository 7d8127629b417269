#!/usr/bin/env bash
# bench/agent-cpu/run.sh - CPU cost of the agent at a given event rate (root).
#
# Runs bin/slowrank agent next to the fake trainer (test/fakelibs) tuned to
# produce about RATE probe events per second (collective and synchronisation
# calls of RANKS ranks; every call is one uprobe event), and measures the
# agent's CPU time from /proc/PID/stat (utime + stime) and its event count
# (GET /status on its socket) over MEASURE seconds after WARMUP seconds. The
# agent runs as shipped: discovery, attach, ring buffer, correlation,
# detection, JSONL facts and verdicts (to files), status endpoint.
#
#   make build fakelibs
#   bench/agent-cpu/run.sh                       # 1 rank, ~100,000 events/s, 1,600 steps/s
#   BUCKETS=1000 GPU_MS=4 bench/agent-cpu/run.sh # ~115,000 events/s at a realistic 114 steps/s
#   RANKS=4 BUCKET_MB=1 bench/agent-cpu/run.sh   # other loads
#   PROFILE=/tmp/agent.pprof bench/agent-cpu/run.sh  # and a CPU profile (go tool pprof)
#
# Output: one JSON object on stdout and in $OUT (default
# bench/results/agent-cpu-<events/s>.json). Target: < 5 % of one core at
# 100,000 events/s.
set -euo pipefail
cd "$(dirname "$0")/../.."
RANKS=${RANKS:-1}
BUCKETS=${BUCKETS:-64}        # ncclAllReduce calls per step (+1 sync)
STEP_MS=${STEP_MS:-0}         # host work per step
GPU_MS=${GPU_MS:-0.18}        # modelled device time per step (~100,000 events/s here)
BUCKET_MB=${BUCKET_MB:-0.01}  # largest allreduce (transfer time in the fake NCCL)
WARMUP=${WARMUP:-8}
MEASURE=${MEASURE:-30}
AGENT=${AGENT:-bin/slowrank}
TRAINER=${TRAINER:-bin/fakelibs/faketrainer}
[ "$(id -u)" = 0 ] || { echo "run as root" >&2; exit 2; }
[ -x "$AGENT" ] && [ -x "$TRAINER" ] || { echo "build first: make build fakelibs" >&2; exit 2; }

tmp=$(mktemp -d /tmp/slowrank-cpu-XXXXXX)
chmod 700 "$tmp"
trap 'kill $apid 2>/dev/null; kill -- -$tpid 2>/dev/null; wait 2>/dev/null; rm -rf "$tmp"' EXIT
sock=$tmp/agent.sock

# LD_LIBRARY_PATH unset: on GPU hosts it names the real libcuda.so.1, which
# the loader prefers to the fake trainer's RUNPATH.
SLOWRANK_CPU_MARK=1 SLOWRANK_FAKE_JOB=cpu-$$ setsid env -u LD_LIBRARY_PATH -u LD_PRELOAD "$TRAINER" --ranks "$RANKS" \
  --duration $((WARMUP + MEASURE + 10)) --buckets "$BUCKETS" --step-ms "$STEP_MS" --gpu-ms "$GPU_MS" \
  --bucket-mb "$BUCKET_MB" --kernels 1 --sleep-before-start 1500 >"$tmp/trainer.out" 2>&1 &
tpid=$!
"$AGENT" agent --env-key SLOWRANK_CPU_MARK --status-socket "$sock" --state-dir "$tmp/state" \
  --facts "$tmp/facts.jsonl" --verdicts "$tmp/verdicts.jsonl" >"$tmp/agent.log" 2>&1 &
apid=$!

status() { curl -s --max-time 2 --unix-socket "$sock" http://agent/status; }
cputicks() { awk '{print $14 + $15}' "/proc/$apid/stat"; }
sleep "$WARMUP"
status >/dev/null || { echo "agent not answering:" >&2; tail -5 "$tmp/agent.log" >&2; exit 1; }
t0=$(date +%s.%N); c0=$(cputicks); e0=$(status | jq .events); f0=$(status | jq .facts)
if [ -n "${PROFILE:-}" ]; then # a CPU profile of the measured interval (adds ~1 % of sampling)
  curl -s --max-time $((MEASURE + 10)) --unix-socket "$sock" -o "$PROFILE" \
    "http://agent/debug/pprof/profile?seconds=$MEASURE" &
fi
sleep "$MEASURE"
t1=$(date +%s.%N); c1=$(cputicks); st=$(status); e1=$(jq .events <<<"$st"); f1=$(jq .facts <<<"$st")
lost=$(jq '.lost' <<<"$st")
rss=$(awk '/VmRSS/ {print $2}' "/proc/$apid/status")
hz=$(getconf CLK_TCK)
result=$(python3 - "$t0" "$t1" "$c0" "$c1" "$e0" "$e1" "$f0" "$f1" "$hz" "$lost" "$rss" "$RANKS" "$BUCKETS" "$STEP_MS" "$GPU_MS" <<'PY'
import json, sys, os, platform
t0, t1, c0, c1, e0, e1, f0, f1, hz, lost, rss = map(float, sys.argv[1:12])
ranks, buckets, step_ms, gpu_ms = sys.argv[12:16]
dt = t1 - t0
cpu = (c1 - c0) / hz
rate = (e1 - e0) / dt
out = {
    "name": "agent-cpu",
    "events_per_s": round(rate),
    "facts_per_s": round((f1 - f0) / dt, 1),
    "agent_cpu_percent_of_one_core": round(100 * cpu / dt, 2),
    "agent_cpu_ns_per_event": round(1e9 * cpu / max(e1 - e0, 1)),
    "measure_s": round(dt, 1),
    "cpu_ticks": int(c1 - c0), "clk_tck": int(hz),
    "lost": int(lost), "agent_rss_mib": round(rss / 1024, 1),
    "load": {"ranks": int(ranks), "buckets": int(buckets), "step_ms": float(step_ms), "gpu_ms": float(gpu_ms),
             "events": "one per ncclAllReduce and cudaStreamSynchronize call (uprobe+uretprobe joined in BPF)"},
    "host": {"cpus": os.cpu_count(), "kernel": platform.release()},
    "target": "< 5 % of one core at 100,000 events/s",
    "profiled": bool(os.environ.get("PROFILE")),
}
out["verdict"] = "pass" if out["agent_cpu_percent_of_one_core"] < 5 * max(rate, 1) / 100000 else "fail"
print(json.dumps(out, indent=1))
PY
)
echo "$result"
mkdir -p bench/results
out=${OUT:-bench/results/agent-cpu-$(jq .events_per_s <<<"$result").json}
echo "$result" >"$out"
echo "written to $out" >&2
