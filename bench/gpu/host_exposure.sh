#!/usr/bin/env bash
# shellcheck source-path=SCRIPTDIR
# Issue 16 item 1 on ONE H200, one call: a host stall that slows the job and
# one that hides, judged by the agent's exposure gate (docs/DESIGN.md
# section 4). 4 ranks share the GPU through torch.distributed gloo (NCCL
# refuses two ranks on one GPU; bench/gpu/multigpu.sh's ddp-host is the same
# check with one rank per GPU). Three runs, in this order:
#   hx-start  rank HOST_RANK sleeps HOST_MS before its forward pass, from
#             INJ_AT s on: its GPU has nothing queued, its peers wait for it
#             in the gloo all-reduce, every step gets longer. Pass: a rank
#             HOST_RANK / host straggler within 3 windows (+ the window the
#             injection falls in) + lateness, no other rank's host alert.
#   hx-end    the same stall after the optimizer step, before the end-of-step
#             device synchronisation: it hides behind the GPU work still
#             queued there, no step gets longer. Pass: no host straggler,
#             and rank HOST_RANK's host deviation shown hidden (ok verdicts
#             with exposure.exposed false; the agent runs with --emit-ok).
#   hx-end-marker  hx-end again, the agent cutting steps at the timer's
#             device synchronisation (--step-marker cudaDeviceSynchronize, as
#             c3c2.sh ran it): the CPU dry run's hx-end lost every step of
#             the stalled rank once its stall began (steps from the gloo
#             collectives' period), and this run tells such a loss from a
#             wrong exposure judgement.
# The passes above are the design; analyze.py judges every run by its truth:
# a run whose job step rose by the host threshold (5 %) or more must end with
# rank HOST_RANK / host straggler in time, one whose step rose less with no
# host straggler (hx-start on one shared GPU: +1 %, so none).
# Each run has its own agent (bin/slowrank agent, default settings plus
# --probe-torch, which gloo jobs need (README: steps from the c10d
# collectives), and --emit-ok, which only adds the ok verdicts to the file;
# --otel off, facts and verdicts to files, its own --status-socket) and the
# injection library (CUDA_INJECTION64_PATH, built here by `make cupti`).
#
# The sizes. gloo's blocking all-reduce copies each gradient bucket to the
# host, so the host waits there for the whole backward; after the last bucket
# only the optimizer step is left queued, which no model size makes long
# against the step (its GPU time and the all-reduce's CPU time both grow
# with the parameters): c3c2.sh's 20 ms stall at that point lengthened every
# step by 22 ms. So every rank also queues TAIL_MS of GPU matmuls after the
# optimizer step (train.py --tail-gpu-ms, timed with the 4 ranks sharing the
# GPU and the same count on every rank), a stand-in for the backward that an
# NCCL job queues behind its host. Defaults: c3c2.sh's model (step ~84 ms,
# host ~16 ms per rank on the H200) + TAIL_MS=40, so the step is ~125 ms and
# the queue at the end-of-step synchronisation ~40 ms; HOST_MS=15 is then
# ~12 % of the step (start: exposed, ~15x the 1 ms floor, ~90 % of the host
# reference) and 25 ms shorter than the queue (end: hidden). The ground truth
# shows both: rank*.jsonl's step_ms (the job's step time) and sync_ms (the
# queue left at the end of the step; the stalled rank's drops by about
# HOST_MS in hx-end).
#
# How to run it (build the agent here first: `make build`):
#   run(kind="nvidia-h200", carry=["bin/slowrank"], timeout_s=600,
#       command="bash bench/gpu/host_exposure.sh")
# bin/slowrank may travel compressed as bin/slowrank.xz (the carry holds 64
# MiB): then `bash bench/gpu/batch.sh hx:570:'bash bench/gpu/host_exposure.sh'`
# unpacks it first (its results come back as hx.tgz plus batch.log).
# Expected wall time ~6 min (estimates, not measured on a GPU: library build
# ~20 s, per run ~30 s start + INJ_AT + INJ_DUR = 65 s of training + ~10 s
# agent stop, three runs); BUDGET_S (default 530 s) skips a run that would
# not fit and says so in plan.jsonl and the summary; each run's trainer is
# killed at its share of the budget, so a hung job cannot take the call.
#
# What comes back in $OUT (3 files):
#   gpu-host-exposure.json   analyze.py host-exposure: per run the truth's step
#                            time before/after, the stalled rank's idle,
#                            coll_wait, host, sync_wait against its peers', the
#                            verdicts after the injection (rank, phase, the
#                            exposure object and reason), pass/fail
#   host-exposure-raw.tgz    facts, verdicts, agent logs, ground truth
#                            (hx-*/rank*.jsonl), training logs, plan, env
#   console.log              this script's output
# Re-run the analysis on the development machine over the unpacked tarball:
#   python3 bench/gpu/analyze.py host-exposure DIR > bench/results/gpu-host-exposure.json
#
# Knobs: MODEL (train.py model flags), HOST_MS (15), HOST_RANK (1), TAIL_MS
# (40), INJ_AT (25 s after the loop starts: warm-up + at least 3 clean
# windows for the step-time baseline), INJ_DUR (40 s: 3 windows + the one the
# injection falls in + lateness, with room), RUNS ("start end end+marker";
# start+marker also exists), AGENT_FLAGS (--probe-torch --emit-ok),
# WINDOW_S/CONSECUTIVE/LATENESS_S (the pass criterion; the agent's defaults
# 5 s, 3, 2 s), BUDGET_S (530), STARTUP (40, the estimate of a run's start),
# SKIP_BUILD=1 (use a carried bin/libslowrank_cupti.so), DUMP=1 (each run's
# agent also writes --dump-events; its host calls come back as
# <run>-dump-host.jsonl.gz for replays: correlate/testdata/dump2records.py).
#
# DRY=1: a CPU dry run (Debian's python3-torch: --device cpu --backend gloo, a
# tiny model, short durations, no injection library). DRY_AGENT=1 also runs
# the real agent (root, real uprobes on CPU torch's c10d), selecting the dry
# trainer by a private variable (--env-key SLOWRANK_HXDRY) so that it never
# attaches to other processes of a shared machine; runs start and end only.
# It checks the plumbing only: on CPU nothing is queued behind the host, so
# hx-end is not the GPU's case (what it partly hides behind there is the
# ranks' contention for a few cores; its truth says how much the steps grew,
# and pass whether the agent followed it: every run is judged by its truth).
set -euo pipefail
SCRIPT_DIR=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
RESULTS=${OUT:-$SCRIPT_DIR/../../out/host-exposure}  # what comes back
WORK=${HX_WORK:-/var/tmp/slowrank-hx}                  # scratch, outside the working tree
mkdir -p "$RESULTS"
RESULTS=$(cd "$RESULTS" && pwd)
export OUT=$WORK/run
rm -rf "$OUT"
mkdir -p "$OUT"

SELECT=()  # agent flags that select the trainer (none: RANK, the default)
DRYKEY=    # the trainer's SLOWRANK_HXDRY (selects it in a dry run with the real agent)
if [ -n "${DRY:-}" ]; then
  # train() runs python3: the one with torch (Debian's python3-torch).
  mkdir -p "$WORK/pybin"
  ln -sf "${DRY_PYTHON:-/usr/bin/python3}" "$WORK/pybin/python3"
  export PATH=$WORK/pybin:$PATH
  : "${MODEL:=--device cpu --dim 64 --layers 2 --heads 4 --seq 32 --batch 2 --vocab 256}"
  : "${TAIL_MS:=5}" "${TAIL_SIZE:=64}" "${HOST_MS:=30}" "${INJ_AT:=22}" "${INJ_DUR:=23}" "${STARTUP:=15}"
  : "${RUNS:=start end}"  # no cudaDeviceSynchronize on CPU: no marker run
  SELECT=(--env-key SLOWRANK_HXDRY --state-dir "$WORK/agent-state")
  DRYKEY=1
fi
: "${MODEL:=--dim 512 --layers 4 --seq 256 --batch 8 --vocab 4096}"
: "${HOST_MS:=15}" "${HOST_RANK:=1}" "${TAIL_MS:=40}" "${TAIL_SIZE:=2048}"
: "${INJ_AT:=25}" "${INJ_DUR:=40}" "${RUNS:=start end end+marker}"
: "${AGENT_FLAGS=--probe-torch --emit-ok}"
: "${WINDOW_S:=5}" "${CONSECUTIVE:=3}" "${LATENESS_S:=2}"
: "${BUDGET_S:=530}" "${STARTUP:=40}"
RESERVE=25  # analysis and packing
for m in $RUNS; do
  case $m in start | end | start+marker | end+marker) ;; *) echo "host_exposure.sh: RUNS names '$m' (want start, end, start+marker, end+marker)"; exit 2 ;; esac
done

# shellcheck source=common.sh
source "$SCRIPT_DIR/common.sh"  # cd to the repository root; AGENT, LIB, build_lib, start_agent, stop_agent, train
exec > >(tee -a "$OUT/console.log") 2>&1
echo "host_exposure.sh: runs '$RUNS', HOST_MS=$HOST_MS on rank $HOST_RANK from ${INJ_AT} s for ${INJ_DUR} s, TAIL_MS=$TAIL_MS, model '$MODEL', budget ${BUDGET_S} s${DRY:+ (DRY RUN on CPU${DRY_AGENT:+, real agent})}"
if { [ -z "${DRY:-}" ] || [ -n "${DRY_AGENT:-}" ]; } && [ ! -x "$AGENT" ]; then
  echo "no agent binary at $AGENT: run 'make build' on the development machine and carry bin/slowrank"; exit 2
fi
{
  date -u; uname -a; nproc
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>/dev/null || echo "no nvidia-smi"
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)' 2>&1 || true
  "$AGENT" --version 2>/dev/null || true
} >"$OUT/env.txt" 2>&1
if [ -n "${SKIP_BUILD:-}" ] && [ -f "$LIB" ]; then echo "using the carried $LIB"; else build_lib; fi

note() {  # note RUN STATUS EST TOOK RC [WHY]
  printf '{"run":"%s","status":"%s","est_s":%s,"took_s":%s,"rc":%s,"why":"%s","t_s":%s}\n' \
    "$1" "$2" "$3" "$4" "$5" "${6:-}" "$SECONDS" >>"$OUT/plan.jsonl"
}

port=29580
for m in $RUNS; do
  mode=${m%+marker}
  name=hx-$mode
  extra=()
  if [ "$mode" != "$m" ]; then name=hx-$mode-marker extra=(--step-marker cudaDeviceSynchronize); fi
  est=$((STARTUP + INJ_AT + INJ_DUR + 15))
  left=$((BUDGET_S - RESERVE - SECONDS))
  if ((est > left)); then
    echo "== $name: skipped (needs ~${est} s, ${left} s left)"
    note "$name" skipped "$est" 0 0 budget
    continue
  fi
  echo "== $name: start at t=${SECONDS} s (estimate ${est} s)"
  t0=$SECONDS rc=0
  port=$((port + 1))
  # shellcheck disable=SC2086 # AGENT_FLAGS is a list of flags
  if [ -n "${DUMP:-}" ]; then extra+=(--dump-events "$OUT/$name-dump.jsonl"); fi
  start_agent "$name" "${SELECT[@]}" --status-socket "$OUT/$name.sock" $AGENT_FLAGS "${extra[@]}"
  # The launcher stops every rank when its share of the budget is spent
  # (what is left, less the agent's stop).
  # shellcheck disable=SC2086 # MODEL is a list of flags
  SLOWRANK_HXDRY=$DRYKEY TORCHELASTIC_RUN_ID=$name train "$name" --launch 4 --backend gloo $MODEL \
    --duration $((INJ_AT + INJ_DUR)) --kill-after $((left - 20)) \
    --slow-host-rank "$HOST_RANK" --slow-host-ms "$HOST_MS" --slow-host-at "$mode" --slow-from-s "$INJ_AT" \
    --tail-gpu-ms "$TAIL_MS" --tail-gpu-size "$TAIL_SIZE" --port "$port" || rc=$?
  if [ -n "${AGENT_PID:-}" ]; then
    (sleep 30; kill -KILL "$AGENT_PID") >/dev/null 2>&1 &  # an agent that does not stop cannot take the call
    guard=$!
    stop_agent
    kill "$guard" 2>/dev/null || true
  fi
  if [ -f "$OUT/$name-dump.jsonl" ]; then
    # The host calls only: device intervals are most of a dump and no replay reads them.
    grep -v '"type":"correlate.DeviceInterval"' "$OUT/$name-dump.jsonl" | gzip -9 >"$RESULTS/$name-dump-host.jsonl.gz" || true
    rm -f "$OUT/$name-dump.jsonl"
  fi
  echo "== $name: rc=$rc after $((SECONDS - t0)) s"
  note "$name" "$([ "$rc" = 0 ] && echo ran || echo failed)" "$est" $((SECONDS - t0)) "$rc"
  if [ "$rc" != 0 ]; then tail -n 15 "$OUT/$name-train.log" || true; fi
done

python3 bench/gpu/analyze.py host-exposure "$OUT" "$WINDOW_S" "$CONSECUTIVE" "$LATENESS_S" \
  >"$RESULTS/gpu-host-exposure.json" 2>"$OUT/analyze.err" || { echo "analyze.py failed:"; tail -n 5 "$OUT/analyze.err"; }
python3 - "$RESULTS/gpu-host-exposure.json" <<'PY' || true
import json, sys
d = json.load(open(sys.argv[1]))
for name, r in d.get("runs", {}).items():
    t, j = r.get("truth", {}), r.get("judgement", {})
    ph = r.get("agent_phases", {})
    def ch(p):
        x = ph.get(p) or {}
        return f"{p} rank {x.get('rank_change')} peers {x.get('peers_change')}"
    print(f"{name}: pass={r.get('pass')} step {t.get('step_ms_before')} -> {t.get('step_ms_after')} ms "
          f"({t.get('step_rise_pct')} %), as designed {t.get('as_designed')}, alert expected {j.get('expect_alert')}; host alerts {j.get('host_alert_ranks')} "
          f"after {j.get('alert_logged_after_s', j.get('alert_window_end_after_s'))} s, exposed windows "
          f"{j.get('exposed_windows')}, hidden {j.get('hidden_windows')}, evidence {j.get('exposure_evidence')}; "
          f"change: {ch('idle')}; {ch('coll_wait')}; {ch('sync_wait')}")
    if r.get("note"):
        print("  note:", r["note"])
print("pass:", d.get("pass"))
PY
tar -C "$OUT" -czf "$RESULTS/host-exposure-raw.tgz" --exclude='*.sock' --exclude=console.log .
cp "$OUT/console.log" "$RESULTS/console.log"
ls -l "$RESULTS"
