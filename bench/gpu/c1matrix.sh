#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# Issue 15 ("do no harm"), part 3: C1 overhead as users run the agent, one
# shape per call: OTLP export on, to a real OpenTelemetry Collector on the
# same machine (bin/otelcol-mini: OTLP receiver, debug exporter at basic
# verbosity), agent settings otherwise default.
#
# Protocol (fixed before the run; written to c1-SHAPE-design.json):
#   one training process, ext_train.py --shape SHAPE (transformers GPT-2,
#   DDP/NCCL world size 1, injection library loaded). ABBA over PAIRS pairs
#   (pair i even: OFF, ON; odd: ON, OFF), blocks of BLOCK s after SETTLE s.
#   ON  = the agent attached: started at the beginning of the block's SETTLE,
#         exporting OTLP/HTTP to 127.0.0.1:4318 through the standard variable
#         OTEL_EXPORTER_OTLP_ENDPOINT (its --otel auto default turns export on).
#   OFF = no agent (stopped with SIGINT and exited; the library loaded, idle).
#   delta_i = mean(step_ms ON_i) / mean(step_ms OFF_i) - 1 over the steps
#   inside the block; bootstrap 95 % CI over pairs (seeded, 20000 resamples).
#   Noise: A/A deltas of consecutive OFF blocks (same orientation rule as the
#   pairs) and AA_PAIRS extra OFF/OFF pairs (default 0).
# Steady state: the agent keeps its duty-cycle cost estimate in memory only
# (agent/duty.go), so a freshly started agent runs on the prior (3 % ->
# on-share 10 %) until it has 20 steps with and 20 without device records
# per rank, which takes 20-100 s depending on the step time. A warm-up agent
# therefore runs first, continuously, for at least WARM_MIN s (>= 60 s) and
# until its estimate is measured (at most WARM_MAX s); with ON_SHARE=warm
# (default) every ON agent is then pinned at start to the warm-up's final
# on-share (`slowrank control set --duty-share`; escalations stay on), i.e.
# the steady state of a long-running agent. ON_SHARE=default: fresh agents on
# their own estimate; ON_SHARE=<x>: pinned to x.
#
# The budget split (issue 15 item 3): ARMS="off uprobes full on" runs rounds
# of those arms in the order of a Williams square (balanced for the arm
# before; round i takes row i mod its rows), each arm's delta against the
# round's OFF block:
#   uprobes  the agent with --device-collection=false (host uprobes only; the
#            library never collects: its default is off)
#   full     the agent with its on-share pinned to 1 (device records always)
#   on       as above (defaults; per ON_SHARE)
# The JSON's "arms" gives each arm's deltas, mean and CI, and the agent's own
# cost estimate at the end of each block ("on_status").
#   SHAPE=dense ARMS="off uprobes full on" BLOCK=10 SETTLE=4 WARM_MIN=45 bash bench/gpu/c1matrix.sh
# Device calls (one per shape, each <= 9.5 min; carry ["bin/slowrank","bin/otelcol-mini.xz"]):
#   SHAPE=dense  bash bench/gpu/c1matrix.sh     (~9 min)
#   SHAPE=gpu    bash bench/gpu/c1matrix.sh     (~9 min)
#   SHAPE=launch bash bench/gpu/c1matrix.sh     (~9 min)
# Knobs: PAIRS (8), BLOCK/SETTLE (per shape below), WARM_MIN/WARM_MAX,
# AA_PAIRS (0), ARMS ("off on": ABBA), ON_SHARE (warm), OTLP (1; 0: --otel off), BUDGET (565 s: pairs
# that would not fit are not started and the JSON says how many ran),
# SKIP_BUILD=1.
# The collector: build it on the development machine, then compress it so
# that it and bin/slowrank fit the 64 MiB a call may carry (26 MB -> 6.7 MB):
#   (cd bench/otelcol-mini && CGO_ENABLED=0 go build -trimpath -ldflags='-s -w' -o ../../bin/otelcol-mini .)
#   xz -9 -k -f bin/otelcol-mini          # carry bin/otelcol-mini.xz
# (bin/otelcol-mini itself works too when the carry has room.)
# The GPU's SM clock is sampled every 200 ms through the run (gpu_sampler_start
# in dnh_common.sh; the same in every block): the JSON's "gpu_clock" gives the
# clock per block and the pairs adjusted for it (ANCOVA on the pair
# differences, analyze.py clock_adjusted), so that the job's own drift with
# the GPU's clock does not swamp a 0.3 % effect.
# What comes back in $OUT (3 files): c1-SHAPE.json (analyze.py c1m: pairs,
# deltas, mean, CI, noise, steps per block, warm-up, OTLP counts, GPU clock),
# c1-SHAPE-raw.tgz (steps, blocks, agent logs, collector log tail, training
# log tail), c1-SHAPE-console.log.
# DRY=1 [DRY_AGENT=1] SHAPE=dense PAIRS=2 BLOCK=3 SETTLE=1 WARM_MIN=4 WARM_MAX=6 bash bench/gpu/c1matrix.sh
set -euo pipefail
SHAPE=${SHAPE:-dense}
case $SHAPE in
  dense)  : "${BLOCK:=14}" "${SETTLE:=5}" "${WARM_MIN:=60}" "${WARM_MAX:=100}" ;;
  launch) : "${BLOCK:=14}" "${SETTLE:=5}" "${WARM_MIN:=60}" "${WARM_MAX:=100}" ;;
  gpu)    : "${BLOCK:=12}" "${SETTLE:=4}" "${WARM_MIN:=60}" "${WARM_MAX:=130}" ;;
  *) echo "SHAPE must be dense, gpu or launch"; exit 2 ;;
esac
NAME=c1-$SHAPE
# shellcheck source=dnh_begin.sh
source "$(dirname "$0")/dnh_begin.sh" c1matrix "$NAME"

PAIRS=${PAIRS:-8}
AA_PAIRS=${AA_PAIRS:-0}
ON_SHARE=${ON_SHARE:-warm}
ARMS=${ARMS:-off on}
for a in $ARMS; do
  case $a in off | on | uprobes | full) ;; *) echo "ARMS: unknown arm $a (off, on, uprobes, full)"; exit 2 ;; esac
done
[[ " $ARMS " == *" off "* ]] || { echo "ARMS must include off (every delta is against it)"; exit 2; }
OTLP=${OTLP:-1}
BUDGET=${BUDGET:-565}
RESERVE=${RESERVE:-35}  # trainer stop, analysis, packing
if [ -z "${DRY:-}" ] && [ ! -x "$AGENT" ]; then echo "no agent at $AGENT: carry bin/slowrank"; exit 2; fi
echo "c1matrix.sh: shape $SHAPE, $PAIRS ABBA pairs (+$AA_PAIRS A/A) of ${BLOCK} s after ${SETTLE} s, warm-up ${WARM_MIN}-${WARM_MAX} s, ON share $ON_SHARE, OTLP $OTLP${DRY:+ (DRY RUN)}"
env_info "$OUT/env.txt"
[ -n "${SKIP_BUILD:-}" ] || build_lib
AGENT_PID= EXT_PID= COL_PID=
trap '[ -z "$AGENT_PID" ] || kill -KILL "$AGENT_PID" 2>/dev/null || true; [ -z "$EXT_PID" ] || kill -KILL "$EXT_PID" 2>/dev/null || true; collector_stop; gpu_sampler_stop' EXIT

OTEL_FLAGS=(--otel off)
if [ "$OTLP" = 1 ]; then
  collector_start
  OTEL_FLAGS=()  # the default --otel auto: on, because of the variable below
fi
cat >"$OUT/$NAME-design.json" <<JSON
{"shape":"$SHAPE","arms":"$ARMS","order":"$( [ "$ARMS" = "off on" ] && echo 'ABBA (pair i even: off,on; odd: on,off)' || echo 'Williams square of the arms, row i mod rows for round i')","pairs":$PAIRS,"aa_pairs":$AA_PAIRS,"block_s":$BLOCK,"settle_s":$SETTLE,
 "warm_min_s":$WARM_MIN,"warm_max_s":$WARM_MAX,"on_share":"$ON_SHARE","otlp":$([ "$OTLP" = 1 ] && echo '"OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4318 (http/protobuf) to otelcol-mini, debug exporter basic"' || echo '"off"'),
 "model":"ext_train.py --shape $SHAPE (transformers GPT2LMHeadModel, bf16 autocast, AdamW, DDP world size 1 over NCCL), one process",
 "on":"slowrank agent attached (default settings; on-share per on_share)","off":"no agent (library loaded, idle)",
 "metric":"delta_i = mean(step_ms ON_i)/mean(step_ms OFF_i) - 1 over steps fully inside the block",
 "analysis":"bootstrap 95% CI of the mean delta over pairs, 20000 resamples, seed 1"}
JSON

ext_start "$NAME" 29630 "$LIB" --shape "$SHAPE" --duration "$BUDGET" --stop-file "$OUT/$NAME.stop"
ext_wait_steps "$NAME" 20 240
echo "trainer up at t=${SECONDS} s: $(tail -n 1 "$OUT/$NAME/rank0.jsonl" | cut -c1-120)"
gpu_sampler_start "$OUT/$NAME-gpu.jsonl"
if [ "$OTLP" = 1 ]; then export OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4318; fi

# status_json SOCKET: duty share, cost estimate, uptime of a running agent (one line of JSON).
status_json() {
  local raw
  raw=$("$AGENT" status --socket "$1" --json 2>/dev/null) || raw='{}'
  "$PYA" -c 'import json, sys
try:
    s = json.load(sys.stdin)
except Exception:
    print("{}"); sys.exit()
print(json.dumps({"uptime_s": round(s.get("uptime_ns", 0) / 1e9, 1), "share": s.get("duty_share"), "cost": s.get("duty_cost_estimate"),
                  "state": s.get("device_collection"), "processes": s.get("processes")}))' <<<"$raw" || echo '{}'
}

# 1. warm-up agent: >= WARM_MIN s and until its cost estimate is measured (<= WARM_MAX s)
t0=$SECONDS
agent_spawn "$OUT/$NAME-warm-agent.log" "${OTEL_FLAGS[@]}" --facts "$OUT/$NAME-warm-facts.jsonl" --status-socket "$OUT/$NAME-warm.sock"
: >"$OUT/$NAME-warm-status.jsonl"
while ((SECONDS - t0 < WARM_MAX)); do
  sleep 5
  st=$(status_json "$OUT/$NAME-warm.sock")
  echo "$st" >>"$OUT/$NAME-warm-status.jsonl"
  measured=$(echo "$st" | "$PYA" -c 'import json, sys; s = json.load(sys.stdin); c = s.get("cost"); print(1 if c not in (None, 0, 0.03) else 0)')
  if ((SECONDS - t0 >= WARM_MIN)) && [ "$measured" = 1 ]; then break; fi
done
agent_stop "$AGENT_PID" 30
AGENT_PID=
echo "warm-up agent: $((SECONDS - t0)) s, stopped in ${AGENT_STOP_MS} ms; $(grep 'msg=overhead' "$OUT/$NAME-warm-agent.log" | sed 's/^time=[^ ]* //' | tail -1)"
WARM_S=$((SECONDS - t0)) STOP_MS=$AGENT_STOP_MS "$PYA" - "$OUT/$NAME-warm-agent.log" "$OUT/$NAME-warm.json" <<'PY'
import json, os, re, sys
log, out = sys.argv[1], sys.argv[2]
m = None
for line in open(log, errors="replace"):
    # the agent's periodic "overhead" line: ... cost=C cost_ci=... pairs=N measured=B share=S ...
    m = re.search(r'msg=overhead .*\bcost=([0-9.]+) .*\bpairs=(\d+) measured=(\w+) share=([0-9.]+)', line) or m
res = {"seconds": int(os.environ["WARM_S"]), "stop_ms": int(os.environ["STOP_MS"])}
if m:
    res.update(cost=float(m.group(1)), pairs=int(m.group(2)), measured=m.group(3) == "true", share=float(m.group(4)))
else:
    res["error"] = "no overhead line in the warm-up agent's log: ON agents run on their own estimate"
    print("c1matrix.sh: " + res["error"], file=sys.stderr)
json.dump(res, open(out, "w"))
print(json.dumps(res))
PY
case $ON_SHARE in
  warm) PIN=$("$PYA" -c 'import json, sys; print(json.load(open(sys.argv[1])).get("share") or "")' "$OUT/$NAME-warm.json") ;;
  default) PIN= ;;
  *) PIN=$ON_SHARE ;;
esac
echo "ON agents: on-share ${PIN:-their own estimate}"
stop_ms=${AGENT_STOP_MS:-6000}

# 2. ABBA pairs (then A/A pairs)
n_arms=$(wc -w <<<"$ARMS")
pair_est=$((n_arms * (BLOCK + SETTLE) + (n_arms - 1) * (stop_ms / 1000 + 3)))
: >"$OUT/$NAME-blocks.jsonl"
block() {  # block PAIR ARM
  local p=$1 arm=$2 s e tag=p$1 extra=() pin=
  case $arm in
    on) pin=$PIN ;;
    full) pin=1 tag=p$1-full ;;
    uprobes) extra=(--device-collection=false) tag=p$1-uprobes ;;
  esac
  case $arm in on | full | uprobes)
    agent_spawn "$OUT/$NAME-$tag-agent.log" "${OTEL_FLAGS[@]}" "${extra[@]}" --facts "$OUT/$NAME-$tag-facts.jsonl" \
      --verdicts "$OUT/$NAME-$tag-verdicts.jsonl" --status-socket "$OUT/$NAME-$tag.sock"
    if [ -n "$pin" ]; then agent_pin_share "$OUT/$NAME-$tag.sock" "$pin" "$OUT/$NAME-$tag-control.log" "pair $p $arm" || true; fi
    ;;
  esac
  sleep "$SETTLE"
  s=$(mono); sleep "$BLOCK"; e=$(mono)
  echo "{\"pair\":$p,\"arm\":\"$arm\",\"start_ns\":$s,\"end_ns\":$e}" >>"$OUT/$NAME-blocks.jsonl"
  if [ -n "$AGENT_PID" ]; then
    st=$(status_json "$OUT/$NAME-$tag.sock")
    echo "{\"pair\":$p,\"arm\":\"$arm\",\"status\":$st}" >>"$OUT/$NAME-on-status.jsonl"
    agent_stop "$AGENT_PID" 30
    AGENT_PID=
  fi
}
# round_order P: the arms of round P (ABBA for two arms, else a Williams square row).
round_order() {
  "$PYA" - "$1" $ARMS <<'PY'
import sys
p, arms = int(sys.argv[1]), sys.argv[2:]
k = len(arms)
if k == 2:
    print(" ".join(arms if p % 2 == 0 else arms[::-1])); sys.exit()
def row(r):  # Williams: r, r+1, r-1, r+2, r-2, ... (mod k)
    seq, j = [r], 1
    while len(seq) < k:
        seq.append((r + j) % k)
        if len(seq) < k:
            seq.append((r - j) % k)
        j += 1
    return seq
rows = [row(r) for r in range(k)]
if k % 2:
    rows += [r[::-1] for r in rows]
print(" ".join(arms[i] for i in rows[p % len(rows)]))
PY
}
done_pairs=0
for ((p = 0; p < PAIRS; p++)); do
  if ((SECONDS + pair_est + RESERVE > BUDGET)); then echo "pair $p: no time left (t=${SECONDS} s, a pair takes ~${pair_est} s): stopping after $p pairs"; break; fi
  for arm in $(round_order "$p"); do block "$p" "$arm"; done
  done_pairs=$((p + 1))
  echo "pair $p done at t=${SECONDS} s"
done
for ((q = 0; q < AA_PAIRS; q++)); do
  if ((SECONDS + 2 * (BLOCK + SETTLE) + RESERVE > BUDGET)); then echo "A/A pair $q: no time left"; break; fi
  p=$((PAIRS + q))
  if ((q % 2 == 0)); then arms="a1 a2"; else arms="a2 a1"; fi
  for arm in $arms; do block "$p" "$arm"; done
done

# 3. stop, count what the collector got, analyse
touch "$OUT/$NAME.stop"
ext_finish "$EXT_PID" 60
EXT_PID=
echo "trainer rc $EXT_RC at t=${SECONDS} s"
collector_stop
gpu_sampler_stop
"$PYA" - "$OUT" "$NAME" "$EXT_RC" "$done_pairs" <<'PY'
import json, os, re, sys
d, name, rc, pairs = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
res = {"trainer_rc": rc, "pairs_run": pairs, "collector_log": os.path.exists(os.path.join(d, "otelcol.log"))}
spans = points = tl = ml = errs = 0
if res["collector_log"]:
    for line in open(os.path.join(d, "otelcol.log"), errors="replace"):
        m = re.search(r'"spans": (\d+)', line)
        if m:
            tl += 1; spans += int(m.group(1))
        m = re.search(r'"data points": (\d+)', line)
        if m:
            ml += 1; points += int(m.group(1))
        if "\terror\t" in line or "\twarn\t" in line:
            errs += 1
res.update(trace_batches=tl, spans=spans, metric_batches=ml, data_points=points, collector_warn_error_lines=errs)
json.dump(res, open(os.path.join(d, name + "-otlp.json"), "w"))
PY
"$PYA" bench/gpu/analyze.py c1m "$OUT" "$NAME" >"$RESULTS/$NAME.json" || echo "analyze.py c1m failed"
tail -n 200 "$OUT/otelcol.log" >"$OUT/otelcol.tail.log" 2>/dev/null || true
tail -n 200 "$OUT/$NAME-train.log" >"$OUT/$NAME-train.tail.log" 2>/dev/null || true
(cd "$OUT" && tar czf "$RESULTS/$NAME-raw.tgz" --exclude='*.sock' --exclude=console.log --exclude=otelcol-mini \
  --exclude=otelcol.log --exclude="$NAME-train.log" .) || true
"$PYA" - "$RESULTS/$NAME.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
n, x = r["noise_off_blocks"], r.get("noise_extra_aa")
print(f'shape {r["shape"]}: {r["pairs"]} pairs, mean delta {r["mean_pct"]} %, 95 % CI {r["ci95_pct"]} (bar 0.5 %: below {r["below_bar"]})')
print(f'  deltas % {r["deltas_pct"]}')
print(f'  A/A from OFF blocks: {n["pairs"]} pairs, mean {n["mean_pct"]} %, CI {n["ci95_pct"]}, sd {n["sd_pct"]} %'
      + (f'; extra A/A: mean {x["mean_pct"]} %, CI {x["ci95_pct"]}' if x else ''))
print(f'  OFF step {r["off_step_ms_mean"]} ms, OFF block CV {r["off_block_cv_pct"]} %, steps per block {r["steps_per_block"]}')
print(f'  warm-up {r.get("warm")}; OTLP {r.get("otlp")}')
print(f'  agent counters (sum over ON blocks) {r["agent_counters_sum"]}; problems {r["agent_problems"]}')
for arm, a in (r.get("arms") or {}).items():
    if len(r["arms"]) > 1:
        print(f'  arm {arm:8s}: {a["pairs"]} rounds, mean {a["mean_pct"]} %, 95 % CI {a["ci95_pct"]}, deltas % {a["deltas_pct"]}')
g = r.get("gpu_clock")
if g:
    print(f'  GPU SM clock {g["sm_mhz_range"]} MHz over {g["samples"]} samples; OFF blocks ln(step) ~ ln(clock): {g.get("off_blocks_fit")}')
    for arm, a in g["arms"].items():
        print(f'  clock-adjusted {arm}: {a["pairs"]} pairs, effect {a["effect_pct"]} %, 95 % CI {a["ci95_pct"]}, slope {a["slope"]}, r2 {a["r2"]}')
    if g.get("aa_off_blocks"):
        a = g["aa_off_blocks"]
        print(f'  clock-adjusted A/A: {a["pairs"]} pairs, effect {a["effect_pct"]} %, 95 % CI {a["ci95_pct"]}')
PY
cp "$OUT/console.log" "$RESULTS/$NAME-console.log"
ls -l "$RESULTS"
