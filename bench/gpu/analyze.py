#!/usr/bin/env python3
"""Summaries of slowrank's GPU experiments (bench/gpu). Standard library only.

  analyze.py smoke DIR            facts found per run (steps, phases, device share)
  analyze.py c3 DIR               localisation: detected rank/phase/hint, seconds to verdict
  analyze.py c2 DIR               equivalence: losses, parameter hashes, overlap
  analyze.py c1 DIR               overhead: ABBA pairs, bootstrap 95 % CI
"""
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


def clock_agreement(dump):
    """For each synchronisation that waited >= 1 ms, the last kernel of that
    process to end before the wait returned must end inside the wait: the gap
    (sync end - kernel end) bounds the host/device clock offset from above,
    kernels ending after the wait returned (negative gap) would show an offset."""
    syncs, kernels = {}, {}
    for r in jsonl(dump):
        rec = r.get("record", {})
        if r.get("type") == "correlate.HostCall" and rec.get("Kind") == 2 and rec["EndNS"] - rec["StartNS"] >= 1_000_000:
            syncs.setdefault(rec["PID"], []).append((rec["StartNS"], rec["EndNS"]))
        elif r.get("type") == "correlate.DeviceInterval":
            kernels.setdefault(rec["PID"], []).append(rec["EndNS"])
    gaps = []
    for pid, ss in syncs.items():
        ks = sorted(kernels.get(pid, []))
        for s0, s1 in ss:
            inside = [k for k in ks if s0 <= k <= s1 + 1_000_000]
            if inside:
                gaps.append((s1 - max(inside)) / 1e3)
    if not gaps:
        return {"syncs": 0}
    gaps.sort()
    return {"syncs_checked": len(gaps), "gap_us_min": round(gaps[0], 1), "gap_us_p50": round(gaps[len(gaps) // 2], 1),
            "gap_us_p99": round(gaps[int(0.99 * (len(gaps) - 1))], 1), "kernel_after_wait": sum(1 for g in gaps if g < 0)}


def cupti(d):
    status = {}
    try:
        status = json.load(open(os.path.join(d, "val-full-status.json")))
    except (OSError, json.JSONDecodeError):
        pass
    counters = status.get("counters", {}) if isinstance(status, dict) else {}
    pairs = []
    for p in range(4):
        lib = truth_steps(os.path.join(d, f"val-noagent-p{p}-lib"))
        bare = truth_steps(os.path.join(d, f"val-noagent-p{p}-bare"))
        ml = [x["step_ms"] for v in lib.values() for x in v[20:]]
        mb = [x["step_ms"] for v in bare.values() for x in v[20:]]
        if ml and mb:
            pairs.append(100 * (statistics.fmean(ml) / statistics.fmean(mb) - 1))
    lo, hi = bootstrap_ci(pairs) if len(pairs) >= 2 else (None, None)
    return {"clock": clock_agreement(os.path.join(d, "val-full-dump.jsonl")),
            "device_latency_p50_us": counters.get("device_latency_p50_us"),
            "device_latency_p99_us": counters.get("device_latency_p99_us"),
            "device_records": counters.get("device_records"), "device_records_dropped": counters.get("device_records_dropped", 0),
            "batches_lost": counters.get("batches_lost", 0),
            "loaded_without_agent_pct": [round(x, 3) for x in pairs],
            "loaded_without_agent_ci95": [lo, hi],
            "full_collection": c1(d, "val-c1full"), "duty_cycle": c1(d, "val-c1duty")}


if __name__ == "__main__":
    kind, d = sys.argv[1], sys.argv[2]
    fns = {"smoke": smoke, "c3": c3, "c2": c2, "c1": c1, "cupti": cupti}
    print(json.dumps(fns[kind](d, *sys.argv[3:]), indent=1, default=list))
