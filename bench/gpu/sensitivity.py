#!/usr/bin/env python3
"""Issue 33 item 4: how small a slowdown of one rank a detector names, and how
fast, on one DDP job (bench/gpu/sensitivity.sh runs it; bench/results/README.md
"Sensitivity vs NVRx" has the command and the table).

  train [flags]   the job: --ranks N processes (started like torchrun, train.py's
                  launcher) of one DDP job over NCCL. With fewer GPUs than
                  ranks (--share-gpu) every rank runs on GPU 0 with its own
                  NCCL_HOSTID (NCCL then takes them for separate nodes and runs
                  its socket transport on lo); else one rank per GPU. Rank
                  --slow-rank follows a schedule (--kinds x --mags): a healthy
                  warm-up (--warmup-s), then for each kind and magnitude a slow
                  phase (--slow-s) and a healthy one (--healthy-s). A magnitude
                  is a share of the job's step measured in the warm-up (rank
                  0's median of its second half, broadcast at the first slow
                  phase). host: a sleep of that many ms before the forward
                  pass (the GPU has nothing queued, the peers wait in the
                  gradient all-reduce). gpu: that many ms of extra GPU work
                  ahead of the forward pass on the rank's stream (--gpu-mode
                  sleep: torch.cuda._sleep, a spin kernel that every rank
                  launches every step, 1000 cycles when healthy, so that the
                  kernel multiset, the agent's workload fingerprint, stays the
                  ranks' common one; matmul: extra fp32 matmuls, which change
                  the slow rank's fingerprint); the unit is timed on the slow
                  rank before the loop while the others wait on the host.
                  --from-start KIND:PCT: one slow phase from the first step
                  (--start-s long) sized from --ref-step-ms (the schedule run's
                  measured step). Every rank writes its truth to
                  --out-dir/rank<R>.jsonl: a "meta" line (plan, calibration,
                  placement), then one line per step (start/end in
                  CLOCK_MONOTONIC ns, the agent's clock, and wall time, the
                  phase label, what this rank injected). --nvrx wraps the
                  step in NVRx's straggler sections (bench/gpu/nvrx_export.sh).
                  --device cpu: a dry run with gloo and a tiny model.
  analyze DIR [--verdicts V] [--nvrx-reports R] [--json OUT] [--md OUT]
                  judge a run folder (rank*.jsonl) against the verdicts (the
                  agent's --verdicts, or a replay's output: `slowrank replay
                  --input facts.jsonl --output V`) or NVRx's report log: per
                  phase the step rise (truth), whether the slow rank was
                  named within --limit-s (default consecutive x window +
                  lateness = 17 s) of the onset, when, when it was recovered
                  after the phase, and the false alerts (other ranks
                  anywhere; the slow rank in warm-up, or in a healthy phase
                  beyond the recovery allowance of --limit-s). JSON to
                  stdout (or --json), a markdown table to --md.
  table SUMMARY.json...
                  one markdown table, slowrank and NVRx side by side: a row per
                  slow phase, a column per run and detector (sensitivity.sh's
                  sensitivity.json files of both calls)
  selftest        analyze and the schedule on synthetic data (make bench-selftest)

Standard library only, except train (torch).
"""
import argparse
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import analyze as analyze_py  # noqa: E402  (jsonl)

HEALTHY_CYCLES = 1000  # the spin kernel's length on a healthy step (gpu-mode sleep)


# ---------------------------------------------------------------- the schedule


def schedule(warmup_s, slow_s, healthy_s, kinds, mags, from_start=None, start_s=60.0):
    """The phases, in order: dicts of name, kind (None: healthy), mag_pct,
    start_s and end_s after the loop's common start."""
    if from_start:
        kind, mag = from_start
        return [{"name": f"{kind}-{mag:g}-from-start", "kind": kind, "mag_pct": mag, "start_s": 0.0, "end_s": start_s}]
    plan = [{"name": "warmup", "kind": None, "mag_pct": 0, "start_s": 0.0, "end_s": warmup_s}]
    t = warmup_s
    for kind in kinds:
        for mag in mags:
            plan.append({"name": f"{kind}-{mag:g}", "kind": kind, "mag_pct": mag, "start_s": t, "end_s": t + slow_s})
            t += slow_s
            plan.append({"name": f"{kind}-{mag:g}-healthy", "kind": None, "mag_pct": 0, "start_s": t, "end_s": t + healthy_s})
            t += healthy_s
    return plan


def phase_at(plan, elapsed_s):
    """Index of the phase at elapsed_s; len(plan) once the schedule is over."""
    for i, p in enumerate(plan):
        if elapsed_s < p["end_s"]:
            return i
    return len(plan)


def parse_from_start(s):
    if not s:
        return None
    kind, _, mag = s.partition(":")
    if kind not in ("host", "gpu") or not mag:
        raise ValueError(f"--from-start {s!r}: want host:PCT or gpu:PCT")
    return kind, float(mag)


# ---------------------------------------------------------------- the job


class GpuWork:
    """The gpu injection: ms of extra GPU work on the rank's stream."""

    def __init__(self, torch, dev, mode):
        self.torch, self.dev, self.mode = torch, dev, mode
        size = 2048 if dev.type == "cuda" else 128  # the CPU dry run: small
        self.unit_ms = None  # ms of one unit: 1e6 spin cycles, or one matmul
        if mode == "matmul" or dev.type != "cuda":
            self.a = torch.randn(size, size, device=dev)
            self.b = torch.randn(size, size, device=dev)

    def _run(self, units):
        if self.mode == "sleep" and self.dev.type == "cuda":
            self.torch.cuda._sleep(int(units * 1e6) if units else HEALTHY_CYCLES)
            return
        for _ in range(int(units)):
            self.a.copy_(self.a @ self.b * 1e-3)

    def calibrate(self, sync):
        self._run(1)
        sync()
        n = 20
        t0 = time.perf_counter()
        for _ in range(n):
            self._run(1)
        sync()
        self.unit_ms = (time.perf_counter() - t0) * 1e3 / n
        return self.unit_ms

    def units(self, ms):
        u = ms / self.unit_ms
        return u if self.mode == "sleep" and self.dev.type == "cuda" else max(1, round(u))

    def step(self, units):
        """Every rank, every step: the healthy spin kernel (sleep mode) or the
        injected units (0: nothing in matmul mode)."""
        if units or (self.mode == "sleep" and self.dev.type == "cuda"):
            self._run(units)


def rank_main(args):
    import torch
    import torch.distributed as dist
    import torch.nn.functional as F
    from torch.nn.parallel import DistributedDataParallel

    import nccl_plugin  # init_nccl_group
    import train  # GPT

    cuda = args.device == "cuda"
    if cuda:
        rank, world, dev = nccl_plugin.init_nccl_group(torch, dist)
        ctl_group = dist.new_group(backend="gloo")  # host-side waits of the calibration only
        sync = torch.cuda.synchronize
    else:
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        dist.init_process_group("gloo", rank=rank, world_size=world)
        dev, ctl_group, sync = torch.device("cpu"), None, (lambda: None)
        torch.set_num_threads(1)
    slow = rank == args.slow_rank
    plan = schedule(args.warmup_s, args.slow_s, args.healthy_s, args.kinds.split(","),
                    [float(m) for m in args.mags.split(",")], parse_from_start(args.from_start), args.start_s)
    torch.manual_seed(args.seed)
    model = train.GPT(args.vocab, args.dim, args.layers, args.heads, args.seq).to(dev)
    ddp = DistributedDataParallel(model, device_ids=[dev.index] if cuda else None)
    opt = torch.optim.AdamW(ddp.parameters(), lr=3e-4)
    g = torch.Generator(device=dev)
    g.manual_seed(args.seed + rank)
    work = GpuWork(torch, dev, args.gpu_mode)
    nv = Nvrx(args, rank) if args.nvrx else None

    sizing = size_batch(args, ddp, opt, g, dev, sync, ctl_group, torch, dist, F) if args.target_step_ms > 0 else None
    # The gpu unit, timed on the slow rank while the others wait on the host
    # (a GPU collective would spin on the shared GPU meanwhile).
    sync()
    dist.barrier(group=ctl_group)
    cal = torch.zeros(1, dtype=torch.float64)
    if slow:
        cal[0] = work.calibrate(sync)
    dist.broadcast(cal, args.slow_rank, group=ctl_group)
    work.unit_ms = float(cal[0])
    # The schedule's common start: rank 0's CLOCK_MONOTONIC (one host's clock).
    t0 = torch.tensor([time.monotonic_ns()], dtype=torch.int64)
    dist.broadcast(t0, 0, group=ctl_group)
    t0_ns = int(t0[0])
    out = open(os.path.join(args.out_dir, f"rank{rank}.jsonl"), "w", buffering=1)
    meta = {"meta": True, "rank": rank, "world": world, "slow_rank": args.slow_rank, "device": str(dev),
            "share_gpu": args.share_gpu, "nccl_hostid": os.environ.get("NCCL_HOSTID"), "pid": os.getpid(),
            "t0_ns": t0_ns, "t0_wall": time.time() - (time.monotonic_ns() - t0_ns) / 1e9, "plan": plan,
            "gpu_mode": args.gpu_mode, "gpu_unit_ms": work.unit_ms, "nvrx": bool(args.nvrx),
            "nvrx_commit": os.environ.get("NVRX_COMMIT") if args.nvrx else None, "batch": args.batch,
            "sizing": sizing, "args": vars(args)}
    if cuda:
        v = torch.cuda.nccl.version()
        meta.update(gpu=torch.cuda.get_device_name(dev), torch=torch.__version__,
                    nccl=".".join(map(str, v)) if isinstance(v, tuple) else str(v))
    out.write(json.dumps(meta) + "\n")

    ctl = torch.zeros(1, device=dev)
    warm_ms = []  # rank 0's warm-up steps
    ref_ms = args.ref_step_ms if args.from_start else None
    cur = -1
    step = 0
    if ref_ms is not None:
        out.write(json.dumps({"calibration": True, "rank": rank, "ref_step_ms": ref_ms, "source": "--ref-step-ms",
                              "gpu_unit_ms": work.unit_ms}) + "\n")
    while True:
        # Rank 0 decides the phase from its clock; every rank gets it (MAX).
        ctl.fill_(phase_at(plan, (time.monotonic_ns() - t0_ns) / 1e9) if rank == 0 else 0)
        dist.all_reduce(ctl, op=dist.ReduceOp.MAX)
        idx = int(ctl.item())
        if idx >= len(plan):
            break
        p = plan[idx]
        if idx != cur:
            cur = idx
            if p["kind"] and ref_ms is None:
                # The first slow phase: the healthy step, measured in the warm-up.
                half = warm_ms[len(warm_ms) // 2:] or [0.0]
                x = torch.tensor([statistics.median(half)], device=dev, dtype=torch.float64)
                dist.broadcast(x, 0)
                ref_ms = float(x.item())
                out.write(json.dumps({"calibration": True, "rank": rank, "ref_step_ms": ref_ms,
                                      "warmup_steps": len(half), "gpu_unit_ms": work.unit_ms}) + "\n")
            inj = {"host_ms": 0.0, "gpu_ms": 0.0, "gpu_units": 0}
            if slow and p["kind"] == "host":
                inj["host_ms"] = p["mag_pct"] / 100 * ref_ms
            elif slow and p["kind"] == "gpu":
                inj["gpu_ms"] = p["mag_pct"] / 100 * ref_ms
                inj["gpu_units"] = work.units(inj["gpu_ms"])
            out.write(json.dumps({"phase_start": True, "rank": rank, "phase": p["name"], "index": idx, "step": step,
                                  "mono_ns": time.monotonic_ns(), "wall": time.time(), **inj}) + "\n")
        s_ns, s_wall = time.monotonic_ns(), time.time()
        # NVRx's sections as its usage guide shows them (--nvrx): data loading
        # (CPU time only) holds the host stall, the forward pass (CPU time and
        # its CUDA kernels) the GPU injection. Their CPU times are truth too.
        with nv.section("data", False) if nv else _null():
            if inj["host_ms"]:
                time.sleep(inj["host_ms"] / 1e3)  # like a data loader stall: the GPU has nothing queued
            idx_t = torch.randint(0, args.vocab, (args.batch, args.seq), device=dev, generator=g)
        d_ns = time.monotonic_ns()
        with nv.section("fwd", True) if nv else _null():
            work.step(inj["gpu_units"])
            logits = ddp(idx_t[:, :-1])
        f_ns = time.monotonic_ns()
        loss = F.cross_entropy(logits.reshape(-1, args.vocab), idx_t[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()  # DDP all-reduces the gradient buckets over NCCL meanwhile
        opt.step()
        lv = loss.item()  # the step's synchronisation, as a loop logs its loss
        e_ns = time.monotonic_ns()
        ms = (e_ns - s_ns) / 1e6
        if rank == 0 and p["name"] == "warmup":
            warm_ms.append(ms)
        out.write(json.dumps({"rank": rank, "step": step, "phase": p["name"], "start_ns": s_ns, "end_ns": e_ns,
                              "start_wall": s_wall, "end_wall": round(s_wall + ms / 1e3, 6), "step_ms": round(ms, 3), "host_ms": round(inj["host_ms"], 3),
                              "gpu_ms": round(inj["gpu_ms"], 3), "data_ms": round((d_ns - s_ns) / 1e6, 3),
                              "fwd_ms": round((f_ns - d_ns) / 1e6, 3), "loss": round(lv, 4)}) + "\n")
        if nv:
            nv.after_step()
        step += 1
    out.write(json.dumps({"final": True, "rank": rank, "steps": step}) + "\n")
    out.close()
    if nv:
        nv.close()
    dist.barrier(group=ctl_group)
    dist.destroy_process_group()


def size_batch(args, ddp, opt, g, dev, sync, ctl_group, torch, dist, F, rounds=2, steps=8):
    """--target-step-ms: before the loop, scale the batch (every rank the
    same) so that a step takes about the target: rounds of a few steps,
    rank 0's median step, batch x target / measured, agreed through the
    host-side group. Returns what was measured; sets args.batch."""
    out = []
    for _ in range(rounds):
        ms = []
        for i in range(steps + 2):
            t = time.perf_counter()
            idx_t = torch.randint(0, args.vocab, (args.batch, args.seq), device=dev, generator=g)
            loss = F.cross_entropy(ddp(idx_t[:, :-1]).reshape(-1, args.vocab), idx_t[:, 1:].reshape(-1))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            loss.item()
            if i >= 2:  # the first steps pay for allocations and kernel selection
                ms.append((time.perf_counter() - t) * 1e3)
        b = torch.tensor([max(1, round(args.batch * args.target_step_ms / statistics.median(ms)))], dtype=torch.int64)
        dist.broadcast(b, 0, group=ctl_group)
        out.append({"batch": args.batch, "step_ms": round(statistics.median(ms), 2), "next_batch": int(b[0])})
        args.batch = min(int(b[0]), 4 * out[0]["batch"])  # no runaway on a noisy first measurement
    sync()
    return out


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *_):
        return False


class Nvrx:
    """NVRx's straggler detection as its docs show it: Detector.initialize
    (all scores, gathered on rank 0, report_time_interval --nvrx-interval-s),
    detection_section around code of the step, and
    generate_report_if_interval_elapsed after every step on every rank.
    Rank 0 logs each report to --out-dir/nvrx-reports.jsonl: the time
    (CLOCK_MONOTONIC ns and wall), every score, and the stragglers that
    Report.identify_stragglers names at its default thresholds (0.75)."""

    def __init__(self, args, rank):
        from nvidia_resiliency_ext.attribution import straggler

        self.det = straggler.Detector
        self.det.initialize(scores_to_compute="all", gather_on_rank0=True, report_time_interval=args.nvrx_interval_s)
        self.n = 0
        self.log = open(os.path.join(args.out_dir, "nvrx-reports.jsonl"), "w", buffering=1) if rank == 0 else None

    def section(self, name, cuda):
        return self.det.detection_section(name, profile_cuda=cuda)

    def after_step(self):
        rep = self.det.generate_report_if_interval_elapsed()
        if rep is None or self.log is None:
            return
        st = rep.identify_stragglers()
        ids = lambda xs: sorted(x.rank for x in xs)  # noqa: E731
        rec = {"report": self.n, "mono_ns": time.monotonic_ns(), "wall": time.time(),
               "gpu_rel": _scores(rep.gpu_relative_perf_scores), "gpu_ind": _scores(rep.gpu_individual_perf_scores),
               "sec_rel": {k: _scores(v) for k, v in rep.section_relative_perf_scores.items()},
               "sec_ind": {k: _scores(v) for k, v in rep.section_individual_perf_scores.items()},
               "stragglers": {"gpu_rel": ids(st["straggler_gpus_relative"]), "gpu_ind": ids(st["straggler_gpus_individual"]),
                              "sec_rel": {k: ids(v) for k, v in st["straggler_sections_relative"].items()},
                              "sec_ind": {k: ids(v) for k, v in st["straggler_sections_individual"].items()}},
               "elapsed_s": rep.generate_report_elapsed_time}
        rec["flagged"] = sorted(set(rec["stragglers"]["gpu_rel"]) | set(rec["stragglers"]["gpu_ind"]) |
                                {r for v in rec["stragglers"]["sec_rel"].values() for r in v} |
                                {r for v in rec["stragglers"]["sec_ind"].values() for r in v})
        self.log.write(json.dumps(rec) + "\n")
        self.n += 1

    def close(self):
        self.det.shutdown()
        if self.log:
            self.log.close()


def _scores(m):
    """rank -> score, NaN (no common kernel) as None."""
    return {str(r): (None if v != v else round(float(v), 4)) for r, v in m.items()}


def train_main(argv):
    ap = argparse.ArgumentParser(prog="sensitivity.py train")
    ap.add_argument("--ranks", type=int, default=4)
    ap.add_argument("--share-gpu", action="store_true", help="every rank on GPU 0, each its own NCCL_HOSTID")
    ap.add_argument("--slow-rank", type=int, default=1)
    ap.add_argument("--warmup-s", type=float, default=15)
    ap.add_argument("--slow-s", type=float, default=25)
    ap.add_argument("--healthy-s", type=float, default=20)
    ap.add_argument("--kinds", default="host,gpu")
    ap.add_argument("--mags", default="3,5,10,25", help="percent of the healthy step")
    ap.add_argument("--from-start", default="", help="KIND:PCT: one slow phase from the first step instead")
    ap.add_argument("--start-s", type=float, default=60)
    ap.add_argument("--ref-step-ms", type=float, default=100, help="(--from-start) the step the magnitude is a share of")
    ap.add_argument("--gpu-mode", choices=("sleep", "matmul"), default="sleep")
    ap.add_argument("--nvrx", action="store_true", help="wrap the step in NVRx's straggler sections")
    ap.add_argument("--nvrx-interval-s", type=float, default=5)
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--dim", type=int, default=512)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--heads", type=int, default=8)
    ap.add_argument("--seq", type=int, default=256)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--target-step-ms", type=float, default=100,
                    help="scale --batch before the loop so that a step takes about this long (0: keep --batch)")
    ap.add_argument("--vocab", type=int, default=4096)
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--port", type=int, default=29660)
    ap.add_argument("--kill-after", type=float, default=0, help="stop every rank after this many seconds (0: never)")
    ap.add_argument("--out-dir", default=".")
    args = ap.parse_args(argv)
    os.makedirs(args.out_dir, exist_ok=True)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(args.port)
    for k, v in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"), ("NVSHMEM_DISABLE_NVLS", "1")):
        os.environ.setdefault(k, v)
    if "RANK" in os.environ:
        rank_main(args)
        return 0
    import train  # the launcher (no torch import needed before the fork, but train.py has it at the top)

    def rank_env(r):
        if not args.share_gpu:
            return {}
        return {"LOCAL_RANK": "0", "NCCL_HOSTID": f"slowrank-sens-node{r}", "NCCL_SOCKET_IFNAME": "lo",
                "NCCL_IB_DISABLE": "1"}

    args.launch = args.ranks
    return train.launch(args, rank_env)


# ---------------------------------------------------------------- the analysis


def load_truth(run_dir):
    """meta (rank 0's, or any), per-rank calibration and steps, phase starts."""
    meta, cal, steps, starts = None, {}, [], []
    for name in sorted(os.listdir(run_dir)):
        if not (name.startswith("rank") and name.endswith(".jsonl")):
            continue
        for r in analyze_py.jsonl(os.path.join(run_dir, name)):
            if r.get("meta"):
                if meta is None or r["rank"] == 0:
                    meta = r
            elif r.get("calibration"):
                cal[r["rank"]] = r
            elif r.get("phase_start"):
                starts.append(r)
            elif "step_ms" in r:
                steps.append(r)
    return meta, cal, steps, starts


def phases_from_truth(meta, steps, settle_s=2.0):
    """Per phase of the plan (in order): its boundaries in the truth (first
    step start, last step end over the ranks), the slow rank's onset (its
    first step in the phase), and the job's median step after settle_s."""
    by = {}
    for s in steps:
        by.setdefault(s["phase"], []).append(s)
    out = []
    for p in meta["plan"]:
        ss = by.get(p["name"])
        if not ss:
            continue
        start, end = min(s["start_ns"] for s in ss), max(s["end_ns"] for s in ss)
        mine = [s for s in ss if s["rank"] == meta["slow_rank"]]
        onset = min(s["start_ns"] for s in mine) if mine else start
        per_step = {}
        for s in ss:
            if s["start_ns"] >= start + settle_s * 1e9:
                per_step.setdefault(s["step"], []).append(s["step_ms"])
        job = [max(v) for v in per_step.values()] or [s["step_ms"] for s in ss]
        inj = [s for s in mine if s.get("host_ms") or s.get("gpu_ms")]
        out.append({"name": p["name"], "kind": p["kind"], "mag_pct": p["mag_pct"], "start_ns": start, "end_ns": end,
                    "onset_ns": onset, "steps": len(per_step), "step_ms": round(statistics.median(job), 2),
                    "injected_ms": round(statistics.median([s["host_ms"] + s["gpu_ms"] for s in inj]), 2) if inj else 0.0})
    return out


def slowrank_obs(verdicts, lateness_s):
    """Observations from slowrank verdicts: a straggler verdict flags its
    rank, and so does an uncertain one that holds an alert (alert_active:
    uncertainty never ends an alert); a recovered one clears it. Each is
    known when its window settles (window end + lateness); an alert is
    (rank, phase, since_window)."""
    obs = []
    for v in verdicts:
        st = v.get("state")
        held = st == "uncertain" and bool(v.get("alert_active"))
        if v.get("kind") not in (None, "verdict") or (st not in ("straggler", "recovered") and not held):
            continue
        end = v.get("window_end_ns")
        if end is None:
            continue
        obs.append({"data_ns": end, "t_ns": end + int(lateness_s * 1e9), "rank": v["rank"],
                    "flagged": st != "recovered", "what": v.get("phase") + (" (held)" if held else ""),
                    "alert": (v["rank"], v.get("phase"), v.get("since_window", v.get("window")))})
    return sorted(obs, key=lambda o: o["t_ns"])


NVRX_THRESHOLD = 0.75  # Report.identify_stragglers' default for every score
NVRX_KINDS = ("gpu_rel", "gpu_ind", "sec_rel", "sec_ind")


def nvrx_ranks(rep):
    ranks = set(rep.get("gpu_rel", {})) | set(rep.get("gpu_ind", {}))
    for k in ("sec_rel", "sec_ind"):
        for v in rep.get(k, {}).values():
            ranks |= set(v)
    return sorted(int(r) for r in ranks)


def nvrx_obs(reports):
    """Observations from NVRx's report log: each report flags the ranks its
    identify_stragglers named and clears the others; each report is one
    alert (the issue counts reports)."""
    obs = []
    for rep in reports:
        flagged = set(rep.get("flagged", []))
        for r in nvrx_ranks(rep):
            obs.append({"data_ns": rep["mono_ns"], "t_ns": rep["mono_ns"], "rank": r, "flagged": r in flagged,
                        "what": ",".join(k for k in NVRX_KINDS if _nvrx_flags(rep, k, r)) or None,
                        "alert": ("report", rep["report"], r)})
    return obs


def _nvrx_flags(rep, kind, rank):
    st = rep.get("stragglers", {}).get(kind)
    if isinstance(st, dict):
        return any(rank in v for v in st.values())
    return rank in (st or [])


def nvrx_blocks(reports, per, steps=None):
    """An estimate of NVRx's reports at per times the interval (12: the
    shipped 60 s from 5-s reports): each block of per consecutive reports
    becomes one report at the time of its last, flagged below 0.75. Its
    section scores are NVRx's formulas over the truth's section times of
    the block where steps (with data_ms, fwd_ms) are given
    (truth_section_scores), else the median of the block's scores; its GPU
    scores are always the median of the block's (the kernel times are
    NVRx's alone). Not NVRx's own output."""
    out = []
    blocks = [reports[b:b + per] for b in range(0, len(reports) - per + 1, per)]  # a partial last: not reported yet
    truth = truth_section_scores(steps, [(blocks[i - 1][-1]["mono_ns"] if i else 0, blk[-1]["mono_ns"])
                                         for i, blk in enumerate(blocks)]) if steps and blocks else None
    for i, blk in enumerate(blocks):
        rec = {"report": i, "mono_ns": blk[-1]["mono_ns"], "stragglers": {}, "estimated_from": len(blk)}
        flagged = set()
        for kind in NVRX_KINDS:
            if kind.startswith("gpu"):
                rec[kind] = _median_scores([x.get(kind, {}) for x in blk])
                rec["stragglers"][kind] = sorted(int(r) for r, v in rec[kind].items() if v is not None and v < NVRX_THRESHOLD)
                flagged |= set(rec["stragglers"][kind])
            else:
                secs = sorted({k for x in blk for k in x.get(kind, {})})
                rec[kind] = truth[i][kind] if truth else {
                    sec: _median_scores([x.get(kind, {}).get(sec, {}) for x in blk]) for sec in secs}
                rec["stragglers"][kind] = {sec: sorted(int(r) for r, v in m.items() if v is not None and v < NVRX_THRESHOLD)
                                           for sec, m in rec[kind].items()}
                for v in rec["stragglers"][kind].values():
                    flagged |= set(v)
        rec["flagged"] = sorted(flagged)
        out.append(rec)
    return out


SECTIONS = (("data", "data_ms"), ("fwd", "fwd_ms"))  # NVRx's sections in train --nvrx and their truth fields


def truth_section_scores(steps, bounds):
    """NVRx's section scores recomputed from the truth: for each interval
    (lo_ns, hi_ns] of bounds, per rank and section the median of its steps'
    section time (steps ending in the interval); relative = the smallest
    rank median / the rank's; individual = the smallest of the rank's
    medians so far, this one included / this one (ReportGenerator's
    formulas). Returns per interval {"sec_rel": {sec: {rank: score}},
    "sec_ind": ...}."""
    best = {}
    out = []
    for lo, hi in bounds:
        rel, ind = {}, {}
        for sec, field in SECTIONS:
            med = {}
            for r in sorted({s["rank"] for s in steps}):
                xs = [s[field] for s in steps if s["rank"] == r and lo < s["end_ns"] <= hi and s.get(field) is not None]
                if xs:
                    med[r] = statistics.median(xs)
            if not med:
                continue
            ref = min(med.values())
            rel[sec] = {str(r): round(ref / m, 4) if m > 0 else None for r, m in med.items()}
            for r, m in med.items():
                best[(sec, r)] = min(best.get((sec, r), m), m)
            ind[sec] = {str(r): round(best[(sec, r)] / m, 4) if m > 0 else None for r, m in med.items()}
        out.append({"sec_rel": rel, "sec_ind": ind})
    return out


def nvrx_truth_check(reports, steps):
    """How well the truth recomputes NVRx's own section scores (report by
    report): the median and largest difference of the relative scores, and
    the reports whose flagged section ranks differ."""
    if not steps or not reports or not any("data_ms" in s for s in steps):
        return None
    rec = truth_section_scores(steps, [(reports[i - 1]["mono_ns"] if i else 0, x["mono_ns"]) for i, x in enumerate(reports)])
    diffs, differ = [], 0
    for live, mine in zip(reports, rec):
        lf, mf = set(), set()
        for sec, m in live.get("sec_rel", {}).items():
            for r, v in m.items():
                w = mine["sec_rel"].get(sec, {}).get(r)
                if v is not None and w is not None:
                    diffs.append(abs(v - w))
                if v is not None and v < NVRX_THRESHOLD:
                    lf.add((sec, r))
                if w is not None and w < NVRX_THRESHOLD:
                    mf.add((sec, r))
        differ += lf != mf
    return {"reports": len(reports), "median_abs_diff": round(statistics.median(diffs), 4) if diffs else None,
            "max_abs_diff": round(max(diffs), 4) if diffs else None, "reports_flagging_differently": differ}


def _median_scores(maps):
    ranks = sorted({r for m in maps for r in m})
    res = {}
    for r in ranks:
        xs = [m[r] for m in maps if m.get(r) is not None]
        res[r] = round(statistics.median(xs), 4) if xs else None
    return res


def local_baselines(phases):
    """Per slow phase, the step it lengthened: the mean of the healthy
    phases on either side of it (the one before alone at the end of the
    run). A machine whose speed drifts through a run (a loaded CI host,
    a GPU warming up) moves every phase's step; against the warm-up alone
    that drift would count as the stall's (one CI run: warm-up 40.4 ms,
    healthy phases 41.3-42.0 ms, and a 5 % stall read as +7.4 %)."""
    out = []
    for i, p in enumerate(phases):
        if not p["kind"]:
            out.append(None)
            continue
        near = [q["step_ms"] for q in (phases[i - 1] if i else None, phases[i + 1] if i + 1 < len(phases) else None)
                if q and not q["kind"] and q["step_ms"]]
        out.append(statistics.mean(near) if near else None)
    return out


def judge(phases, obs, slow_rank, limit_s):
    """Per phase: named (recall), time to verdict and to recovered (slow
    phases), false alerts; and the totals. A false alert is one alert (an
    observation's alert key) first flagged in a false context: on another
    rank anywhere, or on the slow rank in the warm-up or in a healthy phase
    later than limit_s after it began (the recovery allowance)."""
    lim = limit_s * 1e9
    base = next((p["step_ms"] for p in phases if p["name"] == "warmup"), None)
    local = local_baselines(phases)
    rows, seen_false = [], set()
    tot = {"other_ranks": 0, "warmup": 0, "healthy": 0, "flagged_obs_false": 0}
    for i, p in enumerate(phases):
        nxt = phases[i + 1]["start_ns"] if i + 1 < len(phases) else float("inf")
        inside = [o for o in obs if p["start_ns"] <= o["data_ns"] < nxt]
        row = {k: p[k] for k in ("name", "kind", "mag_pct", "injected_ms", "step_ms", "steps")}
        row["step_rise_pct"] = round((p["step_ms"] / local[i] - 1) * 100, 1) if local[i] and p["kind"] else None
        false = {"other_ranks": set(), "slow_rank": set()}
        for o in inside:
            if not o["flagged"]:
                continue
            if o["rank"] != slow_rank:
                false["other_ranks"].add(o["alert"])
            elif not p["kind"] and (p["name"] == "warmup" or o["data_ns"] > p["start_ns"] + lim):
                false["slow_rank"].add(o["alert"])
            else:
                continue
            tot["flagged_obs_false"] += 1
        row["false_other_ranks"] = len(false["other_ranks"] - seen_false)
        row["false_slow_rank"] = len(false["slow_rank"] - seen_false)
        tot["other_ranks"] += row["false_other_ranks"]
        tot["warmup" if p["name"] == "warmup" else "healthy"] += row["false_slow_rank"] if not p["kind"] else 0
        seen_false |= false["other_ranks"] | false["slow_rank"]
        if p["kind"]:
            hit = next((o for o in obs if o["rank"] == slow_rank and o["flagged"]
                        and o["data_ns"] > p["onset_ns"] and o["data_ns"] <= p["end_ns"] + lim), None)
            row["time_to_verdict_s"] = round((hit["t_ns"] - p["onset_ns"]) / 1e9, 2) if hit else None
            row["named"] = bool(hit) and hit["t_ns"] - p["onset_ns"] <= lim
            row["named_as"] = hit["what"] if hit else None
            rec = next((o for o in obs if o["rank"] == slow_rank and not o["flagged"] and o["t_ns"] > p["end_ns"]), None)
            row["time_to_recovered_s"] = round((rec["t_ns"] - p["end_ns"]) / 1e9, 2) if rec and hit else None
        rows.append(row)
    slow_rows = [r for r in rows if r["kind"]]
    tot["false_alerts"] = tot["other_ranks"] + tot["warmup"] + tot["healthy"]
    targets = {
        "recall_ge5": all(r["named"] for r in slow_rows if r["mag_pct"] >= 5) if slow_rows else None,
        "no_false_alerts": tot["false_alerts"] == 0,
    }
    targets["pass"] = bool(targets["recall_ge5"]) and targets["no_false_alerts"]
    return {"phases": rows, "false": tot, "targets": targets, "limit_s": limit_s, "baseline_step_ms": base}


def markdown(title, res):
    lines = [f"### {title}", ""] + ([res["estimated"] + ".", ""] if res.get("estimated") else []) + [
             f"Named = the slow rank flagged within {res['limit_s']:g} s of the onset. "
             f"False alerts: {res['false']['false_alerts']} (other ranks {res['false']['other_ranks']}, "
             f"slow rank in warm-up {res['false']['warmup']}, in healthy phases {res['false']['healthy']}).", "",
             "| phase | injected ms | job step ms | step rise | named | time to verdict s | time to recovered s | false (slow rank / others) |",
             "|---|---|---|---|---|---|---|---|"]
    for r in res["phases"]:
        rise = "" if r["step_rise_pct"] is None else f"{r['step_rise_pct']:+.1f} %"
        named = "" if not r["kind"] else ("yes" if r["named"] else "no")
        ttv = "" if not r["kind"] else (r["time_to_verdict_s"] if r["time_to_verdict_s"] is not None else "-")
        ttr = "" if not r["kind"] else (r["time_to_recovered_s"] if r["time_to_recovered_s"] is not None else "-")
        lines.append(f"| {r['name']} | {r['injected_ms']} | {r['step_ms']} | {rise} | {named} | {ttv} | {ttr} | "
                     f"{r['false_slow_rank']} / {r['false_other_ranks']} |")
    return "\n".join(lines) + "\n"


def analyze_run(run_dir, verdicts=None, window_s=5.0, lateness_s=2.0, consecutive=3, limit_s=None,
                nvrx_reports=None, nvrx_per=12):
    meta, cal, steps, _ = load_truth(run_dir)
    if meta is None or not steps:
        return {"run": run_dir, "error": "no truth (rank*.jsonl with a meta line and steps)"}
    limit_s = consecutive * window_s + lateness_s if limit_s is None else limit_s
    phases = phases_from_truth(meta, steps)
    if meta.get("args", {}).get("from_start"):
        phases[0]["baseline_from"] = "ref_step_ms"
    res = {"run": os.path.basename(os.path.normpath(run_dir)), "slow_rank": meta["slow_rank"], "world": meta["world"],
           "device": meta.get("gpu", meta["device"]), "share_gpu": meta.get("share_gpu"), "gpu_mode": meta.get("gpu_mode"),
           "gpu_unit_ms": meta.get("gpu_unit_ms"), "ref_step_ms": (cal.get(meta["slow_rank"]) or {}).get("ref_step_ms"),
           "torch": meta.get("torch"), "nccl": meta.get("nccl"), "nvrx_commit": meta.get("nvrx_commit"),
           "batch": meta.get("batch")}
    judged = {}
    if verdicts is not None:
        res["verdicts"] = verdicts
        judged["slowrank"] = judge(phases, slowrank_obs(analyze_py.jsonl(verdicts), lateness_s), meta["slow_rank"], limit_s)
    if nvrx_reports is not None:
        reps = analyze_py.jsonl(nvrx_reports)
        res["nvrx_reports"] = {"path": nvrx_reports, "count": len(reps)}
        if len(reps) > 1:
            res["nvrx_reports"]["interval_s"] = round((reps[-1]["mono_ns"] - reps[0]["mono_ns"]) / 1e9 / (len(reps) - 1), 2)
        judged["nvrx"] = judge(phases, nvrx_obs(reps), meta["slow_rank"], limit_s)
        res["nvrx_reports"]["truth_check"] = nvrx_truth_check(reps, steps)
        from_truth = res["nvrx_reports"]["truth_check"] is not None
        blocks = nvrx_blocks(reps, nvrx_per, steps if from_truth else None)
        est = judge(phases, nvrx_obs(blocks), meta["slow_rank"], limit_s)
        est["estimated"] = (f"{len(blocks)} reports, one per {nvrx_per} consecutive live reports: section scores by "
                            + ("NVRx's formulas over the truth's section times of the block" if from_truth else
                               "the median of the block's scores")
                            + ", GPU scores the median of the block's, flagged below 0.75; an estimate of a longer "
                            "report interval, not NVRx's own output")
        judged[f"nvrx_x{nvrx_per}_estimate"] = est
    for j in judged.values():
        if j["baseline_step_ms"] is None and res["ref_step_ms"]:
            for row in j["phases"]:
                if row["kind"]:
                    row["step_rise_pct"] = round((row["step_ms"] / res["ref_step_ms"] - 1) * 100, 1)
    res["judged"] = judged
    return res


def analyze_main(argv):
    ap = argparse.ArgumentParser(prog="sensitivity.py analyze")
    ap.add_argument("run_dir")
    ap.add_argument("--verdicts", help="slowrank verdicts (the agent's --verdicts or a replay's --output)")
    ap.add_argument("--nvrx-reports", help="NVRx's report log (train --nvrx: RUN_DIR/nvrx-reports.jsonl)")
    ap.add_argument("--nvrx-per", type=int, default=12,
                    help="reports per estimated longer report (12: 60 s from 5-s reports)")
    ap.add_argument("--window-s", type=float, default=5.0)
    ap.add_argument("--lateness-s", type=float, default=2.0)
    ap.add_argument("--consecutive", type=int, default=3)
    ap.add_argument("--limit-s", type=float, help="named within this many s of the onset (default consecutive x window + lateness)")
    ap.add_argument("--title", default="")
    ap.add_argument("--json", help="write the summary here instead of stdout")
    ap.add_argument("--md", help="also write a markdown table here")
    a = ap.parse_args(argv)
    res = analyze_run(a.run_dir, a.verdicts, a.window_s, a.lateness_s, a.consecutive, a.limit_s,
                      a.nvrx_reports, a.nvrx_per)
    text = json.dumps(res, indent=1, default=list)
    if a.json:
        with open(a.json, "w") as f:
            f.write(text + "\n")
    else:
        print(text)
    if a.md and res.get("judged"):
        with open(a.md, "w") as f:
            for name, j in res["judged"].items():
                nv = f" (NVRx {res['nvrx_commit'][:12]})" if name.startswith("nvrx") and res.get("nvrx_commit") else ""
                f.write(markdown(f"{a.title or res['run']}: {name}{nv}", j) + "\n")
    return 0 if "error" not in res else 1


def side_by_side(runs):
    """One markdown table of every judged detector of runs ({run name:
    analyze_run result}): a row per phase name (schedule and from-start
    runs), a column per run and detector with named, time to verdict and
    the job's step rise of that run; the false alerts last."""
    cols = [(name, det, j) for name, res in runs.items() for det, j in res.get("judged", {}).items()]
    names = []
    for _, _, j in cols:
        for r in j["phases"]:
            if r["kind"] and r["name"] not in names:
                names.append(r["name"])
    head = "| phase | " + " | ".join(f"{det} ({name})" for name, det, _ in cols) + " |"
    lines = [head, "|---|" + "---|" * len(cols)]
    for n in names:
        cells = []
        for _, _, j in cols:
            r = next((x for x in j["phases"] if x["name"] == n), None)
            if r is None:
                cells.append("")
                continue
            t = r["time_to_verdict_s"]
            rise = "" if r["step_rise_pct"] is None else f", step {r['step_rise_pct']:+.1f} %"
            cells.append(("yes" if r["named"] else "no") + (f" {t:g} s" if t is not None else "") + rise)
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    lines.append("| false alerts (warm-up / healthy / other ranks) | " + " | ".join(
        f"{j['false']['warmup']} / {j['false']['healthy']} / {j['false']['other_ranks']}" for _, _, j in cols) + " |")
    return "\n".join(lines) + "\n"


def table_main(argv):
    ap = argparse.ArgumentParser(prog="sensitivity.py table")
    ap.add_argument("summaries", nargs="+", help="sensitivity.json files (sensitivity.sh) or analyze --json outputs")
    a = ap.parse_args(argv)
    runs = {}
    for path in a.summaries:
        with open(path) as f:
            d = json.load(f)
        runs.update(d["runs"] if "runs" in d else {d.get("run", path): d})
    sys.stdout.write(side_by_side(runs))
    return 0


# ---------------------------------------------------------------- selftest


def synth_run(d, plan, slow_rank=1, step_ms=100.0, ranks=4, t0=10**12):
    """rank*.jsonl of a synthetic job following plan: every step step_ms,
    +mag % on slow phases."""
    s = 10**6
    files = [open(os.path.join(d, f"rank{r}.jsonl"), "w") for r in range(ranks)]
    for r, f in enumerate(files):
        f.write(json.dumps({"meta": True, "rank": r, "world": ranks, "slow_rank": slow_rank, "device": "cpu",
                            "plan": plan, "t0_ns": t0, "args": {}}) + "\n")
    t, step = t0, 0
    for p in plan:
        while t < t0 + p["end_s"] * 1e9:
            ms = step_ms * (1 + p["mag_pct"] / 100)
            for r, f in enumerate(files):
                inj = p["mag_pct"] / 100 * step_ms if r == slow_rank and p["kind"] else 0.0
                f.write(json.dumps({"rank": r, "step": step, "phase": p["name"], "start_ns": t, "end_ns": t + int(ms * s),
                                    "step_ms": ms, "host_ms": inj if p["kind"] == "host" else 0.0,
                                    "gpu_ms": inj if p["kind"] == "gpu" else 0.0}) + "\n")
            t += int(ms * s)
            step += 1
    for f in files:
        f.close()
    return t0


def selftest():
    import tempfile
    passed, failed = [0], []

    def check(name, cond):
        if cond:
            passed[0] += 1
        else:
            failed.append(name)
            print("FAIL", name)

    plan = schedule(15, 25, 20, ["host", "gpu"], [3, 5, 10, 25])
    check("schedule: warm-up + 8 x (slow, healthy), 375 s", len(plan) == 17 and plan[-1]["end_s"] == 375
          and plan[1] == {"name": "host-3", "kind": "host", "mag_pct": 3, "start_s": 15, "end_s": 40}
          and plan[10]["name"] == "gpu-3-healthy")
    check("phase_at", phase_at(plan, 0) == 0 and phase_at(plan, 15) == 1 and phase_at(plan, 374.9) == 16
          and phase_at(plan, 375) == 17)
    fs = schedule(15, 25, 20, ["host"], [5], parse_from_start("host:10"), 60)
    check("from start: one slow phase", fs == [{"name": "host-10-from-start", "kind": "host", "mag_pct": 10.0,
                                                 "start_s": 0.0, "end_s": 60}])
    drift = [{"name": "warmup", "kind": None, "step_ms": 40.0}, {"name": "host-5", "kind": "host", "step_ms": 43.0},
             {"name": "host-5-healthy", "kind": None, "step_ms": 42.0}, {"name": "host-10", "kind": "host", "step_ms": 46.2}]
    check("rise against the healthy phases either side (drift cancels), the one before at the end",
          local_baselines(drift) == [None, 41.0, None, 42.0])
    plan = schedule(15, 25, 20, ["host"], [3, 10])
    with tempfile.TemporaryDirectory() as d:
        t0 = synth_run(d, plan)
        sec = 10**9

        def v(w, rank, state, since=None, phase="host"):
            return {"kind": "verdict", "window": w, "window_end_ns": t0 + 5 * sec * (w + 1), "rank": rank,
                    "phase": phase, "state": state, "since_window": since if since is not None else w}
        # host-10 runs 60..85 s: windows 11.. end at 60+5k s. Named in window
        # 14 (ends 75 s: 15 s + 2 s lateness after the onset), recovered in
        # window 17 (ends 90 s, 5 s + 2 s after the phase). Rank 2 flagged in
        # warm-up (twice, one alert); rank 1 again late in its healthy phase.
        vs = [v(1, 2, "straggler", 1), v(2, 2, "straggler", 1), v(14, 1, "straggler", 12), v(15, 1, "straggler", 12),
              v(17, 1, "recovered"), v(20, 1, "straggler", 20), dict(v(21, 1, "uncertain", 20), alert_active=True),
              v(3, 3, "uncertain"), {"kind": "summary"}]
        with open(os.path.join(d, "v.jsonl"), "w") as f:
            f.write("\n".join(json.dumps(x) for x in vs) + "\n")
        res = analyze_run(d, os.path.join(d, "v.jsonl"))["judged"]["slowrank"]
        ph = {r["name"]: r for r in res["phases"]}
        check("step rise from truth", ph["host-10"]["step_rise_pct"] == 10.0 and ph["host-3"]["step_rise_pct"] == 3.0
              and ph["host-3-healthy"]["step_rise_pct"] is None and res["baseline_step_ms"] == 100.0)
        check("injected ms", ph["host-10"]["injected_ms"] == 10.0 and ph["warmup"]["injected_ms"] == 0.0)
        t10 = ph["host-10"]["time_to_verdict_s"]
        check("named host-10 in 17 s", ph["host-10"]["named"] and t10 is not None and 16.9 <= t10 <= 17.0)
        check("host-3 missed", not ph["host-3"]["named"] and ph["host-3"]["time_to_verdict_s"] is None
              and ph["host-3"]["time_to_recovered_s"] is None)
        tr = ph["host-10"]["time_to_recovered_s"]
        check("recovered 7 s after", tr is not None and 6.8 <= tr <= 7.0)
        check("false alerts: one other-rank alert in warm-up, one late on the slow rank",
              res["false"]["other_ranks"] == 1 and res["false"]["healthy"] == 1 and res["false"]["warmup"] == 0
              and ph["warmup"]["false_other_ranks"] == 1 and ph["host-10-healthy"]["false_slow_rank"] == 1
              and res["false"]["flagged_obs_false"] == 4)
        check("targets fail", res["targets"] == {"recall_ge5": True, "no_false_alerts": False, "pass": False})
        late = analyze_run(d, os.path.join(d, "v.jsonl"), limit_s=10)["judged"]["slowrank"]
        check("a tighter limit misses host-10", not {r["name"]: r for r in late["phases"]}["host-10"]["named"])
        md = markdown("t", res)
        check("markdown", "| host-10 | 10.0 | 110.0 | +10.0 % | yes | 16.97 | 6.89 | 0 / 0 |" in md)
        with open(os.path.join(d, "v.jsonl"), "w") as f:
            f.write(json.dumps(v(14, 1, "straggler", 12)) + "\n")
        check("clean run passes", analyze_run(d, os.path.join(d, "v.jsonl"))["judged"]["slowrank"]["targets"]["pass"])
        # NVRx: a report every 5 s from 2 s on. Rank 1's data section scores
        # 0.6 from the first report after the onset of host-10 (62 s) to its
        # end; rank 3's GPU 0.7 in the report at 7 s (warm-up), rank 1's
        # individual data score 0.7 in the report at 92 s (healthy).
        reps = []
        for k in range(21):
            t = 2 + 5 * k
            r1 = 0.6 if 62 <= t <= 85 else (0.7 if t == 92 else 1.0)
            rep = {"report": k, "mono_ns": t0 + t * sec, "gpu_rel": {"0": 1.0, "1": 1.0, "2": 1.0, "3": 0.7 if t == 7 else 0.95},
                   "gpu_ind": {}, "sec_rel": {"data": {"0": 1.0, "1": r1 if t != 92 else 1.0, "2": 1.0, "3": 1.0}},
                   "sec_ind": {"data": {"0": 1.0, "1": 0.7 if t == 92 else 1.0, "2": 1.0, "3": 1.0}},
                   "stragglers": {"gpu_rel": [3] if t == 7 else [], "gpu_ind": [],
                                  "sec_rel": {"data": [1]} if 62 <= t <= 85 else {},
                                  "sec_ind": {"data": [1]} if t == 92 else {}}}
            rep["flagged"] = sorted({3} if t == 7 else set() | ({1} if 62 <= t <= 85 or t == 92 else set()))
            reps.append(rep)
        with open(os.path.join(d, "n.jsonl"), "w") as f:
            f.write("\n".join(json.dumps(x) for x in reps) + "\n")
        allj = analyze_run(d, nvrx_reports=os.path.join(d, "n.jsonl"), nvrx_per=4)
        nj = allj["judged"]["nvrx"]
        ph = {r["name"]: r for r in nj["phases"]}
        check("nvrx: named 2 s after the onset as sec_rel", ph["host-10"]["named"] and ph["host-10"]["named_as"] == "sec_rel"
              and 1.9 <= ph["host-10"]["time_to_verdict_s"] <= 2.0 and not ph["host-3"]["named"])
        check("nvrx: recovered at the first report after the phase", 1.8 <= ph["host-10"]["time_to_recovered_s"] <= 1.9)
        check("nvrx: false reports, one a context", nj["false"] == {"other_ranks": 1, "warmup": 0, "healthy": 0,
                                                                 "flagged_obs_false": 1, "false_alerts": 1}
              and ph["host-10-healthy"]["false_slow_rank"] == 0)
        check("nvrx: report count and interval, no section truth", allj["nvrx_reports"] == {
            "path": os.path.join(d, "n.jsonl"), "count": 21, "interval_s": 5.0, "truth_check": None})
        blocks = nvrx_blocks(reps, 4)
        check("nvrx blocks: 5 full blocks of 4, medians", len(blocks) == 5 and blocks[3]["sec_rel"]["data"]["1"] == 0.6
              and blocks[3]["flagged"] == [1] and blocks[0]["flagged"] == [] and blocks[0]["gpu_rel"]["3"] == 0.95)
        est = allj["judged"]["nvrx_x4_estimate"]
        eph = {r["name"]: r for r in est["phases"]}
        check("nvrx estimate: named later, no false report", eph["host-10"]["named"]
              and eph["host-10"]["time_to_verdict_s"] > ph["host-10"]["time_to_verdict_s"]
              and est["false"]["false_alerts"] == 0 and "estimate" in est["estimated"])
        # NVRx's section formulas over the truth: rank 1's data section
        # doubles from step 11; the second interval sees it.
        ts = [{"rank": r, "end_ns": k * sec, "data_ms": 20.0 if r == 1 and k > 10 else 10.0, "fwd_ms": 5.0}
              for r in range(4) for k in range(1, 21)]
        sc = truth_section_scores(ts, [(0, 10 * sec), (10 * sec, 20 * sec)])
        check("truth section scores", sc[0]["sec_rel"]["data"] == {"0": 1.0, "1": 1.0, "2": 1.0, "3": 1.0}
              and sc[1]["sec_rel"]["data"]["1"] == 0.5 and sc[1]["sec_ind"]["data"]["1"] == 0.5
              and sc[1]["sec_ind"]["data"]["0"] == 1.0 and sc[1]["sec_rel"]["fwd"]["1"] == 1.0)
        live = [{"mono_ns": 10 * sec, "sec_rel": sc[0]["sec_rel"]}, {"mono_ns": 20 * sec, "sec_rel": sc[1]["sec_rel"]}]
        check("truth check agrees", nvrx_truth_check(live, ts) == {
            "reports": 2, "median_abs_diff": 0.0, "max_abs_diff": 0.0, "reports_flagging_differently": 0})
        live[1] = {"mono_ns": 20 * sec, "sec_rel": {"data": {"0": 1.0, "1": 0.9, "2": 1.0, "3": 1.0}}}
        tc = nvrx_truth_check(live, ts)
        check("truth check disagrees", tc["max_abs_diff"] == 0.4 and tc["reports_flagging_differently"] == 1)
        bl = nvrx_blocks([dict(x, report=i, gpu_rel={}, gpu_ind={}, sec_ind={}) for i, x in enumerate(live)], 1, ts)
        check("blocks from the truth", bl[1]["sec_rel"]["data"]["1"] == 0.5 and bl[1]["flagged"] == [1]
              and bl[0]["flagged"] == [])
        tab = side_by_side({"sens-nvrx": allj})
        check("side by side: a column per detector, a row per slow phase",
              "| phase | nvrx (sens-nvrx) | nvrx_x4_estimate (sens-nvrx) |" in tab
              and "| host-10 | yes 1.97 s, step +10.0 % | yes " in tab and "| host-3 | no, step +3.0 % | no, step +3.0 % |" in tab
              and "| false alerts (warm-up / healthy / other ranks) | 0 / 0 / 1 | 0 / 0 / 0 |" in tab)
    print(f"{passed[0]} passed, {len(failed)} failed")
    return {"passed": passed[0], "failed": failed}


def main(argv):
    if len(argv) >= 2 and argv[1] == "train":
        return train_main(argv[2:])
    if len(argv) >= 2 and argv[1] == "analyze":
        return analyze_main(argv[2:])
    if len(argv) >= 2 and argv[1] == "table":
        return table_main(argv[2:])
    if len(argv) == 2 and argv[1] == "selftest":
        return 1 if selftest()["failed"] else 0
    sys.exit(__doc__)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
