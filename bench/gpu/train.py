#!/usr/bin/env python3
"""A GPT-style training job for slowrank's GPU validation (bench/gpu).

Two forms:
  * 4 ranks sharing one GPU with torch.distributed gloo (NCCL refuses two ranks
    on one GPU): launch with --launch 4 --backend gloo;
  * 1 rank with NCCL: --launch 1 --backend nccl.

Each rank writes one JSON line per step to --out-dir/rank<R>.jsonl with its own
ground truth (step, wall ms measured around the step's end-of-step
synchronisation, loss) and, at the end, a SHA-256 of its parameters.

Injections (for localisation experiments):
  --slow-gpu-rank R --slow-gpu-factor F --slow-from S : extra GPU matmuls on
      rank R from step S, sized to add about (F-1) of its compute;
  --slow-host-rank R --slow-host-ms M --slow-from S   : a host sleep per step.
  --ab-block N : for in-process A/B, print step times; the agent toggles.

The training code knows nothing about slowrank: the agent attaches from the
outside and the injection library is loaded through CUDA_INJECTION64_PATH.
"""
import argparse
import hashlib
import json
import os
import subprocess
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn


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
    torch.cuda.set_device(0)
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
    dev = torch.device("cuda", 0)
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
    ev0, ev1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    fb_ms = []  # forward+backward GPU time of early steps, to size the GPU injection
    slow_iters = args.slow_gpu_iters
    out = open(os.path.join(args.out_dir, f"rank{rank}.jsonl"), "w", buffering=1)
    deadline = time.monotonic() + args.duration if args.duration > 0 else None
    step = 0
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
        slow = step >= args.slow_from
        if slow and step == args.slow_from:
            if extra is not None and args.slow_gpu_frac > 0 and fb_ms:
                # Size the extra work to slow_gpu_frac of this rank's compute.
                torch.cuda.synchronize()
                a0 = time.perf_counter()
                for _ in range(20):
                    extra[0].copy_(extra[0] @ extra[1] * 1e-3)
                torch.cuda.synchronize()
                per = (time.perf_counter() - a0) * 1e3 / 20
                fb = sorted(fb_ms)[len(fb_ms) // 2]
                slow_iters = max(1, round(args.slow_gpu_frac * fb / per))
            out.write(json.dumps({"rank": rank, "injection_start": True, "step": step, "mono_ns": time.monotonic_ns(),
                                  "wall": time.time(), "slow_gpu_iters": slow_iters if extra is not None else 0}) + "\n")
        measure = 5 <= step < 25 and extra is not None
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
        if args.slow_host_rank == rank and slow:
            time.sleep(args.slow_host_ms / 1e3)
        torch.cuda.synchronize()  # the timer's native effect: a device synchronisation
        t1 = time.monotonic_ns()
        out.write(json.dumps({"rank": rank, "step": step, "start_ns": t0, "end_ns": t1,
                              "step_ms": (t1 - t0) / 1e6, "loss": loss.item()}) + "\n")
        step += 1
    out.write(json.dumps({"rank": rank, "final": True, "steps": step, "param_sha256": param_hash(model)}) + "\n")
    out.close()
    dist.barrier()
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--launch", type=int, default=4, help="ranks to start (one GPU)")
    ap.add_argument("--backend", default="gloo", choices=["gloo", "nccl"])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--duration", type=float, default=0, help="seconds; overrides --steps")
    ap.add_argument("--dim", type=int, default=1024)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--heads", type=int, default=16)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=8192)
    ap.add_argument("--bucket", type=int, default=16, help="parameters per all-reduce bucket")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--deterministic", action="store_true")
    ap.add_argument("--slow-from", type=int, default=1 << 30)
    ap.add_argument("--slow-gpu-rank", type=int, default=-1)
    ap.add_argument("--slow-gpu-size", type=int, default=2048)
    ap.add_argument("--slow-gpu-iters", type=int, default=4)
    ap.add_argument("--slow-gpu-frac", type=float, default=0, help="size the GPU injection to this share of compute")
    ap.add_argument("--slow-host-rank", type=int, default=-1)
    ap.add_argument("--slow-host-ms", type=float, default=0)
    ap.add_argument("--port", type=int, default=29511)
    ap.add_argument("--out-dir", default=".")
    args = ap.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ["MASTER_PORT"] = str(args.port)
    os.environ.setdefault("TORCHELASTIC_RUN_ID", "bench")
    if "RANK" in os.environ:
        run(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), args)
        return 0
    # Launch like torchrun: one process per rank with RANK etc. in its initial
    # environment, which is where the agent reads identity from.
    procs = []
    for r in range(args.launch):
        env = dict(os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(args.launch),
                   LOCAL_WORLD_SIZE=str(args.launch), GROUP_RANK="0")
        procs.append(subprocess.Popen([sys.executable] + sys.argv, env=env))
    return max(p.wait() for p in procs)


if __name__ == "__main__":
    sys.exit(main())
