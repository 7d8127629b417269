#!/usr/bin/env python3
"""Analysis of bench/gpu/ext_loops.sh (issue 16 item 4); standard library only.

  ext_loops_analyze.py summarize WORK [--md FILE] [--prof-from DIR]
                                                    the JSON summary on stdout;
                                                    --prof-from: the profiler
                                                    runs (L-prof/, facts) of an
                                                    earlier WORK (a SKIP_PROF=1
                                                    rerun of the agent runs)
  ext_loops_analyze.py reduce TRACE OUT.json.gz     a Chrome trace cut to what
                                                    the analysis reads
  ext_loops_analyze.py selftest                     synthetic checks (no torch)

WORK holds what ext_loops.sh wrote: facts.jsonl and verdicts.jsonl of the
one agent that watched every run, runs.jsonl (one line per run), and per
loop L the folders L-agent/ (the run with the agent and the injection
library: steps.jsonl) and L-prof/ (the torch.profiler run: steps.jsonl,
trace.min.json.gz or trace.json). The agent's facts of a run carry the
run's folder name as job (its TORCHELASTIC_RUN_ID).

Per loop, the pass criteria of issue 16 item 4:
- steps: the agent's step facts of the run, against the loop's iterations
  (its own hook's records): |facts - iterations| <= 1. Each fact is placed
  in the iteration during which it ended (start_ns < end <= end_ns of the
  hook's record), which gives the first fact's iteration, iterations with
  two facts (duplicates) and iterations between the first and the last
  placed fact without one (missed).
- step time: over the steady iterations (index >= warm, not the last) that
  hold exactly one fact, the median and the mean of the facts' `step`
  against those of the loop's own step_ms (for Megatron also its own
  interval-time timer, own_ms): both within 1 %.
- compute: the median `compute` of those facts that carry it (gpu:true)
  against the profiler run's median per-step compute, within 2 %. Profiler
  compute per step follows the agent's definition (DESIGN.md section 3):
  the union of the intervals of non-communication kernels, memcpys and
  memsets, with the agent's kernel classification (slowrank_classify in
  cupti/slowrank_convert.c, mirrored in classify() here). A device event
  belongs to the ProfilerStep#N whose CPU range holds the runtime or driver
  call that launched it (by correlation id; a CUDA graph's kernels carry
  the graph launch's); the first and the last profiled step are left out.
  The agent's rule (the step in which the event ended, clipped to its
  start) is reported beside it (compute_by_end).
"""
import bisect
import gzip
import json
import math
import os
import re
import statistics
import sys
import tempfile

LOOP_NAMES = {
    "trainer": "transformers Trainer",
    "lightning": "PyTorch Lightning (DDP strategy)",
    "compile": "torch.compile (nanoGPT recipe, DDP)",
    "cudagraph": "CUDA graph (whole step captured)",
    "fsdp2": "FSDP2 (fully_shard)",
    "megatron": "Megatron-core (local spec, own timers)",
}
ORDER = ("trainer", "lightning", "compile", "cudagraph", "fsdp2", "megatron")
STEP_TOL, TIME_TOL, COMPUTE_TOL = 1, 0.01, 0.02

# slowrank_classify (cupti/slowrank_convert.c): case-insensitive substrings.
_COMM = ("nccldevkernel", "nvshmem", "cross_device_reduce", "all_reduce", "allreduce", "all_gather", "allgather",
         "reduce_scatter", "reducescatter")
_ATTN = ("flash", "fmha", "sdpa", "attention", "attn")
_MOE = ("grouped_gemm", "groupedgemm", "grouped_mm", "groupgemm", "moe", "alltoall", "all_to_all", "all2all", "expert")
_GEMM = ("gemm", "gemv", "cutlass", "cublas", "xmma", "nvjet", "matmul", "wgmma", "splitkreduce")
_COPY = ("copy", "memcpy", "memset")


def classify(name):
    n = (name or "").lower()
    if not n:
        return "other"
    if ("nccl" in n and "kernel" in n) or any(s in n for s in _COMM):
        return "communication"
    if any(s in n for s in _ATTN):
        return "attention"
    if any(s in n for s in _MOE) or ("permute" in n and "token" in n):
        return "moe"
    if any(s in n for s in _GEMM):
        return "gemm"
    if any(s in n for s in _COPY):
        return "copy"
    return "other"


def union_ns(spans):
    total, cur_s, cur_e = 0, None, None
    for s, e in sorted(spans):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        elif e > cur_e:
            cur_e = e
    if cur_e is not None:
        total += cur_e - cur_s
    return total


def read_jsonl(path):
    out = []
    if not os.path.exists(path):
        return out
    with open(path, errors="replace") as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            try:
                out.append(json.loads(line))
            except ValueError:
                out.append({"_malformed": line[:200]})
    return out


# ---- traces ---------------------------------------------------------------

STEP_RE = re.compile(r"^ProfilerStep#(\d+)$")
GPU_CATS = {"kernel": "kernel", "gpu_memcpy": "memcpy", "gpu_memset": "memset"}
LAUNCH_CATS = ("cuda_runtime", "cuda_driver")


def reduce_trace(events):
    """The parts of a Chrome trace (list of events, or {"traceEvents": ...})
    that the analysis reads, in ns: steps [[name, start, end]], gpu
    [[start, end, kind, class, corr]], launch {corr: start}."""
    if isinstance(events, dict):
        events = events.get("traceEvents", [])
    steps, gpu, launch = [], [], {}
    for e in events:
        if e.get("ph") != "X" or "ts" not in e:
            continue
        cat = e.get("cat") or ""
        name = e.get("name") or ""
        ts = int(round(float(e["ts"]) * 1000))
        dur = int(round(float(e.get("dur", 0)) * 1000))
        args = e.get("args") or {}
        if cat in GPU_CATS:
            kind = GPU_CATS[cat]
            cls = classify(name) if kind == "kernel" else "copy"
            gpu.append([ts, ts + dur, kind, cls, args.get("correlation")])
        elif cat in LAUNCH_CATS:
            c = args.get("correlation")
            if c is not None:
                launch[c] = ts
        elif STEP_RE.match(name) and not cat.startswith("gpu_"):
            steps.append([name, ts, ts + dur])
    steps.sort(key=lambda s: s[1])
    used = {g[4] for g in gpu}
    return {"steps": steps, "gpu": gpu, "launch": {str(k): v for k, v in launch.items() if k in used}}


def load_trace(folder):
    for name in ("trace.min.json.gz", "trace.min.json"):
        p = os.path.join(folder, name)
        if os.path.exists(p):
            with (gzip.open if p.endswith(".gz") else open)(p, "rt") as f:
                return json.load(f)
    p = os.path.join(folder, "trace.json")
    if os.path.exists(p):
        with open(p) as f:
            return reduce_trace(json.load(f))
    return None


def prof_compute(tr):
    """Per profiled step: compute by launch and by end (ns), comm, kernels."""
    steps = tr["steps"]
    if not steps:
        return None
    starts = [s[1] for s in steps]
    launch = {str(k): v for k, v in tr["launch"].items()}
    by_launch = [[] for _ in steps]
    by_end = [[] for _ in steps]
    comm = [[] for _ in steps]
    kernels = [0] * len(steps)
    unplaced = 0
    for s, e, kind, cls, corr in tr["gpu"]:
        t = launch.get(str(corr))
        i = None
        if t is not None:
            j = bisect.bisect_right(starts, t) - 1
            if j >= 0 and t <= steps[j][2]:
                i = j
        if cls == "communication":
            if i is not None:
                comm[i].append((s, e))
        elif i is not None:
            by_launch[i].append((s, e))
            if kind == "kernel":
                kernels[i] += 1
        else:
            unplaced += 1
        if cls != "communication":
            j = bisect.bisect_right(starts, e) - 1  # the step in which it ended, clipped to its start
            if 0 <= j and (j + 1 < len(steps) or e <= steps[j][2]):
                by_end[j].append((max(s, steps[j][1]), e))
    return {"names": [s[0] for s in steps], "step_ns": [s[2] - s[1] for s in steps],
            "compute_ns": [union_ns(x) for x in by_launch], "compute_by_end_ns": [union_ns(x) for x in by_end],
            "comm_ns": [union_ns(x) for x in comm], "kernels": kernels, "unplaced": unplaced,
            "gpu_events": len(tr["gpu"])}


def interior(xs):
    return xs[1:-1] if len(xs) >= 4 else xs


def med(xs):
    return statistics.median(xs) if xs else None


def rel(a, b):
    return (a / b - 1) if a is not None and b else None


def r3(x, n=4):
    return None if x is None else round(x, n)


# ---- one loop -------------------------------------------------------------

def split_steps(recs):
    iters = [r for r in recs if "step" in r and "end_ns" in r]
    events = {r["event"]: r for r in recs if "event" in r}
    final = next((r for r in recs if r.get("final")), None)
    return iters, events, final


def place(facts, iters):
    """For each fact the index of the iteration during which it ended, or
    None (before the first / after the last iteration)."""
    ends = [it["end_ns"] for it in iters]
    out = []
    for f in facts:
        i = bisect.bisect_left(ends, f["end_ns"])
        if i < len(iters) and iters[i]["start_ns"] < f["end_ns"] <= iters[i]["end_ns"]:
            out.append(i)
        else:
            out.append(None)
    return out


def step_facts(facts, job):
    fs = [f for f in facts if f.get("kind") == "step" and f.get("job") == job]
    return sorted(fs, key=lambda f: f["end_ns"])


def analyze_run_steps(facts, iters, warm):
    """Counts, placement and step times of one run's facts against its iterations."""
    pl = place(facts, iters)
    per = {}
    for f, i in zip(facts, pl):
        if i is not None:
            per.setdefault(i, []).append(f)
    placed = sorted(per)
    res = {"iterations": len(iters), "steps_found": len(facts),
           "first_fact_iteration": placed[0] if placed else None,
           "unplaced_facts": sum(1 for i in pl if i is None),
           "duplicate_iterations": sum(1 for v in per.values() if len(v) > 1),
           "missed_iterations": (placed[-1] - placed[0] + 1 - len(placed)) if placed else None}
    res["steps_ok"] = bool(iters) and abs(len(facts) - len(iters)) <= STEP_TOL
    steady = [i for i in placed if i >= warm and i < len(iters) - 1 and len(per[i]) == 1]
    a = [per[i][0]["phases"]["step"] for i in steady if "step" in per[i][0].get("phases", {})]
    lo = [iters[i]["step_ms"] for i in steady]
    own = [iters[i]["own_ms"] for i in steady if iters[i].get("own_ms") is not None]
    res.update({"steady_steps": len(steady),
                "agent_step_ms_median": r3(med(a)), "loop_step_ms_median": r3(med(lo)),
                "agent_step_ms_mean": r3(statistics.fmean(a) if a else None),
                "loop_step_ms_mean": r3(statistics.fmean(lo) if lo else None),
                "own_timer_ms_median": r3(med(own))})
    res["step_time_dev_median"] = r3(rel(med(a), med(lo)), 5)
    res["step_time_dev_mean"] = r3(rel(res["agent_step_ms_mean"], res["loop_step_ms_mean"]), 5)
    if own:
        res["step_time_dev_own_timer"] = r3(rel(med(a), med(own)), 5)
    res["step_time_ok"] = (res["step_time_dev_median"] is not None and abs(res["step_time_dev_median"]) <= TIME_TOL
                           and abs(res["step_time_dev_mean"]) <= TIME_TOL)
    comp = [per[i][0]["phases"]["compute"] for i in steady
            if per[i][0].get("gpu") and "compute" in per[i][0].get("phases", {})]
    res.update({"gpu_steps": len(comp), "agent_compute_ms_median": r3(med(comp))})
    # Offset of the agent's cut point from the hook (fact end - iteration end), median.
    offs = [(per[i][0]["end_ns"] - iters[i]["end_ns"]) / 1e6 for i in steady]
    res["cut_minus_hook_ms_median"] = r3(med(offs))
    return res


def run_error(final, iters, runs):
    if final:
        return final.get("error")
    if not runs:
        return "not run"
    r = runs[-1]
    if r.get("skipped"):
        return f"skipped: {r.get('why')}"
    return f"no final line (rc {r.get('rc')}{', timed out' if r.get('timed_out') else ''}, {len(iters)} iterations)"


def analyze_loop(work, loop, facts, verdicts, runs, prof_from=None, prof_facts=None, prof_runs=None):
    row = {"loop": loop, "name": LOOP_NAMES.get(loop, loop)}
    a_dir, p_dir = os.path.join(work, loop + "-agent"), os.path.join(prof_from or work, loop + "-prof")
    ra = [r for r in runs if r.get("name") == loop + "-agent"]
    rp = [r for r in (runs if prof_runs is None else prof_runs) if r.get("name") == loop + "-prof"]
    if prof_from:
        row["prof_from"] = prof_from
    row["runs"] = {"agent": ra[-1] if ra else None, "prof": rp[-1] if rp else None}
    iters, ev, final = split_steps(read_jsonl(os.path.join(a_dir, "steps.jsonl")))
    begin = ev.get("begin", {})
    row["versions"] = begin.get("versions")
    row["dry"] = (final or {}).get("dry") or begin.get("dry")
    row["error"] = run_error(final, iters, ra)
    warm = ev.get("warm", {}).get("step", 10)
    row["warm"] = warm
    row.update(analyze_run_steps(step_facts(facts, loop + "-agent"), iters, warm))
    # The profiler run: its compute, and the agent's steps there (no injection library).
    p_iters, p_ev, p_final = split_steps(read_jsonl(os.path.join(p_dir, "steps.jsonl")))
    pf = step_facts(facts if prof_facts is None else prof_facts, loop + "-prof")
    row["prof_run"] = {"iterations": len(p_iters), "steps_found": len(pf),
                       "error": run_error(p_final, p_iters, rp),
                       "export_s": p_ev.get("trace_exported", {}).get("export_s")}
    tr = load_trace(p_dir)
    pc = prof_compute(tr) if tr else None
    if pc:
        ci, ce = interior(pc["compute_ns"]), interior(pc["compute_by_end_ns"])
        row["prof_run"].update({"profiled_steps": len(pc["names"]), "used_steps": len(ci),
                                "gpu_events": pc["gpu_events"], "unplaced_events": pc["unplaced"],
                                "kernels_per_step": med(interior(pc["kernels"])),
                                "step_ms_median": r3(med(interior(pc["step_ns"])) / 1e6),
                                "comm_ms_median": r3(med(interior(pc["comm_ns"])) / 1e6),
                                "compute_by_end_ms_median": r3(med(ce) / 1e6)})
        # By launch unless the trace lacks the launches of many device events
        # (then by end, the agent's own rule).
        placed_share = 1 - pc["unplaced"] / max(1, pc["gpu_events"])
        row["prof_run"]["compute_method"] = "launch" if placed_share >= 0.9 else "end"
        use = ci if placed_share >= 0.9 else ce
        row["prof_compute_ms_median"] = r3(med(use) / 1e6) if use and med(use) else None
    else:
        row["prof_compute_ms_median"] = None
    row["compute_dev"] = r3(rel(row["agent_compute_ms_median"], row["prof_compute_ms_median"]), 5)
    if pc and row["agent_compute_ms_median"] is not None and row["prof_run"].get("compute_by_end_ms_median"):
        # reported beside the primary figure whichever method that used
        row["compute_dev_by_end"] = r3(rel(row["agent_compute_ms_median"], row["prof_run"]["compute_by_end_ms_median"]), 5)
    row["compute_ok"] = row["compute_dev"] is not None and abs(row["compute_dev"]) <= COMPUTE_TOL
    job = loop + "-agent"
    vs = [v for v in verdicts if v.get("job") == job and v.get("kind") == "verdict"]
    row["alerts"] = sum(1 for v in vs if v.get("state") == "straggler")
    row["verdict_states"] = {s: sum(1 for v in vs if v.get("state") == s) for s in sorted({v.get("state") for v in vs})}
    row["pass"] = bool(row["steps_ok"] and row["step_time_ok"] and row["compute_ok"] and not row["error"])
    return row


def pct(x):
    return "n/a" if x is None else f"{x * 100:+.2f} %"


def md_rows(rows):
    head = ["| loop | steps found / iterations | step time: agent vs the loop's own | compute: agent vs torch.profiler | result |",
            "|---|---|---|---|---|"]
    out = []
    for r in rows:
        v = r.get("versions") or {}
        ver = ", ".join(f"{k} {v[k]}" for k in sorted(v))
        name = r["name"] + (f" ({ver})" if ver else "")
        if r.get("error") and not r.get("iterations"):
            out.append(f"| {name} | — | — | — | did not run: {str(r['error'])[:80]} |")
            continue
        steps = f"{r['steps_found']} / {r['iterations']}"
        if r.get("first_fact_iteration") not in (None, 0):
            steps += f" (first at iteration {r['first_fact_iteration']})"
        st = "n/a" if r.get("agent_step_ms_median") is None else \
            f"{r['agent_step_ms_median']:.2f} vs {r['loop_step_ms_median']:.2f} ms ({pct(r['step_time_dev_median'])})"
        cp = "n/a" if r.get("compute_dev") is None else \
            f"{r['agent_compute_ms_median']:.2f} vs {r['prof_compute_ms_median']:.2f} ms ({pct(r['compute_dev'])})"
        fails = [k for k, ok in (("steps", r["steps_ok"]), ("step time", r["step_time_ok"]),
                                 ("compute", r["compute_ok"])) if not ok]
        res = "**works**" if r["pass"] else "fails: " + ", ".join(fails or ["error"])
        out.append(f"| {name} | {steps} | {st} | {cp} | {res} |")
    return head + out


def summarize(work, prof_from=None):
    facts = read_jsonl(os.path.join(work, "facts.jsonl"))
    verdicts = read_jsonl(os.path.join(work, "verdicts.jsonl"))
    runs = read_jsonl(os.path.join(work, "runs.jsonl"))
    prof_facts = prof_runs = None
    if prof_from:
        prof_facts = read_jsonl(os.path.join(prof_from, "facts.jsonl"))
        prof_runs = read_jsonl(os.path.join(prof_from, "runs.jsonl"))
    seen = [r.get("loop") for r in runs if r.get("loop")]
    loops = [l for l in ORDER if l in seen] + sorted(set(seen) - set(ORDER))
    rows = [analyze_loop(work, l, facts, verdicts, runs, prof_from, prof_facts, prof_runs) for l in loops]
    summ = next((v for v in reversed(verdicts) if v.get("kind") == "summary"), None)
    return {"script": "bench/gpu/ext_loops.sh", "analysis": "bench/gpu/ext_loops_analyze.py",
            "criteria": {"steps": f"|facts - iterations| <= {STEP_TOL}", "step_time": f"median and mean within {TIME_TOL:.0%}",
                         "compute": f"median within {COMPUTE_TOL:.0%} of torch.profiler's"},
            "prof_from": prof_from,
            "facts_lines": len(facts), "malformed_fact_lines": sum(1 for f in facts if "_malformed" in f),
            "agent_summary": summ, "rows": rows, "passed": sum(1 for r in rows if r["pass"]), "loops": len(rows),
            "markdown": md_rows(rows)}


# ---- selftest -------------------------------------------------------------

def _synth(work, loop, n=60, step_ms=20.0, compute_ms=15.0, cut_off_ms=-3.0, drop=(), extra=(), comm_ms=1.0,
           warm=10, t0=10 ** 12, prof_compute_ms=None):
    """A run whose agent facts cut cut_off_ms from the hook; drop: iterations
    without a fact; extra: iterations with a second fact."""
    os.makedirs(os.path.join(work, loop + "-agent"), exist_ok=True)
    os.makedirs(os.path.join(work, loop + "-prof"), exist_ok=True)
    ns = int(step_ms * 1e6)
    with open(os.path.join(work, loop + "-agent", "steps.jsonl"), "w") as f:
        f.write(json.dumps({"event": "begin", "mono_ns": t0, "versions": {"x": "1"}}) + "\n")
        for i in range(n):
            f.write(json.dumps({"step": i, "start_ns": t0 + i * ns, "end_ns": t0 + (i + 1) * ns, "step_ms": step_ms}) + "\n")
            if i + 1 == warm:
                f.write(json.dumps({"event": "warm", "step": warm}) + "\n")
        f.write(json.dumps({"final": True, "steps": n, "error": None}) + "\n")
    facts = []
    for i in range(n):
        if i in drop:
            continue
        end = t0 + (i + 1) * ns + int(cut_off_ms * 1e6)
        for k in range(2 if i in extra else 1):
            facts.append({"kind": "step", "job": loop + "-agent", "rank": 0, "step": i, "start_ns": end - ns, "end_ns": end - k,
                          "phases": {"step": step_ms, "compute": compute_ms * (1.001 if i % 2 else 0.999)}, "gpu": i >= 5})
    # Profiler trace: 8 steps; per step a kernel launched in it running compute_ms
    # (two overlapping pieces), a memcpy, and an NCCL kernel (comm, excluded).
    ev = []
    base = 5000.0
    compute_ms = prof_compute_ms or compute_ms
    for k in range(8):
        s = base + k * step_ms * 1000
        ev.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{k + 1}", "ts": s, "dur": step_ms * 1000})
        ev.append({"ph": "X", "cat": "gpu_user_annotation", "name": f"ProfilerStep#{k + 1}", "ts": s, "dur": 1})
        for j, (off, dur, cat, name) in enumerate(((100, compute_ms * 600, "kernel", "ampere_bf16_gemm"),
                                                   (100 + compute_ms * 500, compute_ms * 500 - 50, "kernel", "triton_poi_fused"),
                                                   (100 + compute_ms * 1000 - 50, 50, "gpu_memcpy", "Memcpy DtoD"),
                                                   (200, comm_ms * 1000, "kernel", "ncclDevKernel_AllReduce_Sum_f32_RING_LL"))):
            corr = k * 10 + j
            ev.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": s + 10 + j, "dur": 2,
                       "args": {"correlation": corr}})
            ev.append({"ph": "X", "cat": cat, "name": name, "ts": s + off, "dur": dur, "args": {"correlation": corr}})
    with open(os.path.join(work, loop + "-prof", "trace.json"), "w") as f:
        json.dump({"traceEvents": ev}, f)
    with open(os.path.join(work, loop + "-prof", "steps.jsonl"), "w") as f:
        f.write(json.dumps({"event": "trace_exported", "export_s": 0.1}) + "\n")
        f.write(json.dumps({"final": True, "steps": 19, "error": None}) + "\n")
    return facts


def selftest():
    fails = []

    def check(name, cond, got=None):
        print(("ok   " if cond else "FAIL ") + name + ("" if cond else f": {got}"))
        if not cond:
            fails.append(name)

    check("classify nccl", classify("ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevKernelArgsStorage<4096ul>)") == "communication")
    check("classify gemm", classify("sm90_xmma_gemm_bf16bf16_bf16f32") == "gemm")
    check("classify flash", classify("void pytorch_flash::flash_fwd_kernel<...>") == "attention")
    check("classify copy", classify("CatArrayBatchedCopy") == "copy")
    check("classify triton", classify("triton_per_fused_native_layer_norm_0") == "other")
    check("union", union_ns([(0, 10), (5, 15), (20, 30), (29, 31), (40, 40)]) == 26, union_ns([(0, 10), (5, 15), (20, 30)]))
    with tempfile.TemporaryDirectory() as work:
        facts = []
        facts += _synth(work, "trainer")  # exact
        facts += _synth(work, "lightning", cut_off_ms=-15.0, drop=(0, 1, 2))  # three early iterations missed
        facts += _synth(work, "compile", extra=(30,), compute_ms=15.6, prof_compute_ms=15.0)  # a duplicate; compute 4 % off
        facts.append({"kind": "step", "job": "fsdp2-prof", "rank": 0, "end_ns": 1, "start_ns": 0, "phases": {"step": 1}})
        with open(os.path.join(work, "facts.jsonl"), "w") as f:
            for x in facts + [{"kind": "topology", "job": "trainer-agent", "ranks": []}]:
                f.write(json.dumps(x) + "\n")
        with open(os.path.join(work, "verdicts.jsonl"), "w") as f:
            f.write(json.dumps({"kind": "verdict", "job": "trainer-agent", "state": "uncertain"}) + "\n")
            f.write(json.dumps({"kind": "summary", "alerts": 0}) + "\n")
        with open(os.path.join(work, "runs.jsonl"), "w") as f:
            for l in ("trainer", "lightning", "compile", "megatron"):
                for ph in ("agent", "prof"):
                    f.write(json.dumps({"loop": l, "phase": ph, "name": f"{l}-{ph}", "rc": 0 if l != "megatron" else 1}) + "\n")
        # the profiler folder of 'compile' holds a reduced trace instead of the full one
        tr = load_trace(os.path.join(work, "compile-prof"))
        with gzip.open(os.path.join(work, "compile-prof", "trace.min.json.gz"), "wt") as f:
            json.dump(tr, f)
        os.remove(os.path.join(work, "compile-prof", "trace.json"))
        s = summarize(work)
        rows = {r["loop"]: r for r in s["rows"]}
        t = rows["trainer"]
        check("trainer counts", (t["steps_found"], t["iterations"], t["first_fact_iteration"]) == (60, 60, 0),
              (t["steps_found"], t["iterations"], t["first_fact_iteration"]))
        check("trainer step time", t["step_time_dev_median"] == 0 and t["step_time_ok"], t["step_time_dev_median"])
        check("trainer cut offset", abs(t["cut_minus_hook_ms_median"] + 3.0) < 1e-6, t["cut_minus_hook_ms_median"])
        check("trainer prof compute 15 ms", abs(t["prof_compute_ms_median"] - 15.0) < 1e-6, t["prof_compute_ms_median"])
        check("trainer compute by end", abs(t["prof_run"]["compute_by_end_ms_median"] - 15.0) < 1e-6, t["prof_run"])
        check("trainer comm excluded", abs(t["prof_run"]["comm_ms_median"] - 1.0) < 1e-6, t["prof_run"]["comm_ms_median"])
        check("trainer compute ok", t["compute_ok"] and abs(t["compute_dev"]) < 0.002, t["compute_dev"])
        check("trainer gpu steps", t["gpu_steps"] == 49, t["gpu_steps"])
        check("trainer passes", t["pass"], t)
        li = rows["lightning"]
        check("lightning 3 missed at start", (li["steps_found"], li["first_fact_iteration"], li["steps_ok"]) == (57, 3, False),
              (li["steps_found"], li["first_fact_iteration"], li["steps_ok"]))
        check("lightning placement with a 15 ms earlier cut", li["missed_iterations"] == 0 and li["unplaced_facts"] == 0, li)
        co = rows["compile"]
        check("compile duplicate", (co["duplicate_iterations"], co["steps_found"], co["steps_ok"]) == (1, 61, True),
              (co["duplicate_iterations"], co["steps_found"]))
        check("compile compute fails at 4 %", not co["compute_ok"] and abs(co["compute_dev"] - 0.04) < 0.002, co["compute_dev"])
        check("compile reduced trace read", co["prof_compute_ms_median"] is not None)
        check("launch method", t["prof_run"]["compute_method"] == "launch", t["prof_run"])
        me = rows["megatron"]
        check("megatron without output", me["error"].startswith("no final line (rc 1") and not me["pass"], me["error"])
        check("prof-run facts counted", rows["trainer"]["prof_run"]["steps_found"] == 0)
        check("passed count", s["passed"] == 1, s["passed"])
        md = "\n".join(s["markdown"])
        check("markdown rows", md.count("\n| ") == len(s["rows"]) and "**works**" in md and "did not run" in md, md)
        print(md)
        # reduce keeps what load_trace needs
        ev = [{"ph": "X", "cat": "kernel", "name": "k", "ts": 1.5, "dur": 2.25, "args": {"correlation": 7}},
              {"ph": "X", "cat": "cuda_driver", "name": "cuLaunchKernel", "ts": 1.0, "dur": 0.1, "args": {"correlation": 7}},
              {"ph": "X", "cat": "cuda_runtime", "name": "cudaMalloc", "ts": 0.5, "dur": 0.1, "args": {"correlation": 8}},
              {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 1.0, "dur": 1}]
        r = reduce_trace({"traceEvents": ev})
        check("reduce", r["gpu"] == [[1500, 3750, "kernel", "other", 7]] and r["launch"] == {"7": 1000}, r)
        check("legacy list trace", reduce_trace(ev)["gpu"] == r["gpu"])
    print(f"{len(fails)} failed" if fails else "selftest passed")
    return 1 if fails else 0


def main(argv):
    if len(argv) >= 2 and argv[1] == "selftest":
        return selftest()
    if len(argv) >= 4 and argv[1] == "reduce":
        with open(argv[2]) as f:
            r = reduce_trace(json.load(f))
        with gzip.open(argv[3], "wt") as g:
            json.dump(r, g, separators=(",", ":"))
        print(f"{argv[3]}: {len(r['steps'])} steps, {len(r['gpu'])} device events")
        return 0
    if len(argv) >= 3 and argv[1] == "summarize":
        s = summarize(argv[2], argv[argv.index("--prof-from") + 1] if "--prof-from" in argv else None)
        if "--md" in argv:
            with open(argv[argv.index("--md") + 1], "w") as f:
                f.write("\n".join(s["markdown"]) + "\n")
        json.dump(s, sys.stdout, indent=1)
        sys.stdout.write("\n")
        return 0
    print(__doc__, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv))
