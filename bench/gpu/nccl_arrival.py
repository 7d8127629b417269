#!/usr/bin/env python3
"""Issue 20, item 2 on one H200: the device arrival order against the truth.

  loop     the workload (nccl_plugin.sh part "arrival"): WORLD_SIZE ranks of a
           torch NCCL process group (on one GPU each its own NCCL_HOSTID, so
           that NCCL runs ring kernels over its socket transport); a step is
           BUCKETS times [CHUNK_MM matmuls of MM_N x MM_N bf16 (rank SLOW_RANK
           EXTRA_MM more), then an all-reduce of BUCKET_KB], all on the
           current stream like DDP's buckets, then .item() of a loss: every
           all-reduce waits for the slow rank's extra matmuls on its GPU while
           the hosts enqueue the step's work at once. CUDA events time each
           rank's chunks: the truth of how much later the slow GPU reaches
           each collective. Busy until START_FILE exists, then RUN_S seconds
           (rank 0 decides, every rank runs the same steps). Writes
           TRUTH_FILE (@RANK@: the rank) as JSON. On a shared GPU the
           events time the time slices too: they are context, not the truth.
  analyze  FACTS VERDICTS STATUS OUT TRUTH... [-- DUMP...]: per rank the
           steps with device evidence, the share with device_last_arrival,
           the median device_arrival_lag_ms and device_coll_ms, the host
           evidence beside them, the verdicts that carry it, the agent's
           kernel counters; and the truth the agent never saw: each rank's
           library dump (SLOWRANK_CUPTI_DUMP) pairs the plugin's kernel
           records with CUPTI's kernel records of the same collectives
           (nccl_plugin.pair_kernels), and CUPTI's starts of one collective
           (func, NCCL seq) on every rank say which GPU reached it last:
           per rank the share of collectives it reached last by 50 us or
           more, and its median lag behind the first. Checks compare both.
  selftest analyze on synthetic facts and dumps (CPU, make bench-selftest).
"""
import json
import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import analyze as analyze_py  # noqa: E402  (jsonl)
import nccl_plugin  # noqa: E402  (StartGate, pair_kernels; the dump's record layout)

TIE_NS = 50_000  # the agent's DeviceArrivalTie


def env(name, default, kind=int):
    return kind(os.environ.get(name, str(default)))


def loop(_args):
    import torch
    import torch.distributed as dist
    rank, world = env("RANK", 0), env("WORLD_SIZE", 1)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", os.environ.get("PORT", "29620"))
    device = torch.device("cuda", env("LOCAL_RANK", rank))
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=device)
    n, buckets, chunk = env("MM_N", 4096), env("BUCKETS", 8), env("CHUNK_MM", 4)
    extra = env("EXTRA_MM", 0) if rank == env("SLOW_RANK", 1) else 0
    a = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    b = torch.randn(n, n, device=device, dtype=torch.bfloat16)
    grads = [torch.ones(env("BUCKET_KB", 1024) * 256, device=device) for _ in range(buckets)]
    run_s = env("RUN_S", 60, float)
    gate = nccl_plugin.StartGate(dist, torch.zeros(1, device=device), rank, os.environ.get("START_FILE"),
                                 run_s, env("START_WAIT_S", 120, float))
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(buckets)]
    chunk_ms, steps = [], 0
    while True:
        c = gate.next()
        if c == 2.0:
            break
        for k in range(buckets):
            events[k][0].record()
            x = a
            for _ in range(chunk + extra):
                x = torch.mm(x, b)
                x = x * (1.0 / n)  # keep the values finite
            events[k][1].record()
            grads[k].add_(x[0, 0].float())
            dist.all_reduce(grads[k])
        loss = sum(g[0] for g in grads)
        loss.item()  # the step's synchronisation, as a training loop logs its loss
        if c == 1.0:
            steps += 1
            chunk_ms.append(statistics.median(s.elapsed_time(e) for s, e in events))
    dist.destroy_process_group()
    out = {"rank": rank, "world_size": world, "steps": steps, "buckets": buckets, "extra_mm": extra,
           "chunk_mm": chunk, "mm_n": n, "chunk_ms_median": statistics.median(chunk_ms) if chunk_ms else None,
           "run_s": run_s}
    truth = os.environ.get("TRUTH_FILE", "").replace("@RANK@", str(rank))
    if truth:
        with open(truth, "w") as f:
            json.dump(out, f)
    print(json.dumps(out))


def median(v):
    return statistics.median(v) if v else None


def share(v):
    return sum(1 for x in v if x) / len(v) if v else None


def per_rank(steps):
    ranks = {}
    for s in steps:
        if s.get("kind") != "step":
            continue
        r = ranks.setdefault(s["rank"], {"steps": 0, "dev_last": [], "dev_lag": [], "dev_coll": [],
                                         "host_last": [], "host_lag": [], "gpu_steps": 0})
        r["steps"] += 1
        r["gpu_steps"] += 1 if s.get("gpu") else 0
        for key, field in (("dev_last", "device_last_arrival"), ("dev_lag", "device_arrival_lag_ms"),
                           ("dev_coll", "device_coll_ms"), ("host_last", "last_arrival"), ("host_lag", "arrival_lag_ms")):
            if field in s:
                r[key].append(s[field])
    out = {}
    for rank, r in sorted(ranks.items()):
        out[str(rank)] = {
            "steps": r["steps"], "covered_steps": r["gpu_steps"],
            "steps_with_device_order": len(r["dev_last"]),
            "device_last_share": share(r["dev_last"]),
            "device_arrival_lag_ms_median": median(r["dev_lag"]),
            "steps_with_device_coll": len(r["dev_coll"]),
            "device_coll_ms_median": median(r["dev_coll"]),
            "steps_with_host_order": len(r["host_last"]),
            "host_last_share": share(r["host_last"]),
            "host_arrival_lag_ms_median": median(r["host_lag"]),
        }
    return out


def status(status_path):
    try:
        return json.load(open(status_path))
    except (OSError, ValueError):
        return {}


def counters(status_path):
    st = status(status_path)
    c = st.get("counters", st)
    keys = ("nccl_kernel_records", "nccl_kernel_records_p2p", "nccl_kernel_records_clock_suspect",
            "nccl_kernel_records_off_plugin", "correlate_kernel_records", "correlate_kernels_unmatched",
            "correlate_device_arrival_timeouts", "nccl_plugin_colls", "correlate_arrival_timeouts",
            "correlate_arrival_realigned", "correlate_arrival_misaligned", "nccl_uprobe_nested_calls",
            "nccl_kernel_channels_off")
    return {k: c.get(k) for k in keys if isinstance(c, dict)}


def cupti_truth(dumps):
    """Per rank (dump order), from CUPTI's starts of the collectives every
    rank's dump pairs: the share it reached last (by TIE_NS or more) and its
    median lag behind the first."""
    starts = []  # per rank: (func, seq) -> CUPTI start
    for path in dumps:
        m = {}
        if os.path.exists(path):
            for p in nccl_plugin.pair_kernels(path)["pairs"]:
                if not p["flags"] & nccl_plugin.NCCL_F_P2P:
                    m[(p["func"], p["seq"])] = p["cupti_start"]
        starts.append(m)
    common = set.intersection(*(set(m) for m in starts)) if starts else set()
    last, lags = [[] for _ in starts], [[] for _ in starts]
    for k in common:
        v = [m[k] for m in starts]
        lo, hi = min(v), max(v)
        for r, x in enumerate(v):
            lags[r].append((x - lo) / 1e6)
            last[r].append(hi - x < TIE_NS and sum(1 for y in v if hi - y < TIE_NS) == 1)
    return {"collectives": len(common), "per_rank_paired": [len(m) for m in starts],
            "ranks": {str(r): {"last_share": share(last[r]), "lag_ms_median": median(lags[r])} for r in range(len(starts))}}


def analyze(args):
    dumps = []
    if "--" in args:
        i = args.index("--")
        args, dumps = args[:i], args[i + 1:]
    facts, verdicts, status_path, out_path, truths = args[0], args[1], args[2], args[3], args[4:]
    truth = {}
    for t in truths:
        if os.path.exists(t):
            d = json.load(open(t))
            truth[str(d["rank"])] = d
    ranks = per_rank(analyze_py.jsonl(facts))
    vs = [v for v in analyze_py.jsonl(verdicts) if v.get("kind") == "verdict"]
    ov = status(status_path).get("overhead") or {}
    res = {"ranks": ranks, "truth": truth, "counters": counters(status_path),
           "overhead": {k: ov.get(k) for k in ("cost", "spent_total", "spent_nccl_plugin", "nccl_kernel_channels")},
           "verdicts": [{k: v.get(k) for k in ("window", "rank", "phase", "state", "deviation", "device_last_arrival_share",
                                                "device_coll_ms", "device_coll_peer_ms", "last_arrival_share", "reason")}
                        for v in vs if v.get("state") in ("candidate", "straggler")]}
    if dumps:
        res["cupti_truth"] = cupti_truth(dumps)
    checks = []
    ct = res.get("cupti_truth", {}).get("ranks", {})
    if ct:
        checks.append(("CUPTI pairs >= 100 collectives on every rank", res["cupti_truth"]["collectives"] >= 100))
        for r, t in ct.items():
            a = ranks.get(r, {})
            checks.append((f"rank {r}: the agent's device-last share is CUPTI's within 0.15",
                           a.get("device_last_share") is not None and t["last_share"] is not None
                           and abs(a["device_last_share"] - t["last_share"]) <= 0.15))
            checks.append((f"rank {r}: the agent's median device lag is CUPTI's within 25 % or 0.1 ms",
                           a.get("device_arrival_lag_ms_median") is not None and t["lag_ms_median"] is not None
                           and abs(a["device_arrival_lag_ms_median"] - t["lag_ms_median"]) <= max(0.25 * t["lag_ms_median"], 0.1)))
        lastr = [r for r, t in ct.items() if (t["last_share"] or 0) >= 0.9]
        if lastr:
            r = lastr[0]
            colls = {q: ranks.get(q, {}).get("device_coll_ms_median") for q in ct}
            checks.append((f"rank {r}, last on CUPTI's clock, has the least collective GPU time",
                           all(colls[r] is not None and (q == r or (colls[q] is not None and colls[r] < colls[q])) for q in ct)))
    checks.append(("device evidence in >= 100 steps per rank", all(d.get("steps_with_device_order", 0) >= 100 for d in ranks.values())))
    res["checks"] = [{"check": c, "ok": bool(ok)} for c, ok in checks]
    res["ok"] = all(ok for _, ok in checks) if checks else None
    what = os.environ.get("ARRIVAL_LABEL")
    if what:
        res["what"] = what
    with open(out_path, "w") as f:
        json.dump(res, f, indent=1)
    print(json.dumps({k: res[k] for k in ("ranks", "checks", "ok") if k in res}))
    return res


def quiet(fn, args):
    """fn(args) with its stdout discarded."""
    sys.stdout = open(os.devnull, "w")
    try:
        return fn(args)
    finally:
        sys.stdout.close()
        sys.stdout = sys.__stdout__


def selftest(_args):
    """analyze on synthetic facts: a slow rank 1, 200 steps."""
    d = tempfile.mkdtemp()
    facts, truths = os.path.join(d, "f.jsonl"), []
    with open(facts, "w") as f:
        for i in range(200):
            for r in range(2):
                f.write(json.dumps({"kind": "step", "rank": r, "step": i, "gpu": True, "device_last_arrival": r == 1,
                                    "device_arrival_lag_ms": 0.4 if r == 1 else 0.0,
                                    "device_coll_ms": 2.0 if r == 1 else 5.2, "last_arrival": i % 2 == r}) + "\n")
    for r in range(2):
        p = os.path.join(d, f"t{r}.json")
        json.dump({"rank": r, "extra_mm": 2 if r == 1 else 0, "chunk_ms_median": 1.2 if r == 1 else 0.8}, open(p, "w"))
        truths.append(p)
    dumps = []
    for r in range(2):  # rank 1's CUPTI kernels start 0.4 ms after rank 0's
        bs, t = [], 1_000_000_000
        for i in range(150):
            s0 = t + (400_000 if r == 1 else 0)
            e0 = t + 600_000
            bs.append(nccl_plugin.batch([nccl_plugin.rec_kernel(s0, e0, 1),
                                         nccl_plugin.rec_nccl_kernel(s0 + 2_000, e0 - 1_000, e0 + 9_000, seq=i)]))
            t += 2_000_000
        dumps.append(os.path.join(d, f"d{r}.dump"))
        nccl_plugin.write_dump(dumps[-1], bs)
    res = quiet(analyze, [facts, os.path.join(d, "none"), os.path.join(d, "none"), os.path.join(d, "o.json")] + truths + ["--"] + dumps)
    ct = res["cupti_truth"]
    ok = (res["ok"] is True and res["ranks"]["1"]["device_last_share"] == 1.0 and ct["collectives"] == 150
          and ct["ranks"]["1"]["last_share"] == 1.0 and abs(ct["ranks"]["1"]["lag_ms_median"] - 0.4) < 1e-9)
    # A disagreeing agent fails the checks.
    with open(facts, "a") as f:
        for i in range(200, 600):
            f.write(json.dumps({"kind": "step", "rank": 1, "step": i, "device_last_arrival": False,
                                "device_arrival_lag_ms": 0.0}) + "\n")
    bad = quiet(analyze, [facts, os.path.join(d, "none"), os.path.join(d, "none"), os.path.join(d, "o.json")] + truths + ["--"] + dumps)
    ok = ok and bad["ok"] is False
    print(f"nccl_arrival selftest: {'pass' if ok else 'FAIL'}")
    if not ok:
        print(json.dumps(res))
        raise SystemExit(1)


if __name__ == "__main__":
    {"loop": loop, "analyze": analyze, "selftest": selftest}[sys.argv[1]](sys.argv[2:])
