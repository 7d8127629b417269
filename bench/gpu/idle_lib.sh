#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# Issue 15 ("do no harm"), part 4: the idle injection library (loaded through
# CUDA_INJECTION64_PATH, no agent) vs no library at all.
#
# The library is loaded at cuInit, so the two arms are two processes. Short
# separate runs (cupti_validate.sh part 2) pay start-up and warm-up per run
# (~25 s of a 30 s run) and compare processes started at different times.
# Here four processes are started once and take turns on the GPU instead:
# L0, L1 with the library and N0, N1 without, all ext_train.py --shape
# SHAPE (dense) with --gate FILE: a process steps only while its gate file
# exists (a stat per step and a 5 ms sleep while closed, the same in both
# arms), so exactly one trains at a time and blocks can be as short as in the
# in-process C1 protocol. Protocol (written to idle-design.json):
#   after WARMUP_STEPS (30) ungated steps of every process, PAIRS (8) ABBA
#   pairs of blocks (BLOCK s after SETTLE s with the gate open): pair p pits
#   L(p mod 2) against N(p div 2 mod 2), lib first when p is even, so every
#   lib/bare combination occurs twice in both orders;
#   delta_p = mean(step_ms lib) / mean(step_ms bare) - 1, bootstrap 95 % CI
#   over pairs (seeded);
#   then AA_PAIRS (4) A/A pairs of two processes of the same arm (N0 vs N1,
#   then L0 vs L1, both orders): the process-to-process noise that the
#   lib/bare deltas carry.
#
# Device call (one, ~7.5 min; carry ["bin/slowrank"] (the agent is not used;
# nothing else is needed)):
#   bash bench/gpu/idle_lib.sh
# Knobs: SHAPE (dense), PAIRS (8), AA_PAIRS (4), BLOCK (12), SETTLE (3),
# WARMUP_STEPS (30), BUDGET (565), SKIP_BUILD=1.
# What comes back in $OUT (3 files): idle.json (analyze.py idle),
# idle-raw.tgz (steps of the four processes, blocks, log tails),
# idle-console.log.
# DRY=1 PAIRS=2 AA_PAIRS=2 BLOCK=2 SETTLE=1 bash bench/gpu/idle_lib.sh   (CPU dry run: no library)
set -euo pipefail
# shellcheck source=dnh_begin.sh
source "$(dirname "$0")/dnh_begin.sh" idle "idle"

SHAPE=${SHAPE:-dense}
PAIRS=${PAIRS:-8}
AA_PAIRS=${AA_PAIRS:-4}
BLOCK=${BLOCK:-12}
SETTLE=${SETTLE:-3}
WARMUP_STEPS=${WARMUP_STEPS:-30}
BUDGET=${BUDGET:-565}
RESERVE=${RESERVE:-30}
echo "idle_lib.sh: shape $SHAPE, $PAIRS lib/bare pairs + $AA_PAIRS A/A pairs of ${BLOCK} s after ${SETTLE} s, 4 processes taking turns${DRY:+ (DRY RUN)}"
env_info "$OUT/env.txt"
[ -n "${SKIP_BUILD:-}" ] || build_lib
cat >"$OUT/idle-design.json" <<JSON
{"shape":"$SHAPE","processes":{"L0":"library loaded, no agent","L1":"library loaded, no agent","N0":"no library","N1":"no library"},
 "gate":"one process steps at a time (its gate file exists); the others sleep 5 ms between gate checks",
 "pairs":$PAIRS,"aa_pairs":$AA_PAIRS,"block_s":$BLOCK,"settle_s":$SETTLE,"warmup_steps":$WARMUP_STEPS,
 "order":"pair p: L(p%2) vs N((p//2)%2), lib first when p even; A/A: N0/N1 then L0/L1, alternating order",
 "metric":"delta_p = mean(step_ms lib)/mean(step_ms bare) - 1 over steps fully inside the block",
 "analysis":"bootstrap 95% CI of the mean delta over pairs, 20000 resamples, seed 1"}
JSON

declare -A PID=()
trap 'for p in "${PID[@]}"; do kill -KILL "$p" 2>/dev/null || true; done' EXIT
port=29640
for proc in L0 L1 N0 N1; do
  lib=
  [ "${proc:0:1}" = N ] || lib=$LIB
  ext_start "$proc" "$port" "$lib" --shape "$SHAPE" --duration "$BUDGET" --gate "$OUT/gate-$proc" \
    --warmup-steps "$WARMUP_STEPS" --stop-file "$OUT/idle.stop" --print-every 500
  PID[$proc]=$EXT_PID
  port=$((port + 1))
done
for proc in L0 L1 N0 N1; do
  EXT_PID=${PID[$proc]}
  ext_wait_steps "$proc" "$WARMUP_STEPS" 300
done
echo "4 processes warmed up at t=${SECONDS} s"
sleep 2

: >"$OUT/idle-blocks.jsonl"
block() {  # block KIND PAIR ARM PROC
  local s e
  touch "$OUT/gate-$4"
  sleep "$SETTLE"
  s=$(mono); sleep "$BLOCK"; e=$(mono)
  rm -f "$OUT/gate-$4"
  echo "{\"kind\":\"$1\",\"pair\":$2,\"arm\":\"$3\",\"proc\":\"$4\",\"start_ns\":$s,\"end_ns\":$e}" >>"$OUT/idle-blocks.jsonl"
}
pair_s=$((2 * (BLOCK + SETTLE) + 1))
for ((p = 0; p < PAIRS; p++)); do
  if ((SECONDS + pair_s + RESERVE > BUDGET)); then echo "pair $p: no time left at t=${SECONDS} s"; break; fi
  L=L$((p % 2)) N=N$(((p / 2) % 2))
  if ((p % 2 == 0)); then block ab "$p" lib "$L"; block ab "$p" bare "$N"; else block ab "$p" bare "$N"; block ab "$p" lib "$L"; fi
  echo "pair $p ($L vs $N) done at t=${SECONDS} s"
done
for ((q = 0; q < AA_PAIRS; q++)); do
  if ((SECONDS + pair_s + RESERVE > BUDGET)); then echo "A/A pair $q: no time left at t=${SECONDS} s"; break; fi
  if (((q / 2) % 2 == 0)); then X=N0 Y=N1; else X=L0 Y=L1; fi
  if ((q % 2 == 0)); then block aa "$q" x "$X"; block aa "$q" y "$Y"; else block aa "$q" y "$Y"; block aa "$q" x "$X"; fi
  echo "A/A pair $q ($X vs $Y) done at t=${SECONDS} s"
done

touch "$OUT/idle.stop"
rcs=()
for proc in L0 L1 N0 N1; do
  ext_finish "${PID[$proc]}" 60
  rcs+=("$proc=$EXT_RC")
  unset "PID[$proc]"
done
echo "trainers: ${rcs[*]} at t=${SECONDS} s"
echo "${rcs[*]}" >"$OUT/idle-rcs.txt"
"$PYA" bench/gpu/analyze.py idle "$OUT" >"$RESULTS/idle.json" || echo "analyze.py idle failed"
for proc in L0 L1 N0 N1; do tail -n 100 "$OUT/$proc-train.log" >"$OUT/$proc-train.tail.log" 2>/dev/null || true; done
(cd "$OUT" && tar czf "$RESULTS/idle-raw.tgz" --exclude=console.log --exclude='*-train.log' .)
"$PYA" - "$RESULTS/idle.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
a, n = r["lib_vs_bare"], r["aa_same_arm_other_process"]
print(f'idle library vs none: {a["pairs"]} pairs, mean {a["mean_pct"]} %, 95 % CI {a["ci95_pct"]}, sd {a["sd_pct"]} %')
print(f'  deltas % {a["deltas_pct"]}')
print(f'A/A (same arm, other process): {n["pairs"]} pairs, mean {n["mean_pct"]} %, CI {n["ci95_pct"]}, deltas {n["deltas_pct"]}')
for b in r["blocks"]:
    print(f'  {b["kind"]} {b["pair"]} {b["arm"]:4s} {b["proc"]} {b["steps"]:5d} steps {b["mean_ms"] and round(b["mean_ms"], 3)} ms')
print("processes:", json.dumps(r["processes"]))
PY
cp "$OUT/console.log" "$RESULTS/idle-console.log"
ls -l "$RESULTS"
