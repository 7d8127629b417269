#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# A short check, on the GPU-bound shape, of two changes made after the C1
# runs showed them (bench/results/README.md, session 9): the library takes
# its buffers back by normal flushes after a switch-off (before: a forced
# flush 50 ms after each disable returned the records of kernels still
# queued on the GPU without timestamps, 69 % of all records there), and the
# duty plan doubles its period until an on-block holds a few whole steps.
#
# One training process (ext_train.py --shape gpu, library loaded), one agent
# at default settings (--otel off) for AGENT_S seconds. Reported from the
# agent's last counters and overhead lines: cupti_lib_incomplete_records (was counted in cupti_lib_bad_records) against
# cupti_lib_records_seen, the planned period and share, steps with device
# records, and the trainer's exit.
#
# DRAIN_SHARE pins the on-share (default 0.1; empty: the agent's own plan).
# At defaults on this shape the plan is ~0.8 % of a 320-s period, so an
# unpinned agent may collect nothing in AGENT_S.
#
# Device call (~3 min with the start; carry ["bin/slowrank"]):
#   AGENT_S=75 bash bench/gpu/drain_check.sh
# What comes back in $OUT: drain.json, drain-raw.tgz, drain-console.log.
set -euo pipefail
# shellcheck source=dnh_begin.sh
source "$(dirname "$0")/dnh_begin.sh" drain "drain"
AGENT_S=${AGENT_S:-75}
DRAIN_SHARE=${DRAIN_SHARE-0.1}
if [ -z "${DRY:-}" ] && [ ! -x "$AGENT" ]; then echo "no agent at $AGENT: carry bin/slowrank"; exit 2; fi
env_info "$OUT/env.txt"
[ -n "${SKIP_BUILD:-}" ] || build_lib
AGENT_PID= EXT_PID=
trap '[ -z "$AGENT_PID" ] || kill -KILL "$AGENT_PID" 2>/dev/null || true; [ -z "$EXT_PID" ] || kill -KILL "$EXT_PID" 2>/dev/null || true' EXIT
ext_start drain 29640 "$LIB" --shape "${SHAPE:-gpu}" --duration $((AGENT_S + 120)) --stop-file "$OUT/drain.stop"
ext_wait_steps drain 10 240
echo "trainer up at t=${SECONDS} s"
agent_spawn "$OUT/drain-agent.log" --otel off --facts "$OUT/drain-facts.jsonl" --status-socket "$OUT/drain.sock"
if [ -n "$DRAIN_SHARE" ]; then agent_pin_share "$OUT/drain.sock" "$DRAIN_SHARE" "$OUT/drain-control.log" drain || true; fi
sleep "$AGENT_S"
"$AGENT" status --socket "$OUT/drain.sock" --json >"$OUT/drain-status.json" 2>/dev/null || true
agent_stop "$AGENT_PID" 30
AGENT_PID=
touch "$OUT/drain.stop"
ext_finish "$EXT_PID" 60
EXT_PID=
"$PYA" - "$OUT" "$EXT_RC" "$RESULTS/drain.json" <<'PY'
import json, re, sys
d, rc, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
counters, overhead = {}, None
for line in open(d + "/drain-agent.log", errors="replace"):
    if "msg=counters" in line:
        counters = dict(kv.split("=", 1) for kv in line.split() if "=" in kv and kv.split("=", 1)[1].isdigit())
    if "msg=overhead" in line:
        overhead = line.strip()
try:
    st = json.load(open(d + "/drain-status.json"))
except Exception:
    st = {}
facts = [json.loads(l) for l in open(d + "/drain-facts.jsonl") if l.strip()]
steps = [f for f in facts if f.get("kind") == "step" or "step" in f.get("type", "")]
gpu = sum(1 for f in steps if f.get("gpu"))
keys = ["cupti_lib_records_seen", "cupti_lib_bad_records", "cupti_lib_incomplete_records", "cupti_lib_kernels", "cupti_lib_enables", "device_records",
        "device_records_dropped", "correlate_dropped_device", "duty_pairs_dropped_short"]
res = {"trainer_rc": rc, "counters": {k: int(counters[k]) for k in keys if k in counters},
       "duty_share": st.get("duty_share"), "duty_period_ns": st.get("duty_period_ns"),
       "overhead_line": overhead, "step_facts": len(steps), "gpu_steps": gpu}
json.dump(res, open(out, "w"), indent=1)
print(json.dumps(res, indent=1))
PY
(cd "$OUT" && tar czf "$RESULTS/drain-raw.tgz" --exclude='*.sock' --exclude=console.log .) || true
cp "$OUT/console.log" "$RESULTS/drain-console.log"
