"""Issue 20 on the H200: the NCCL profiler plugin's cost and clock.

  loop   a tight loop of small all-reduces on one rank (world size 1; NCCL
         still enqueues and launches), host ns per call, median of blocks
         (each block shorter than the launch queue, synchronised after);
         prints one JSON line
  clock  reads a SLOWRANK_CUPTI_DUMP file holding both CUPTI kernel records
         and the plugin's NCCL_KERNEL records and reports, per collective,
         plugin GPU start/end minus the overlapping CUPTI NCCL kernel's
         (the globaltimer -> CLOCK_MONOTONIC mapping against CUPTI's clock)
  ratios combines the loop lines of nccl_plugin.sh into ratios against "neither"
  selftest pairs a synthetic dump (make bench-selftest)

Layouts come from cupti/slowrank_abi.h (record kinds 1 and 9); this parser
reads only the fields it needs and skips everything else by size.
"""
import json
import os
import statistics
import struct
import sys
import time


def wait_for_start(dist, x, device):
    """With START_FILE set, keep the process busy (small all-reduces) until
    that file exists: the agent needs a few seconds to find the process,
    attach the library and have the share pinned, and the measured loop
    takes about one. Rank 0 decides and broadcasts, so that every rank runs
    the same number of collectives."""
    import torch
    path = os.environ.get("START_FILE")
    if not path:
        return
    wait_s = float(os.environ.get("START_WAIT_S", "60"))
    deadline = time.monotonic() + wait_s
    flag = torch.zeros(1, device=device)
    while True:
        if dist.get_rank() == 0:
            flag.fill_(1.0 if os.path.exists(path) else (2.0 if time.monotonic() > deadline else 0.0))
        dist.broadcast(flag, 0)
        state = flag.item()
        if state == 1.0:
            return
        if state == 2.0:
            raise SystemExit(f"no {path} after {wait_s} s")
        for _ in range(100):
            dist.all_reduce(x)
        time.sleep(0.01)


def loop(args):
    import torch
    import torch.distributed as dist
    n, blocks = int(args[0]), int(args[1])
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", os.environ.get("PORT", "29610"))
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", str(rank))))
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=device)
    x = torch.ones(256, device=device)  # 1 KiB: host enqueue cost dominates
    for _ in range(2000):
        dist.all_reduce(x)
    torch.cuda.synchronize()
    wait_for_start(dist, x, device)
    per = []
    for _ in range(blocks):
        t0 = time.perf_counter_ns()
        for _ in range(n):
            dist.all_reduce(x)
        t1 = time.perf_counter_ns()  # host time only: the GPU runs behind
        torch.cuda.synchronize()
        per.append((t1 - t0) / n)
    dist.destroy_process_group()
    if rank == 0:
        print(json.dumps({"mode": os.environ.get("MODE", "?"), "ns_per_call": statistics.median(per),
                          "blocks": per, "calls": n, "world_size": world}))


def records(path):
    with open(path, "rb") as f:
        data = f.read()
    off = 0
    while off + 4 <= len(data):
        (n,) = struct.unpack_from("<I", data, off)
        b = data[off + 4: off + 4 + n]
        off += 4 + n
        hs, = struct.unpack_from("<H", b, 44)
        count, = struct.unpack_from("<I", b, 12)
        p = hs
        for _ in range(count):
            kind, size = struct.unpack_from("<HH", b, p)
            yield kind, b[p:p + size]
            p += size


def pair_kernels(path):
    """One process's dump: each plugin kernel record against the CUPTI NCCL
    kernel that overlaps it most. Returns the counts and the differences."""
    import bisect
    cupti, plugin = [], []
    for kind, r in records(path):
        if kind == 1 and r[4] == 1:  # SLOWRANK_REC_KERNEL, class communication
            cupti.append(struct.unpack_from("<QQ", r, 8))
        elif kind == 9:  # SLOWRANK_REC_NCCL_KERNEL
            plugin.append(struct.unpack_from("<QQQq", r, 32))
    cupti.sort()
    starts = [c[0] for c in cupti]
    ds, de, lag = [], [], []
    for s, e, seen, _ in plugin:
        i = bisect.bisect_left(starts, s) - 1
        best = None
        for j in range(max(i - 2, 0), min(i + 3, len(cupti))):
            cs, ce = cupti[j]
            ov = min(e, ce) - max(s, cs)
            if best is None or ov > best[0]:
                best = (ov, cs, ce)
        if best and best[0] > 0:
            ds.append(s - best[1])
            de.append(e - best[2])
            lag.append(seen - e)
    return len(cupti), len(plugin), ds, de, lag, (plugin[-1][3] if plugin else None)


def clock(args):
    """The dumps of all ranks (one file each), paired per process."""
    nc = np_ = 0
    ds, de, lag, offsets = [], [], [], []
    missing = [path for path in args if not os.path.exists(path)]
    for path in args:
        if path in missing:
            continue
        c, p, a, b, l, off = pair_kernels(path)
        nc, np_ = nc + c, np_ + p
        ds, de, lag = ds + a, de + b, lag + l
        offsets.append(off)
    q = lambda v: {"n": len(v), "median": statistics.median(v) if v else None,
                   "p5": sorted(v)[len(v) // 20] if v else None, "p95": sorted(v)[len(v) * 19 // 20] if v else None}
    print(json.dumps({"dumps": len(args) - len(missing), "missing_dumps": missing, "cupti_nccl_kernels": nc, "plugin_kernels": np_,
                      "start_minus_cupti_ns": q(ds), "end_minus_cupti_ns": q(de), "host_seen_lag_ns": q(lag),
                      "clock_offset_ns": offsets}))


ONE_RANK = ("world size 1: NCCL runs a one-rank collective as ncclLaunchOneRank (an in-place sum is a "
            "no-op, out of place a memcpy): no collective kernel, no Coll or KernelCh profiler event. The "
            "uprobe figure holds (the trap is on the call); the plugin figures cover its API events only")


def ratios(args):
    by, worlds = {}, set()
    for line in open(args[0]):
        d = json.loads(line)
        by.setdefault(d["mode"], []).append(d["ns_per_call"])
        worlds.add(d.get("world_size", 1))
    base = statistics.median(by.get("neither", [float("nan")]))
    out = {m: {"ns_per_call": statistics.median(v), "rounds": len(v),
               "ratio_vs_neither": statistics.median(v) / base,
               "added_ns_per_call": statistics.median(v) - base} for m, v in by.items()}
    out["world_size"] = max(worlds) if worlds else None
    if worlds == {1}:
        out["note"] = ONE_RANK
    print(json.dumps(out))


def batch(recs):
    """A batch as the library writes it: the 64-byte header (count at 12,
    header_size at 44), then the records."""
    body = b"".join(recs)
    head = bytearray(64)
    struct.pack_into("<IHHII", head, 0, 0x53524231, 1, 0, 1, len(recs))
    struct.pack_into("<IH", head, 40, 64 + len(body), 64)
    return bytes(head) + body


def selftest(_args):
    """Pairs a synthetic dump of two batches (two CUPTI NCCL kernels, one
    compute kernel, two plugin kernels) and checks the differences."""
    import tempfile
    def kernel(start, end, kclass):
        r = bytearray(72)
        struct.pack_into("<HHBB", r, 0, 1, 72, kclass, 0)
        struct.pack_into("<QQ", r, 8, start, end)
        return bytes(r)
    def nccl_kernel(start, end, seen):
        r = bytearray(64)
        struct.pack_into("<HH", r, 0, 9, 64)
        struct.pack_into("<QQQq", r, 32, start, end, seen, -7)
        return bytes(r)
    b1 = batch([kernel(1000, 2000, 1), kernel(1500, 2500, 0), nccl_kernel(1010, 1990, 2100)])
    b2 = batch([kernel(5000, 6000, 1), nccl_kernel(4980, 6030, 6100)])
    with tempfile.NamedTemporaryFile(suffix=".dump") as f:
        for b in (b1, b2):
            f.write(struct.pack("<I", len(b)) + b)
        f.flush()
        c, p, ds, de, lag, off = pair_kernels(f.name)
    checks = [("two CUPTI NCCL kernels (the compute one skipped)", c == 2), ("two plugin kernels", p == 2),
              ("start differences", sorted(ds) == [-20, 10]), ("end differences", sorted(de) == [-10, 30]),
              ("host lag", sorted(lag) == [70, 110]), ("clock offset", off == -7)]
    bad = [name for name, ok in checks if not ok]
    print(f"nccl_plugin selftest: {len(checks) - len(bad)} of {len(checks)} pass" + (f"; FAIL: {bad}" if bad else ""))
    if bad:
        raise SystemExit(1)


if __name__ == "__main__":
    {"loop": loop, "clock": clock, "ratios": ratios, "selftest": selftest}[sys.argv[1]](sys.argv[2:])
