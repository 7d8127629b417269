#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# Issue 15 ("do no harm"), part 2: torch.profiler next to slowrank. Three
# runs of ext_train.py --shape dense (transformers GPT-2, DDP/NCCL, world
# size 1), CO_S seconds each, every one with a torch.profiler window
# (activities CPU + CUDA) that counts CUDA kernel events per profiled step:
#   (a) no slowrank at all (no injection library, no agent); window of
#       PROF_STEPS (13) steps at step PROF_AT (300)
#   (b) library loaded, agent attached from the start (it starts before the
#       trainer) and collecting; the same window at step PROF_AT (agent first)
#   (c) library loaded, window first: PROF_C_STEPS (80) steps from step
#       PROF_C_AT (100); the agent starts 1 s into it and stays to the end
# In (b) and (c) the agent's on-share is pinned to COEXIST_SHARE (default 1:
# the library wants CUPTI all the time, the worst case for coexistence; empty:
# the default duty cycle, which collects ~10 % of the time and so would
# rarely overlap a 13-step window). Reported: kernels per profiled step of
# each run, ratios b/a and c/a (medians; for (c) also over the steps after
# the agent started), and whether the agent had device records again after
# the profiler window ended (its facts: steps with "gpu": true after the
# window's end, CLOCK_MONOTONIC on both sides). The trainer's resident memory
# is sampled every RSS_EVERY s (co-NAME-rss.txt: CLOCK_MONOTONIC ns, VmRSS
# kB) and its log searched for Kineto's buffer warnings: in (c) the library
# collects up to 30 s without a buffer of its own (the CUDA 13.0 limit,
# DESIGN.md), and records CUPTI kept for the profiler's callbacks then would
# grow the user's process; the analysis reports each run's RSS growth after
# the window against (a)'s.
#
# Device call (one, ~5 min; carry ["bin/slowrank"]):
#   bash bench/gpu/coexist.sh
# What comes back in $OUT (3 files): coexist.json (analyze.py coexist),
# coexist-raw.tgz (steps, profiler counts, agent facts/logs, training logs),
# coexist-console.log.
# DRY=1 [DRY_AGENT=1] CO_S=15 PROF_AT=30 PROF_C_AT=20 PROF_C_STEPS=30 bash bench/gpu/coexist.sh
#   CPU dry run (no CUDA events: counts are 0).
set -euo pipefail
# shellcheck source=dnh_begin.sh
source "$(dirname "$0")/dnh_begin.sh" coexist "coexist"

CO_S=${CO_S:-60}
PROF_AT=${PROF_AT:-300}
PROF_STEPS=${PROF_STEPS:-13}
PROF_C_AT=${PROF_C_AT:-100}
PROF_C_STEPS=${PROF_C_STEPS:-80}
COEXIST_SHARE=${COEXIST_SHARE-1}
RSS_EVERY=${RSS_EVERY:-1}
CO_RUNS=${CO_RUNS:-a b c} # a subset re-runs one case (the analysis then reports the others as missing)
echo "coexist.sh: 3 runs of ${CO_S} s, windows ${PROF_STEPS}@${PROF_AT} (a, b) and ${PROF_C_STEPS}@${PROF_C_AT} (c), on-share ${COEXIST_SHARE:-default}${DRY:+ (DRY RUN)}"
if [ -z "${DRY:-}" ] && [ ! -x "$AGENT" ]; then echo "no agent at $AGENT: carry bin/slowrank"; exit 2; fi
env_info "$OUT/env.txt"
[ -n "${SKIP_BUILD:-}" ] || build_lib
AGENT_PID= EXT_PID= RSS_PID=
trap '[ -z "$AGENT_PID" ] || kill -KILL "$AGENT_PID" 2>/dev/null || true; [ -z "$EXT_PID" ] || kill -KILL "$EXT_PID" 2>/dev/null || true; [ -z "$RSS_PID" ] || kill "$RSS_PID" 2>/dev/null || true' EXIT

# co_rss NAME: sample the trainer's VmRSS until it exits (background).
co_rss() {
  local pid=$EXT_PID f="$OUT/$1-rss.txt"
  "$PYA" - "$pid" "$f" "$RSS_EVERY" <<'PY' &
import sys, time
pid, path, every = sys.argv[1], sys.argv[2], float(sys.argv[3])
with open(path, "w") as out:
    while True:
        try:
            with open(f"/proc/{pid}/status") as f:
                kb = next(int(l.split()[1]) for l in f if l.startswith("VmRSS:"))
        except (OSError, StopIteration):
            break
        out.write(f"{time.monotonic_ns()} {kb}\n")
        out.flush()
        time.sleep(every)
PY
  RSS_PID=$!
}

# co_agent NAME: the agent for run NAME (default settings, OTLP off), its
# on-share pinned to COEXIST_SHARE; start time in NAME-agent.json.
co_agent() {
  local name=$1 t ok=false
  t=$(mono)
  agent_spawn "$OUT/$name-agent.log" --otel off --facts "$OUT/$name-facts.jsonl" --verdicts "$OUT/$name-verdicts.jsonl" \
    --status-socket "$OUT/$name.sock"
  if [ -n "$COEXIST_SHARE" ] && { [ -z "${DRY:-}" ] || [ -n "${DRY_AGENT:-}" ]; }; then
    agent_pin_share "$OUT/$name.sock" "$COEXIST_SHARE" "$OUT/$name-control.log" "$name" && ok=true
  fi
  echo "{\"agent_start_ns\":$t,\"share\":\"${COEXIST_SHARE:-default}\",\"pinned\":$ok}" >"$OUT/$name-agent.json"
}

co_end() {  # co_end NAME: wait for the trainer, then stop the agent if any
  ext_finish "$EXT_PID" $((CO_S + 150))
  EXT_PID=
  if [ -n "$RSS_PID" ]; then wait "$RSS_PID" 2>/dev/null || true; RSS_PID=; fi
  echo "$1: trainer rc $EXT_RC at t=${SECONDS} s"
  echo "$EXT_RC" >"$OUT/$1.rc"
  if [ -n "$AGENT_PID" ]; then agent_stop "$AGENT_PID" 30; AGENT_PID=; echo "$1: agent stopped in ${AGENT_STOP_MS} ms (rc $AGENT_RC)"; fi
}

co_want() { [[ " $CO_RUNS " == *" $1 "* ]]; }

# (a) nothing of slowrank
if co_want a; then
ext_start co-a 29620 "" --shape dense --duration "$CO_S" --profile-at "$PROF_AT" --profile-steps "$PROF_STEPS" --profile-out "$OUT/co-a-prof.json"
co_rss co-a
co_end co-a
fi

# (b) agent first, then the trainer, then the window
if co_want b; then
co_agent co-b
ext_start co-b 29621 "$LIB" --shape dense --duration "$CO_S" --profile-at "$PROF_AT" --profile-steps "$PROF_STEPS" --profile-out "$OUT/co-b-prof.json"
co_rss co-b
co_end co-b
fi

# (c) the window first, the agent 1 s into it
if co_want c; then
ext_start co-c 29622 "$LIB" --shape dense --duration "$CO_S" --profile-at "$PROF_C_AT" --profile-steps "$PROF_C_STEPS" --profile-out "$OUT/co-c-prof.json"
co_rss co-c
if ext_wait_event co-c profiler_start $((CO_S + 120)); then
  sleep 1
  co_agent co-c
else
  echo "co-c: the profiler window never opened"
fi
co_end co-c
fi

"$PYA" bench/gpu/analyze.py coexist "$OUT" >"$RESULTS/coexist.json" || echo "analyze.py coexist failed"
(cd "$OUT" && tar czf "$RESULTS/coexist-raw.tgz" --exclude='*.sock' --exclude=console.log .)
"$PYA" - "$RESULTS/coexist.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print(f'{"run":4s} {"kernels/step median":>20s} {"mean":>8s} {"window s":>9s} {"gpu steps before/during/after":>30s}  errors')
for k, v in r["runs"].items():
    a = v.get("agent_steps") or {}
    gs = "/".join(str((a.get(x) or {}).get("gpu", "-")) for x in ("before", "during", "after")) if a else "-"
    err = v.get("parse_error") or v.get("profiler_error") or (v.get("fatal_patterns") or "")
    print(f'{k:4s} {str(v["kernels_median"]):>20s} {str(v["kernels_mean"]):>8s} {str(v["profiler_window_s"]):>9s} {gs:>30s}  {err}')
    print(f'     rss MB: {v.get("rss")}  kineto warnings: {v.get("kineto_warnings")}')
c = r["runs"]["c"]
print(f'b/a {r["ratio_b_over_a"]}   c/a {r["ratio_c_over_a"]}   c(after agent start)/a {r["ratio_c_after_agent_over_a"]} '
      f'(before agent: {c.get("kernels_median_before_agent")}, after: {c.get("kernels_median_after_agent")}, {c.get("steps_after_agent")} steps)')
print("collected again after the window: b", r["runs"]["b"].get("collected_after_profiler"), " c", r["runs"]["c"].get("collected_after_profiler"))
PY
cp "$OUT/console.log" "$RESULTS/coexist-console.log"
ls -l "$RESULTS"
