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

Layouts come from cupti/slowrank_abi.h (record kinds 1 and 9); this parser
reads only the fields it needs and skips everything else by size.
"""
import json
import os
import statistics
import struct
import sys
import time


def wait_for_start(dist, x):
    """With START_FILE set, keep the process busy (small all-reduces) until
    that file exists: the agent needs a few seconds to find the process,
    attach the library and have the share pinned, and the measured loop
    takes about one."""
    path = os.environ.get("START_FILE")
    if not path:
        return
    deadline = time.monotonic() + float(os.environ.get("START_WAIT_S", "60"))
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            raise SystemExit(f"no {path} after {os.environ.get('START_WAIT_S', '60')} s")
        for _ in range(100):
            dist.all_reduce(x)
        time.sleep(0.01)


def loop(args):
    import torch
    import torch.distributed as dist
    n, blocks = int(args[0]), int(args[1])
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", os.environ.get("PORT", "29610"))
    dist.init_process_group("nccl", rank=0, world_size=1)
    torch.cuda.set_device(0)
    x = torch.ones(256, device="cuda")  # 1 KiB: host enqueue cost dominates
    for _ in range(2000):
        dist.all_reduce(x)
    torch.cuda.synchronize()
    wait_for_start(dist, x)
    per = []
    for _ in range(blocks):
        t0 = time.perf_counter_ns()
        for _ in range(n):
            dist.all_reduce(x)
        t1 = time.perf_counter_ns()  # host time only: the GPU runs behind
        torch.cuda.synchronize()
        per.append((t1 - t0) / n)
    dist.destroy_process_group()
    print(json.dumps({"mode": os.environ.get("MODE", "?"), "ns_per_call": statistics.median(per),
                      "blocks": per, "calls": n}))


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


def clock(args):
    cupti, plugin = [], []
    for kind, r in records(args[0]):
        if kind == 1 and r[4] == 1:  # SLOWRANK_REC_KERNEL, class communication
            s, e = struct.unpack_from("<QQ", r, 8)
            cupti.append((s, e))
        elif kind == 9:  # SLOWRANK_REC_NCCL_KERNEL
            s, e, seen, off = struct.unpack_from("<QQQq", r, 32)
            plugin.append((s, e, seen, off))
    cupti.sort()
    import bisect
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
    q = lambda v: {"n": len(v), "median": statistics.median(v) if v else None,
                   "p5": sorted(v)[len(v) // 20] if v else None, "p95": sorted(v)[len(v) * 19 // 20] if v else None}
    print(json.dumps({"cupti_nccl_kernels": len(cupti), "plugin_kernels": len(plugin),
                      "start_minus_cupti_ns": q(ds), "end_minus_cupti_ns": q(de), "host_seen_lag_ns": q(lag),
                      "clock_offset_ns": plugin[-1][3] if plugin else None}))


def ratios(args):
    by = {}
    for line in open(args[0]):
        d = json.loads(line)
        by.setdefault(d["mode"], []).append(d["ns_per_call"])
    base = statistics.median(by.get("neither", [float("nan")]))
    print(json.dumps({m: {"ns_per_call": statistics.median(v), "rounds": len(v),
                          "ratio_vs_neither": statistics.median(v) / base,
                          "added_ns_per_call": statistics.median(v) - base} for m, v in by.items()}))


if __name__ == "__main__":
    {"loop": loop, "clock": clock, "ratios": ratios}[sys.argv[1]](sys.argv[2:])
