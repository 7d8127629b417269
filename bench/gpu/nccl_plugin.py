"""Issue 20 on the H200: the NCCL profiler plugin's cost and clock.

  paired OUT.jsonl   cost per NCCL operation, one process, world size 1: arms
                     neither / plugin / plugin_kch switched in-process (the
                     library's control block, as the agent writes it) in
                     Williams-ordered rounds of short blocks; uprobe blocks in
                     segments during which the shell runs the agent (files in
                     SYNC_DIR); one JSON line per block
  report IN.jsonl OUT.json
                     per-round differences of each arm against the round's
                     "neither" block, bootstrap 95 % CIs, the ratio table
  sizing LOOP.jsonl...
                     blocks needed for a CI half-width <= 0.3 us, from an
                     earlier run's raw blocks (block-to-block A/A differences)
  clockloop          the clock part's workload on WORLD_SIZE ranks: CLOCK_OP
                     allreduce (torch, ranks may share one GPU) or selfp2p
                     (ctypes NCCL, one rank) for CLOCK_S seconds after START_FILE
  clock OUT.json PAIRS.jsonl DUMP...
                     per collective, plugin GPU start/end (NCCL_KERNEL) against
                     the CUPTI NCCL kernel it overlaps most, per process dump
  synthdump DUMP     a synthetic dump (the dry run's clock input)
  ratios / loop      the first design (rounds of separate processes), kept for
                     the committed session-11 data
  selftest           checks of the pure functions (make bench-selftest)

World size 1 (NCCL 2.28.9, docs/nccl-profiler-plugin.md "World size 1"): an
all-reduce reaches no profiler site at all (ncclLaunchOneRank before the task
append), so it is the design's negative control; a grouped ncclSend+ncclRecv to
the own rank makes GroupApi, 2 P2pApi, Group and 2 P2p events (a SendRecv
kernel copies) but no KernelCh event (no proxy op for a self send).

Layouts come from cupti/slowrank_abi.h; this file reads only the fields it
needs. Standard library only, except the GPU workloads (torch, ctypes).
"""
import ctypes
import gzip
import json
import os
import random
import statistics
import struct
import sys
import time

# cupti/slowrank_abi.h
CTL_MAGIC, NST_MAGIC = 0x54435253, 0x4E435253
DUTY_OFF, DUTY_ALWAYS = 0, 1
AGENT_F_NCCL_PLUGIN = 0x1
MASK_KERNELCH = 1 << 6
REC_KERNEL, REC_NCCL_COLL, REC_NCCL_KERNEL = 1, 8, 9
NCCL_F_P2P = 1
NCCL_FLOAT32, NCCL_SUM = 7, 0
ARMS3 = ("neither", "plugin", "plugin_kch")
# Williams design for 3 treatments: every ordered pair adjacent exactly twice.
WILLIAMS3 = ((0, 1, 2), (1, 2, 0), (2, 0, 1), (2, 1, 0), (0, 2, 1), (1, 0, 2))


def init_nccl_group(torch, dist):
    """The torch NCCL process group of RANK, WORLD_SIZE and LOCAL_RANK (the
    launcher's variables; MASTER_ADDR 127.0.0.1, MASTER_PORT from PORT)."""
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", os.environ.get("PORT", "29610"))
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", str(rank))))
    torch.cuda.set_device(device)
    dist.init_process_group("nccl", rank=rank, world_size=world, device_id=device)
    return rank, world, device


class StartGate:
    """Every rank's loop the same number of times: waiting (code 0, busy)
    until START_FILE exists, then RUN seconds measured (1), then done (2);
    rank 0 decides each round and broadcasts it (3: no START_FILE within
    wait_s). next() returns the round's code."""

    def __init__(self, dist, flag, rank, path, run_s, wait_s):
        self.dist, self.flag, self.rank = dist, flag, rank
        self.path, self.run_s, self.wait_s = path, run_s, wait_s
        self.t0, self.phase, self.started = time.monotonic(), "wait", None

    def next(self):
        if self.rank == 0:
            now = time.monotonic()
            if self.phase == "wait" and (not self.path or os.path.exists(self.path)):
                self.phase, self.started = "run", now
            code = {"wait": 0.0, "run": 1.0}[self.phase]
            if self.phase == "wait" and now - self.t0 > self.wait_s:
                code = 3.0
            if self.phase == "run" and now - self.started > self.run_s:
                code = 2.0
            self.flag.fill_(code)
        self.dist.broadcast(self.flag, 0)
        c = self.flag.item()
        if c == 3.0:
            raise SystemExit(f"no {self.path} after {self.wait_s} s")
        return c


def env_int(name, default):
    return int(os.environ.get(name, str(default)))


def env_float(name, default):
    return float(os.environ.get(name, str(default)))


# ---------------------------------------------------------------- library control

class Ctl:
    """The injection library's control block and NCCL status, in this process.

    dlopen of the same file returns the instance NCCL loaded as its plugin
    (glibc maps a file once), so these are the very fields the agent writes
    through /proc/PID/mem. The bench plays the agent: it raises the uprobe
    semaphore itself (the kernel adds its own count when a real agent attaches
    slowrank_cupti_emit, and takes only that away again), and writes
    agent_flags (NCCL_PLUGIN: NCCL's mask may be set) and the duty mode
    (ALWAYS: kernel channels too) under the seqlock. The library's control
    thread applies them within one poll (<= 50 ms) and stores NCCL's mask,
    which NCCL copies into every operation it enqueues afterwards."""

    def __init__(self, path):
        self.h = ctypes.CDLL(path)
        ctl = ctypes.addressof(ctypes.c_uint8.in_dll(self.h, "slowrank_cupti_control"))
        nst = ctypes.addressof(ctypes.c_uint8.in_dll(self.h, "slowrank_nccl_status"))
        u32 = lambda a: ctypes.c_uint32.from_address(a)
        u64 = lambda a: ctypes.c_uint64.from_address(a)
        if u32(ctl).value != CTL_MAGIC or u32(nst).value != NST_MAGIC:
            raise SystemExit(f"{path}: control block or NCCL status has a foreign magic")
        self.sem = ctypes.c_uint16.in_dll(self.h, "slowrank_cupti_semaphore")
        self.gen, self.mode, self.flags = u32(ctl + 8), u32(ctl + 12), u32(ctl + 52)
        self.escalate = u64(ctl + 40)
        self.applied = u32(ctl + 72)
        self.api, self.mask_st = u32(nst + 8), u32(nst + 12)
        self.colls_st, self.dropped_st = u64(nst + 32), u64(nst + 40)
        self.target = None

    def attach(self):
        self.sem.value = self.sem.value + 1

    def set_arm(self, arm):
        """Writes the arm's configuration; returns nothing to wait for when
        the arm is not switched in-process (uprobe: the agent's own)."""
        if arm not in ARMS3:
            self.target = None
            return
        g = self.gen.value
        if g & 1:
            g += 1
        self.gen.value = g + 1
        self.escalate.value = 0
        self.mode.value = DUTY_ALWAYS if arm == "plugin_kch" else DUTY_OFF
        self.flags.value = 0 if arm == "neither" else AGENT_F_NCCL_PLUGIN
        self.gen.value = g + 2
        self.target = (g + 2, arm)

    def applied_ok(self):
        if self.target is None:
            return True
        g, arm = self.target
        if self.applied.value != g:
            return False
        m = self.mask_st.value
        return {"neither": m == 0, "plugin": m != 0 and not m & MASK_KERNELCH, "plugin_kch": bool(m & MASK_KERNELCH)}[arm]

    def mask(self):
        return self.mask_st.value

    def counts(self):
        return self.colls_st.value, self.dropped_st.value

    def version(self):
        return self.api.value


class DryCtl:
    """No library: the arms are labels only (DRY=1 without bin/libslowrank_cupti.so)."""

    def attach(self):
        pass

    def set_arm(self, arm):
        pass

    def applied_ok(self):
        return True

    def mask(self):
        return 0

    def counts(self):
        return 0, 0

    def version(self):
        return 0


# ---------------------------------------------------------------- NCCL through ctypes

class UniqueId(ctypes.Structure):
    _fields_ = [("internal", ctypes.c_char * 128)]


def mapped(name):
    try:
        with open("/proc/self/maps") as f:
            for line in f:
                p = line.split()[-1]
                if os.path.basename(p).startswith(name):
                    return p
    except OSError:
        pass
    return None


class Nccl:
    """A one-rank NCCL communicator of its own (no torch process group: no
    Work objects, no watchdog thread taking the list's lock every 100 ms,
    which made 1 of 7 blocks of the torch loop twice as long), driven through
    ctypes with prebuilt arguments. Real: torch's libnccl (the file the
    uprobes attach to), torch's buffers and a stream of its own. DRY=1: the
    fake NCCL and CUDA of test/fakelibs (CPU only; they do not model
    ncclLaunchOneRank, so the all-reduce reaches the plugin there)."""

    def __init__(self, dry, count=256):
        if dry:
            fl = os.environ.get("FAKELIBS", "bin/fakelibs")
            self.cudart = ctypes.CDLL(os.path.join(fl, "libcudart.so.12"), mode=ctypes.RTLD_GLOBAL)
            self.lib = ctypes.CDLL(os.path.join(fl, "libnccl.so.2"), mode=ctypes.RTLD_GLOBAL)
            self.path = os.path.join(fl, "libnccl.so.2")
            self.sb, self.rb = ctypes.c_void_p(0x1000), ctypes.c_void_p(0x2000)
            self.stream = ctypes.c_void_p(0)
            sync = self.cudart.cudaStreamSynchronize
            st = self.stream
            self.sync = lambda: sync(st)
        else:
            import torch
            dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
            torch.cuda.set_device(dev)
            self.x = torch.ones(count, device=dev)
            self.y = torch.empty_like(self.x)
            self.s = torch.cuda.Stream(device=dev)
            self.path = os.environ.get("NCCL_LIB") or mapped("libnccl.so")
            if not self.path:
                import nvidia.nccl  # the wheel torch links against
                self.path = os.path.join(list(nvidia.nccl.__path__)[0], "lib", "libnccl.so.2")
            self.lib = ctypes.CDLL(self.path)
            self.sb, self.rb = ctypes.c_void_p(self.x.data_ptr()), ctypes.c_void_p(self.y.data_ptr())
            self.stream = ctypes.c_void_p(self.s.cuda_stream)
            self.sync = self.s.synchronize
        uid = UniqueId()
        if self.lib.ncclGetUniqueId(ctypes.byref(uid)) != 0:
            raise SystemExit("ncclGetUniqueId failed")
        self.comm = ctypes.c_void_p()
        self.lib.ncclCommInitRank.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, UniqueId, ctypes.c_int]
        if self.lib.ncclCommInitRank(ctypes.byref(self.comm), 1, uid, 0) != 0:
            raise SystemExit("ncclCommInitRank(nranks 1) failed")
        self.count = ctypes.c_size_t(count)
        self.dt, self.red, self.peer = ctypes.c_int(NCCL_FLOAT32), ctypes.c_int(NCCL_SUM), ctypes.c_int(0)

    def op(self, name):
        """A function that makes one operation; non-zero NCCL results raise."""
        L, sb, rb, n, dt, peer, comm, st = self.lib, self.sb, self.rb, self.count, self.dt, self.peer, self.comm, self.stream
        if name == "selfp2p":
            gs, send, recv, ge = L.ncclGroupStart, L.ncclSend, L.ncclRecv, L.ncclGroupEnd

            def f():
                if gs() | send(sb, n, dt, peer, comm, st) | recv(rb, n, dt, peer, comm, st) | ge():
                    raise SystemExit("selfp2p: NCCL error")
        elif name == "allreduce":
            ar, red = L.ncclAllReduce, self.red

            def f():
                if ar(sb, rb, n, dt, red, comm, st):
                    raise SystemExit("allreduce: NCCL error")
        else:
            raise SystemExit(f"unknown op {name}")
        return f


# ---------------------------------------------------------------- paired design

def touch(path):
    with open(path, "w"):
        pass


class Paired:
    def __init__(self, out):
        self.dry = bool(os.environ.get("DRY"))
        self.ops = os.environ.get("OPS", "selfp2p allreduce").split()
        self.calls = env_int("CALLS", 500)
        self.chunk = env_int("CHUNK", 20)
        self.gap_ns = int(env_float("GAP_MS", 55) * 1e6)
        self.duration = env_float("DURATION_S", 170)
        self.segs = env_int("UPROBE_SEGS", 6)
        self.seg_blocks = env_int("SEG_BLOCKS", 5)
        self.sync_dir = os.environ.get("SYNC_DIR")
        self.agent_wait = env_float("AGENT_WAIT_S", 60)
        lib = os.environ.get("LIB")
        self.ctl = Ctl(lib) if lib else DryCtl()
        self.nccl = Nccl(self.dry)
        self.f = {o: self.nccl.op(o) for o in self.ops}
        self.out = open(out, "w")
        self.t0 = time.monotonic_ns()
        self.uprobe_off = None if self.sync_dir else "no SYNC_DIR"

    def spin(self, op, n):
        f = self.f[op]
        for _ in range(n):
            f()
        self.nccl.sync()

    def emit(self, d):
        self.out.write(json.dumps(d) + "\n")

    def block(self, arm, op, **meta):
        """The gap (chunks of CHUNK operations, each synchronised, until the
        arm is applied and GAP_MS passed: every block, whatever its arm, starts
        after the same kind of gap with an idle GPU queue), then CALLS
        operations timed on the host only, then a synchronisation."""
        self.ctl.set_arm(arm)
        g0 = time.monotonic_ns()
        timeout = False
        while True:
            self.spin(op, self.chunk)
            el = time.monotonic_ns() - g0
            if el >= self.gap_ns and self.ctl.applied_ok():
                break
            if el > 3_000_000_000:
                timeout = True
                break
        gap = time.monotonic_ns() - g0
        c0, d0 = self.ctl.counts()
        f, n = self.f[op], self.calls
        t1 = time.perf_counter_ns()
        for _ in range(n):
            f()
        t2 = time.perf_counter_ns()
        self.nccl.sync()
        t3 = time.perf_counter_ns()
        c1, d1 = self.ctl.counts()
        d = {"arm": arm, "op": op, "ns_per_call": (t2 - t1) / n, "calls": n, "gpu_tail_ns": t3 - t2,
             "gap_ms": round(gap / 1e6, 2), "mask": self.ctl.mask(), "records": c1 - c0, "dropped": d1 - d0,
             "t_s": round((time.monotonic_ns() - self.t0) / 1e9, 3)}
        if timeout:
            d["switch_timeout"] = True
        d.update(meta)
        self.emit(d)

    def wait_file(self, names, op, timeout_s):
        """Keeps the process busy (chunks, 5-ms sleeps) until one of the
        files exists; returns its name or None."""
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            for n in names:
                if os.path.exists(os.path.join(self.sync_dir, n)):
                    return n
            self.spin(op, self.chunk)
            time.sleep(0.005)
        return None

    def uprobe_segment(self, seg):
        """Neither blocks, the agent attached (its libnccl uprobes on every
        call of this process: it tracks it by SLOWRANK_NCCL_BENCH), uprobe
        blocks, the agent gone, neither blocks: per segment and op, the
        uprobe blocks against the neither blocks on both sides."""
        k, op0 = self.seg_blocks, self.ops[0]
        for i in range(k):
            for op in self.ops:
                self.block("neither", op, seg=seg, part="pre")
        t = time.monotonic()
        touch(os.path.join(self.sync_dir, "agent.want"))
        got = self.wait_file(["agent.ready", "agent.failed"], op0, self.agent_wait)
        attach_s = round(time.monotonic() - t, 2)
        if got != "agent.ready":
            self.uprobe_off = f"segment {seg}: the agent did not attach ({got or 'timeout'} after {attach_s} s)"
            touch(os.path.join(self.sync_dir, "agent.done"))
            self.wait_file(["agent.gone"], op0, self.agent_wait)
            self.emit({"event": "uprobe_off", "seg": seg, "why": self.uprobe_off})
            return
        for name in ("agent.ready", "agent.want"):
            try:
                os.unlink(os.path.join(self.sync_dir, name))
            except OSError:
                pass
        for i in range(2 * k):
            for op in self.ops:
                self.block("uprobe", op, seg=seg, part="on")
        t = time.monotonic()
        touch(os.path.join(self.sync_dir, "agent.done"))
        got = self.wait_file(["agent.gone"], op0, self.agent_wait)
        self.emit({"event": "segment", "seg": seg, "attach_s": attach_s,
                   "detach_s": round(time.monotonic() - t, 2), "gone": got == "agent.gone"})
        try:
            os.unlink(os.path.join(self.sync_dir, "agent.gone"))
        except OSError:
            pass
        if got != "agent.gone":
            self.uprobe_off = f"segment {seg}: the agent did not stop"
            return
        for i in range(k):
            for op in self.ops:
                self.block("neither", op, seg=seg, part="post")

    def run(self):
        import gc
        gc.disable()  # the loop allocates almost nothing; a collection in a block is noise
        self.ctl.attach()
        for op in self.ops:  # warm-up: plans, pools, the plugin's slots
            for arm in ARMS3:
                self.ctl.set_arm(arm)
                self.spin(op, 2000)
        start = time.monotonic()
        self.emit({"event": "start", "ops": self.ops, "calls": self.calls, "chunk": self.chunk,
                   "gap_ms": self.gap_ns / 1e6, "duration_s": self.duration, "uprobe_segs": self.segs,
                   "seg_blocks": self.seg_blocks, "dry": self.dry, "nccl": self.nccl.path,
                   "plugin_api": self.ctl.version(), "pid": os.getpid()})
        seg_at = [start + (i + 0.5) * self.duration / self.segs for i in range(self.segs)] if self.segs > 0 else []
        r = seg = 0
        while time.monotonic() - start < self.duration:
            if seg_at and time.monotonic() >= seg_at[0]:
                seg_at.pop(0)
                if self.uprobe_off is None:
                    self.uprobe_segment(seg)
                seg += 1
                continue
            op = self.ops[r % len(self.ops)]
            order = WILLIAMS3[(r // len(self.ops)) % len(WILLIAMS3)]
            for pos, a in enumerate(order):
                self.block(ARMS3[a], op, round=r, pos=pos)
            r += 1
        self.emit({"event": "end", "rounds": r, "segments": seg, "uprobe_off": self.uprobe_off,
                   "wall_s": round(time.monotonic() - start, 1)})
        self.out.close()


def paired(args):
    Paired(args[0]).run()


# ---------------------------------------------------------------- statistics

def quantile(v, q):
    v = sorted(v)
    if not v:
        return None
    i = q * (len(v) - 1)
    lo = int(i)
    hi = min(lo + 1, len(v) - 1)
    return v[lo] + (v[hi] - v[lo]) * (i - lo)


def trimmed(v, p=0.25):
    v = sorted(v)
    k = int(len(v) * p)
    return statistics.mean(v[k:len(v) - k]) if len(v) > 2 * k else None


def bootstrap(v, est, n=2000, seed=1):
    """Percentile 95 % interval of est over resamples of v."""
    if len(v) < 2:
        return None
    rnd = random.Random(seed)
    bs = sorted(est(rnd.choices(v, k=len(v))) for _ in range(n))
    return [bs[int(0.025 * n)], bs[int(0.975 * n) - 1]]


T975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
        2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def t_interval(d):
    """Student's t 95 % interval of the mean: the honest one for a few
    segments, where a percentile bootstrap is too narrow."""
    if len(d) < 2:
        return None
    m, se = statistics.mean(d), statistics.stdev(d) / len(d) ** 0.5
    t = T975[len(d) - 2] if len(d) - 1 <= len(T975) else 1.96
    return [m - t * se, m + t * se]


def summary(d, boot=2000):
    """Differences (ns): median and mean with bootstrap CIs, 25 % trimmed mean."""
    if not d:
        return {"n": 0}
    return {"n": len(d), "median_ns": statistics.median(d), "ci95_median_ns": bootstrap(d, statistics.median, boot),
            "mean_ns": statistics.mean(d), "ci95_mean_ns": bootstrap(d, statistics.mean, boot, seed=2),
            "trimmed25_ns": trimmed(d), "sd_ns": statistics.stdev(d) if len(d) > 1 else None}


def load_blocks(path):
    blocks, events = [], []
    with open(path) as f:
        for line in f:
            line = line.strip()
            if not line:
                continue
            d = json.loads(line)
            (events if "event" in d else blocks).append(d)
    return blocks, events


def report(args):
    """The paired run's analysis: JSON to args[1], the ratio table on stdout."""
    blocks, events = load_blocks(args[0])
    start = next((e for e in events if e["event"] == "start"), {})
    end = next((e for e in events if e["event"] == "end"), {})
    boot = env_int("BOOT", 2000)
    out = {"design": ("one process, world size 1, one NCCL communicator of its own; rounds of one block per arm "
                      "(neither, plugin, plugin_kch) in Williams order, switched in-process through the library's "
                      "control block; uprobe blocks in segments with the agent attached, against the neither "
                      "blocks on both sides of the segment"),
           "start": start, "end": end, "ops": {}}
    for op in start.get("ops") or sorted({b["op"] for b in blocks}):
        rounds = {}
        for b in blocks:
            if b["op"] == op and "round" in b and not b.get("switch_timeout"):
                rounds.setdefault(b["round"], {})[b["arm"]] = b
        base = [r["neither"]["ns_per_call"] for r in rounds.values() if "neither" in r]
        o = {"rounds": len(rounds), "neither_ns_per_call": statistics.median(base) if base else None, "arms": {}}
        for arm in ARMS3:
            bl = [r[arm] for r in rounds.values() if arm in r]
            d = [r[arm]["ns_per_call"] - r["neither"]["ns_per_call"] for r in rounds.values()
                 if arm in r and "neither" in r]
            s = summary(d, boot) if arm != "neither" else {"n": len(bl)}
            s["ns_per_call"] = statistics.median([b["ns_per_call"] for b in bl]) if bl else None
            if arm != "neither" and d and o["neither_ns_per_call"]:
                s["ratio_vs_neither"] = (o["neither_ns_per_call"] + s["median_ns"]) / o["neither_ns_per_call"]
            # NCCL_COLL records the control thread drained during the arm's
            # blocks (it publishes its count at each drain, <= 50 ms late, so
            # this includes the gap's chunks: a sign of life, not a rate)
            s["plugin_records_drained_per_block"] = statistics.mean([b["records"] for b in bl]) if bl else None
            s["dropped"] = sum(b["dropped"] for b in bl)
            s["masks"] = sorted({b["mask"] for b in bl})
            o["arms"][arm] = s
        # uprobes: per segment, on-blocks minus the neither blocks around them
        segs, seg_d = {}, []
        for b in blocks:
            if b["op"] == op and "seg" in b:
                segs.setdefault(b["seg"], {}).setdefault(b["part"], []).append(b["ns_per_call"])
        for k in sorted(segs):
            s = segs[k]
            if s.get("on") and (s.get("pre") or s.get("post")):
                ref = statistics.median(s.get("pre", []) + s.get("post", []))
                seg_d.append({"seg": k, "on_ns": statistics.median(s["on"]), "neither_ns": ref,
                              "diff_ns": statistics.median(s["on"]) - ref, "blocks_on": len(s["on"])})
        u = summary([x["diff_ns"] for x in seg_d], boot)
        u["ci95_mean_t_ns"] = t_interval([x["diff_ns"] for x in seg_d])
        u["segments"] = seg_d
        ub = [b for b in blocks if b["op"] == op and b.get("part") == "on"]
        u["masks"] = sorted({b["mask"] for b in ub})
        u["ns_per_call"] = statistics.median([b["ns_per_call"] for b in ub]) if ub else None
        if seg_d and o["neither_ns_per_call"]:
            u["ratio_vs_neither"] = (o["neither_ns_per_call"] + u["median_ns"]) / o["neither_ns_per_call"]
        o["arms"]["uprobe"] = u
        to = [b for b in blocks if b["op"] == op and b.get("switch_timeout")]
        o["switch_timeouts"] = len(to)
        out["ops"][op] = o
    if start.get("dry"):
        out["note"] = "DRY RUN on CPU: fake NCCL and CUDA (test/fakelibs), no GPU; the figures say nothing about the H200"
    with open(args[1], "w") as f:
        json.dump(out, f, indent=1)
    print_table(out)


def fmt_ci(ci):
    return f"[{ci[0] / 1e3:+.3f}, {ci[1] / 1e3:+.3f}]" if ci else "[-]"


def print_table(out):
    print(f"{'op':10} {'arm':11} {'us/call':>8} {'d median us':>12} {'95% CI':>20} {'d mean us':>10} "
          f"{'95% CI':>20} {'ratio':>7} {'n':>5} {'rec/blk':>8}")
    for op, o in out["ops"].items():
        for arm in ("neither", "plugin", "plugin_kch", "uprobe"):
            s = o["arms"].get(arm, {})
            if arm == "neither":
                base = o.get("neither_ns_per_call")
                print(f"{op:10} {arm:11} {base / 1e3 if base else float('nan'):8.3f} {'':>12} {'':>20} {'':>10} "
                      f"{'':>20} {1.0:7.4f} {s.get('n', 0):5d} {s.get('plugin_records_drained_per_block') or 0:8.0f}")
                continue
            if not s.get("n"):
                print(f"{op:10} {arm:11} no data")
                continue
            us = s.get("ns_per_call")
            print(f"{op:10} {arm:11} {us / 1e3 if us else float('nan'):8.3f} {s['median_ns'] / 1e3:+12.3f} "
                  f"{fmt_ci(s['ci95_median_ns']):>20} {s['mean_ns'] / 1e3:+10.3f} {fmt_ci(s['ci95_mean_ns']):>20} "
                  f"{s.get('ratio_vs_neither', float('nan')):7.4f} {s['n']:5d} "
                  f"{s.get('plugin_records_drained_per_block') or 0:8.0f}")
    if out.get("end", {}).get("uprobe_off"):
        print(f"uprobe arm: {out['end']['uprobe_off']}")


def sizing(args):
    """From earlier raw blocks (loop.jsonl lines of the first design, each a
    run of consecutive blocks of one arm): adjacent blocks' differences are
    A/A pairs; the bootstrap half-width of their median for n pairs, and the
    n for 0.3 us. Prints JSON."""
    d = []
    for p in args:
        with open(p) as f:
            for line in f:
                b = json.loads(line)["blocks"]
                d += [b[2 * i + 1] - b[2 * i] for i in range(len(b) // 2)]
    q1, q3 = quantile(d, 0.25), quantile(d, 0.75)
    rsd = (q3 - q1) / 1.349
    rows = {}
    for n in (25, 50, 100, 200, 400, 800):
        rnd = random.Random(n)
        bs = sorted(statistics.median(rnd.choices(d, k=n)) for _ in range(1000))
        rows[n] = (bs[974] - bs[25]) / 2
    need = next((n for n in sorted(rows) if rows[n] <= 300), None)
    print(json.dumps({"pairs": len(d), "sd_ns": statistics.stdev(d), "robust_sd_ns": rsd,
                      "median_halfwidth_ns_by_pairs": rows, "pairs_for_300ns": need,
                      "normal_approx_pairs_for_300ns_median": int((1.96 * 1.2533 * rsd / 300) ** 2) + 1,
                      "normal_approx_pairs_for_300ns_mean": int((1.96 * statistics.stdev(d) / 300) ** 2) + 1}))


# ---------------------------------------------------------------- clock agreement

def records(path):
    with open(path, "rb") as f:
        data = f.read()
    off = 0
    while off + 4 <= len(data):
        (n,) = struct.unpack_from("<I", data, off)
        b = data[off + 4: off + 4 + n]
        off += 4 + n
        if len(b) < 64:
            break
        hs, = struct.unpack_from("<H", b, 44)
        count, = struct.unpack_from("<I", b, 12)
        p = hs
        for _ in range(count):
            if p + 4 > len(b):
                break
            kind, size = struct.unpack_from("<HH", b, p)
            if size == 0:
                break
            yield kind, b[p:p + size]
            p += size


def pair_kernels(path):
    """One process's dump: each plugin kernel record against the CUPTI NCCL
    kernel that overlaps it most. Returns counts, the pairs, the last clock
    offset and the plugin's host-side records (NCCL_COLL: all, p2p)."""
    import bisect
    cupti, plugin = [], []
    colls = p2p = 0
    for kind, r in records(path):
        if kind == REC_KERNEL and r[4] == 1:  # class communication
            cupti.append(struct.unpack_from("<QQ", r, 8))
        elif kind == REC_NCCL_KERNEL:
            func, flags = r[4], r[5]
            seq, = struct.unpack_from("<Q", r, 16)
            s, e, seen, off = struct.unpack_from("<QQQq", r, 32)
            plugin.append((s, e, seen, off, func, seq, flags))
        elif kind == REC_NCCL_COLL:
            colls += 1
            fl, = struct.unpack_from("<H", r, 44)
            p2p += bool(fl & NCCL_F_P2P)
    cupti.sort()
    starts = [c[0] for c in cupti]
    pairs = []
    for s, e, seen, _, func, seq, flags in plugin:
        i = bisect.bisect_left(starts, s) - 1
        best = None
        for j in range(max(i - 2, 0), min(i + 3, len(cupti))):
            cs, ce = cupti[j]
            ov = min(e, ce) - max(s, cs)
            if best is None or ov > best[0]:
                best = (ov, cs, ce)
        if best and best[0] > 0:
            pairs.append({"func": func, "seq": seq, "flags": flags, "plugin_start": s, "plugin_end": e,
                          "cupti_start": best[1], "cupti_end": best[2], "d_start_ns": s - best[1],
                          "d_end_ns": e - best[2], "host_lag_ns": seen - e})
    return {"cupti_nccl_kernels": len(cupti), "plugin_kernels": len(plugin), "pairs": pairs,
            "clock_offset_ns": plugin[-1][3] if plugin else None, "plugin_colls": colls, "plugin_p2p": p2p}


def clock_summary(pairs, limit_ns=50_000):
    ds = [abs(p["d_start_ns"]) for p in pairs]
    de = [abs(p["d_end_ns"]) for p in pairs]
    q = lambda v: {"median": quantile(v, 0.5), "p99": quantile(v, 0.99), "max": max(v) if v else None}
    return {"matched": len(pairs), "abs_d_start_ns": q(ds), "abs_d_end_ns": q(de),
            "signed_d_start_median_ns": quantile([p["d_start_ns"] for p in pairs], 0.5),
            "signed_d_end_median_ns": quantile([p["d_end_ns"] for p in pairs], 0.5),
            "within_50us": (sum(1 for a, b in zip(ds, de) if a <= limit_ns and b <= limit_ns) / len(pairs)) if pairs else None,
            "host_lag_ns": q([p["host_lag_ns"] for p in pairs])}


def clock(args):
    """clock OUT.json PAIRS.jsonl.gz DUMP...: every rank's dump paired on its
    own (the clocks of one process); the per-collective pairs go to PAIRS,
    the summary to OUT and stdout."""
    out_path, pairs_path, dumps = args[0], args[1], args[2:]
    res = {"dumps": [], "missing_dumps": [d for d in dumps if not os.path.exists(d)]}
    allp = []
    with gzip.open(pairs_path, "wt") as pf:
        for path in dumps:
            if not os.path.exists(path):
                continue
            r = pair_kernels(path)
            for p in r["pairs"]:
                p["dump"] = os.path.basename(path)
                pf.write(json.dumps(p) + "\n")
            allp += r["pairs"]
            del r["pairs"]
            r["dump"] = os.path.basename(path)
            res["dumps"].append(r)
    res["summary"] = clock_summary(allp)
    for k in ("cupti_nccl_kernels", "plugin_kernels", "plugin_colls", "plugin_p2p"):
        res[k] = sum(d[k] for d in res["dumps"])
    label = os.environ.get("CLOCK_LABEL")
    if label:
        res["what"] = label
    with open(out_path, "w") as f:
        json.dump(res, f, indent=1)
    print(json.dumps(res))


def clockloop(_args):
    """The clock part's workload. CLOCK_OP=allreduce: a torch process group
    of WORLD_SIZE ranks (ranks may share GPU 0: nccl_plugin.sh gives each its
    own NCCL_HOSTID, so NCCL takes them for two nodes and runs real ring
    kernels over its socket transport); selfp2p: one rank, a grouped
    ncclSend+ncclRecv to itself on a communicator of its own. Keeps busy until
    START_FILE exists (the agent attached and pinned the share), then runs
    CLOCK_S seconds; rank 0 decides and broadcasts, so that every rank runs
    the same collectives."""
    import torch
    op = os.environ.get("CLOCK_OP", "allreduce")
    secs = env_float("CLOCK_S", 15)
    path = os.environ.get("START_FILE")
    wait_s = env_float("START_WAIT_S", 90)
    n = 0
    if op == "selfp2p":
        nc = Nccl(False)
        f = nc.op("selfp2p")
        deadline = time.monotonic() + wait_s
        while path and not os.path.exists(path):
            if time.monotonic() > deadline:
                raise SystemExit(f"no {path} after {wait_s} s")
            for _ in range(100):
                f()
            nc.sync()
            time.sleep(0.01)
        end = time.monotonic() + secs
        while time.monotonic() < end:
            for _ in range(100):
                f()
            n += 100
            nc.sync()
            time.sleep(0.002)
        print(json.dumps({"op": op, "ops": n, "seconds": secs, "nccl": nc.path}))
        return
    import torch.distributed as dist
    rank, world, device = init_nccl_group(torch, dist)
    x = torch.ones(256, device=device)
    gate = StartGate(dist, torch.zeros(1, device=device), rank, path, secs, wait_s)
    while True:
        c = gate.next()
        if c == 2.0:
            break
        k = 20 if c == 1.0 else 5
        for _ in range(k):
            dist.all_reduce(x)
        if c == 1.0:
            n += k
        torch.cuda.synchronize()
        if c == 0.0:
            time.sleep(0.05)
    dist.destroy_process_group()
    if rank == 0:
        print(json.dumps({"op": op, "allreduces_measured": n, "world_size": world, "seconds": secs}))


# ---------------------------------------------------------------- the first design

def loop(args):
    """Rounds of separate processes (sessions 10-12); kept for their data."""
    import torch
    import torch.distributed as dist
    n, blocks = int(args[0]), int(args[1])
    rank, world, device = init_nccl_group(torch, dist)
    x = torch.ones(256, device=device)
    for _ in range(2000):
        dist.all_reduce(x)
    torch.cuda.synchronize()
    per = []
    for _ in range(blocks):
        t0 = time.perf_counter_ns()
        for _ in range(n):
            dist.all_reduce(x)
        t1 = time.perf_counter_ns()
        torch.cuda.synchronize()
        per.append((t1 - t0) / n)
    dist.destroy_process_group()
    if rank == 0:
        print(json.dumps({"mode": os.environ.get("MODE", "?"), "ns_per_call": statistics.median(per),
                          "blocks": per, "calls": n, "world_size": world}))


def ratios(args):
    by = {}
    for line in open(args[0]):
        d = json.loads(line)
        by.setdefault(d["mode"], []).append(d["ns_per_call"])
    base = statistics.median(by.get("neither", [float("nan")]))
    print(json.dumps({m: {"ns_per_call": statistics.median(v), "rounds": len(v),
                          "ratio_vs_neither": statistics.median(v) / base,
                          "added_ns_per_call": statistics.median(v) - base} for m, v in by.items()}))


# ---------------------------------------------------------------- synthetic data and checks

def batch(recs):
    """A batch as the library writes it: the 64-byte header (count at 12,
    header_size at 44), then the records."""
    body = b"".join(recs)
    head = bytearray(64)
    struct.pack_into("<IHHII", head, 0, 0x53524231, 1, 0, 1, len(recs))
    struct.pack_into("<IH", head, 40, 64 + len(body), 64)
    return bytes(head) + body


def rec_kernel(start, end, kclass):
    r = bytearray(72)
    struct.pack_into("<HHBB", r, 0, REC_KERNEL, 72, kclass, 0)
    struct.pack_into("<QQ", r, 8, start, end)
    return bytes(r)


def rec_nccl_kernel(start, end, seen, seq=0, func=0):
    r = bytearray(64)
    struct.pack_into("<HHBB", r, 0, REC_NCCL_KERNEL, 64, func, 0)
    struct.pack_into("<Q", r, 16, seq)
    struct.pack_into("<QQQq", r, 32, start, end, seen, -7)
    return bytes(r)


def rec_nccl_coll(flags):
    r = bytearray(88)
    struct.pack_into("<HH", r, 0, REC_NCCL_COLL, 88)
    struct.pack_into("<H", r, 44, flags)
    return bytes(r)


def write_dump(path, batches):
    with open(path, "wb") as f:
        for b in batches:
            f.write(struct.pack("<I", len(b)) + b)


def synthdump(args):
    """A dump like the clock part's: 200 collectives, CUPTI kernels and plugin
    kernel channels a few us apart, one compute kernel each, p2p records."""
    rnd = random.Random(3)
    bs, t = [], 1_000_000_000
    for i in range(200):
        s, e = t, t + 20_000 + rnd.randrange(5_000)
        recs = [rec_kernel(s, e, 1), rec_kernel(e + 1_000, e + 9_000, 0), rec_nccl_coll(NCCL_F_P2P if i % 4 == 0 else 0),
                rec_nccl_kernel(s + 1_500 + rnd.randrange(2_000), e - 800 - rnd.randrange(1_500), e + 30_000, seq=i)]
        bs.append(batch(recs))
        t = e + 50_000
    write_dump(args[0], bs)


def selftest(_args):
    """Pairs a synthetic dump, checks the statistics and the report on
    synthetic blocks."""
    import tempfile
    checks = []
    b1 = batch([rec_kernel(1000, 2000, 1), rec_kernel(1500, 2500, 0), rec_nccl_kernel(1010, 1990, 2100),
                rec_nccl_coll(NCCL_F_P2P), rec_nccl_coll(0)])
    b2 = batch([rec_kernel(5000, 6000, 1), rec_nccl_kernel(4980, 6030, 6100)])
    with tempfile.TemporaryDirectory() as td:
        dump = os.path.join(td, "x.dump")
        write_dump(dump, [b1, b2])
        r = pair_kernels(dump)
        ds = sorted(p["d_start_ns"] for p in r["pairs"])
        de = sorted(p["d_end_ns"] for p in r["pairs"])
        lag = sorted(p["host_lag_ns"] for p in r["pairs"])
        checks += [("two CUPTI NCCL kernels (the compute one skipped)", r["cupti_nccl_kernels"] == 2),
                   ("two plugin kernels", r["plugin_kernels"] == 2), ("start differences", ds == [-20, 10]),
                   ("end differences", de == [-10, 30]), ("host lag", lag == [70, 110]),
                   ("clock offset", r["clock_offset_ns"] == -7), ("plugin colls, p2p", (r["plugin_colls"], r["plugin_p2p"]) == (2, 1))]
        s = clock_summary(r["pairs"])
        checks += [("clock summary", s["matched"] == 2 and s["abs_d_start_ns"]["median"] == 15 and s["within_50us"] == 1.0)]
        # the paired report on synthetic blocks: plugin +300 ns, plugin_kch +1000 ns, uprobe +5000 ns
        rnd = random.Random(7)
        path = os.path.join(td, "p.jsonl")
        add = {"neither": 0, "plugin": 300, "plugin_kch": 1000, "uprobe": 5000}
        with open(path, "w") as f:
            f.write(json.dumps({"event": "start", "ops": ["selfp2p"]}) + "\n")
            for rr in range(300):
                drift = 200 * ((rr // 50) % 2)
                for pos, a in enumerate(WILLIAMS3[rr % 6]):
                    arm = ARMS3[a]
                    v = 8000 + drift + add[arm] + rnd.gauss(0, 150) + (9000 if rnd.random() < 0.1 else 0)
                    f.write(json.dumps({"arm": arm, "op": "selfp2p", "ns_per_call": v, "calls": 500, "mask": 0,
                                        "records": 1000 if arm != "neither" else 0, "dropped": 0, "round": rr, "pos": pos}) + "\n")
            for sg in range(6):
                for part, arm, k in (("pre", "neither", 5), ("on", "uprobe", 10), ("post", "neither", 5)):
                    for _ in range(k):
                        f.write(json.dumps({"arm": arm, "op": "selfp2p", "ns_per_call": 8000 + add[arm] + rnd.gauss(0, 150),
                                            "calls": 500, "mask": 0, "records": 0, "dropped": 0, "seg": sg, "part": part}) + "\n")
        out = os.path.join(td, "r.json")
        stdout = sys.stdout
        sys.stdout = open(os.devnull, "w")
        try:
            os.environ.setdefault("BOOT", "400")
            report([path, out])
        finally:
            sys.stdout.close()
            sys.stdout = stdout
        rep = json.load(open(out))["ops"]["selfp2p"]["arms"]
        if os.environ.get("SELFTEST_DEBUG"):
            print(json.dumps(rep["uprobe"]))
        inside = lambda ci, x: ci[0] <= x <= ci[1]
        checks += [("report: plugin +300 inside its median CI", inside(rep["plugin"]["ci95_median_ns"], 300)),
                   ("report: plugin_kch +1000 inside its median CI", inside(rep["plugin_kch"]["ci95_median_ns"], 1000)),
                   ("report: plugin CI half-width < 100 ns", (rep["plugin"]["ci95_median_ns"][1] - rep["plugin"]["ci95_median_ns"][0]) / 2 < 100),
                   ("report: uprobe +5000 within 200 ns, t interval around it",
                    abs(rep["uprobe"]["median_ns"] - 5000) < 200 and inside(rep["uprobe"]["ci95_mean_t_ns"], rep["uprobe"]["mean_ns"])),
                   ("report: records drained per block", rep["plugin"]["plugin_records_drained_per_block"] == 1000)]
    bad = [name for name, ok in checks if not ok]
    print(f"nccl_plugin selftest: {len(checks) - len(bad)} of {len(checks)} pass" + (f"; FAIL: {bad}" if bad else ""))
    if bad:
        raise SystemExit(1)


if __name__ == "__main__":
    {"paired": paired, "report": report, "sizing": sizing, "clock": clock, "clockloop": clockloop,
     "synthdump": synthdump, "loop": loop, "ratios": ratios, "selftest": selftest}[sys.argv[1]](sys.argv[2:])
