#!/usr/bin/env bash
# bench/agent-cpu/compare.sh - two agent builds side by side at the same load (root).
#
# Runs bench/agent-cpu/run.sh alternately with agent A and agent B in ABBA
# order for PAIRS pairs, so that drift and background load hit both alike,
# and prints each pair's CPU per event and the ratio B/A with a bootstrap
# 95 % confidence interval over pairs.
#
#   A=/tmp/slowrank-old B=bin/slowrank PAIRS=4 MEASURE=20 bench/agent-cpu/compare.sh
#
# Output: raw runs (JSON lines) and the summary (JSON) in $OUT_DIR (default
# a temporary directory, printed).
set -euo pipefail
cd "$(dirname "$0")/../.."
: "${A:?agent binary A}" "${B:?agent binary B}"
PAIRS=${PAIRS:-4}
OUT_DIR=${OUT_DIR:-$(mktemp -d /tmp/slowrank-cmp-XXXXXX)}
mkdir -p "$OUT_DIR"
raw=$OUT_DIR/runs.jsonl
: >"$raw"
one() { # arm pair binary
  AGENT=$3 OUT=$OUT_DIR/run.json bash bench/agent-cpu/run.sh >/dev/null 2>"$OUT_DIR/run.err" ||
    { cat "$OUT_DIR/run.err" >&2; exit 1; }
  jq -c --arg arm "$1" --argjson pair "$2" --arg load "$(cut -d' ' -f1 /proc/loadavg)" \
    '{arm: $arm, pair: $pair, load1: ($load|tonumber), events_per_s, agent_cpu_percent_of_one_core, agent_cpu_ns_per_event, lost}' \
    "$OUT_DIR/run.json" | tee -a "$raw"
}
for p in $(seq 1 "$PAIRS"); do
  if [ $((p % 2)) = 1 ]; then one A "$p" "$A"; one B "$p" "$B"; else one B "$p" "$B"; one A "$p" "$A"; fi
done
python3 - "$raw" "$A" "$B" <<'PY' | tee "$OUT_DIR/summary.json"
import json, random, sys
runs = [json.loads(l) for l in open(sys.argv[1])]
pairs = sorted({r["pair"] for r in runs})
get = lambda arm, p, k: next(r[k] for r in runs if r["arm"] == arm and r["pair"] == p)
ratios = [get("B", p, "agent_cpu_ns_per_event") / get("A", p, "agent_cpu_ns_per_event") for p in pairs]
rng = random.Random(1)
boots = sorted(sum(rng.choice(ratios) for _ in ratios) / len(ratios) for _ in range(10000))
mean = lambda arm, k: sum(get(arm, p, k) for p in pairs) / len(pairs)
print(json.dumps({
    "name": "agent-cpu-compare", "a": sys.argv[2], "b": sys.argv[3], "pairs": len(pairs), "order": "ABBA",
    "a_ns_per_event": round(mean("A", "agent_cpu_ns_per_event")), "b_ns_per_event": round(mean("B", "agent_cpu_ns_per_event")),
    "a_cpu_percent": round(mean("A", "agent_cpu_percent_of_one_core"), 2), "b_cpu_percent": round(mean("B", "agent_cpu_percent_of_one_core"), 2),
    "ratio_b_over_a": round(sum(ratios) / len(ratios), 3),
    "ratio_ci95": [round(boots[249], 3), round(boots[9749], 3)],
    "per_pair_ratio": [round(r, 3) for r in ratios],
}, indent=1))
PY
echo "raw runs and summary in $OUT_DIR" >&2
