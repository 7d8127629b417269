#!/usr/bin/env python3
"""An 'external' training job for slowrank's do-no-harm runs (issue 15).

A plain Hugging Face transformers GPT-2 (GPT2LMHeadModel built from a
GPT2Config, random weights, random tokens) in a standard PyTorch loop: DDP
over NCCL with the torchrun environment (RANK, LOCAL_RANK, WORLD_SIZE,
MASTER_ADDR, MASTER_PORT; world size 1 on the one GPU), AdamW, bf16 autocast.
Nothing in it knows about slowrank: the agent attaches from the outside and
the injection library comes in through CUDA_INJECTION64_PATH.

Shapes (--shape; --layers/--embd/--heads/--seq/--batch override one field):
  dense   12 x 1024, seq 1024, batch 8   kernel-dense, ~57 ms steps on an H200
  gpu     12 x 2048, seq 1024, batch 12  GPU-bound, > 150 ms steps
  launch  24 x 512,  seq 512,  batch 4   launch-bound (many small kernels)
  tiny    2 x 64, seq 64, batch 2, vocab 512: CPU dry runs (--device cpu)

Every step ends with loss.item(), which waits for the step's own work on the
stream (forward, backward, DDP's all-reduce, optimizer): no
torch.cuda.synchronize, yet every step's time is real. One JSON line per step
goes to --out-dir/rank0.jsonl: {"rank","step","start_ns","end_ns","step_ms",
"loss"} with time.monotonic_ns() (CLOCK_MONOTONIC, the agent's clock), the
start being the previous step's end (or the moment a --gate opened). Markers
({"event": ...}) record the profiler window and gate changes; a final line
{"final": true, ...} the step count and whether every loss was finite.

--profile-at STEP --profile-steps N --profile-out FILE opens
torch.profiler.profile(activities=[CPU, CUDA]) at step STEP for N steps and
writes to FILE the number of CUDA kernel events per profiled step (device
events of device type CUDA that are not memcpy/memset, assigned to the step
whose CPU range holds their start; each step is wrapped in a
record_function), plus the window's monotonic start and end.

--gate FILE: step only while FILE exists (checked before every step, a 5 ms
sleep while closed; the first --warmup-steps steps ignore it). Several
processes can so take turns on one GPU (bench/gpu/idle_lib.sh).
--duration S / --steps N / --stop-file FILE end the run.

The pure helpers (count_per_step, kernel_like) import no torch, so
analyze.py selftest can test them without it.
"""
import argparse
import bisect
import json
import math
import os
import sys
import time

SHAPES = {
    "dense": dict(layers=12, embd=1024, heads=16, seq=1024, batch=8, vocab=50257),
    "gpu": dict(layers=12, embd=2048, heads=16, seq=1024, batch=12, vocab=50257),
    "launch": dict(layers=24, embd=512, heads=8, seq=512, batch=4, vocab=50257),
    "tiny": dict(layers=2, embd=64, heads=4, seq=64, batch=2, vocab=512),
}

COPY_PREFIXES = ("memcpy", "memset", "[memcpy", "[memset")


def kernel_like(name):
    """A device event that is a kernel, not a copy or a set."""
    n = (name or "").strip().lower()
    return not n.startswith(COPY_PREFIXES)


def count_per_step(steps, device_events):
    """steps: [(label, start, end)] CPU ranges of the profiled steps, in any
    order; device_events: [(start, is_kernel)]. Each device event belongs to
    the last step that started at or before it (a step's kernels start after
    its launches and, with the loss.item() at its end, before the next step
    begins). Returns per step (in start order) the kernels and all device
    events, and the events before the first step."""
    steps = sorted(steps, key=lambda s: s[1])
    starts = [s[1] for s in steps]
    kernels = [0] * len(steps)
    device = [0] * len(steps)
    before = 0
    for start, is_kernel in device_events:
        i = bisect.bisect_right(starts, start) - 1
        if i < 0:
            before += 1
            continue
        device[i] += 1
        if is_kernel:
            kernels[i] += 1
    return {"labels": [s[0] for s in steps], "kernels": kernels, "device_events": device, "before_first_step": before}


def profile_summary(prof, labels_prefix, torch):
    """Kernel counts per step from a finished torch.profiler.profile."""
    t0 = time.monotonic()
    res = {"parse_error": None}
    try:
        events = prof.events()
        cuda_type = torch.autograd.DeviceType.CUDA
        steps, dev = [], []
        cpu = 0
        for e in events:
            tr = e.time_range
            if getattr(e, "device_type", None) == cuda_type:
                dev.append((tr.start, kernel_like(e.name)))
            else:
                cpu += 1
                if e.name.startswith(labels_prefix):
                    steps.append((e.name, tr.start, tr.end))
        res.update(count_per_step(steps, dev))
        res["cpu_events"] = cpu
        res["device_events_total"] = len(dev)
        res["kernels_total"] = sum(1 for _, k in dev if k)
    except Exception as ex:  # keep the training alive; the run reports it
        res["parse_error"] = repr(ex)
    res["parse_s"] = round(time.monotonic() - t0, 3)
    return res


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="dense")
    for k in ("layers", "embd", "heads", "seq", "batch", "vocab"):
        ap.add_argument("--" + k, type=int, help=f"override the shape's {k}")
    ap.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16", help="bf16: autocast (weights fp32)")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--backend", choices=("nccl", "gloo"), default=None, help="default: nccl on cuda, gloo on cpu")
    ap.add_argument("--duration", type=float, default=60, help="seconds of training (from the first step)")
    ap.add_argument("--steps", type=int, default=0, help="stop after this many steps (0: no limit)")
    ap.add_argument("--stop-file", help="stop once this file exists")
    ap.add_argument("--gate", help="step only while this file exists")
    ap.add_argument("--warmup-steps", type=int, default=0, help="steps run before the gate is honoured")
    ap.add_argument("--profile-at", type=int, default=-1)
    ap.add_argument("--profile-steps", type=int, default=13)
    ap.add_argument("--profile-out")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--threads", type=int, default=0, help="(cpu) torch threads")
    ap.add_argument("--print-every", type=int, default=100)
    ap.add_argument("--out-dir", default=".")
    args = ap.parse_args()

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from transformers import GPT2Config, GPT2LMHeadModel

    shape = dict(SHAPES[args.shape])
    for k in shape:
        if getattr(args, k) is not None:
            shape[k] = getattr(args, k)
    backend = args.backend or ("nccl" if args.device == "cuda" else "gloo")
    for k, v in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("MASTER_ADDR", "127.0.0.1"),
                 ("MASTER_PORT", "29500")):
        os.environ.setdefault(k, v)
    rank, local = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    os.makedirs(args.out_dir, exist_ok=True)
    out = open(os.path.join(args.out_dir, f"rank{rank}.jsonl"), "w", buffering=1)

    def mark(event, **kw):
        out.write(json.dumps({"rank": rank, "event": event, "mono_ns": time.monotonic_ns(), "wall": time.time(), **kw}) + "\n")

    if args.device == "cuda":
        torch.cuda.set_device(local)
        dev = torch.device("cuda", local)
    else:
        dev = torch.device("cpu")
        if args.threads:
            torch.set_num_threads(args.threads)
    dist.init_process_group(backend)
    torch.manual_seed(args.seed)
    cfg = GPT2Config(n_layer=shape["layers"], n_embd=shape["embd"], n_head=shape["heads"],
                     n_positions=shape["seq"], vocab_size=shape["vocab"])
    model = GPT2LMHeadModel(cfg).to(dev)
    model.train()
    ddp = DDP(model, device_ids=[local] if args.device == "cuda" else None)
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-4)
    gen = torch.Generator(device=dev)
    gen.manual_seed(args.seed + rank)
    amp = torch.autocast(device_type=args.device, dtype=torch.bfloat16, enabled=args.dtype == "bf16")
    mark("start", pid=os.getpid(), shape=args.shape, dims=shape, dtype=args.dtype, backend=backend,
         torch=torch.__version__, world=dist.get_world_size(),
         params=sum(p.numel() for p in model.parameters()),
         injection=os.environ.get("CUDA_INJECTION64_PATH", ""))
    print(f"ext_train: {args.shape} {shape} {args.dtype} on {dev}, pid {os.getpid()}, "
          f"{sum(p.numel() for p in model.parameters()) / 1e6:.1f} M parameters", flush=True)

    prof = done_prof = None
    prof_res = None
    label = "ext_step#"
    step, finite, last_loss = 0, True, None
    deadline = None
    t_prev = time.monotonic_ns()
    gate_open = True
    rec = None
    while True:
        if args.steps and step >= args.steps:
            break
        if deadline is not None and time.monotonic() >= deadline:
            break
        if args.stop_file and os.path.exists(args.stop_file):
            mark("stop_file")
            break
        if args.gate and step >= args.warmup_steps:
            if not os.path.exists(args.gate):
                if gate_open:
                    mark("gate_closed", step=step)
                    gate_open = False
                time.sleep(0.005)
                continue
            if not gate_open:
                gate_open = True
                t_prev = time.monotonic_ns()  # the pause is no step's time
                mark("gate_open", step=step)
        if step == args.profile_at:
            from torch.profiler import ProfilerActivity, profile
            acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if args.device == "cuda" else [])
            prof = profile(activities=acts)
            try:
                prof.__enter__()
                mark("profiler_start", step=step)
            except Exception as ex:  # reported, not fatal: the run goes on without it
                mark("profiler_error", step=step, error=repr(ex))
                print(f"profiler failed to start: {ex!r}", flush=True)
                prof_res = {"parse_error": "start: " + repr(ex), "profile_at": args.profile_at}
                prof = None
                if args.profile_out:
                    with open(args.profile_out, "w") as f:
                        json.dump(prof_res, f)
            t_prev = time.monotonic_ns()
        if prof is not None:
            from torch.profiler import record_function
            rec = record_function(f"{label}{step}")
            rec.__enter__()
        idx = torch.randint(0, shape["vocab"], (shape["batch"], shape["seq"]), device=dev, generator=gen)
        with amp:
            loss = ddp(input_ids=idx, labels=idx).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        lv = loss.item()  # waits for this step's work on the stream
        t = time.monotonic_ns()
        if rec is not None:
            rec.__exit__(None, None, None)
            rec = None
        finite = finite and math.isfinite(lv)
        last_loss = lv
        out.write(json.dumps({"rank": rank, "step": step, "start_ns": t_prev, "end_ns": t,
                              "step_ms": (t - t_prev) / 1e6, "loss": lv, "prof": prof is not None}) + "\n")
        if step == 0:
            deadline = time.monotonic() + args.duration if args.duration > 0 else None
        if args.print_every and step % args.print_every == 0:
            print(f"step {step} {(t - t_prev) / 1e6:.2f} ms loss {lv:.4f}", flush=True)
        step += 1
        t_prev = t
        if prof is not None and step >= args.profile_at + args.profile_steps:
            try:
                prof.__exit__(None, None, None)
                mark("profiler_stop", step=step)
                done_prof = prof
            except Exception as ex:
                mark("profiler_stop", step=step, error=repr(ex))
                prof_res = {"parse_error": "stop: " + repr(ex), "parse_s": 0}
            prof = None
            t_prev = time.monotonic_ns()  # the profiler's stop is no step's time
    if prof is not None:  # the run ended inside the window
        prof.__exit__(None, None, None)
        mark("profiler_stop", step=step, early=True)
    if done_prof is not None:
        # Parsed after training, not at the window's end: the parse of a long
        # window takes a minute and gigabytes, which would end the run and
        # hide what the process does after the window (coexist.sh's RSS).
        mark("profile_parse", step=step)
        try:
            prof_res = profile_summary(done_prof, label, torch)
        except Exception as ex:
            prof_res = {"parse_error": "parse: " + repr(ex), "parse_s": 0}
    if prof_res is not None:
        prof_res.update({"profile_at": args.profile_at, "profile_steps": args.profile_steps})
        if args.profile_out:
            with open(args.profile_out, "w") as f:
                json.dump(prof_res, f)
                f.write("\n")
        print(f"profiler: {prof_res.get('kernels', [])} kernels per step, parse {prof_res.get('parse_s')} s, "
              f"error {prof_res.get('parse_error')}", flush=True)
    out.write(json.dumps({"rank": rank, "final": True, "steps": step, "loss_finite": finite, "last_loss": last_loss,
                          "profiled": prof_res is not None}) + "\n")
    out.close()
    print(f"ext_train: done, {step} steps, last loss {last_loss}, finite {finite}", flush=True)
    dist.destroy_process_group()
    return 0 if finite else 3


if __name__ == "__main__":
    sys.exit(main())
