#!/usr/bin/env python3
"""A GPT-style training job for slowrank's GPU validation (bench/gpu).

Three forms:
  * 4 ranks sharing one GPU with torch.distributed gloo (NCCL refuses two ranks
    on one GPU): launch with --launch 4 --backend gloo;
  * 1 rank with NCCL: --launch 1 --backend nccl;
  * --multi-gpu: one rank per GPU (cuda:LOCAL_RANK) with NCCL, --launch N for
    N GPUs, tensor parallel x data parallel (--tp T: TP groups of T
    consecutive ranks, DP groups of the ranks with the same TP index). The TP
    group all-reduces activations inside every layer (Megatron's column- and
    row-parallel attention and MLP, hand-written), torch's
    DistributedDataParallel all-reduces gradients over the DP group (over the
    whole world when --tp 1, plain DDP). No collective runs on the world
    group when --tp > 1, so the agent's cohorts come from the DP
    communicators. Stopping on --duration goes through the c10d TCP store
    (rank 0 announces a stop step; no per-step collective, no extra device
    synchronisation). --device cpu --backend gloo runs the same code on CPU
    ranks with a tiny model: a dry run of launching, groups, injections, step
    loop, stop logic and output files on a machine without a GPU (both
    the --multi-gpu form and the one-GPU gloo form).

Each rank writes one JSON line per step to --out-dir/rank<R>.jsonl with its own
ground truth (step, wall ms measured around the step's end-of-step
synchronisation, loss; one GPU: also sync_ms, the wait in that
synchronisation, i.e. the GPU queue left at the end of the step) and, at
the end, a SHA-256 of its parameters. In --multi-gpu mode rank 0 also
writes --out-dir/layout.json (world, TP and DP groups in global ranks,
versions, arguments) and every rank begins its file with a "meta" line
(local rank, TP/DP index, device, pid).

Injections (for localisation experiments):
  --slow-gpu-rank R --slow-gpu-factor F --slow-from S : extra GPU matmuls on
      rank R from step S, sized to add about (F-1) of its compute;
  --slow-host-rank R --slow-host-ms M --slow-from S   : a host sleep per step;
      --slow-host-at start|end puts it before the forward pass (the GPU
      idles: the job slows) or after the optimizer step, before the
      end-of-step synchronisation (the GPU still works: hidden unless
      longer than its queue; the default).
  --slow-from-s T : start the injection T seconds after the loop began
      instead of at a step number (one GPU: each rank on its own clock, so
      each writes its injection_start at its own step).
  --tail-gpu-ms M : (one GPU, gloo) GPU matmuls queued after the optimizer
      step on every rank, about M ms with the ranks sharing the GPU. gloo's
      blocking all-reduce copies each bucket to the host, so the host waits
      for the backward there and only the optimizer step is left queued at
      the end of the step: too little for a host stall to hide behind
      (bench/gpu/c3c2.sh's 20 ms end stall lengthened every step by 22 ms).
      An NCCL job queues its whole backward behind the host; the tail
      stands in for that queue (bench/gpu/host_exposure.sh). Every rank runs
      the same number (agreed on at start), so workloads stay comparable.
  --slow-gpu-mode contend : (--multi-gpu) instead of extra kernels in the
      training process (which change its kernel mix, so its workload
      fingerprint, so the detector rightly finds no comparable peer), a
      noisy neighbour: a separate process on the same GPU keeps it busy
      --slow-gpu-frac of the time. The rank runs the same kernels, slower,
      like a throttled or shared GPU.
  --ab-block N : for in-process A/B, print step times; the agent toggles.

The training code knows nothing about slowrank: the agent attaches from the
outside and the injection library is loaded through CUDA_INJECTION64_PATH.
"""
import argparse
import contextlib
import datetime
import hashlib
import json
import os
import platform
import signal
import subprocess
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


class Block(nn.Module):
    def __init__(self, d, heads):
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, batch_first=True)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x, mask):
        h = self.ln1(x)
        a, _ = self.attn(h, h, h, attn_mask=mask, need_weights=False)
        x = x + a
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab, d, layers, heads, seq):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(seq, d)
        self.blocks = nn.ModuleList([Block(d, heads) for _ in range(layers)])
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.register_buffer("mask", torch.triu(torch.full((seq, seq), float("-inf")), 1), persistent=False)

    def forward(self, idx):
        t = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        for b in self.blocks:
            x = b(x, self.mask[:t, :t])
        return self.head(self.ln(x))


def param_hash(model):
    h = hashlib.sha256()
    for name, p in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(p.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def run(rank, world, args):
    if args.device == "cuda":
        torch.cuda.set_device(0)
        dev = torch.device("cuda", 0)
    else:
        dev = torch.device("cpu")
        torch.set_num_threads(args.cpu_threads)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    dist.init_process_group(args.backend, rank=rank, world_size=world)
    if args.deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.benchmark = False
        # Memory-efficient and flash attention backward are non-deterministic:
        # the math backend is the deterministic one (seen on the H200: with
        # warn_only the ON and OFF runs differed for this reason alone).
        torch.backends.cuda.enable_mem_efficient_sdp(False)
        torch.backends.cuda.enable_flash_sdp(False)
        torch.backends.cuda.enable_math_sdp(True)
    torch.manual_seed(args.seed)
    model = GPT(args.vocab, args.dim, args.layers, args.heads, args.seq).to(dev)
    # Same initial parameters on every rank (as DDP broadcasts them).
    for p in model.parameters():
        dist.broadcast(p.data, 0)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4)
    g = torch.Generator(device=dev)
    g.manual_seed(args.seed + rank)
    extra = None
    if args.slow_gpu_rank == rank:
        n = args.slow_gpu_size
        extra = (torch.randn(n, n, device=dev), torch.randn(n, n, device=dev))
    out = open(os.path.join(args.out_dir, f"rank{rank}.jsonl"), "w", buffering=1)
    tail = tail_iters = None
    if args.tail_gpu_ms > 0:
        tail, tail_iters, per = calibrate_tail(args, dev, sync)
        out.write(json.dumps({"rank": rank, "tail_gpu": True, "tail_gpu_ms": args.tail_gpu_ms, "iters": tail_iters,
                              "matmul_ms": round(per, 4), "size": args.tail_gpu_size}) + "\n")
    timing = dev.type == "cuda"
    if timing:
        ev0, ev1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    fb_ms = []  # forward+backward GPU time of early steps, to size the GPU injection
    slow_iters = args.slow_gpu_iters
    loop_t0 = time.monotonic()
    deadline = loop_t0 + args.duration if args.duration > 0 else None
    step = 0
    slow = False
    stop = torch.zeros(1, device=dev)
    while True:
        if deadline is None and step >= args.steps:
            break
        if deadline is not None:
            # Every rank must run the same number of steps: agree on stopping.
            stop.fill_(1.0 if time.monotonic() >= deadline else 0.0)
            dist.all_reduce(stop, op=dist.ReduceOp.MAX)
            if stop.item() > 0:
                break
        t0 = time.monotonic_ns()
        # --slow-from S: every rank at step S (one record per rank); --slow-from-s T:
        # each rank on its own clock, T s after its loop began.
        if not slow and (step >= args.slow_from or
                         (args.slow_from_s >= 0 and time.monotonic() - loop_t0 >= args.slow_from_s)):
            slow = True
            if extra is not None and args.slow_gpu_frac > 0 and fb_ms:
                # Size the extra work to slow_gpu_frac of this rank's compute.
                sync()
                a0 = time.perf_counter()
                for _ in range(20):
                    extra[0].copy_(extra[0] @ extra[1] * 1e-3)
                sync()
                per = (time.perf_counter() - a0) * 1e3 / 20
                fb = sorted(fb_ms)[len(fb_ms) // 2]
                slow_iters = max(1, round(args.slow_gpu_frac * fb / per))
            out.write(json.dumps({"rank": rank, "injection_start": True, "step": step, "mono_ns": time.monotonic_ns(),
                                  "wall": time.time(), "slow_gpu_iters": slow_iters if extra is not None else 0,
                                  "slow_host_ms": args.slow_host_ms if args.slow_host_rank == rank else 0,
                                  "slow_host_at": args.slow_host_at if args.slow_host_rank == rank else None}) + "\n")
        if args.slow_host_rank == rank and slow and args.slow_host_at == "start":
            time.sleep(args.slow_host_ms / 1e3)  # like a data loader stall: the GPU has nothing queued
        measure = timing and 5 <= step < 25 and extra is not None
        if measure:
            ev0.record()
        idx = torch.randint(0, args.vocab, (args.batch, args.seq), device=dev, generator=g)
        logits = model(idx[:, :-1])
        loss = nn.functional.cross_entropy(logits.reshape(-1, args.vocab), idx[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if measure:
            ev1.record()
            ev1.synchronize()
            fb_ms.append(ev0.elapsed_time(ev1))
        if extra is not None and slow:
            for _ in range(slow_iters):
                extra[0].copy_(extra[0] @ extra[1] * 1e-3)
        # Gradient all-reduce in buckets, like DDP.
        grads = [p.grad for p in model.parameters() if p.grad is not None]
        for i in range(0, len(grads), args.bucket):
            flat = torch.cat([x.reshape(-1) for x in grads[i:i + args.bucket]])
            dist.all_reduce(flat)
            flat /= world
            off = 0
            for x in grads[i:i + args.bucket]:
                x.copy_(flat[off:off + x.numel()].view_as(x))
                off += x.numel()
        opt.step()
        if tail is not None:
            # GPU work queued behind the host (see --tail-gpu-ms).
            for _ in range(tail_iters):
                tail[0].copy_(tail[0] @ tail[1] * 1e-3)
        if args.slow_host_rank == rank and slow and args.slow_host_at == "end":
            time.sleep(args.slow_host_ms / 1e3)  # while the GPU still works: hidden unless longer than its queue
        ts = time.monotonic_ns()
        sync()  # the timer's native effect: a device synchronisation
        t1 = time.monotonic_ns()
        out.write(json.dumps({"rank": rank, "step": step, "start_ns": t0, "end_ns": t1,
                              "step_ms": (t1 - t0) / 1e6, "sync_ms": (t1 - ts) / 1e6, "loss": loss.item()}) + "\n")
        step += 1
    out.write(json.dumps({"rank": rank, "final": True, "steps": step, "param_sha256": param_hash(model)}) + "\n")
    out.close()
    dist.barrier()
    dist.destroy_process_group()


def calibrate_tail(args, dev, sync):
    """Matmuls for --tail-gpu-ms: timed on every rank at once (the ranks share
    the GPU in the step too), the count agreed on as the largest over the
    ranks (equal kernel counts: equal workload fingerprints)."""
    n = args.tail_gpu_size
    tg = torch.Generator(device=dev)
    tg.manual_seed(args.seed + 3000)
    tail = (torch.randn(n, n, device=dev, generator=tg), torch.randn(n, n, device=dev, generator=tg))
    for _ in range(3):  # cuBLAS handle and kernel selection
        tail[0].copy_(tail[0] @ tail[1] * 1e-3)
    sync()
    dist.barrier()
    a0 = time.perf_counter()
    for _ in range(20):
        tail[0].copy_(tail[0] @ tail[1] * 1e-3)
    sync()
    per = (time.perf_counter() - a0) * 1e3 / 20
    iters = torch.tensor([max(1, round(args.tail_gpu_ms / per))], device=dev)
    dist.all_reduce(iters, op=dist.ReduceOp.MAX)
    return tail, int(iters.item()), per



# --- one rank per GPU: tensor parallel x data parallel (--multi-gpu) ---------


class _ToTP(torch.autograd.Function):
    """Megatron's f: identity forward, all-reduce of the gradient over the TP group backward."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad):
        # The input of f feeds only a column-parallel linear: its gradient is
        # a fresh tensor, reduced in place as Megatron does.
        grad = grad.contiguous()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


class _FromTP(torch.autograd.Function):
    """Megatron's g: all-reduce over the TP group forward, identity backward."""

    @staticmethod
    def forward(ctx, x, group):
        x = x.contiguous()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad, None


def to_tp(x, group):
    return x if group is None else _ToTP.apply(x, group)


def from_tp(x, group):
    return x if group is None else _FromTP.apply(x, group)


def causal_attention(q, k, v):
    if hasattr(F, "scaled_dot_product_attention"):  # torch >= 2.0; backend chosen by torch.backends.cuda
        return F.scaled_dot_product_attention(q, k, v, is_causal=True)
    t = q.shape[-2]  # torch 1.x (the CPU dry run): the same computation by hand
    att = (q @ k.transpose(-2, -1)) * (q.shape[-1] ** -0.5)
    mask = torch.ones(t, t, dtype=torch.bool, device=q.device).triu(1)
    return att.masked_fill(mask, float("-inf")).softmax(-1) @ v


class TPBlock(nn.Module):
    """A transformer block split over a TP group of tp ranks: attention heads and
    the MLP's hidden units are sharded (column-parallel qkv and fc1, row-parallel
    proj and fc2); layer norms, residual biases, embeddings and head are replicated."""

    def __init__(self, d, heads, tp, group):
        super().__init__()
        if heads % tp or d % heads or (4 * d) % tp:
            raise ValueError(f"--heads {heads} and --dim {d} must split over --tp {tp}")
        self.group = group if tp > 1 else None
        self.lh, self.hd = heads // tp, d // heads
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * self.lh * self.hd)
        self.proj = nn.Linear(self.lh * self.hd, d, bias=False)
        self.proj_b = nn.Parameter(torch.zeros(d))
        self.fc1 = nn.Linear(d, 4 * d // tp)
        self.fc2 = nn.Linear(4 * d // tp, d, bias=False)
        self.fc2_b = nn.Parameter(torch.zeros(d))
        for m in (self.qkv, self.proj, self.fc1, self.fc2):
            for p in m.parameters():
                p.tp_shard = True

    def forward(self, x):
        b, t, _ = x.shape
        h = to_tp(self.ln1(x), self.group)
        q, k, v = self.qkv(h).view(b, t, 3, self.lh, self.hd).permute(2, 0, 3, 1, 4)
        a = causal_attention(q, k, v).transpose(1, 2).reshape(b, t, self.lh * self.hd)
        x = x + from_tp(self.proj(a), self.group) + self.proj_b
        h = to_tp(self.ln2(x), self.group)
        return x + from_tp(self.fc2(F.gelu(self.fc1(h))), self.group) + self.fc2_b


class TPGPT(nn.Module):
    def __init__(self, vocab, d, layers, heads, seq, tp, group):
        super().__init__()
        self.tok = nn.Embedding(vocab, d)
        self.pos = nn.Embedding(seq, d)
        self.blocks = nn.ModuleList([TPBlock(d, heads, tp, group) for _ in range(layers)])
        self.ln = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)

    def forward(self, idx):
        t = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        for b in self.blocks:
            x = b(x)
        return self.head(self.ln(x))


STOP_KEY = "slowrank_bench/stop_at"  # stop step + 1, set once by rank 0 (0: not yet)
DONE_KEY = "slowrank_bench/done"
EXIT_KEY = "slowrank_bench/exit"


def layout_groups(world, tp):
    """TP groups of tp consecutive ranks; DP groups of the ranks with one TP index."""
    if tp < 1 or world % tp:
        raise ValueError(f"--tp {tp} must divide the number of ranks {world}")
    dp = world // tp
    tp_groups = [list(range(i * tp, (i + 1) * tp)) for i in range(dp)]
    dp_groups = [[j + i * tp for i in range(dp)] for j in range(tp)]
    return tp_groups, dp_groups


def set_deterministic():
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)  # no warn_only: a non-deterministic op fails the run
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    # Flash, memory-efficient and cuDNN attention backward are not
    # deterministic: the math backend is (seen on the H200).
    for name, on in (("enable_flash_sdp", False), ("enable_mem_efficient_sdp", False),
                     ("enable_cudnn_sdp", False), ("enable_math_sdp", True)):
        fn = getattr(torch.backends.cuda, name, None)
        if fn is not None:
            fn(on)


def nccl_version():
    v = torch.cuda.nccl.version()
    return ".".join(map(str, v)) if isinstance(v, tuple) else str(v)


HOG = r"""
import json, os, sys, time
ppid = int(sys.argv[3])  # the trainer, passed in: it may die before torch is imported
import torch
dev, busy = torch.device("cuda", int(sys.argv[1])), float(sys.argv[2])
a = torch.randn(4096, 4096, device=dev)
b = torch.randn(4096, 4096, device=dev)
for _ in range(3):
    a @ b
torch.cuda.synchronize(dev)
t = time.perf_counter()
for _ in range(10):
    a @ b
torch.cuda.synchronize(dev)
per, period = (time.perf_counter() - t) / 10, 0.02
n = max(1, round(busy * period / per))
# busy is a target: the trainer shares the GPU while this calibrates.
print(json.dumps({"hog": str(dev), "matmuls": n, "matmul_ms": round(per * 1e3, 3), "period_ms": period * 1e3,
                  "loop_start_mono_ns": time.monotonic_ns()}), flush=True)
while os.getppid() == ppid:  # the trainer is gone: stop
    t0 = time.perf_counter()
    for _ in range(n):
        a @ b
    torch.cuda.synchronize(dev)
    time.sleep(max(0.0, period - (time.perf_counter() - t0)))
"""


def start_hog(local, busy, log_path):
    """A noisy neighbour on GPU `local`: another CUDA context that keeps the
    GPU busy `busy` of the time. Not a training process for the agent: no
    RANK in its environment, no injection library."""
    drop = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "CUDA_INJECTION64_PATH",
            "TORCHELASTIC_RUN_ID", "MASTER_ADDR", "MASTER_PORT")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    with open(log_path, "w") as log:  # the child keeps its own descriptor
        return subprocess.Popen([sys.executable, "-c", HOG, str(local), str(busy), str(os.getpid())],
                                env=env, stdout=log, stderr=log)


def run_multi(rank, world, args):
    local = int(os.environ.get("LOCAL_RANK", rank))
    if args.deterministic:
        set_deterministic()
    if args.device == "cuda":
        if local >= torch.cuda.device_count():
            raise SystemExit(f"rank {rank}: LOCAL_RANK {local} but only {torch.cuda.device_count()} GPUs")
        torch.cuda.set_device(local)
        dev = torch.device("cuda", local)
    else:
        dev = torch.device("cpu")
        torch.set_num_threads(args.cpu_threads)
    sync = torch.cuda.synchronize if dev.type == "cuda" else (lambda: None)
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world, rank == 0,
                          timeout=datetime.timedelta(seconds=args.store_timeout))
    dist.init_process_group(args.backend, store=store, rank=rank, world_size=world,
                            timeout=datetime.timedelta(seconds=args.store_timeout))
    tp = args.tp
    tp_groups, dp_groups = layout_groups(world, tp)
    tp_rank, dp_rank = rank % tp, rank // tp
    # Every rank creates every group, in the same order (torch's rule).
    tp_group = dp_group = None
    if tp > 1:
        for ranks in tp_groups:
            g = dist.new_group(ranks)
            if rank in ranks:
                tp_group = g
        for ranks in dp_groups:
            g = dist.new_group(ranks)
            if rank in ranks:
                dp_group = g
    # tp == 1: plain DDP over the default (world) group.
    out = open(os.path.join(args.out_dir, f"rank{rank}.jsonl"), "w", buffering=1)
    meta = {"rank": rank, "meta": True, "local_rank": local, "world": world, "tp": tp, "dp": world // tp,
            "tp_rank": tp_rank, "dp_rank": dp_rank, "tp_group": tp_groups[dp_rank], "dp_group": dp_groups[tp_rank],
            "device": str(dev), "backend": args.backend, "pid": os.getpid(), "host": platform.node(),
            "mono_ns": time.monotonic_ns(), "wall": time.time()}
    if dev.type == "cuda":
        meta["gpu"] = torch.cuda.get_device_name(dev)
    out.write(json.dumps(meta) + "\n")
    if rank == 0:
        layout = {"world": world, "tp": tp, "dp": world // tp, "tp_groups": tp_groups, "dp_groups": dp_groups,
                  "device": args.device, "backend": args.backend, "torch": torch.__version__,
                  "nccl": nccl_version() if dev.type == "cuda" else None,
                  "gpus": torch.cuda.device_count() if dev.type == "cuda" else 0,
                  "job": os.environ.get("TORCHELASTIC_RUN_ID"), "args": vars(args)}
        with open(os.path.join(args.out_dir, "layout.json"), "w") as f:
            json.dump(layout, f, indent=1)

    torch.manual_seed(args.seed)  # replicated parameters: the same on every rank
    # Built on the GPU where torch can (>= 2.0): no host copy of the model,
    # whose memory the machine would first have to grow into.
    on_dev = dev if dev.type == "cuda" and hasattr(torch.device, "__enter__") else contextlib.nullcontext()
    with on_dev:
        model = TPGPT(args.vocab, args.dim, args.layers, args.heads, args.seq, tp, tp_group)
    model = model.to(dev)
    shard_gen = torch.Generator(device=dev)
    shard_gen.manual_seed(args.seed + 1 + tp_rank)  # each TP index its own shard
    with torch.no_grad():
        for p in model.parameters():
            if getattr(p, "tp_shard", False):
                if p.dim() > 1:
                    p.normal_(0.0, 0.02, generator=shard_gen)
                else:
                    p.zero_()
    ddp_kw = {"process_group": dp_group, "bucket_cap_mb": args.bucket_mb, "broadcast_buffers": False}
    if dev.type == "cuda":
        ddp_kw.update(device_ids=[local], output_device=local)
    ddp = nn.parallel.DistributedDataParallel(model, **ddp_kw)
    opt = torch.optim.AdamW(ddp.parameters(), lr=3e-4)
    g = torch.Generator(device=dev)
    g.manual_seed(args.seed + 1000 + dp_rank)  # one batch per DP rank, the same on its TP peers

    extra = hog = None
    if args.slow_gpu_rank == rank and args.slow_gpu_mode == "extra":
        n = args.slow_gpu_size
        eg = torch.Generator(device=dev)
        eg.manual_seed(args.seed + 2000)  # not g: the TP peers must keep drawing the same batches
        extra = (torch.randn(n, n, device=dev, generator=eg), torch.randn(n, n, device=dev, generator=eg))
    fb_ms = []
    slow_iters = args.slow_gpu_iters
    slow = False
    step = 0
    stop_at = None
    loop_t0 = time.monotonic()
    timed = args.duration > 0 or bool(args.stop_file)
    while True:
        if timed:
            if stop_at is None:
                if rank == 0:
                    if (args.duration > 0 and time.monotonic() - loop_t0 >= args.duration) or \
                            (args.stop_file and os.path.exists(args.stop_file)):
                        stop_at = step + args.stop_margin
                        store.add(STOP_KEY, stop_at + 1)
                else:
                    v = store.add(STOP_KEY, 0)
                    if v > 0:
                        stop_at = v - 1
                        if stop_at < step:
                            raise RuntimeError(f"rank {rank} at step {step} learned the stop step {stop_at} too late; "
                                               "raise --stop-margin")
            if stop_at is not None and step >= stop_at:
                break
        if args.duration <= 0 and step >= args.steps:
            break
        t0 = time.monotonic_ns()
        injected = args.slow_gpu_rank == rank or args.slow_host_rank == rank
        if injected and not slow and (step >= args.slow_from or
                                      (args.slow_from_s >= 0 and time.monotonic() - loop_t0 >= args.slow_from_s)):
            slow = True
            if extra is not None and args.slow_gpu_frac > 0 and fb_ms:
                # Size the extra work to slow_gpu_frac of this rank's forward+backward.
                sync()
                a0 = time.perf_counter()
                for _ in range(20):
                    extra[0].copy_(extra[0] @ extra[1] * 1e-3)
                sync()
                per = (time.perf_counter() - a0) * 1e3 / 20
                fb = sorted(fb_ms)[len(fb_ms) // 2]
                slow_iters = max(1, round(args.slow_gpu_frac * fb / per))
            if args.slow_gpu_rank == rank and args.slow_gpu_mode == "contend" and dev.type == "cuda" \
                    and args.slow_gpu_frac > 0:
                hog = start_hog(local, args.slow_gpu_frac, os.path.join(args.out_dir, f"hog{rank}.log"))
            out.write(json.dumps({"rank": rank, "injection_start": True, "step": step, "mono_ns": time.monotonic_ns(),
                                  "wall": time.time(), "slow_gpu_iters": slow_iters if extra is not None else 0,
                                  "slow_gpu_mode": args.slow_gpu_mode if args.slow_gpu_rank == rank else None,
                                  "slow_host_ms": args.slow_host_ms if args.slow_host_rank == rank else 0,
                                  "slow_host_at": args.slow_host_at if args.slow_host_rank == rank else None,
                                  "fb_ms_median": sorted(fb_ms)[len(fb_ms) // 2] if fb_ms else None}) + "\n")
        if extra is not None and slow:
            # Extra GPU work ahead of the forward pass, on the compute stream.
            for _ in range(slow_iters):
                extra[0].copy_(extra[0] @ extra[1] * 1e-3)
        if args.slow_host_rank == rank and slow and args.slow_host_at == "start":
            time.sleep(args.slow_host_ms / 1e3)  # like a data loader stall: the GPU has nothing queued
        measure = 5 <= step < 25 and extra is not None
        if measure:
            sync()
            m0 = time.perf_counter()
        idx = torch.randint(0, args.vocab, (args.batch, args.seq), device=dev, generator=g)
        logits = ddp(idx[:, :-1])
        loss = F.cross_entropy(logits.reshape(-1, args.vocab), idx[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()  # DDP all-reduces gradient buckets over the DP group during backward
        if measure:
            sync()
            fb_ms.append((time.perf_counter() - m0) * 1e3)
        opt.step()
        if args.slow_host_rank == rank and slow and args.slow_host_at == "end":
            time.sleep(args.slow_host_ms / 1e3)  # while the GPU still works: hidden unless longer than its queue
        sync()  # the timer's native effect: a device synchronisation
        t1 = time.monotonic_ns()
        out.write(json.dumps({"rank": rank, "step": step, "start_ns": t0, "end_ns": t1,
                              "step_ms": (t1 - t0) / 1e6, "loss": loss.item()}) + "\n")
        step += 1
    # The hash copies every parameter to the host: only where it means something
    # (deterministic runs) or costs nothing (the CPU dry run).
    if hog is not None:
        hog.terminate()
        hog.wait()
    sha = param_hash(model) if args.deterministic or dev.type == "cpu" else None
    out.write(json.dumps({"rank": rank, "final": True, "steps": step, "param_sha256": sha,
                          "seconds": round(time.monotonic() - loop_t0, 3)}) + "\n")
    out.close()
    # End through the store, not a collective: no world communicator appears.
    store.add(DONE_KEY, 1)
    while store.add(DONE_KEY, 0) < world:
        time.sleep(0.05)
    if rank != 0:
        store.add(EXIT_KEY, 1)
    else:
        while store.add(EXIT_KEY, 0) < world - 1:  # rank 0 holds the store: leave last
            time.sleep(0.05)
        time.sleep(0.2)
    dist.destroy_process_group()


def launch(args, rank_env=None):
    """Start one process per rank like torchrun: RANK etc. are in each
    process's initial environment, which is where the agent reads identity
    from. If a rank fails, or --kill-after passes, the others are stopped
    instead of hanging in a collective. rank_env(r), if given, returns
    variables that rank r's environment adds or overrides (ranks sharing one
    GPU: LOCAL_RANK 0 and a per-rank NCCL_HOSTID, bench/gpu/sensitivity.py)."""
    procs = []
    for r in range(args.launch):
        env = dict(os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(args.launch),
                   LOCAL_WORLD_SIZE=str(args.launch), GROUP_RANK="0")
        if rank_env is not None:
            env.update(rank_env(r))
        procs.append(subprocess.Popen([sys.executable] + sys.argv, env=env))

    def stop_all(*_):
        for p in procs:
            if p.poll() is None:
                p.terminate()
        t = time.monotonic() + 10
        while any(p.poll() is None for p in procs) and time.monotonic() < t:
            time.sleep(0.1)
        for p in procs:
            if p.poll() is None:
                p.kill()
        for p in procs:
            p.wait()

    def on_signal(sig, _):
        stop_all()
        sys.exit(128 + sig)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    deadline = time.monotonic() + args.kill_after if args.kill_after > 0 else None
    while True:
        codes = [p.poll() for p in procs]
        if all(c is not None for c in codes):
            return max(abs(c) for c in codes)
        failed = [(r, c) for r, c in enumerate(codes) if c not in (None, 0)]
        if failed:
            print(f"launcher: rank {failed[0][0]} exited with {failed[0][1]}; stopping the other ranks", file=sys.stderr)
            stop_all()
            return abs(failed[0][1]) or 1
        if deadline is not None and time.monotonic() > deadline:
            print(f"launcher: --kill-after {args.kill_after:g} s passed; stopping every rank", file=sys.stderr)
            stop_all()
            return 124
        time.sleep(0.2)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--launch", type=int, default=4, help="ranks to start (one GPU, or one per GPU with --multi-gpu)")
    ap.add_argument("--backend", default="gloo", choices=["gloo", "nccl"])
    ap.add_argument("--multi-gpu", action="store_true", help="one rank per device (cuda:LOCAL_RANK), TP x DP with DDP")
    ap.add_argument("--tp", type=int, default=1, help="(--multi-gpu) tensor-parallel group size; DP = ranks / tp")
    ap.add_argument("--device", default="cuda", choices=["cuda", "cpu"], help="cpu: dry run with gloo")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--duration", type=float, default=0, help="seconds; overrides --steps")
    ap.add_argument("--dim", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--bucket", type=int, default=16, help="parameters per all-reduce bucket")
    ap.add_argument("--bucket-mb", type=float, default=25, help="(--multi-gpu) DDP bucket size")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--deterministic", action="store_true")
    ap.add_argument("--slow-from", type=int, default=1 << 30)
    ap.add_argument("--slow-from-s", type=float, default=-1, help="start the injection after this many seconds of the loop")
    ap.add_argument("--slow-gpu-rank", type=int, default=-1)
    ap.add_argument("--slow-gpu-size", type=int, default=2048)
    ap.add_argument("--slow-gpu-iters", type=int, default=4)
    ap.add_argument("--slow-gpu-frac", type=float, default=0, help="size the GPU injection to this share of compute")
    ap.add_argument("--slow-gpu-mode", choices=("extra", "contend"), default="extra",
                    help="extra: more kernels in the rank; contend: a noisy neighbour process on its GPU (--multi-gpu)")
    ap.add_argument("--slow-host-rank", type=int, default=-1)
    ap.add_argument("--slow-host-ms", type=float, default=0)
    ap.add_argument("--slow-host-at", choices=("start", "end"), default="end",
                    help="where the host stall sits: start of the step (GPU idle: the job slows) or "
                         "after optimizer.step (GPU still busy: hidden unless longer than its queued work)")
    ap.add_argument("--tail-gpu-ms", type=float, default=0,
                    help="(one GPU, gloo) every rank queues about this many ms of GPU matmuls after optimizer.step, "
                         "timed with all ranks sharing the GPU: the queue an end-of-step host stall can hide behind")
    ap.add_argument("--tail-gpu-size", type=int, default=2048, help="matrix size of the --tail-gpu-ms matmuls")
    ap.add_argument("--stop-file", help="(--multi-gpu) stop early once this file exists (checked by rank 0 every step)")
    ap.add_argument("--stop-margin", type=int, default=10, help="(--multi-gpu) steps between rank 0's stop decision and the stop")
    ap.add_argument("--store-timeout", type=float, default=300, help="(--multi-gpu) seconds for store and collectives")
    ap.add_argument("--cpu-threads", type=int, default=1, help="(--device cpu) torch threads per rank")
    ap.add_argument("--kill-after", type=float, default=0, help="launcher: stop every rank after this many seconds (0: never)")
    ap.add_argument("--port", type=int, default=29511)
    ap.add_argument("--out-dir", default=".")
    args = ap.parse_args()
    if args.device == "cpu" and args.backend != "gloo":
        ap.error("--device cpu needs --backend gloo")
    os.makedirs(args.out_dir, exist_ok=True)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(args.port)
    os.environ.setdefault("TORCHELASTIC_RUN_ID", "bench")
    # NVLink multicast stays off (the GPU machines' rule), also for ranks
    # started with their own environment.
    for k, v in (("NCCL_NVLS_ENABLE", "0"), ("TORCH_SYMM_MEM_DISABLE_MULTICAST", "1"), ("NVSHMEM_DISABLE_NVLS", "1")):
        os.environ.setdefault(k, v)
    if args.deterministic:
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # before any cuBLAS handle exists
    if "RANK" in os.environ:
        (run_multi if args.multi_gpu else run)(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), args)
        return 0
    return launch(args)


if __name__ == "__main__":
    sys.exit(main())
