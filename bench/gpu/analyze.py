#!/usr/bin/env python3
"""Summaries of slowrank's GPU experiments (bench/gpu). Standard library only.

  analyze.py smoke DIR            facts found per run (steps, phases, device share)
  analyze.py c3 DIR               localisation: detected rank/phase/hint, seconds to verdict
  analyze.py c2 DIR               equivalence: losses, parameter hashes, overlap
  analyze.py c1 DIR               overhead: ABBA pairs, bootstrap 95 % CI

Multi-GPU (bench/gpu/multigpu.sh; DIR... are one or more unpacked run folders,
each holding run folders with layout.json and the agent's NAME-facts.jsonl,
NAME-verdicts.jsonl and NAME-agent.log beside them):
  analyze.py mg-loc DIR...        injected runs: detected rank/phase/hint, seconds to verdict,
                                  other alerts, communicators and cohorts the agent found
  analyze.py mg-healthy DIR...    runs without injection: false alerts, duration, cohorts
  analyze.py mg-c1 DIR...         C1 overhead of the ABBA run mg-c1: mean delta, bootstrap 95 % CI
  analyze.py mg-c2 DIR...         C2 deterministic OFF/ON/OFF: losses and parameters of every rank
  analyze.py mg-all OUTDIR DIR... all four into OUTDIR/multigpu-*.json; prints a short summary
Where the agent's output is absent (a CPU dry run, or the agent failed), the
summaries say so under "agent" instead of failing.
"""
import bisect
import glob
import json
import os
import random
import re
import statistics
import sys
from datetime import datetime


def jsonl(path):
    out = []
    if not os.path.exists(path):
        return out
    with open(path) as f:
        for line in f:
            line = line.strip()
            if line:
                try:
                    out.append(json.loads(line))
                except json.JSONDecodeError:
                    pass
    return out


def facts_summary(path):
    steps = [f for f in jsonl(path) if f.get("kind") == "step"]
    if not steps:
        return {"steps": 0}
    ranks = sorted({s["rank"] for s in steps})
    phases = {}
    for s in steps:
        for p, v in s["phases"].items():
            phases.setdefault(p, []).append(v)
    return {
        "steps": len(steps),
        "steps_per_rank": {r: sum(1 for s in steps if s["rank"] == r) for r in ranks},
        "gpu_share": round(sum(1 for s in steps if s.get("gpu")) / len(steps), 3),
        "with_fingerprint": sum(1 for s in steps if (s.get("workload") or {}).get("fp")),
        "phase_median_ms": {p: round(statistics.median(v), 3) for p, v in sorted(phases.items())},
        "phase_samples": {p: len(v) for p, v in sorted(phases.items())},
    }


def truth_steps(run_dir):
    out = {}
    for path in glob.glob(os.path.join(run_dir, "rank*.jsonl")):
        for r in jsonl(path):
            if "step_ms" in r:
                out.setdefault(r["rank"], []).append(r)
    return out


def smoke(d):
    res = {}
    for facts in sorted(glob.glob(os.path.join(d, "*-facts.jsonl"))):
        name = os.path.basename(facts)[: -len("-facts.jsonl")]
        s = facts_summary(facts)
        truth = truth_steps(os.path.join(d, name))
        s["truth_steps_per_rank"] = {r: len(v) for r, v in sorted(truth.items())}
        s["truth_step_ms_median"] = {r: round(statistics.median([x["step_ms"] for x in v[5:]] or [0]), 3) for r, v in sorted(truth.items())}
        s["verdicts"] = len([v for v in jsonl(os.path.join(d, name + "-verdicts.jsonl")) if v.get("kind") == "verdict"])
        log = open(os.path.join(d, name + "-agent.log")).read() if os.path.exists(os.path.join(d, name + "-agent.log")) else ""
        s["agent_log_tail"] = log.strip().splitlines()[-6:]
        res[name] = s
    return res


LOG_TIME = re.compile(r"^time=(\S+) level=WARN msg=STRAGGLER .* rank=(\d+) phase=(\w+) hint=(\S*)")


def straggler_log(path):
    out = []
    if not os.path.exists(path):
        return out
    for line in open(path):
        m = LOG_TIME.match(line)
        if m:
            t = datetime.fromisoformat(m.group(1).replace("Z", "+00:00")).timestamp()
            out.append({"wall": t, "rank": int(m.group(2)), "phase": m.group(3), "hint": m.group(4).strip('"')})
    return out


def injection_start(run_dir):
    for path in glob.glob(os.path.join(run_dir, "rank*.jsonl")):
        for r in jsonl(path):
            if r.get("injection_start"):
                return r
    return None


def c3(d):
    res = {"scenarios": {}}
    for name, want in (("c3-gpu", (3, "compute")), ("c3-host", (1, "host")), ("c3-healthy", None)):
        verdicts = [v for v in jsonl(os.path.join(d, name + "-verdicts.jsonl")) if v.get("kind") == "verdict"]
        alerts = [v for v in verdicts if v["state"] == "straggler"]
        logged = straggler_log(os.path.join(d, name + "-agent.log"))
        inj = injection_start(os.path.join(d, name))
        sc = {"facts": facts_summary(os.path.join(d, name + "-facts.jsonl")), "straggler_verdicts": len(alerts),
              "alerts": sorted({(a["rank"], a["phase"], a["hint"]) for a in alerts})}
        truth = truth_steps(os.path.join(d, name))
        if truth:
            first = min(v[0]["start_ns"] for v in truth.values())
            last = max(v[-1]["end_ns"] for v in truth.values())
            sc["training_seconds"] = round((last - first) / 1e9, 1)
        if want is None:
            sc["healthy_false_alerts"] = len({(a["rank"], a["phase"]) for a in alerts})
        else:
            hits = [l for l in logged if (l["rank"], l["phase"]) == want]
            sc["expected"] = {"rank": want[0], "phase": want[1]}
            if hits:
                sc["detected_rank"], sc["phase"], sc["hint"] = hits[0]["rank"], hits[0]["phase"], hits[0]["hint"]
                if inj:
                    sc["seconds_to_verdict"] = round(hits[0]["wall"] - inj["wall"], 2)
                    sc["slow_gpu_iters"] = inj.get("slow_gpu_iters")
            sc["other_alerts"] = sorted({(l["rank"], l["phase"]) for l in logged if (l["rank"], l["phase"]) != want})
        res["scenarios"][name] = sc
    h = res["scenarios"].get("c3-healthy", {})
    res["healthy_false_alerts"] = h.get("healthy_false_alerts")
    res["healthy_seconds"] = h.get("training_seconds")
    return res


def final_record(run_dir, rank=0):
    path = os.path.join(run_dir, f"rank{rank}.jsonl")
    losses, final = [], None
    for r in jsonl(path):
        if "loss" in r:
            losses.append(r["loss"])
        if r.get("final"):
            final = r
    return losses, final


def overlap(facts):
    comm = exposed = 0.0
    for f in jsonl(facts):
        if f.get("kind") == "step" and "comm" in f.get("phases", {}):
            comm += f["phases"]["comm"]
            exposed += f["phases"].get("exposed_comm", 0.0)
    return None if comm == 0 else round(exposed / comm, 6)


def c2(d):
    runs = {}
    for name in ("c2-off1", "c2-on", "c2-off2"):
        losses, final = final_record(os.path.join(d, name))
        runs[name] = {"steps": len(losses), "param_sha256": (final or {}).get("param_sha256"), "losses": losses}
    off1, on, off2 = runs["c2-off1"], runs["c2-on"], runs["c2-off2"]
    ov_on = overlap(os.path.join(d, "c2-on-facts.jsonl"))
    ov_off = overlap(os.path.join(d, "c2-off1-facts.jsonl"))
    ov_off2 = overlap(os.path.join(d, "c2-off2-facts.jsonl"))
    return {
        "loss_identical": bool(on["losses"]) and on["losses"] == off1["losses"],
        "params_identical": on["param_sha256"] is not None and on["param_sha256"] == off1["param_sha256"],
        "offoff_loss_identical": off1["losses"] == off2["losses"],
        "offoff_params_identical": off1["param_sha256"] == off2["param_sha256"],
        "steps": {k: v["steps"] for k, v in runs.items()},
        "param_sha256": {k: v["param_sha256"] for k, v in runs.items()},
        "overlap_on": ov_on, "overlap_off": ov_off, "overlap_off2": ov_off2,
        "overlap_offoff_spread": None if ov_off is None or ov_off2 is None else round(abs(ov_off - ov_off2), 6),
    }


def bootstrap_ci(xs, n=20000, seed=1):
    rng = random.Random(seed)
    means = sorted(statistics.fmean(rng.choices(xs, k=len(xs))) for _ in range(n))
    return means[int(0.025 * n)], means[int(0.975 * n) - 1]


def c1(d, name="c1"):
    blocks = jsonl(os.path.join(d, name + "-blocks.jsonl"))
    steps = []
    for rows in truth_steps(os.path.join(d, name)).values():
        steps += rows
    means = []
    for b in blocks:
        xs = [s["step_ms"] for s in steps if s["start_ns"] >= b["start_ns"] and s["end_ns"] <= b["end_ns"]]
        means.append({**b, "steps": len(xs), "mean_ms": statistics.fmean(xs) if xs else None})
    pairs = {}
    for b in means:
        pairs.setdefault(b["pair"], {})[b["arm"]] = b
    deltas = []
    for p in sorted(pairs):
        on, off = pairs[p].get("on"), pairs[p].get("off")
        if on and off and on["mean_ms"] and off["mean_ms"]:
            deltas.append(100 * (on["mean_ms"] / off["mean_ms"] - 1))
    lo, hi = bootstrap_ci(deltas) if len(deltas) >= 2 else (None, None)
    dpath = os.path.join(d, name + "-design.json")
    design = json.load(open(dpath)) if os.path.exists(dpath) else {}
    return {"pairs": len(deltas), "deltas_pct": [round(x, 4) for x in deltas],
            "mean_pct": round(statistics.fmean(deltas), 4) if deltas else None,
            "ci95_low_pct": None if lo is None else round(lo, 4), "ci95_high_pct": None if hi is None else round(hi, 4),
            "blocks": [{k: b[k] for k in ("pair", "arm", "steps", "mean_ms")} for b in means], "design": design}


# Only waits for the whole device bound the clock offset: a stream or event
# wait does not wait for kernels of other streams (NCCL's).
DEVICE_WIDE_SYNCS = ("cudaDeviceSynchronize", "cuCtxSynchronize")


def clock_agreement(dump):
    """Bounds on the host/device clock offset from synchronisations that
    waited >= 1 ms. The kernels launched before a wait returned must end
    before it returned: gap = sync end - latest end among kernels that started
    before it; a negative gap would show a device clock running ahead. The
    first kernel after the wait was launched after it returned: lead = its
    start - sync end; a negative lead would show a device clock running
    behind. So host minus device lies in [-min lead, +min gap], provided
    the offset is smaller than the launch delay and kernel lengths (kernels
    are split at the wait by their device start). (The first version
    took the latest kernel ending up to 1 ms after the wait, which in a busy
    loop is the next step's first kernel, and reported every wait as late.)"""
    syncs, kernels = {}, {}
    for r in jsonl(dump):
        rec = r.get("record", {})
        if r.get("type") == "correlate.HostCall" and rec.get("Kind") == 2 and rec.get("Op") in DEVICE_WIDE_SYNCS \
                and rec["EndNS"] - rec["StartNS"] >= 1_000_000:
            syncs.setdefault(rec["PID"], []).append(rec["EndNS"])
        elif r.get("type") == "correlate.DeviceInterval":
            kernels.setdefault(rec["PID"], []).append((rec["StartNS"], rec["EndNS"]))
    gaps, leads = [], []
    for pid, ends in syncs.items():
        ks = sorted(kernels.get(pid, []))
        starts = [k[0] for k in ks]
        latest, run = [], 0  # latest[i]: max end of ks[:i+1]
        for _, e in ks:
            run = max(run, e)
            latest.append(run)
        for s1 in ends:
            i = bisect.bisect_left(starts, s1)
            if i == 0:
                continue
            gaps.append((s1 - latest[i - 1]) / 1e3)
            if i < len(ks):
                leads.append((ks[i][0] - s1) / 1e3)
    if not gaps:
        return {"syncs": 0}

    def q(xs, p):
        xs = sorted(xs)
        return round(xs[int(p * (len(xs) - 1))], 1)
    return {"syncs_checked": len(gaps), "gap_us_min": q(gaps, 0), "gap_us_p50": q(gaps, 0.5), "gap_us_p99": q(gaps, 0.99),
            "gap_us_max": q(gaps, 1), "kernel_after_wait": sum(1 for g in gaps if g < 0),
            "next_start_us_min": q(leads, 0) if leads else None, "next_start_us_p50": q(leads, 0.5) if leads else None,
            "host_minus_device_us": [-q(leads, 0) if leads else None, q(gaps, 0)]}


def cupti(d):
    status = {}
    try:
        status = json.load(open(os.path.join(d, "val-full-status.json")))
    except (OSError, json.JSONDecodeError):
        pass
    counters = status.get("counters", {}) if isinstance(status, dict) else {}
    pairs = []
    n_pairs = len(glob.glob(os.path.join(d, "val-noagent-p*-lib")))
    for p in range(n_pairs):
        lib = truth_steps(os.path.join(d, f"val-noagent-p{p}-lib"))
        bare = truth_steps(os.path.join(d, f"val-noagent-p{p}-bare"))
        ml = [x["step_ms"] for v in lib.values() for x in v[20:]]
        mb = [x["step_ms"] for v in bare.values() for x in v[20:]]
        if ml and mb:
            pairs.append(100 * (statistics.fmean(ml) / statistics.fmean(mb) - 1))
    lo, hi = bootstrap_ci(pairs) if len(pairs) >= 2 else (None, None)
    dump = os.path.join(d, "val-full-dump.jsonl")
    if not os.path.exists(dump):  # the committed raw data keeps only the records near the waits
        dump = os.path.join(d, "val-full-dump-near-syncs.jsonl")
    return {"clock": clock_agreement(dump),
            "device_latency_p50_us": counters.get("device_latency_p50_us"),
            "device_latency_p99_us": counters.get("device_latency_p99_us"),
            "device_records": counters.get("device_records"), "device_records_dropped": counters.get("device_records_dropped", 0),
            "batches_lost": counters.get("batches_lost", 0),
            "loaded_without_agent_pct": [round(x, 3) for x in pairs],
            "loaded_without_agent_ci95": [lo, hi],
            "full_collection": c1(d, "val-c1full"), "duty_cycle": c1(d, "val-c1duty")}


# --- multi-GPU runs (bench/gpu/multigpu.sh) ----------------------------------


def mg_runs(dirs):
    """Every run folder holding a layout.json (written by train.py --multi-gpu)."""
    runs = []
    for d in dirs:
        for lp in sorted(glob.glob(os.path.join(d, "*", "layout.json"))):
            run_dir = os.path.dirname(lp)
            try:
                with open(lp) as f:
                    layout = json.load(f)
            except (OSError, json.JSONDecodeError) as e:
                layout = {"error": str(e)}
            runs.append({"name": os.path.basename(run_dir), "base": d, "dir": run_dir, "layout": layout})
    return runs


def mg_agent(base, name):
    """What the agent left for run NAME; a clear note where it left nothing."""
    paths = {k: os.path.join(base, f"{name}-{k}") for k in ("facts.jsonl", "verdicts.jsonl", "agent.log")}
    have = {k: os.path.exists(p) and os.path.getsize(p) > 0 for k, p in paths.items()}
    res = {"facts_file": have["facts.jsonl"], "verdicts_file": have["verdicts.jsonl"], "agent_log": have["agent.log"]}
    if not have["facts.jsonl"] and not have["verdicts.jsonl"]:
        res["note"] = ("no agent output for this run: facts and verdicts are absent (a CPU dry run, "
                       "or the agent did not run or failed; see agent_log_tail)")
    if have["agent.log"]:
        with open(paths["agent.log"], errors="replace") as f:
            lines = [l.rstrip() for l in f]
        res["agent_log_errors"] = [l for l in lines if "level=ERROR" in l][:5]
        res["agent_log_tail"] = lines[-4:]
    return res, paths


def mg_truth(run_dir):
    """Per rank: meta line, step rows, injection record, final record."""
    ranks = {}
    for path in sorted(glob.glob(os.path.join(run_dir, "rank*.jsonl"))):
        r = {"meta": None, "steps": [], "injection": None, "final": None}
        for row in jsonl(path):
            if row.get("meta"):
                r["meta"] = row
            elif "step_ms" in row:
                r["steps"].append(row)
            elif row.get("injection_start"):
                r["injection"] = row
            elif row.get("final"):
                r["final"] = row
        rank = (r["meta"] or {}).get("rank")
        if rank is None:
            rank = int(re.findall(r"rank(\d+)\.jsonl$", path)[0])
        ranks[rank] = r
    return ranks


def median_or_none(xs):
    return round(statistics.median(xs), 3) if xs else None


def mg_training(truth):
    """Duration, steps and median step time of a run from its ground truth."""
    steps = [s for r in truth.values() for s in r["steps"]]
    if not steps:
        return {"steps_per_rank": {}, "training_seconds": None}
    first = min(s["start_ns"] for s in steps)
    last = max(s["end_ns"] for s in steps)
    return {"steps_per_rank": {r: len(v["steps"]) for r, v in sorted(truth.items())},
            "all_ranks_same_steps": len({len(v["steps"]) for v in truth.values()}) == 1,
            "finished_ranks": sum(1 for v in truth.values() if v["final"]),
            "training_seconds": round((last - first) / 1e9, 1),
            "step_ms_median": median_or_none([s["step_ms"] for s in steps if s["step"] >= 5])}


def mg_topology(facts_path):
    """The agent's communicators: the topology version most step facts were
    judged under (the last version, emitted as the processes exit, is empty)."""
    topos, uses = {}, {}
    for f in jsonl(facts_path):
        if f.get("kind") == "topology":
            topos[f.get("version", 0)] = f
        elif f.get("kind") == "step" and "topo" in f:
            uses[f["topo"]] = uses.get(f["topo"], 0) + 1
    if not topos:
        return None
    v = max(uses, key=lambda k: (uses[k], k)) if uses and any(k in topos for k in uses) else max(topos)
    topo = dict(topos.get(v) or topos[max(topos)])
    topo["versions"] = sorted(topos)
    topo["steps_under_version"] = uses.get(topo.get("version"), 0)
    return topo


def mg_cohorts(layout, topo, verdicts):
    """Communicators the agent labelled against the true TP x DP layout, and
    the cohorts it compared ranks in (comparable_ranks of its verdicts)."""
    world, tp = layout.get("world"), layout.get("tp", 1)
    truth = {"world": world, "tp": tp, "dp": layout.get("dp"),
             "tp_groups": layout.get("tp_groups"), "dp_groups": layout.get("dp_groups")}
    res = {"truth": truth}
    want = sorted(sorted(g) for g in (layout.get("dp_groups") or []))
    if topo is None:
        res["agent_groups"] = None
        res["note"] = "no topology fact from the agent"
    else:
        groups = [{"id": g.get("id"), "type": g.get("type"), "ranks": sorted(g.get("ranks") or [])}
                  for g in topo.get("groups") or []]
        res["agent_groups"] = groups
        res["topology_version"] = topo.get("version")
        if not groups:
            res["note"] = ("the agent's topology has no communicator (communicator init not seen, e.g. attached "
                           "after it): every rank of the job forms one 'world' cohort")
        by_type = {}
        for g in groups:
            by_type.setdefault(g["type"], []).append(g["ranks"])
        res["agent_group_types"] = {k: sorted(v) for k, v in sorted(by_type.items())}
        if tp == 1:
            # Pure data parallelism: the agent keeps the world communicator as the cohort.
            res["expected_cohort_type"] = "world"
            res["cohort_groups_match_truth"] = sorted(by_type.get("world", [])) == want and not by_type.get("dp")
        else:
            res["expected_cohort_type"] = "dp"
            res["cohort_groups_match_truth"] = sorted(by_type.get("dp", [])) == want
            res["tp_groups_match_truth"] = sorted(by_type.get("tp", [])) == sorted(sorted(g) for g in layout.get("tp_groups") or [])
            if layout.get("dp") == tp:
                res["label_tie"] = ("TP and DP groups have the same size: the agent's 'dp' label (largest "
                                    "reducing communicator with per-step traffic) cannot tell them apart")
    res["cohort_types_in_verdicts"] = sorted({v["cohort"] for v in verdicts if v.get("cohort")})
    seen = {}
    for v in verdicts:
        if v.get("comparable_ranks"):
            key = tuple(sorted(set(v["comparable_ranks"]) | {v["rank"]}))
            seen.setdefault(v["rank"], {}).setdefault(key, 0)
            seen[v["rank"]][key] += 1
    if seen:
        cohort_of = {r: list(max(c.items(), key=lambda kv: kv[1])[0]) for r, c in sorted(seen.items())}
        res["cohort_of_rank"] = cohort_of
        if want:
            truth_of = {r: g for g in want for r in g}
            res["cohorts_match_truth"] = all(cohort_of[r] == truth_of.get(r) for r in cohort_of)
    else:
        res["cohort_of_rank"] = None
    return res


def mg_expected(layout):
    a = layout.get("args") or {}
    exp = []
    if a.get("slow_gpu_rank", -1) >= 0:
        exp.append({"rank": a["slow_gpu_rank"], "phase": "compute", "hint": "gpu_stream_stall",
                    "injection": f"GPU busy {a.get('slow_gpu_frac', 0) * 100:g} % with a neighbour process"
                    if a.get("slow_gpu_mode") == "contend" else f"+{a.get('slow_gpu_frac', 0) * 100:g} % GPU work"})
    if a.get("slow_host_rank", -1) >= 0:
        exp.append({"rank": a["slow_host_rank"], "phase": "host", "hint": "host_only_stall",
                    "injection": f"{a.get('slow_host_ms', 0):g} ms host stall per step"})
    return exp


def mg_phase_medians(facts, split_ns, phase):
    """Per rank, the agent's median of one phase before and after split_ns."""
    pre, post = {}, {}
    for f in facts:
        if f.get("kind") == "step" and phase in (f.get("phases") or {}):
            (pre if f["end_ns"] < split_ns else post).setdefault(f["rank"], []).append(f["phases"][phase])
    return {r: {"before": median_or_none(pre.get(r, [])), "after": median_or_none(post.get(r, []))}
            for r in sorted(set(pre) | set(post))}


def mg_alerts(verdicts, logged, t0_wall=None, t0_ns=None):
    """First straggler alert per (rank, phase), with its time after t0."""
    first = {}
    for v in verdicts:
        if v.get("state") == "straggler":
            k = (v["rank"], v["phase"])
            if k not in first:
                first[k] = {"rank": v["rank"], "phase": v["phase"], "hint": v.get("hint", ""), "window": v.get("window"),
                            "deviation": v.get("deviation"), "reference_rank": v.get("reference_rank"),
                            "comparable_ranks": v.get("comparable_ranks")}
                if t0_ns is not None and v.get("window_end_ns"):
                    first[k]["window_end_after_s"] = round((v["window_end_ns"] - t0_ns) / 1e9, 2)
    for l in logged:
        k = (l["rank"], l["phase"])
        a = first.setdefault(k, {"rank": l["rank"], "phase": l["phase"], "hint": l["hint"]})
        if "logged_after_s" not in a and t0_wall is not None:
            a["logged_after_s"] = round(l["wall"] - t0_wall, 2)
    return sorted(first.values(), key=lambda a: (a.get("logged_after_s", a.get("window_end_after_s", 0)) or 0))


def mg_loc_run(run):
    layout, name, base = run["layout"], run["name"], run["base"]
    agent, paths = mg_agent(base, name)
    truth = mg_truth(run["dir"])
    facts = jsonl(paths["facts.jsonl"])
    verdicts = [v for v in jsonl(paths["verdicts.jsonl"]) if v.get("kind") == "verdict"]
    logged = straggler_log(paths["agent.log"])
    res = {"world": layout.get("world"), "tp": layout.get("tp"), "dp": layout.get("dp"),
           "training": mg_training(truth), "agent": agent,
           "facts": facts_summary(paths["facts.jsonl"]) if agent["facts_file"] else None,
           "cohorts": mg_cohorts(layout, mg_topology(paths["facts.jsonl"]), verdicts), "expected": []}
    injs = [r["injection"] for r in truth.values() if r["injection"]]
    t0 = min(injs, key=lambda i: i["mono_ns"]) if injs else None
    for exp in mg_expected(layout):
        e = dict(exp)
        inj = (truth.get(exp["rank"]) or {}).get("injection")
        if inj:
            e["injection_step"], e["slow_gpu_iters"] = inj["step"], inj.get("slow_gpu_iters")
            e["fb_ms_median"] = inj.get("fb_ms_median")
            # Ground truth: step time of every rank before and after the injection.
            pre = [s["step_ms"] for r in truth.values() for s in r["steps"] if 5 <= s["step"] < inj["step"]]
            post = [s["step_ms"] for r in truth.values() for s in r["steps"] if s["step"] > inj["step"] + 5]
            e["step_ms_before"], e["step_ms_after"] = median_or_none(pre), median_or_none(post)
            if facts:
                e["agent_" + exp["phase"] + "_ms"] = mg_phase_medians(facts, inj["mono_ns"], exp["phase"])
        else:
            e["note"] = "the injected rank wrote no injection_start record (the run ended before the injection?)"
        # Alerts for the expected (rank, phase) once the injection began.
        hits_v = [v for v in verdicts if v.get("state") == "straggler" and (v["rank"], v["phase"]) == (exp["rank"], exp["phase"])
                  and (inj is None or v.get("window_end_ns", 0) >= inj["mono_ns"])]
        hits_l = [l for l in logged if (l["rank"], l["phase"]) == (exp["rank"], exp["phase"])
                  and (inj is None or l["wall"] >= inj["wall"])]
        e["detected"] = bool(hits_v or hits_l)
        if hits_v:
            v = hits_v[0]
            e["detected_rank"], e["phase_found"], e["hint_found"] = v["rank"], v["phase"], v.get("hint", "")
            e["deviation"], e["reference_rank"], e["comparable_ranks"] = v.get("deviation"), v.get("reference_rank"), v.get("comparable_ranks")
            later = [x.get("hint") for x in hits_v if x.get("hint")]
            e["hints_seen"] = sorted(set(later))
            if inj:
                e["window_end_after_injection_s"] = round((v["window_end_ns"] - inj["mono_ns"]) / 1e9, 2)
        if hits_l and inj:
            e["seconds_to_verdict"] = round(hits_l[0]["wall"] - inj["wall"], 2)  # log time of the STRAGGLER line
            e.setdefault("detected_rank", hits_l[0]["rank"])
            e.setdefault("phase_found", hits_l[0]["phase"])
            e.setdefault("hint_found", hits_l[0]["hint"])
        if not e["detected"] and not agent["verdicts_file"]:
            e["note"] = agent.get("note", "no verdicts from the agent")
        res["expected"].append(e)
    want = {(e["rank"], e["phase"]) for e in res["expected"]}
    alerts = mg_alerts(verdicts, logged, t0 and t0["wall"], t0 and t0["mono_ns"])
    res["other_alerts"] = [a for a in alerts if (a["rank"], a["phase"]) not in want]
    res["alerts_before_injection"] = [a for a in alerts if (a.get("logged_after_s") or a.get("window_end_after_s") or 0) < 0]
    res["all_found"] = bool(res["expected"]) and all(e["detected"] for e in res["expected"])
    return res


def mg_loc(*dirs):
    runs = [r for r in mg_runs(dirs) if mg_expected(r["layout"]) and not r["name"].startswith(("c2-", "mg-c1"))]
    res = {"runs": {r["name"]: mg_loc_run(r) for r in runs}}
    if not runs:
        res["note"] = "no injected multi-GPU run found"
    return res


def mg_healthy_run(run):
    layout, name, base = run["layout"], run["name"], run["base"]
    agent, paths = mg_agent(base, name)
    truth = mg_truth(run["dir"])
    verdicts = [v for v in jsonl(paths["verdicts.jsonl"]) if v.get("kind") == "verdict"]
    logged = straggler_log(paths["agent.log"])
    first = min((s["start_ns"] for r in truth.values() for s in r["steps"]), default=None)
    alerts = mg_alerts(verdicts, logged, None, first)
    states = {}
    for v in verdicts:
        states[v.get("state")] = states.get(v.get("state"), 0) + 1
    uncertain = {}
    for v in verdicts:
        if v.get("state") == "uncertain":
            k = re.sub(r"[0-9.]+", "N", v.get("reason", ""))[:120]
            uncertain[k] = uncertain.get(k, 0) + 1
    tr = mg_training(truth)
    res = {"world": layout.get("world"), "tp": layout.get("tp"), "training": tr, "agent": agent,
           "facts": facts_summary(paths["facts.jsonl"]) if agent["facts_file"] else None,
           "cohorts": mg_cohorts(layout, mg_topology(paths["facts.jsonl"]), verdicts),
           "verdict_states": states, "uncertain_reasons": dict(sorted(uncertain.items(), key=lambda kv: -kv[1])[:8]),
           "false_alerts": None if not (agent["verdicts_file"] or agent["facts_file"] or logged) else len(alerts),
           "alerts": alerts,
           "meets_10_minutes": None if tr["training_seconds"] is None else tr["training_seconds"] >= 600}
    if res["false_alerts"] is None:
        res["note"] = agent.get("note")
    return res


def mg_healthy(*dirs):
    runs = [r for r in mg_runs(dirs) if not mg_expected(r["layout"]) and not r["name"].startswith(("c2-", "mg-c1"))
            and r["name"] != "preflight"]
    res = {"runs": {r["name"]: mg_healthy_run(r) for r in runs}}
    if not runs:
        res["note"] = "no healthy multi-GPU run found"
    return res


def mg_c1(*dirs, name="mg-c1"):
    for d in dirs:
        if os.path.exists(os.path.join(d, name + "-blocks.jsonl")):
            res = c1(d, name)
            lp = os.path.join(d, name, "layout.json")
            if os.path.exists(lp):
                with open(lp) as f:
                    lay = json.load(f)
                res["world"], res["tp"] = lay.get("world"), lay.get("tp")
            res["training"] = mg_training(mg_truth(os.path.join(d, name)))
            res["agent_runs"] = sum(1 for _ in glob.glob(os.path.join(d, name + "-p*-facts.jsonl")))
            if res["agent_runs"] == 0:
                res["agent_note"] = "no facts from the ON blocks: the agent did not run (a CPU dry run?)"
            res["bar_pct"], res["below_bar"] = 0.5, (res["ci95_high_pct"] is not None and res["ci95_high_pct"] < 0.5)
            return res
    return {"note": f"no {name}-blocks.jsonl found: C1 did not run"}


def mg_c2(*dirs):
    runs = {r["name"]: r for r in mg_runs(dirs) if r["name"] in ("c2-off1", "c2-on", "c2-off2")}
    if len(runs) < 3:
        return {"note": "C2 runs missing: " + ", ".join(n for n in ("c2-off1", "c2-on", "c2-off2") if n not in runs)}
    per = {}
    for n, r in runs.items():
        t = mg_truth(r["dir"])
        per[n] = {rank: {"losses": [s["loss"] for s in v["steps"]], "sha": (v["final"] or {}).get("param_sha256")}
                  for rank, v in sorted(t.items())}
    off1, on, off2 = per["c2-off1"], per["c2-on"], per["c2-off2"]

    def same(a, b, key):
        return bool(a) and a.keys() == b.keys() and all(a[r][key] == b[r][key] and a[r][key] not in (None, []) for r in a)
    base = runs["c2-on"]["base"]
    agent, paths = mg_agent(base, "c2-on")
    res = {"world": runs["c2-on"]["layout"].get("world"), "steps": {n: {r: len(v["losses"]) for r, v in p.items()} for n, p in per.items()},
           "offoff_loss_identical": same(off1, off2, "losses"), "offoff_params_identical": same(off1, off2, "sha"),
           "loss_identical": same(off1, on, "losses"), "params_identical": same(off1, on, "sha"),
           "on_vs_off2_loss_identical": same(off2, on, "losses"),
           "overlap_on": overlap(paths["facts.jsonl"]), "agent": agent,
           "param_sha256": {n: {r: v["sha"] for r, v in p.items()} for n, p in per.items()}}
    res["valid"] = res["offoff_loss_identical"] and res["offoff_params_identical"]
    if not res["valid"]:
        res["note"] = "OFF and OFF differ: the runs are not deterministic, so ON vs OFF proves nothing"
    elif "note" in agent:
        res["note"] = "the ON run had no agent attached, so ON vs OFF tests nothing: " + agent["note"]
    res["overlap_note"] = ("exposed_comm/comm is measured by the agent, so only in the ON run; OFF has no observer. "
                           "Equality of losses and parameters implies the same arithmetic, not the same overlap.")
    return res


def mg_plan(*dirs):
    plan = []
    for d in dirs:
        plan += jsonl(os.path.join(d, "plan.jsonl"))
    return plan


def mg_all(outdir, *dirs):
    os.makedirs(outdir, exist_ok=True)
    out = {"localisation": mg_loc(*dirs), "healthy": mg_healthy(*dirs), "c1": mg_c1(*dirs), "c2": mg_c2(*dirs)}
    files = {"localisation": "multigpu-localisation.json", "healthy": "multigpu-healthy.json",
             "c1": "multigpu-c1-overhead.json", "c2": "multigpu-c2-equivalence.json"}
    written = []
    for k, fn in files.items():
        if "note" in out[k] and len(out[k]) == 1:
            continue  # nothing of this kind in these folders
        with open(os.path.join(outdir, fn), "w") as f:
            json.dump({"source": "bench/gpu/multigpu.sh, bench/gpu/analyze.py mg-all", "dirs": list(dirs), **out[k]},
                      f, indent=1, default=list)
            f.write("\n")
        written.append(fn)
    short = {"written": written, "plan": [{k: p.get(k) for k in ("scenario", "status", "took_s", "rc", "why")} for p in mg_plan(*dirs)]}
    for name, r in out["localisation"].get("runs", {}).items():
        short[name] = {"found": r["all_found"], "agent": r["agent"].get("note", "present"),
                       "expected": [{k: e.get(k) for k in ("rank", "phase", "detected", "detected_rank", "phase_found", "hint_found",
                                                           "seconds_to_verdict", "step_ms_before", "step_ms_after")}
                                    for e in r["expected"]],
                       "other_alerts": [(a["rank"], a["phase"]) for a in r["other_alerts"]],
                       "cohorts_match": r["cohorts"].get("cohort_groups_match_truth"),
                       "steps_per_rank": r["training"]["steps_per_rank"]}
    for name, r in out["healthy"].get("runs", {}).items():
        short[name] = {"false_alerts": r["false_alerts"], "training_seconds": r["training"]["training_seconds"],
                       "meets_10_minutes": r["meets_10_minutes"], "agent": r["agent"].get("note", "present"),
                       "cohorts_match": r["cohorts"].get("cohort_groups_match_truth")}
    c = out["c1"]
    short["mg-c1"] = c.get("note") or {k: c.get(k) for k in ("pairs", "mean_pct", "ci95_low_pct", "ci95_high_pct", "agent_note")}
    c = out["c2"]
    short["c2"] = c.get("note") if len(c) == 1 else {k: c.get(k) for k in ("valid", "loss_identical", "params_identical", "overlap_on", "note")}
    return short


def main(argv):
    if len(argv) < 3:
        sys.exit(__doc__)
    kind, rest = argv[1], argv[2:]
    if kind == "mg-all":
        if len(rest) < 2:
            sys.exit("usage: analyze.py mg-all OUTDIR DIR...")
        res = mg_all(rest[0], *rest[1:])
    elif kind.startswith("mg-"):
        fns = {"mg-loc": mg_loc, "mg-healthy": mg_healthy, "mg-c1": mg_c1, "mg-c2": mg_c2}
        res = fns[kind](*rest)
    else:
        fns = {"smoke": smoke, "c3": c3, "c2": c2, "c1": c1, "cupti": cupti}
        res = fns[kind](*rest)
    print(json.dumps(res, indent=1, default=list))


if __name__ == "__main__":
    main(sys.argv)