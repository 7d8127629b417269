#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# Issue 15 ("do no harm"), part 1: attach/detach/kill stress on one real
# training process. ext_train.py --shape dense (transformers GPT-2, DDP world
# size 1 over NCCL, injection library loaded, PYTHONFAULTHANDLER=1) trains
# while a driver starts the agent (`slowrank agent --host-name h200 --otel off
# --facts ... --verdicts ... --status-socket ...`, otherwise its defaults),
# lets it run 0.3-3 s (seeded random schedule), then stops it with SIGINT (it
# detaches) or SIGKILL, >= 500 cycles and >= 50 kills in STRESS_SECONDS.
#
# Device call (one, ~9 min; carry ["bin/slowrank"]):
#   bash bench/gpu/stress.sh
# Knobs: SEED (default random, printed and saved), STRESS_SECONDS (380),
# MIN_CYCLES (500), MIN_KILLS (50), MAX_DRAINING (default from the measured
# detach time), STOP_TIMEOUT (30), PRE_S / POST_S (15: no agent before and
# after, to compare step times), SHAPE (dense), BUDGET (565 s for the call).
#
# A stopped agent takes time to exit: a SIGINT'd one detaches in about
# 0.3 s (uprobe_multi links closed concurrently), but a SIGKILL'd one leaves
# the kernel to release its links one after another, about 50 ms each. With
# one uprobe_multi link per library, probe class and direction that is
# 0.46-0.59 s on the 4-rank fake job (10 links; TestSIGKILLedAgentExitsQuickly);
# with one link per function and direction it was 2.3-2.9 s there (43 links)
# and about 4.5 s on the H200 (seen 2026-12-01; not measured there since).
# The driver therefore does not wait for a stopped agent
# before starting the next one: up to MAX_DRAINING agents may be detaching
# while a new one attaches (like a rolling restart whose old instance still
# shuts down); the next start waits for a slot. MAX_DRAINING=1 makes cycles
# strictly sequential (then fewer cycles fit; the plan says so). Three
# sequential calibration cycles first measure attach and detach times; the
# schedule (analyze.py stress-plan) is sized from them and the driver stops
# at the time budget, counting the cycles actually done.
#
# What comes back in $OUT (3 files):
#   stress.json         analyze.py stress: seed, cycles, kills, attaches, detaches,
#                       crashes, trainer rc, steps, loss finite, agent log errors,
#                       detach times, step time before/during/after
#   stress-raw.tgz      cycles.jsonl, plan.json, phases.jsonl, stress-meta.json,
#                       every agent log (cyc/N.log), the trainer's steps and log tail
#   stress-console.log  this script's output
# DRY=1 [DRY_AGENT=1]: CPU dry run (see dnh_common.sh), e.g.
#   DRY=1 DRY_AGENT=1 STRESS_SECONDS=40 MIN_CYCLES=40 MIN_KILLS=5 bash bench/gpu/stress.sh
set -euo pipefail
# shellcheck source=dnh_begin.sh
source "$(dirname "$0")/dnh_begin.sh" stress "stress"
export LC_ALL=C

BUDGET=${BUDGET:-565}
STRESS_SECONDS=${STRESS_SECONDS:-380}
MIN_CYCLES=${MIN_CYCLES:-500}
MIN_KILLS=${MIN_KILLS:-50}
STOP_TIMEOUT=${STOP_TIMEOUT:-30}
PRE_S=${PRE_S:-15}
POST_S=${POST_S:-15}
SHAPE=${SHAPE:-dense}
SEED=${SEED:-$(($(od -An -N4 -tu4 /dev/urandom | tr -d ' ') % 1000000))}
ATTACH_RE=${ATTACH_RE:-msg=attached}
if [ -n "${DRY:-}" ]; then ATTACH_RE='msg=attached|training process found'; fi
CYC=$OUT/cyc
mkdir -p "$CYC"
echo "stress.sh: seed $SEED, ${STRESS_SECONDS} s of cycles (>= $MIN_CYCLES cycles, >= $MIN_KILLS kills), shape $SHAPE${DRY:+ (DRY RUN)}"
echo "$SEED" >"$OUT/seed"
if [ -z "${DRY:-}" ] && [ ! -x "$AGENT" ]; then echo "no agent at $AGENT: carry bin/slowrank"; exit 2; fi
env_info "$OUT/env.txt"
[ -n "${SKIP_BUILD:-}" ] || build_lib

declare -A D_T=() D_REC=()  # draining agents: pid -> SIGINT time (us), its cycle record so far
TRAINER=
cleanup() {
  local pid
  for pid in "${!D_T[@]}"; do kill -KILL "$pid" 2>/dev/null || true; done
  if [ -n "${AGENT_PID:-}" ]; then kill -KILL "$AGENT_PID" 2>/dev/null || true; fi
  if [ -n "$TRAINER" ] && kill -0 "$TRAINER" 2>/dev/null; then touch "$OUT/stress.stop"; fi
}
trap cleanup EXIT

phase() { echo "{\"phase\":\"$1\",\"start_ns\":$2,\"end_ns\":$3}" >>"$OUT/phases.jsonl"; }

# 1. the trainer; 20 steps of warm-up, then PRE_S s without an agent
ext_start stress-train 29610 "$LIB" --shape "$SHAPE" --duration "$BUDGET" --stop-file "$OUT/stress.stop"
TRAINER=$EXT_PID
ext_wait_steps stress-train 20 240
echo "trainer up (pid $TRAINER) at t=${SECONDS} s"
t_a=$(mono); sleep "$PRE_S"; t_b=$(mono)
phase pre "$t_a" "$t_b"

# 2. calibration: 3 sequential cycles (attach time, detach time)
stress_t0=$(mono)
calib_attach=() calib_stop=()
spawn() {  # spawn I: one agent of cycle I
  agent_spawn "$CYC/$1.log" --otel off --facts "$CYC/$1-facts.jsonl" --verdicts "$CYC/$1-verdicts.jsonl" \
    --status-socket "$CYC/$1.sock"
}
for i in 0 1 2; do
  now_us; t0=$NOW
  spawn "c$i"
  until grep -Eq "$ATTACH_RE" "$CYC/c$i.log" 2>/dev/null; do
    now_us
    if ((NOW - t0 > 10000000)); then echo "calibration $i: no '$ATTACH_RE' in the agent log after 10 s"; break; fi
    if ! kill -0 "$AGENT_PID" 2>/dev/null; then echo "calibration $i: the agent exited:"; tail -n 5 "$CYC/c$i.log"; break; fi
    sleep 0.02
  done
  now_us; calib_attach+=($(((NOW - t0) / 1000)))
  sleep 1
  now_us; sig=$NOW
  agent_stop "$AGENT_PID" "$STOP_TIMEOUT"
  calib_stop+=("$AGENT_STOP_MS")
  printf '{"i":"c%d","calib":true,"action":"int","run_s":%s,"t0_us":%d,"sig_us":%d,"exit_us":%d,"rc":%d,"forced":0,"draining":0}\n' \
    "$i" "$(((sig - t0) / 1000)).0e-3" "$t0" "$sig" "$((sig + AGENT_STOP_MS * 1000))" "$AGENT_RC" >>"$OUT/cycles.jsonl"
done
AGENT_PID=
stop_med=$(printf '%s\n' "${calib_stop[@]}" | sort -n | sed -n 2p)
echo "calibration: attach ms ${calib_attach[*]}, SIGINT-to-exit ms ${calib_stop[*]}"
if [ -z "${MAX_DRAINING:-}" ]; then
  # one SIGINT'd agent may start every 0.5 s: enough slots for its detach time
  MAX_DRAINING=$(((stop_med + 499) / 500))
  ((MAX_DRAINING >= 4)) || MAX_DRAINING=4
  ((MAX_DRAINING <= 16)) || MAX_DRAINING=16
fi
"$PYA" bench/gpu/analyze.py stress-plan "$SEED" "$STRESS_SECONDS" "$(awk "BEGIN{print $stop_med/1000}")" \
  "$MAX_DRAINING" "$MIN_CYCLES" "$MIN_KILLS" >"$OUT/plan.json"
"$PYA" - "$OUT/plan.json" >"$OUT/plan.tsv" <<'PY'
import json, sys
p = json.load(open(sys.argv[1]))
for c in p["plan"]:
    print(c["i"], c["action"], c["run_s"])
print(json.dumps({k: v for k, v in p.items() if k != "plan"}), file=sys.stderr)
PY
echo "plan: max $MAX_DRAINING agents detaching at once"

# 3. the cycles
record_reaped() {  # record_reaped PID RC
  now_us
  printf '%s,"exit_us":%d,"rc":%d}\n' "${D_REC[$1]}" "$NOW" "$2" >>"$OUT/cycles.jsonl"
  unset "D_T[$1]" "D_REC[$1]"
}
reap() {
  local pid rc
  for pid in "${!D_T[@]}"; do
    if ! kill -0 "$pid" 2>/dev/null; then
      rc=0; wait "$pid" 2>/dev/null || rc=$?
      record_reaped "$pid" "$rc"
    else
      now_us
      if ((NOW - D_T[$pid] > STOP_TIMEOUT * 1000000)) && [[ ${D_REC[$pid]} != *'"forced":1'* ]]; then
        echo "agent $pid still running ${STOP_TIMEOUT} s after SIGINT: SIGKILL"
        kill -KILL "$pid" 2>/dev/null || true
        D_REC[$pid]=${D_REC[$pid]/\"forced\":0/\"forced\":1}
      fi
    fi
  done
}
loop_end=$((SECONDS + STRESS_SECONDS))
hard_end=$((BUDGET - POST_S - 60))  # room for the drain, the post phase, analysis and packing
((loop_end <= hard_end)) || loop_end=$hard_end
done_n=0 end_reason=plan
while read -r i action run; do
  if ((SECONDS >= loop_end)); then end_reason=time; break; fi
  reap
  while ((${#D_T[@]} >= MAX_DRAINING)); do sleep 0.05; reap; done
  if ! kill -0 "$TRAINER" 2>/dev/null; then end_reason=trainer_exited; echo "the trainer exited during the stress"; break; fi
  draining=${#D_T[@]}
  now_us; t0=$NOW
  spawn "$i"
  pid=$AGENT_PID
  sleep "$run"
  now_us; sig=$NOW
  rec=$(printf '{"i":%d,"action":"%s","run_s":%s,"t0_us":%d,"sig_us":%d,"draining":%d,"forced":0' "$i" "$action" "$run" "$t0" "$sig" "$draining")
  if [ "$action" = kill ]; then signame=KILL; else signame=INT; fi
  kill "-$signame" "$pid" 2>/dev/null || true
  D_T[$pid]=$sig D_REC[$pid]=$rec
  done_n=$((done_n + 1))
  if ((done_n % 50 == 0)); then echo "t=${SECONDS} s: $done_n cycles, ${#D_T[@]} agents detaching"; fi
done <"$OUT/plan.tsv"
AGENT_PID=
echo "cycles done: $done_n (+3 calibration), end: $end_reason, at t=${SECONDS} s; waiting for ${#D_T[@]} detaching agents"
while ((${#D_T[@]} > 0)); do reap; sleep 0.1; done
t_c=$(mono)
phase stress "$stress_t0" "$t_c"

# 4. POST_S s without an agent, then stop the trainer
sleep 2
t_d=$(mono); sleep "$POST_S"; t_e=$(mono)
phase post "$t_d" "$t_e"
touch "$OUT/stress.stop"
ext_finish "$TRAINER" 90
TRAINER=
echo "trainer rc $EXT_RC at t=${SECONDS} s"
SEED=$SEED STRESS_SECONDS=$STRESS_SECONDS EXT_RC=$EXT_RC DONE_N=$done_n END_REASON=$end_reason MAX_DRAINING=$MAX_DRAINING \
  CALIB_ATTACH="${calib_attach[*]}" CALIB_STOP="${calib_stop[*]}" "$PYA" - "$OUT" <<'PY'
import json, os, sys
d = sys.argv[1]
plan = {k: v for k, v in json.load(open(os.path.join(d, "plan.json"))).items() if k != "plan"}
e = os.environ
json.dump({"seed": int(e["SEED"]), "stress_seconds": int(e["STRESS_SECONDS"]), "trainer_rc": int(e["EXT_RC"]),
           "cycles_done_after_calibration": int(e["DONE_N"]), "loop_end": e["END_REASON"],
           "max_draining": int(e["MAX_DRAINING"]), "plan": plan,
           "calibration": {"attach_ms": [int(x) for x in e["CALIB_ATTACH"].split()],
                           "sigint_to_exit_ms": [int(x) for x in e["CALIB_STOP"].split()]}},
          open(os.path.join(d, "stress-meta.json"), "w"), indent=1)
PY

# 5. analysis and packing
"$PYA" bench/gpu/analyze.py stress "$OUT" >"$RESULTS/stress.json" || echo "analyze.py stress failed"
tail -n 300 "$OUT/stress-train-train.log" >"$OUT/stress-train-train.tail.log" || true
(cd "$OUT" && tar czf "$RESULTS/stress-raw.tgz" --exclude='*.sock' --exclude='*-facts.jsonl' --exclude='*-verdicts.jsonl' \
  --exclude='stress-train-train.log' --exclude=console.log --exclude=otelcol-mini .)
"$PYA" - "$RESULTS/stress.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
rows = [("seed", r["seed"]), ("cycles (incl. 3 calibration)", r["cycles"]), ("SIGINT cycles / clean detaches", f'{r["cycles_int"]} / {r["detaches"]}'),
        ("kills", r["kills"]), ("cycles that attached", r["attaches"]), ("SIGINT forced to SIGKILL", r["int_forced_kill"]),
        ("agent panics / ERROR lines", f'{r["agent_panics"]} / {r["agent_error_lines"]}'), ("SIGINT-to-exit ms (driver, upper bound)", r["stop_ms"]),
        ("detach ms (agent log: stopping -> last line)", r["detach_ms_from_log"]),
        ("most agents detaching at once", r["max_draining_seen"]),
        ("trainer rc / fatal patterns", f'{r["trainer_rc"]} / {r["trainer_fatal_patterns"] or "none"}'),
        ("trainer steps / loss finite", f'{r["trainer_steps"]} / {r["loss_finite"]}'),
        ("step ms pre / stress / post", r["step_ms_median"]), ("post / pre", r["post_over_pre"]),
        ("survived; meets issue (>= 500 cycles, >= 50 kills)", f'{r["trainer_survived"]}; {r["meets_issue"]}')]
for k, v in rows:
    print(f"{k:52s} {v}")
print("agent problems:", json.dumps(r["agent_problems"])[:1500])
PY
cp "$OUT/console.log" "$RESULTS/stress-console.log"
ls -l "$RESULTS"
