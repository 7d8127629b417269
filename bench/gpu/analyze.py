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
Do no harm (issue 15; bench/gpu/stress.sh, coexist.sh, c1matrix.sh, idle_lib.sh):
  analyze.py stress-plan SEED BUDGET_S STOP_S MAX_DRAINING [MIN_CYCLES MIN_KILLS]
                                  the seeded attach/detach/kill schedule (TSV: i action run_s)
  analyze.py stress DIR           trainer survival, steps, cycles, kills, agent log errors
  analyze.py coexist DIR          kernel events per profiled step with and without slowrank
  analyze.py c1m DIR NAME         C1 of one shape: ABBA deltas, bootstrap CI, A/A noise
  analyze.py idle DIR             idle library vs none: turn-taking processes, ABBA
Exposure on one GPU (issue 16 item 1; bench/gpu/host_exposure.sh):
  analyze.py host-exposure DIR [WINDOW_S CONSECUTIVE LATENESS_S HOST_THRESHOLD]
                                  per run DIR/hx-* (start and end host stall): step time from the
                                  ground truth, the stalled rank's GPU idle and collective waits
                                  against its peers', the verdicts after the injection, pass/fail
                                  by the truth: the job's step rose by HOST_THRESHOLD (0.05) or
                                  more -> a host straggler on the stalled rank in time, else none
  analyze.py selftest             the pure functions above on synthetic data
Where the agent's output is absent (a CPU dry run, or the agent failed), the
summaries say so under "agent" instead of failing.
"""
import bisect
import glob
import json
import math
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



# --- do no harm (issue 15): bench/gpu/stress.sh, coexist.sh, c1matrix.sh, idle_lib.sh ---


def stress_plan(seed, budget_s, stop_s, max_draining, min_cycles=500, min_kills=50, lo=0.3, hi=3.0,
                short_hi=0.6, overhead_s=0.08, kill_share=0.15):
    """The seeded schedule of stress.sh: per cycle the agent's run time (from
    its start to the signal, in [lo, hi]) and how it is stopped (int: SIGINT,
    the agent detaches; kill: SIGKILL). A SIGINT'd agent takes stop_s to
    detach and exit; at most max_draining of them may be detaching at once
    (the next start waits for a slot), so SIGINT cycles cannot come faster
    than one per stop_s / max_draining. Run times are a mixture: a share q
    uniform in [lo, short_hi], the rest uniform in [short_hi, hi], q chosen so
    that min_cycles cycles fit into 92 % of budget_s (at most 98 % short, so
    that long runs always occur). Cycles are planned to fill 95 % of the
    budget (the driver stops at the budget); at least min_kills + 10 kills
    fall among the first min_cycles cycles, about kill_share after them."""
    rng = random.Random(seed)
    slot = stop_s / max(1, max_draining)

    def cycle_time(m):
        c = m + overhead_s
        return kill_share * c + (1 - kill_share) * max(c, slot)
    mean_short, mean_long = (lo + short_hi) / 2, (short_hi + hi) / 2
    m_min = 0.98 * mean_short + 0.02 * mean_long
    target = 0.92 * budget_s / min_cycles
    m = m_min
    if cycle_time(m_min) <= target:
        a, b = m_min, mean_long
        for _ in range(60):
            mid = (a + b) / 2
            if cycle_time(mid) <= target:
                a = mid
            else:
                b = mid
        m = a
    q = min(0.98, max(0.0, (mean_long - m) / (mean_long - mean_short)))
    n = max(1, int(0.95 * budget_s / cycle_time(m)))
    runs = [round(rng.uniform(lo, short_hi) if rng.random() < q else rng.uniform(short_hi, hi), 3) for _ in range(n)]
    head = min(n, min_cycles)
    kills = set(rng.sample(range(head), min(head, max(min_kills + 10, round(kill_share * head)))))
    if n > head:
        kills |= set(rng.sample(range(head, n), min(n - head, round(kill_share * (n - head)))))
    plan = [{"i": i, "action": "kill" if i in kills else "int", "run_s": runs[i]} for i in range(n)]
    return {"seed": seed, "budget_s": budget_s, "stop_s": stop_s, "max_draining": max_draining,
            "cycles_planned": n, "kills_planned": len(kills), "mean_run_s": round(statistics.fmean(runs), 3),
            "short_share": round(q, 3), "expected_cycle_s": round(cycle_time(m), 3),
            "fits_min_cycles": n >= min_cycles, "min_cycles": min_cycles, "min_kills": min_kills, "plan": plan}


LOG_LINE = re.compile(r'level=(\w+) msg=("(?:[^"\\]|\\.)*"|\S+)(.*)$')
LOG_KV = re.compile(r'(\w+)=(-?\d+)(?=\s|$)')


def parse_agent_log(path):
    """Counts of one agent log (slog text): lines per level, WARN/ERROR
    messages, libraries attached, whether it began a detach (SIGINT seen),
    the final counters line, and the panics or fatal errors of a Go crash."""
    res = {"levels": {}, "problems": {}, "attached": 0, "stopping": False, "counters": None, "panic": False, "lines": 0}
    if not os.path.exists(path):
        res["missing"] = True
        return res
    with open(path, errors="replace") as f:
        for line in f:
            res["lines"] += 1
            if line.startswith(("panic:", "fatal error:", "SIGSEGV", "unexpected fault")):
                res["panic"] = True
            m = LOG_LINE.search(line)
            if not m:
                continue
            lvl, msg, rest = m.group(1), m.group(2).strip('"'), m.group(3)
            if line.startswith("time="):
                try:
                    ts = datetime.fromisoformat(line[5:line.index(" ")].replace("Z", "+00:00")).timestamp()
                    res["last_ts"] = ts
                    if msg.startswith("stopping: detaching"):
                        res["stopping_ts"] = ts
                except ValueError:
                    pass
            res["levels"][lvl] = res["levels"].get(lvl, 0) + 1
            if msg == "attached":
                res["attached"] += 1
            elif msg.startswith("stopping: detaching"):
                res["stopping"] = True
            elif msg == "counters":
                res["counters"] = {k: int(v) for k, v in LOG_KV.findall(rest)}
            if lvl in ("WARN", "ERROR"):
                key = lvl + " " + re.sub(r"\d+", "N", msg)[:100]
                res["problems"][key] = res["problems"].get(key, 0) + 1
    return res


FATAL_PATTERNS = ("Fatal Python error", "Segmentation fault", "core dumped", "Traceback (most recent call last)",
                  "CUDA error", "NCCL error", "illegal memory access", "Aborted", "ncclInternalError")


def trainer_health(run_dir, log_path):
    """A training run's steps, losses and the fatal patterns of its log."""
    rows = jsonl(os.path.join(run_dir, "rank0.jsonl"))
    steps = [r for r in rows if "step_ms" in r]
    final = next((r for r in rows if r.get("final")), None)
    fatal = {}
    if os.path.exists(log_path):
        with open(log_path, errors="replace") as f:
            for line in f:
                for p in FATAL_PATTERNS:
                    if p in line:
                        fatal[p] = fatal.get(p, 0) + 1
    losses = [r["loss"] for r in steps]
    return {"steps": len(steps), "final_record": final is not None,
            "loss_finite": bool(losses) and all(math.isfinite(x) for x in losses),
            "first_loss": losses[0] if losses else None, "last_loss": losses[-1] if losses else None,
            "fatal_patterns": fatal, "steps_rows": steps, "events": [r for r in rows if "event" in r]}


def median_ms(steps, start_ns=None, end_ns=None):
    xs = [s["step_ms"] for s in steps if (start_ns is None or s["start_ns"] >= start_ns) and (end_ns is None or s["end_ns"] <= end_ns)]
    return (round(statistics.median(xs), 3) if xs else None), len(xs)


def quantiles(xs, ps=(0.5, 0.9, 0.99, 1.0)):
    if not xs:
        return {}
    xs = sorted(xs)
    return {f"p{int(p * 100)}": xs[min(len(xs) - 1, int(p * (len(xs) - 1) + 0.5))] for p in ps}


def stress(d):
    meta = {}
    try:
        with open(os.path.join(d, "stress-meta.json")) as f:
            meta = json.load(f)
    except (OSError, json.JSONDecodeError):
        pass
    cycles = jsonl(os.path.join(d, "cycles.jsonl"))
    logs = {c["i"]: parse_agent_log(os.path.join(d, "cyc", f"{c['i']}.log")) for c in cycles}
    ints = [c for c in cycles if c["action"] == "int"]
    kills = [c for c in cycles if c["action"] == "kill"]
    stop_ms = [round((c["exit_us"] - c["sig_us"]) / 1000) for c in ints if c.get("exit_us") and c.get("sig_us")]
    detach_ms = [round(1000 * (lg["last_ts"] - lg["stopping_ts"])) for lg in logs.values() if "stopping_ts" in lg]
    problems, levels, counter_errs = {}, {}, {}
    for lg in logs.values():
        for k, v in lg["problems"].items():
            problems[k] = problems.get(k, 0) + v
        for k, v in lg["levels"].items():
            levels[k] = levels.get(k, 0) + v
        for k, v in (lg["counters"] or {}).items():
            if v and ("error" in k or "lost" in k or "dropped" in k or "timeout" in k or "failed" in k):
                counter_errs[k] = counter_errs.get(k, 0) + v
    phases = {p["phase"]: p for p in jsonl(os.path.join(d, "phases.jsonl"))}
    th = trainer_health(os.path.join(d, "stress-train"), os.path.join(d, "stress-train-train.log"))
    med = {}
    for name in ("pre", "stress", "post"):
        p = phases.get(name)
        med[name] = median_ms(th["steps_rows"], p["start_ns"], p["end_ns"]) if p else (None, 0)
    rc = meta.get("trainer_rc")
    res = {
        "seed": meta.get("seed"), "stress_seconds": meta.get("stress_seconds"), "plan": meta.get("plan"),
        "calibration": meta.get("calibration"),
        "cycles": len(cycles), "cycles_int": len(ints), "kills": len(kills),
        "attaches": sum(1 for c in cycles if logs[c["i"]]["attached"] > 0),
        "detaches": sum(1 for c in ints if c.get("rc") == 0 and logs[c["i"]]["stopping"]),
        "int_rc_nonzero": sum(1 for c in ints if c.get("rc") not in (0, None)),
        "int_forced_kill": sum(1 for c in ints if c.get("forced")),
        "int_before_handler": sum(1 for c in ints if c.get("rc") == 130),
        "kill_rc_other": sum(1 for c in kills if c.get("rc") not in (137, None)),
        "agent_panics": sum(1 for lg in logs.values() if lg["panic"]),
        "agent_log_levels": levels, "agent_problems": dict(sorted(problems.items(), key=lambda kv: -kv[1])[:20]),
        "agent_error_lines": levels.get("ERROR", 0), "agent_counter_losses": counter_errs,
        "stop_ms": quantiles(stop_ms), "stop_ms_note": "SIGINT to the driver seeing the exit (an upper bound: the driver looks between cycles)",
        "detach_ms_from_log": quantiles(detach_ms), "max_draining_seen": max((c.get("draining", 0) for c in cycles), default=0),
        "trainer_rc": rc, "trainer_steps": th["steps"], "trainer_final_record": th["final_record"],
        "loss_finite": th["loss_finite"], "first_loss": th["first_loss"], "last_loss": th["last_loss"],
        "trainer_fatal_patterns": th["fatal_patterns"],
        "step_ms_median": {k: v[0] for k, v in med.items()}, "steps_in_phase": {k: v[1] for k, v in med.items()},
    }
    pre, post = med["pre"][0], med["post"][0]
    res["post_over_pre"] = round(post / pre, 4) if pre and post else None
    res["crashes"] = (0 if rc == 0 else 1) + len(th["fatal_patterns"])
    res["trainer_survived"] = rc == 0 and not th["fatal_patterns"] and th["loss_finite"] and th["steps"] > 0
    res["meets_issue"] = res["trainer_survived"] and res["cycles"] >= 500 and res["kills"] >= 50
    return res


def profile_counts(path):
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, json.JSONDecodeError) as e:
        return {"error": f"{path}: {e}"}


def gpu_facts_split(facts, t_start, t_end):
    """Steps of the agent's facts with and without device records, before,
    during and after a time window (monotonic ns)."""
    out = {k: {"steps": 0, "gpu": 0} for k in ("before", "during", "after")}
    for f in facts:
        if f.get("kind") != "step":
            continue
        e = f.get("end_ns", 0)
        k = "before" if t_start is not None and e < t_start else "after" if t_end is not None and e > t_end else "during"
        out[k]["steps"] += 1
        out[k]["gpu"] += 1 if f.get("gpu") else 0
    return out


KINETO_WARNING = re.compile(r"(Exceeded max GPU buffer|unknown buffer|CUPTI_ERROR|cupti\w*\(\) failed|Kineto.*(?:WARN|ERROR))", re.I)


def kineto_warnings(log_path):
    """Kineto's and CUPTI's warnings in a training log, by message (numbers masked)."""
    res = {}
    if os.path.exists(log_path):
        with open(log_path, errors="replace") as f:
            for line in f:
                if KINETO_WARNING.search(line):
                    key = re.sub(r"\d+", "N", line.strip())[-120:]
                    res[key] = res.get(key, 0) + 1
    return res


def rss_summary(path, stop_ns, until_ns=None):
    """A trainer's VmRSS samples (mono ns, kB) up to until_ns (the trace's parse
    after training, which is the analysis's memory, not the job's): MB at the
    profiler window's end, the most after it, at the last sample, and the
    growth from the end to the last."""
    rows = []
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                p = line.split()
                if len(p) == 2 and (until_ns is None or int(p[0]) < until_ns):
                    rows.append((int(p[0]), int(p[1]) / 1024))
    if not rows:
        return None
    res = {"samples": len(rows), "max_mb": round(max(r for _, r in rows), 1), "last_mb": round(rows[-1][1], 1)}
    if stop_ns:
        after = [r for t, r in rows if t >= stop_ns]
        at = next((r for t, r in rows if t >= stop_ns), rows[-1][1])
        res.update({"at_window_end_mb": round(at, 1), "max_after_window_mb": round(max(after), 1) if after else None,
                    "growth_after_window_mb": round(rows[-1][1] - at, 1)})
    return res


def coexist(d):
    runs = {}
    for r in ("a", "b", "c"):
        name = f"co-{r}"
        prof = profile_counts(os.path.join(d, name + "-prof.json"))
        th = trainer_health(os.path.join(d, name), os.path.join(d, name + "-train.log"))
        ev = {e["event"]: e for e in th["events"]}
        k = prof.get("kernels") or []
        run = {"kernels_per_step": k, "kernels_median": statistics.median(k) if k else None,
               "kernels_mean": round(statistics.fmean(k), 1) if k else None,
               "device_events_per_step": prof.get("device_events"), "parse_error": prof.get("parse_error") or prof.get("error"),
               "parse_s": prof.get("parse_s"), "trainer_steps": th["steps"], "loss_finite": th["loss_finite"],
               "fatal_patterns": th["fatal_patterns"], "profiler_error": (ev.get("profiler_error") or {}).get("error")}
        ps, pe = ev.get("profiler_start"), ev.get("profiler_stop")
        run["profiler_window_s"] = round((pe["mono_ns"] - ps["mono_ns"]) / 1e9, 2) if ps and pe else None
        pp = ev.get("profile_parse")
        run["rss"] = rss_summary(os.path.join(d, name + "-rss.txt"), pe and pe["mono_ns"], pp and pp["mono_ns"])
        run["kineto_warnings"] = kineto_warnings(os.path.join(d, name + "-train.log"))
        meta = {}
        try:
            with open(os.path.join(d, name + "-agent.json")) as f:
                meta = json.load(f)
        except (OSError, json.JSONDecodeError):
            pass
        run["agent"] = meta or None
        facts = jsonl(os.path.join(d, name + "-facts.jsonl"))
        if facts or meta:
            split = gpu_facts_split(facts, ps and ps["mono_ns"], pe and pe["mono_ns"])
            run["agent_steps"] = split
            run["collected_after_profiler"] = split["after"]["gpu"] > 0
            run["agent_log"] = {k: v for k, v in parse_agent_log(os.path.join(d, name + "-agent.log")).items()
                                if k in ("levels", "problems", "attached", "counters")}
        if r == "c" and meta.get("agent_start_ns") and k:
            # kernels of the steps that began after the agent's start
            ends = {s["step"]: s for s in th["steps_rows"]}
            after = [n for lab, n in zip(prof.get("labels") or [], k)
                     if int(lab.split("#")[1]) in ends and ends[int(lab.split("#")[1])]["start_ns"] >= meta["agent_start_ns"]]
            before = [n for lab, n in zip(prof.get("labels") or [], k)
                      if int(lab.split("#")[1]) in ends and ends[int(lab.split("#")[1])]["end_ns"] < meta["agent_start_ns"]]
            run["kernels_median_before_agent"] = statistics.median(before) if before else None
            run["kernels_median_after_agent"] = statistics.median(after) if after else None
            run["steps_after_agent"] = len(after)
        runs[r] = run
    a = runs["a"]["kernels_median"]

    def ratio(x):
        return round(x / a, 4) if a and x is not None else None
    res = {"runs": runs, "ratio_b_over_a": ratio(runs["b"]["kernels_median"]),
           "ratio_c_over_a": ratio(runs["c"]["kernels_median"]),
           "ratio_c_after_agent_over_a": ratio(runs["c"].get("kernels_median_after_agent"))}
    return res


def aa_noise(blocks, arm="off"):
    """A/A noise from the blocks of one arm (in time order): disjoint pairs of
    consecutive blocks, the ratio oriented alternately (later/earlier, then
    earlier/later) as the ABBA pairs are, so that a linear drift cancels."""
    xs = [b["mean_ms"] for b in blocks if b.get("arm") == arm and b.get("mean_ms")]
    deltas = []
    for j in range(len(xs) // 2):
        e, l = xs[2 * j], xs[2 * j + 1]
        deltas.append(100 * (l / e - 1) if j % 2 == 0 else 100 * (e / l - 1))
    return ci_summary(deltas)


def ci_summary(deltas):
    lo, hi = bootstrap_ci(deltas) if len(deltas) >= 2 else (None, None)
    return {"pairs": len(deltas), "deltas_pct": [round(x, 4) for x in deltas],
            "mean_pct": round(statistics.fmean(deltas), 4) if deltas else None,
            "ci95_pct": [None if lo is None else round(lo, 4), None if hi is None else round(hi, 4)],
            "sd_pct": round(statistics.stdev(deltas), 4) if len(deltas) >= 2 else None}


def block_means(blocks, steps):
    out = []
    for b in blocks:
        xs = [s["step_ms"] for s in steps if s["start_ns"] >= b["start_ns"] and s["end_ns"] <= b["end_ns"]]
        out.append({**b, "steps": len(xs), "mean_ms": statistics.fmean(xs) if xs else None})
    return out


def arm_deltas(blocks):
    """Each arm's deltas against the OFF block of the same round (pair), with
    their bootstrap CI: the budget split's arms (uprobes, full, on)."""
    rounds = {}
    for b in blocks:
        rounds.setdefault(b["pair"], {})[b["arm"]] = b.get("mean_ms")
    arms = sorted({b["arm"] for b in blocks} - {"off", "a1", "a2"})
    res = {}
    for arm in arms:
        deltas = [100 * (v[arm] / v["off"] - 1) for _, v in sorted(rounds.items()) if v.get(arm) and v.get("off")]
        res[arm] = ci_summary(deltas)
    return res


def linfit(xs, ys):
    """Least squares y = a + b x: (a, b, r2); b = 0 when x does not vary."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    syy = sum((y - my) ** 2 for y in ys)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sxx if sxx > 0 else 0.0
    r2 = (b * b * sxx / syy) if syy > 0 and sxx > 0 else 0.0
    return my - b * mx, b, r2


def clock_adjusted(pairs, n=20000, seed=1):
    """ANCOVA on the pair differences: d_i = ln(on_i/off_i) and x_i =
    ln(clk_on_i/clk_off_i) (the blocks' mean SM clock); d = c + b x, where c
    is the effect at equal clocks. The bootstrap resamples pairs and refits.
    Pairs: [(on_ms, off_ms, on_mhz, off_mhz)]. An agent that made the GPU
    idle would raise its clock (x > 0, b < 0): the adjustment then adds to
    the effect, never hides it."""
    ds = [math.log(on / off) for on, off, _, _ in pairs]
    xs = [math.log(con / coff) for _, _, con, coff in pairs]
    c, b, r2 = linfit(xs, ds)
    rng = random.Random(seed)
    cs = []
    for _ in range(n):
        idx = rng.choices(range(len(pairs)), k=len(pairs))
        cs.append(linfit([xs[i] for i in idx], [ds[i] for i in idx])[0])
    cs.sort()
    pct = lambda v: round(100 * (math.exp(v) - 1), 4)  # noqa: E731
    return {"pairs": len(pairs), "effect_pct": pct(c), "ci95_pct": [pct(cs[int(0.025 * n)]), pct(cs[int(0.975 * n) - 1])],
            "slope": round(b, 4), "r2": round(r2, 4), "residual_sd_pct": round(100 * statistics.stdev(
                [d - c - b * x for d, x in zip(ds, xs)]), 4) if len(pairs) >= 3 else None}


def gpu_clock(d, name, blocks):
    """The GPU's SM clock per block (gpu_sampler_start in dnh_common.sh) and
    the C1 pairs adjusted for it (clock_adjusted), with the same adjustment
    applied to the A/A pairs of consecutive OFF blocks as a check; None
    without samples (no nvidia-smi)."""
    samples = [s for s in jsonl(os.path.join(d, name + "-gpu.jsonl")) if s.get("sm_mhz")]
    if not samples:
        return None
    spans = {(b["pair"], b["arm"]): b for b in jsonl(os.path.join(d, name + "-blocks.jsonl"))}
    per = []
    for b in blocks:
        t = spans.get((b["pair"], b["arm"]))
        xs = [s for s in samples if t and t["start_ns"] <= s["mono_ns"] <= t["end_ns"]]
        mean = (lambda k: round(statistics.fmean(s[k] for s in xs if s.get(k) is not None), 2)
                if any(s.get(k) is not None for s in xs) else None)
        per.append({**b, "samples": len(xs), "sm_mhz": mean("sm_mhz"), "power_w": mean("power_w"),
                    "temp_c": mean("temp_c"), "reasons": sorted({s["reasons"] for s in xs if s.get("reasons")})})
    ok = [b for b in per if b["sm_mhz"] and b.get("mean_ms")]
    offs = [b for b in ok if b["arm"] == "off"]
    res = {"samples": len(samples), "sm_mhz_range": [min(s["sm_mhz"] for s in samples), max(s["sm_mhz"] for s in samples)],
           "blocks": [{k: b[k] for k in ("pair", "arm", "samples", "mean_ms", "sm_mhz", "power_w", "temp_c", "reasons")} for b in per]}
    if len(offs) >= 3:
        _, slope, r2 = linfit([math.log(b["sm_mhz"]) for b in offs], [math.log(b["mean_ms"]) for b in offs])
        res["off_blocks_fit"] = {"blocks": len(offs), "slope": round(slope, 4), "r2": round(r2, 4)}
    rounds = {}
    for b in ok:
        rounds.setdefault(b["pair"], {})[b["arm"]] = b
    arms = sorted({b["arm"] for b in ok} - {"off", "a1", "a2"})
    res["arms"] = {}
    for arm in arms:
        pairs = [(v[arm]["mean_ms"], v["off"]["mean_ms"], v[arm]["sm_mhz"], v["off"]["sm_mhz"])
                 for _, v in sorted(rounds.items()) if arm in v and "off" in v]
        if len(pairs) >= 3:
            res["arms"][arm] = clock_adjusted(pairs)
    aa = []
    for j in range(len(offs) // 2):  # oriented as aa_noise orients them
        e, l = offs[2 * j], offs[2 * j + 1]
        first, second = (l, e) if j % 2 == 0 else (e, l)
        aa.append((first["mean_ms"], second["mean_ms"], first["sm_mhz"], second["sm_mhz"]))
    if len(aa) >= 3:
        res["aa_off_blocks"] = clock_adjusted(aa)
    return res


def c1m(d, name):
    """C1 of one shape (c1matrix.sh): c1()'s ABBA deltas and bootstrap CI over
    pairs, with the A/A noise of the OFF blocks and of any extra A/A pairs."""
    base = c1(d, name)
    blocks = base["blocks"]
    res = {"shape": None, "pairs": base["pairs"], "deltas_pct": base["deltas_pct"], "mean_pct": base["mean_pct"],
           "ci95_pct": [base["ci95_low_pct"], base["ci95_high_pct"]],
           "sd_pct": round(statistics.stdev(base["deltas_pct"]), 4) if len(base["deltas_pct"]) >= 2 else None,
           "steps_per_block": [b["steps"] for b in blocks], "blocks": blocks, "design": base["design"]}
    res["shape"] = (base["design"] or {}).get("shape")
    res["noise_off_blocks"] = aa_noise(blocks, "off")
    aa = {}
    for b in blocks:
        if b["arm"] in ("a1", "a2") and b.get("mean_ms"):
            aa.setdefault(b["pair"], {})[b["arm"]] = b["mean_ms"]
    extra = [100 * (v["a2"] / v["a1"] - 1) for _, v in sorted(aa.items()) if "a1" in v and "a2" in v]
    res["noise_extra_aa"] = ci_summary(extra) if extra else None
    res["arms"] = arm_deltas(blocks)
    res["gpu_clock"] = gpu_clock(d, name, blocks)
    res["on_status"] = jsonl(os.path.join(d, name + "-on-status.jsonl"))
    offs = [b["mean_ms"] for b in blocks if b["arm"] == "off" and b.get("mean_ms")]
    res["off_step_ms_mean"] = round(statistics.fmean(offs), 3) if offs else None
    res["off_block_cv_pct"] = round(100 * statistics.stdev(offs) / statistics.fmean(offs), 4) if len(offs) >= 2 else None
    for extra_file in ("warm", "otlp"):
        try:
            with open(os.path.join(d, f"{name}-{extra_file}.json")) as f:
                res[extra_file] = json.load(f)
        except (OSError, json.JSONDecodeError):
            res[extra_file] = None
    logs = sorted(glob.glob(os.path.join(d, f"{name}-p*-agent.log")))
    sums, problems = {}, {}
    for p in logs:
        lg = parse_agent_log(p)
        for k, v in (lg["counters"] or {}).items():
            if k.startswith("otel_") or "error" in k:
                sums[k] = sums.get(k, 0) + v
        for k, v in lg["problems"].items():
            problems[k] = problems.get(k, 0) + v
    res["agent_runs"] = len(logs)
    res["agent_counters_sum"] = {k: v for k, v in sorted(sums.items()) if v}
    res["agent_problems"] = problems
    res["bar_pct"] = 0.5
    res["below_bar"] = res["ci95_pct"][1] is not None and res["ci95_pct"][1] < 0.5
    return res


def idle(d):
    """Idle library vs none (idle_lib.sh): processes that take turns on the
    GPU; blocks {pair, arm (lib|bare|x|y), proc, kind (ab|aa), start_ns, end_ns}."""
    blocks = jsonl(os.path.join(d, "idle-blocks.jsonl"))
    procs = {b["proc"] for b in blocks}
    steps = {p: [s for s in jsonl(os.path.join(d, p, "rank0.jsonl")) if "step_ms" in s] for p in procs}
    means = []
    for b in blocks:
        means.append(block_means([b], steps.get(b["proc"], []))[0])
    pairs = {}
    for b in means:
        pairs.setdefault((b["kind"], b["pair"]), {})[b["arm"]] = b
    ab, aa = [], []
    for (kind, p), v in sorted(pairs.items()):
        if kind == "ab" and v.get("lib", {}).get("mean_ms") and v.get("bare", {}).get("mean_ms"):
            ab.append(100 * (v["lib"]["mean_ms"] / v["bare"]["mean_ms"] - 1))
        if kind == "aa" and v.get("x", {}).get("mean_ms") and v.get("y", {}).get("mean_ms"):
            aa.append(100 * (v["y"]["mean_ms"] / v["x"]["mean_ms"] - 1))
    health = {p: {k: v for k, v in trainer_health(os.path.join(d, p), os.path.join(d, p + "-train.log")).items()
                  if k in ("steps", "loss_finite", "fatal_patterns", "final_record")} for p in sorted(procs)}
    design = {}
    try:
        with open(os.path.join(d, "idle-design.json")) as f:
            design = json.load(f)
    except (OSError, json.JSONDecodeError):
        pass
    return {"lib_vs_bare": ci_summary(ab), "aa_same_arm_other_process": ci_summary(aa),
            "blocks": [{k: b.get(k) for k in ("kind", "pair", "arm", "proc", "steps", "mean_ms")} for b in means],
            "processes": health, "design": design}


# --- exposure of a host stall on one GPU (bench/gpu/host_exposure.sh) --------

HX_PHASES = ("step", "host", "sync_wait", "coll_wait", "idle", "compute")


def hx_truth(truth, inj_ns, skip_s=5.0, settle_s=1.0):
    """Ground truth around the injection: every rank's median step time
    before it (after the first skip_s s of the loop) and after it (from
    settle_s s on), and per rank the wait in the end-of-step synchronisation
    (sync_ms: the GPU queue left when the host reached it)."""
    steps = [s for r in truth.values() for s in r["steps"]]
    if not steps or inj_ns is None:
        return {"steps": len(steps)}
    t0 = min(s["start_ns"] for s in steps) + skip_s * 1e9
    pre = [s for s in steps if t0 <= s["start_ns"] < inj_ns]
    post = [s for s in steps if s["start_ns"] >= inj_ns + settle_s * 1e9]
    b, a = median_or_none([s["step_ms"] for s in pre]), median_or_none([s["step_ms"] for s in post])
    res = {"steps_before": len(pre), "steps_after": len(post), "step_ms_before": b, "step_ms_after": a,
           "step_rise_ms": round(a - b, 3) if a is not None and b is not None else None,
           "step_rise_pct": round(100 * (a / b - 1), 2) if a is not None and b else None}
    sync = {}
    for rank, r in sorted(truth.items()):
        xs = [(s["start_ns"], s["sync_ms"]) for s in r["steps"] if "sync_ms" in s]
        if xs:
            sync[rank] = {"before": median_or_none([v for t, v in xs if t0 <= t < inj_ns]),
                          "after": median_or_none([v for t, v in xs if t >= inj_ns + settle_s * 1e9])}
    if sync:
        res["sync_ms"] = sync
    return res


def hx_phases(facts, inj_ns, rank, settle_s=1.0):
    """The agent's per-phase medians, before and after the injection, of the
    stalled rank and the median over its peers; the device-record steps."""
    split = inj_ns + settle_s * 1e9
    res = {}
    for ph in HX_PHASES:
        pre, post = {}, {}
        for f in facts:
            if f.get("kind") == "step" and ph in (f.get("phases") or {}):
                if f["end_ns"] < inj_ns:
                    pre.setdefault(f["rank"], []).append(f["phases"][ph])
                elif f["end_ns"] >= split:
                    post.setdefault(f["rank"], []).append(f["phases"][ph])
        if not pre and not post:
            continue
        row = {}
        for when, d in (("before", pre), ("after", post)):
            row["rank_" + when] = median_or_none(d.get(rank, []))
            peers = [statistics.median(v) for r, v in d.items() if r != rank and v]
            row["peers_" + when] = median_or_none(peers)
        for who in ("rank", "peers"):
            b, a = row[who + "_before"], row[who + "_after"]
            row[who + "_change"] = round(a - b, 3) if a is not None and b is not None else None
        res[ph] = row
    gpu = {}
    for f in facts:
        if f.get("kind") == "step" and f["end_ns"] >= split:
            g = gpu.setdefault(f["rank"], [0, 0])
            g[0] += 1
            g[1] += 1 if f.get("gpu") else 0
    res["device_record_steps_after"] = {r: {"steps": n, "with_device_records": k} for r, (n, k) in sorted(gpu.items())}
    return res


def hx_judge(mode, host_rank, inj, verdicts, logged, expect_alert, window_s=5.0, consecutive=3, lateness_s=2.0):
    """Pass/fail of one run from the agent's verdicts after the injection,
    against what the truth says the stall did (expect_alert: the job's step
    rose by the host threshold or more). Alert expected: the first host
    straggler after the injection is host_rank, no other rank gets a host
    alert, and it comes within (consecutive + 1) windows (the injection falls
    inside a window) plus the lateness allowance. None expected: no host
    straggler at all. mode (start/end, where the stall sits) and the hidden
    windows (ok verdicts with exposure.exposed false, --emit-ok) are reported,
    not judged."""
    inj_ns, inj_wall = inj["mono_ns"], inj["wall"]
    after = [v for v in verdicts if v.get("window_end_ns", 0) > inj_ns]
    mine = [v for v in after if v.get("rank") == host_rank and v.get("phase") == "host"]
    host_alerts = [v for v in after if v.get("phase") == "host" and v.get("state") == "straggler"]
    alert_ranks = sorted({v["rank"] for v in host_alerts})
    hidden = [v for v in mine if v.get("state") == "ok" and (v.get("exposure") or {}).get("exposed") is False]
    exposed = [v for v in mine if (v.get("exposure") or {}).get("exposed") is True]
    capped = [v for v in mine if (v.get("exposure") or {}).get("capped")]
    limit_s = (consecutive + 1) * window_s + lateness_s
    res = {"mode": mode, "host_rank": host_rank, "limit_s": limit_s, "expect_alert": expect_alert,
           "host_verdicts_of_rank": len(mine), "states": {},
           "exposed_windows": len(exposed), "hidden_windows": len(hidden), "capped_windows": len(capped),
           "host_alert_ranks": alert_ranks,
           "other_alerts": sorted({(v["rank"], v["phase"]) for v in after if v.get("state") == "straggler"
                                   and v.get("phase") != "host"})}
    for v in mine:
        res["states"][v["state"]] = res["states"].get(v["state"], 0) + 1
    ev = {}
    for v in mine:
        e = (v.get("exposure") or {}).get("evidence")
        if e:
            ev[e] = ev.get(e, 0) + 1
    res["exposure_evidence"] = ev
    first = next((v for v in mine if v.get("state") == "straggler"), None)
    sample = first or (exposed[0] if exposed else (hidden[0] if hidden else (mine[0] if mine else None)))
    if sample:
        res["sample_verdict"] = {k: sample.get(k) for k in ("window", "state", "deviation", "value_ms", "reference_ms",
                                                             "reference_rank", "hint", "reason", "exposure")}
    if first:
        res["alert_window_end_after_s"] = round((first["window_end_ns"] - inj_ns) / 1e9, 2)
    logs = [l for l in logged if l["rank"] == host_rank and l["phase"] == "host" and l["wall"] >= inj_wall]
    if logs:
        res["alert_logged_after_s"] = round(logs[0]["wall"] - inj_wall, 2)
    if expect_alert:
        t = res.get("alert_logged_after_s", res.get("alert_window_end_after_s"))
        res["in_time"] = t is not None and t <= limit_s
        res["pass"] = bool(first) and alert_ranks == [host_rank] and res["in_time"]
        res["criterion"] = (f"the job's step rose by the host threshold: rank {host_rank} / host straggler within "
                            f"{limit_s:g} s of the injection, no other rank's host alert")
    else:
        res["pass"] = not host_alerts
        res["criterion"] = "the job's step rose less than the host threshold: no host straggler after the injection"
    return res


def hx_steps(facts, truth):
    """Issue 16's steps check against the truth: per rank the step facts, the
    iterations, and which iteration each fact ends in (the one whose start
    precedes its end: a gloo step is cut after the last bucket's all-reduce,
    inside the truth's iteration, which ends after the optimizer and the
    device synchronisation); the first such iteration, how many iterations
    got none or several facts, and whether step k ends in the same iteration
    on every rank. Pass: first iteration <= 1 and facts = iterations +-1."""
    by = {}
    for f in facts:
        if f.get("kind") == "step":
            by.setdefault(f["rank"], []).append(f)
    out, iter_of = {}, {}
    for r, v in sorted(truth.items()):
        starts = [s["start_ns"] for s in v["steps"]]
        its = [bisect.bisect_right(starts, f["end_ns"]) - 1 for f in by.get(r, [])]
        for f, it in zip(by.get(r, []), its):
            iter_of.setdefault(f["step"], {})[r] = it
        n, seen = len(starts), set(its)
        first = min(its) if its else None
        out[r] = {"facts": len(its), "iterations": n, "first_iteration": first,
                  "iterations_without": n - len(seen & set(range(n))), "several": len(its) - len(seen),
                  "pass": first is not None and first <= 1 and abs(len(its) - n) <= 1 and len(its) == len(seen)}
    mixed = sum(1 for rs in iter_of.values() if len(set(rs.values())) > 1)
    return {"per_rank": out, "steps_on_several_iterations": mixed,
            "pass": bool(out) and mixed == 0 and all(x["pass"] for x in out.values())}


def hx_run(d, name, window_s=5.0, consecutive=3, lateness_s=2.0, threshold=0.05):
    run_dir = os.path.join(d, name)
    truth = mg_truth(run_dir)
    agent, paths = mg_agent(d, name)
    injs = {r: v["injection"] for r, v in truth.items() if v["injection"]}
    stalled = [r for r, i in injs.items() if i.get("slow_host_ms")]
    res = {"agent": agent, "training": mg_training(truth)}
    if not stalled:
        res["note"] = "no rank wrote an injection_start with slow_host_ms (the run ended before the injection?)"
        res["pass"] = False
        return res
    rank = stalled[0]
    inj = injs[rank]
    mode = inj.get("slow_host_at") or "end"
    tails = [row for p in glob.glob(os.path.join(run_dir, "rank*.jsonl")) for row in jsonl(p) if row.get("tail_gpu")]
    res.update({"mode": mode, "host_rank": rank, "host_ms": inj["slow_host_ms"], "injection_step": inj["step"],
                "tail_gpu": {"ms": tails[0]["tail_gpu_ms"], "iters": tails[0]["iters"],
                             "matmul_ms": sorted(t["matmul_ms"] for t in tails)} if tails else None,
                "truth": hx_truth(truth, inj["mono_ns"])})
    tr = res["truth"]
    if tr.get("step_rise_ms") is not None:
        # As designed: start lengthens the step by about the stall, end hides.
        rise, ms = tr["step_rise_ms"], inj["slow_host_ms"]
        tr["as_designed"] = rise >= 0.5 * ms if mode == "start" else rise < 0.25 * ms
    facts = jsonl(paths["facts.jsonl"])
    verdicts = jsonl(paths["verdicts.jsonl"])
    summ = [v for v in verdicts if v.get("kind") == "summary"]
    verdicts = [v for v in verdicts if v.get("kind") == "verdict"]
    if facts:
        res["facts"] = facts_summary(paths["facts.jsonl"])
        res["agent_phases"] = hx_phases(facts, inj["mono_ns"], rank)
        res["steps_vs_truth"] = hx_steps(facts, truth)
    if summ:
        res["summary"] = {k: summ[-1].get(k) for k in ("stragglers", "worst_rank", "worst_phase", "windows",
                                                        "alerts", "hidden_deviations")}
    if not verdicts and not summ:
        res["pass"] = False
        res["note"] = agent.get("note", "no verdicts from the agent")
        return res
    if tr.get("step_rise_pct") is None:
        res["pass"] = False
        res["note"] = "no truth step time before and after the injection: nothing to judge by"
        return res
    # Judged by the truth, whatever the design: the job's step rose by the
    # host threshold (a straggler), or less (none).
    expect = tr["step_rise_pct"] >= 100 * threshold
    j = hx_judge(mode, rank, inj, verdicts, straggler_log(paths["agent.log"]), expect, window_s, consecutive, lateness_s)
    res["judgement"] = j
    res["truth_rise_pct"], res["pass"] = tr["step_rise_pct"], j["pass"]
    return res


def host_exposure(d, window_s=5.0, consecutive=3, lateness_s=2.0, threshold=0.05):
    window_s, consecutive, lateness_s, threshold = float(window_s), int(consecutive), float(lateness_s), float(threshold)
    names = sorted(os.path.basename(os.path.dirname(p)) for p in glob.glob(os.path.join(d, "hx-*", "rank0.jsonl")))
    res = {"runs": {n: hx_run(d, n, window_s, consecutive, lateness_s, threshold) for n in names},
           "window_s": window_s, "consecutive": consecutive, "lateness_s": lateness_s, "host_threshold": threshold}
    plan = os.path.join(d, "plan.jsonl")
    if os.path.exists(plan):
        res["plan"] = jsonl(plan)
    res["pass"] = bool(names) and all(r.get("pass") for r in res["runs"].values())
    res["modes"] = {n: r.get("mode") for n, r in res["runs"].items()}
    res["by_truth"] = {n: {"truth_rise_pct": r.get("truth_rise_pct"), "expect_alert": (r.get("judgement") or {}).get("expect_alert"),
                           "host_alert_ranks": (r.get("judgement") or {}).get("host_alert_ranks"), "pass": r.get("pass")}
                       for n, r in res["runs"].items()}
    if not names:
        res["note"] = "no run folder hx-*/rank0.jsonl"
    return res


def selftest():
    import importlib.util
    import shutil
    import tempfile
    passed, failed = [0], []

    def check(name, cond):
        if cond:
            passed[0] += 1
        else:
            failed.append(name)
            print("FAIL", name)
    # stress_plan
    p = stress_plan(7, 390, 5.8, 10)
    check("plan fits", p["fits_min_cycles"])
    check("plan kills in first 500", sum(1 for c in p["plan"][:500] if c["action"] == "kill") >= 50)
    check("plan bounds", all(0.3 <= c["run_s"] <= 3.0 for c in p["plan"]))
    check("plan has long runs", any(c["run_s"] > 2 for c in p["plan"]))
    check("plan seeded", stress_plan(7, 390, 5.8, 10)["plan"] == p["plan"] and stress_plan(8, 390, 5.8, 10)["plan"] != p["plan"])
    est = sum(c["run_s"] + 0.08 for c in p["plan"][:500])
    check("plan 500 cycles fit the budget when drains do not block", est < 390)
    q = stress_plan(7, 390, 5.8, 1)
    check("sequential plan says it does not fit", not q["fits_min_cycles"] and q["cycles_planned"] < 500)
    # count_per_step of ext_train (no torch needed)
    spec = importlib.util.spec_from_file_location("ext_train", os.path.join(os.path.dirname(os.path.abspath(__file__)), "ext_train.py"))
    et = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(et)
    steps = [("ext_step#2", 200.0, 290.0), ("ext_step#1", 100.0, 190.0)]
    dev = [(50.0, True), (110.0, True), (150.0, False), (195.0, True), (210.0, True), (400.0, True)]
    r = et.count_per_step(steps, dev)
    check("count labels ordered", r["labels"] == ["ext_step#1", "ext_step#2"])
    check("count kernels", r["kernels"] == [2, 2] and r["device_events"] == [3, 2] and r["before_first_step"] == 1)
    check("kernel_like", et.kernel_like("ampere_sgemm") and not et.kernel_like("Memcpy HtoD (Pageable -> Device)")
          and not et.kernel_like("Memset (Device)"))
    tmp = tempfile.mkdtemp(prefix="dnh-selftest-")
    try:
        # agent log parsing
        os.makedirs(os.path.join(tmp, "cyc"))
        lines = ['time=2026-01-01T00:00:00Z level=INFO msg=attached component=agent library=libnccl.so.2 probes=18',
                 'time=2026-01-01T00:00:00Z level=WARN msg="pause: untrack process" pid=12 err=x',
                 'time=2026-01-01T00:00:01Z level=INFO msg="stopping: detaching and settling the last window"',
                 'time=2026-01-01T00:00:02Z level=INFO msg=counters duty_write_errors=2 events=100 ringbuf_lost=0']
        with open(os.path.join(tmp, "cyc", "0.log"), "w") as f:
            f.write("\n".join(lines) + "\n")
        lg = parse_agent_log(os.path.join(tmp, "cyc", "0.log"))
        check("log attached", lg["attached"] == 1 and lg["stopping"])
        check("log counters", lg["counters"] == {"duty_write_errors": 2, "events": 100, "ringbuf_lost": 0})
        check("log problems", lg["problems"] == {"WARN pause: untrack process": 1})
        with open(os.path.join(tmp, "cyc", "1.log"), "w") as f:
            f.write(lines[0] + "\npanic: runtime error\n")
        # stress summary over a synthetic run
        rng = random.Random(3)
        os.makedirs(os.path.join(tmp, "stress-train"))
        t = 1_000_000_000
        with open(os.path.join(tmp, "stress-train", "rank0.jsonl"), "w") as f:
            for i in range(300):
                ms = 57 + rng.gauss(0, 0.3)
                f.write(json.dumps({"rank": 0, "step": i, "start_ns": t, "end_ns": t + int(ms * 1e6), "step_ms": ms, "loss": 10.0 - i / 100}) + "\n")
                t += int(ms * 1e6)
            f.write(json.dumps({"rank": 0, "final": True, "steps": 300, "loss_finite": True}) + "\n")
        with open(os.path.join(tmp, "stress-train-train.log"), "w") as f:
            f.write("step 0 57 ms\n")
        with open(os.path.join(tmp, "phases.jsonl"), "w") as f:
            for n, (a, b) in {"pre": (0, 100), "stress": (100, 200), "post": (200, 300)}.items():
                f.write(json.dumps({"phase": n, "start_ns": 1_000_000_000 + int(a * 57e6), "end_ns": 1_000_000_000 + int(b * 57e6)}) + "\n")
        with open(os.path.join(tmp, "cycles.jsonl"), "w") as f:
            f.write(json.dumps({"i": 0, "action": "int", "rc": 0, "sig_us": 10, "exit_us": 5_000_010, "draining": 3}) + "\n")
            f.write(json.dumps({"i": 1, "action": "kill", "rc": 137, "sig_us": 10, "exit_us": 20}) + "\n")
        with open(os.path.join(tmp, "stress-meta.json"), "w") as f:
            json.dump({"seed": 5, "trainer_rc": 0}, f)
        s = stress(tmp)
        check("stress counts", s["cycles"] == 2 and s["kills"] == 1 and s["detaches"] == 1 and s["attaches"] == 2)
        check("stress panic", s["agent_panics"] == 1)
        check("stress trainer", s["trainer_survived"] and s["trainer_steps"] == 300 and abs(s["post_over_pre"] - 1) < 0.02)
        check("stress stop ms", s["stop_ms"]["p50"] == 5000 and s["max_draining_seen"] == 3)
        with open(os.path.join(tmp, "stress-train-train.log"), "a") as f:
            f.write("Fatal Python error: Segmentation fault\n")
        s = stress(tmp)
        check("stress fatal", not s["trainer_survived"] and s["crashes"] == 2)
        # c1m: ABBA with a +1 % ON effect, drift and noise
        name = "c1-dense"
        os.makedirs(os.path.join(tmp, name))
        t, rows, blocks = 0, [], []
        for p_ in range(10):
            for arm in (("off", "on") if p_ % 2 == 0 else ("on", "off")):
                b0 = t
                for _ in range(300):
                    ms = 57 * (1 + 0.0005 * p_) * (1.01 if arm == "on" else 1.0) + rng.gauss(0, 0.5)
                    rows.append({"rank": 0, "step": len(rows), "start_ns": t, "end_ns": t + int(ms * 1e6), "step_ms": ms, "loss": 1.0})
                    t += int(ms * 1e6)
                blocks.append({"pair": p_, "arm": arm, "start_ns": b0, "end_ns": t})
        for p_ in (10, 11):
            for arm in (("a1", "a2") if p_ % 2 == 0 else ("a2", "a1")):
                b0 = t
                for _ in range(300):
                    ms = 57 + rng.gauss(0, 0.5)
                    rows.append({"rank": 0, "step": len(rows), "start_ns": t, "end_ns": t + int(ms * 1e6), "step_ms": ms, "loss": 1.0})
                    t += int(ms * 1e6)
                blocks.append({"pair": p_, "arm": arm, "start_ns": b0, "end_ns": t})
        with open(os.path.join(tmp, name, "rank0.jsonl"), "w") as f:
            f.writelines(json.dumps(r_) + "\n" for r_ in rows)
        with open(os.path.join(tmp, name + "-blocks.jsonl"), "w") as f:
            f.writelines(json.dumps(b) + "\n" for b in blocks)
        with open(os.path.join(tmp, name + "-design.json"), "w") as f:
            json.dump({"shape": "dense"}, f)
        c = c1m(tmp, name)
        check("c1m pairs", c["pairs"] == 10 and c["shape"] == "dense")
        check("c1m mean ~1 %", abs(c["mean_pct"] - 1.0) < 0.1 and c["ci95_pct"][0] < 1.0 < c["ci95_pct"][1])
        check("c1m noise ~0", c["noise_off_blocks"]["pairs"] == 5 and abs(c["noise_off_blocks"]["mean_pct"]) < 0.2)
        check("c1m extra aa", c["noise_extra_aa"]["pairs"] == 2 and abs(c["noise_extra_aa"]["mean_pct"]) < 0.2)
        check("c1m steps per block", all(n == 299 or n == 300 for n in c["steps_per_block"]))
        # idle: processes L0 L1 (lib) N0 N1 (bare), +0.3 % for the library
        t = 0
        per = {k: [] for k in ("L0", "L1", "N0", "N1")}
        iblocks = []
        seq = [("ab", i, ("lib", "bare") if i % 2 == 0 else ("bare", "lib")) for i in range(8)] + [("aa", 0, ("x", "y")), ("aa", 1, ("y", "x"))]
        for kind, i, arms in seq:
            for arm in arms:
                proc = {"lib": f"L{i % 2}", "bare": f"N{(i // 2) % 2}", "x": "N0", "y": "N1"}[arm]
                b0 = t
                for _ in range(200):
                    ms = 57 * (1.003 if proc.startswith("L") else 1.0) + rng.gauss(0, 0.4)
                    per[proc].append({"rank": 0, "step": len(per[proc]), "start_ns": t, "end_ns": t + int(ms * 1e6), "step_ms": ms, "loss": 1.0})
                    t += int(ms * 1e6)
                iblocks.append({"kind": kind, "pair": i, "arm": arm, "proc": proc, "start_ns": b0, "end_ns": t})
        for k, v in per.items():
            os.makedirs(os.path.join(tmp, k))
            with open(os.path.join(tmp, k, "rank0.jsonl"), "w") as f:
                f.writelines(json.dumps(r_) + "\n" for r_ in v)
        with open(os.path.join(tmp, "idle-blocks.jsonl"), "w") as f:
            f.writelines(json.dumps(b) + "\n" for b in iblocks)
        i_ = idle(tmp)
        check("idle pairs", i_["lib_vs_bare"]["pairs"] == 8 and i_["aa_same_arm_other_process"]["pairs"] == 2)
        check("idle mean ~0.3 %", abs(i_["lib_vs_bare"]["mean_pct"] - 0.3) < 0.1)
        # coexist
        for r_, ks in (("a", [1000] * 13), ("b", [990] * 13), ("c", [0] * 5 + [1000] * 8)):
            nm = f"co-{r_}"
            os.makedirs(os.path.join(tmp, nm))
            with open(os.path.join(tmp, nm + "-prof.json"), "w") as f:
                json.dump({"labels": [f"ext_step#{100 + j}" for j in range(len(ks))], "kernels": ks, "parse_error": None}, f)
            with open(os.path.join(tmp, nm, "rank0.jsonl"), "w") as f:
                for j in range(120):
                    f.write(json.dumps({"rank": 0, "step": j + 90, "start_ns": j * 100, "end_ns": j * 100 + 100, "step_ms": 57.0, "loss": 1.0}) + "\n")
                f.write(json.dumps({"rank": 0, "event": "profiler_start", "mono_ns": 1000}) + "\n")
                f.write(json.dumps({"rank": 0, "event": "profiler_stop", "mono_ns": 2300}) + "\n")
            if r_ != "a":
                with open(os.path.join(tmp, nm + "-facts.jsonl"), "w") as f:
                    for e in (500, 1500, 2500, 2600):
                        f.write(json.dumps({"kind": "step", "end_ns": e, "gpu": e != 1500}) + "\n")
                with open(os.path.join(tmp, nm + "-agent.json"), "w") as f:
                    json.dump({"agent_start_ns": 1500}, f)
        co = coexist(tmp)
        check("coexist ratios", co["ratio_b_over_a"] == 0.99 and co["ratio_c_over_a"] == 1.0)
        check("coexist c after agent", co["runs"]["c"]["kernels_median_after_agent"] == 1000
              and co["runs"]["c"]["kernels_median_before_agent"] == 0)
        check("coexist after profiler", co["runs"]["b"]["collected_after_profiler"]
              and co["runs"]["b"]["agent_steps"]["during"] == {"steps": 1, "gpu": 0})
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    # clock_adjusted: a 0.2 % effect under 2 % clock drift is recovered and
    # the CI narrows; without clock variation the effect is the mean delta.
    rng = random.Random(3)
    pairs = []
    for _ in range(12):
        con, coff = 1800 * (1 + rng.gauss(0, 0.02)), 1800 * (1 + rng.gauss(0, 0.02))
        pairs.append((83 * 1800 / con * 1.002 * (1 + rng.gauss(0, 0.0005)), 83 * 1800 / coff * (1 + rng.gauss(0, 0.0005)), con, coff))
    adj = clock_adjusted(pairs, n=2000)
    check("clock: effect recovered", abs(adj["effect_pct"] - 0.2) < 0.1 and adj["ci95_pct"][0] < 0.2 < adj["ci95_pct"][1])
    check("clock: slope -1", abs(adj["slope"] + 1) < 0.1 and adj["r2"] > 0.9)
    raw = ci_summary([100 * (on / off - 1) for on, off, _, _ in pairs])
    check("clock: CI narrower than raw", adj["ci95_pct"][1] - adj["ci95_pct"][0] < (raw["ci95_pct"][1] - raw["ci95_pct"][0]) / 4)
    flat = clock_adjusted([(100.3, 100.0, 1800, 1800), (100.1, 100.0, 1800, 1800), (100.2, 100.0, 1800, 1800)], n=500)
    check("clock: flat clock gives the mean", flat["slope"] == 0 and abs(flat["effect_pct"] - 0.2) < 0.001)
    # hx_judge / hx_truth: an exposed start stall and a hidden end stall.
    inj = {"mono_ns": 100 * 10**9, "wall": 1000.0}

    def hv(w, state, rank=1, phase="host", exposed=None):
        v = {"kind": "verdict", "window": w, "window_end_ns": (100 + 5 * w) * 10**9, "rank": rank, "phase": phase,
             "state": state}
        if exposed is not None:
            v["exposure"] = {"evidence": "victim_wait", "exposed": exposed}
        return v
    vs = [hv(-1, "ok"), hv(1, "candidate", exposed=True), hv(2, "candidate", exposed=True),
          hv(3, "straggler", exposed=True), hv(3, "straggler", rank=2, phase="compute")]
    j = hx_judge("start", 1, inj, vs, [{"wall": 1016.5, "rank": 1, "phase": "host", "hint": ""}], True)
    check("hx rose: alert passes", j["pass"] and j["alert_logged_after_s"] == 16.5 and j["exposed_windows"] == 3
          and j["other_alerts"] == [(2, "compute")] and j["exposure_evidence"] == {"victim_wait": 3})
    check("hx rose: late alert fails", not hx_judge("start", 1, inj, vs, [{"wall": 1030.0, "rank": 1, "phase": "host", "hint": ""}], True)["pass"])
    check("hx rose: wrong rank fails", not hx_judge("start", 1, inj, vs + [hv(4, "straggler", rank=3)], [], True)["pass"])
    check("hx rose: no alert fails", not hx_judge("start", 1, inj, [hv(2, "ok", exposed=False)], [], True)["pass"])
    check("hx flat: an alert of a start stall fails", not hx_judge("start", 1, inj, vs, [], False)["pass"])
    hidden = [hv(1, "ok", exposed=False), hv(2, "ok", exposed=False)]
    j = hx_judge("end", 1, inj, hidden, [], False)
    check("hx flat: hidden passes", j["pass"] and j["hidden_windows"] == 2 and j["host_alert_ranks"] == [])
    check("hx flat: alert fails", not hx_judge("end", 1, inj, hidden + [hv(4, "straggler")], [], False)["pass"])
    check("hx flat: uncertain passes", hx_judge("end", 1, inj, [hv(2, "uncertain")], [], False)["pass"])
    steps = {r: {"steps": [{"step": i, "start_ns": i * 10**8, "step_ms": 100.0 + (15 if i >= 1000 and r == 1 else 0),
                            "sync_ms": 40.0 - (15 if i >= 1000 and r == 1 else 0)} for i in range(1500)]} for r in range(4)}
    t = hx_truth(steps, inj["mono_ns"])
    # hx_steps: rank 0 a fact per iteration from 1, rank 1 misses one and
    # numbers one step differently.
    tr = {r: {"steps": [{"start_ns": k * 100, "end_ns": k * 100 + 99} for k in range(6)]} for r in (0, 1)}
    fs = [{"kind": "step", "rank": 0, "step": k, "end_ns": k * 100 + 60} for k in range(1, 6)]
    st = hx_steps(fs, {0: tr[0]})
    check("hx steps: one per iteration from 1 passes", st["pass"] and st["per_rank"][0]["first_iteration"] == 1
          and st["per_rank"][0]["iterations_without"] == 1)
    fs1 = fs + [{"kind": "step", "rank": 1, "step": k, "end_ns": (k + (k == 4)) * 100 + 60} for k in (2, 3, 4, 5)]
    st = hx_steps(fs1, tr)
    check("hx steps: a missing first iteration and a shifted index fail", not st["pass"]
          and st["per_rank"][1]["first_iteration"] == 2 and st["steps_on_several_iterations"] == 1)
    check("hx truth", t["step_ms_before"] == 100.0 and t["sync_ms"][1] == {"before": 40.0, "after": 25.0}
          and t["sync_ms"][0]["after"] == 40.0 and t["steps_before"] == 4 * 950)
    print(f"{passed[0]} passed, {len(failed)} failed")
    return {"passed": passed[0], "failed": failed}


def main(argv):
    if len(argv) == 2 and argv[1] == "selftest":
        sys.exit(1 if selftest()["failed"] else 0)
    if len(argv) < 3:
        sys.exit(__doc__)
    kind, rest = argv[1], argv[2:]
    if kind == "stress-plan":
        seed, budget, stop_s, drain = int(rest[0]), float(rest[1]), float(rest[2]), int(rest[3])
        extra = [int(x) for x in rest[4:6]]
        res = stress_plan(seed, budget, stop_s, drain, *extra)
        print(json.dumps(res, indent=1))
        return
    if kind == "host-exposure":
        print(json.dumps(host_exposure(*rest), indent=1, default=list))
        return
    if kind in ("stress", "coexist", "c1m", "idle"):
        res = {"stress": stress, "coexist": coexist, "c1m": c1m, "idle": idle}[kind](*rest)
        print(json.dumps(res, indent=1, default=list))
        return
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