#!/usr/bin/env python3
"""External training loops for issue 16 item 4 (bench/gpu/ext_loops.sh).

One process trains with one loop (--loop):
  trainer    the transformers Trainer (GPT2LMHeadModel from a GPT2Config,
             random weights and tokens, bf16), a TrainerCallback times it
  lightning  PyTorch Lightning, Trainer(strategy="ddp", devices=1,
             precision="bf16-mixed"), a Callback times it
  compile    torch.compile(model) under DDP, the nanoGPT recipe (compile,
             then DDP; bf16 autocast; loss.item() every step)
  cudagraph  the whole step (forward, backward, AdamW(capturable=True))
             captured once in a torch.cuda.CUDAGraph and replayed, as in
             PyTorch's "whole network capture" recipe (3 warm-up steps on a
             side stream first)
  fsdp2      torch.distributed.fsdp.fully_shard on every block and the root,
             MixedPrecisionPolicy(bf16 params, fp32 reduce), world size 1
  megatron   Megatron-core: GPTModel with the local (pure torch) layer spec,
             megatron DDP, get_megatron_optimizer, the pipeline schedule's
             forward_backward_func, and Megatron's own Timers (interval-time
             read with barrier=True every iteration, --timing-log-level 1
             timers around forward-backward and the optimizer), as
             megatron/training/training.py uses them
The model code is the framework's or a plain GPT (MiniGPT below, the one
of nanoGPT); nothing in it knows about slowrank. The process is started
like torchrun starts a rank (RANK, LOCAL_RANK, WORLD_SIZE, ... in the
environment), world size 1; the frameworks decide themselves whether they
use NCCL (the transformers Trainer does not wrap DDP at world size 1).

Timing (the loop's own): one JSON line per iteration to
--out-dir/steps.jsonl, written by the framework's hook (TrainerCallback.
on_step_end, Callback.on_train_batch_end) or at the end of the plain
loops' iteration: {"step", "start_ns", "end_ns", "step_ms", "own_ms"},
time.monotonic_ns() (CLOCK_MONOTONIC, the agent's clock), start = the
previous end (the first: the train-begin hook). own_ms is the framework's
own figure where it has one (Megatron's interval-time timer). Markers:
{"event": "begin" | "warm" | "profiler_start" | "profiler_stop"}; last
line {"final": true, "steps": N}.

--duration S: after --warm iterations, train S more seconds, then stop
through the framework (control.should_training_stop, trainer.should_stop,
the loop's own break). --profile-steps N: instead, after --warm
iterations open torch.profiler.profile(CPU+CUDA, schedule warmup 1,
active N), step it from the same hook, export a Chrome trace to --trace
and stop. The trace is reduced by ext_loops_analyze.py.

--device cpu with the tiny shape is the dry run of ext_loops.sh (DRY=1):
gloo instead of NCCL; what the local torch lacks is replaced and said so
in the "begin" marker ("dry"): torch.compile -> eager, CUDA graph
capture -> eager steps, fully_shard -> none; the transformers Trainer and
Lightning come from bench/gpu/drystub when they are not installed.
Megatron needs torch >= 2.6 and CUDA: no dry run.
"""
import argparse
import json
import math
import os
import sys
import time

SHAPES = {
    # ~20-30 ms steps on an H200 for the GPT loops (bf16), ~3x for megatron (fp32/TF32)
    "small": dict(layers=6, embd=1024, heads=16, seq=1024, batch=8, vocab=32768),
    "tiny": dict(layers=2, embd=64, heads=4, seq=64, batch=2, vocab=512),
}
LOOPS = ("trainer", "lightning", "compile", "cudagraph", "fsdp2", "megatron")


class StepLog:
    """The loop's own per-iteration timing, and the profiler window."""

    def __init__(self, path, warm, duration, profile_steps=0, trace=None, max_steps=0):
        self.f = open(path, "w", buffering=1)
        self.warm, self.duration, self.max_steps = warm, duration, max_steps
        self.profile_steps, self.trace = profile_steps, trace
        self.n = 0
        self.prev = None
        self.deadline = None
        self.prof = None
        self.prof_left = 0
        self.stopped = False

    def mark(self, event, **kw):
        self.f.write(json.dumps({"event": event, "mono_ns": time.monotonic_ns(), "wall": time.time(), **kw}) + "\n")

    def begin(self, **kw):
        if self.prev is None:
            self.prev = time.monotonic_ns()
            self.mark("begin", pid=os.getpid(), **kw)

    def step_end(self, own_ms=None, loss=None):
        """Records one iteration; True when the loop should stop now."""
        t = time.monotonic_ns()
        if self.prev is None:
            self.prev = t
        rec = {"step": self.n, "start_ns": self.prev, "end_ns": t, "step_ms": (t - self.prev) / 1e6}
        if own_ms is not None:
            rec["own_ms"] = own_ms
        if loss is not None:
            rec["loss"] = loss
        if self.prof is not None:
            rec["prof"] = True
        self.f.write(json.dumps(rec) + "\n")
        self.n += 1
        self.prev = t
        if self.n == self.warm:
            self.mark("warm", step=self.n)
            if self.profile_steps:
                self._prof_open()
            elif self.duration > 0:
                self.deadline = time.monotonic() + self.duration
        elif self.prof is not None:
            self.prof.step()
            self.prof_left -= 1
            if self.prof_left <= 0:
                self._prof_close()
                self.stopped = True
        if self.deadline is not None and time.monotonic() >= self.deadline:
            self.stopped = True
        if self.max_steps and self.n >= self.max_steps:
            self.stopped = True
        return self.stopped

    def _prof_open(self):
        import torch
        from torch.profiler import ProfilerActivity, profile, schedule
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
        trace = self.trace

        def ready(p):
            t0 = time.monotonic()
            p.export_chrome_trace(trace)
            self.mark("trace_exported", path=trace, export_s=round(time.monotonic() - t0, 3))

        self.prof = profile(activities=acts, schedule=schedule(wait=0, warmup=1, active=self.profile_steps, repeat=1),
                            on_trace_ready=ready)
        self.prof.start()
        self.prof_left = 1 + self.profile_steps
        self.mark("profiler_start", step=self.n)

    def _prof_close(self):
        self.prof.stop()
        self.prof = None
        self.mark("profiler_stop", step=self.n)

    def close(self, **kw):
        if self.prof is not None:
            self._prof_close()
        self.f.write(json.dumps({"final": True, "steps": self.n, **kw}) + "\n")
        self.f.close()


def mini_gpt(cfg):
    """nanoGPT's GPT (no dropout, untied head); loss in fp32."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F
    E, H = cfg["embd"], cfg["heads"]
    sdpa = getattr(F, "scaled_dot_product_attention", None)

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(E), nn.LayerNorm(E)
            self.qkv, self.proj = nn.Linear(E, 3 * E), nn.Linear(E, E)
            self.fc, self.fc2 = nn.Linear(E, 4 * E), nn.Linear(4 * E, E)

        def forward(self, x):
            B, T, C = x.shape
            q, k, v = self.qkv(self.ln1(x)).split(C, dim=2)
            q, k, v = (t.view(B, T, H, C // H).transpose(1, 2) for t in (q, k, v))
            if sdpa is not None:
                y = sdpa(q, k, v, is_causal=True)
            else:  # torch < 2.0 (the dry run's)
                a = (q @ k.transpose(-2, -1)) / math.sqrt(C // H)
                a = a.masked_fill(torch.ones(T, T, dtype=torch.bool, device=x.device).triu(1), float("-inf"))
                y = a.softmax(-1) @ v
            x = x + self.proj(y.transpose(1, 2).contiguous().view(B, T, C))
            return x + self.fc2(F.gelu(self.fc(self.ln2(x))))

    class GPT(nn.Module):
        def __init__(self):
            super().__init__()
            self.wte, self.wpe = nn.Embedding(cfg["vocab"], E), nn.Embedding(cfg["seq"], E)
            self.blocks = nn.ModuleList([Block() for _ in range(cfg["layers"])])
            self.ln_f = nn.LayerNorm(E)
            self.head = nn.Linear(E, cfg["vocab"], bias=False)

        def forward(self, idx, targets):
            pos = torch.arange(idx.shape[1], device=idx.device)
            x = self.wte(idx) + self.wpe(pos)
            for b in self.blocks:
                x = b(x)
            logits = self.head(self.ln_f(x))
            return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.view(-1))

    return GPT()


class Env:
    """What every loop shares: torch, the device, the distributed environment."""

    def __init__(self, args):
        import torch
        self.torch = torch
        self.args = args
        for k, v in (("RANK", "0"), ("LOCAL_RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_WORLD_SIZE", "1"),
                     ("MASTER_ADDR", "127.0.0.1"), ("MASTER_PORT", "29500")):
            os.environ.setdefault(k, v)
        self.rank, self.local, self.world = (int(os.environ[k]) for k in ("RANK", "LOCAL_RANK", "WORLD_SIZE"))
        self.cuda = args.device == "cuda"
        if self.cuda:
            torch.cuda.set_device(self.local)
            self.dev = torch.device("cuda", self.local)
            torch.backends.cuda.matmul.allow_tf32 = True
            torch.backends.cudnn.allow_tf32 = True
        else:
            self.dev = torch.device("cpu")
            torch.set_num_threads(args.threads)
        self.backend = "nccl" if self.cuda else "gloo"
        self.shape = dict(SHAPES[args.shape])
        self.dry = []  # what the local torch lacked (dry runs)
        torch.manual_seed(args.seed)
        self.gen = torch.Generator(device=self.dev)
        self.gen.manual_seed(args.seed + self.rank)

    def batch(self):
        s = self.shape
        x = self.torch.randint(0, s["vocab"], (s["batch"], s["seq"]), device=self.dev, generator=self.gen)
        return x, x.roll(-1, dims=1)

    def init_pg(self):
        import torch.distributed as dist
        if not dist.is_initialized():
            dist.init_process_group(self.backend)
        return dist

    def autocast(self, **kw):
        t = self.torch
        return t.autocast(device_type=self.dev.type, dtype=t.bfloat16, enabled=self.cuda, **kw)


class RandomTokens:
    """A map-style data set of random token rows (input_ids == labels, the
    model shifts); a plain object so that it needs no torch at import."""

    def __init__(self, n, seq, vocab, seed):
        self.n, self.seq, self.vocab, self.seed = n, seq, vocab, seed

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        import torch
        g = torch.Generator()
        g.manual_seed(self.seed * 1000003 + i)
        return torch.randint(0, self.vocab, (self.seq,), generator=g)


def loop_trainer(env, log):
    import transformers
    from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments
    s = env.shape

    class Rows(RandomTokens):
        def __getitem__(self, i):
            x = super().__getitem__(i)
            return {"input_ids": x, "labels": x}

    class Timing(TrainerCallback):
        def on_train_begin(self, args, state, control, **kw):
            log.begin(dry=env.dry, versions={"transformers": transformers.__version__, "torch": env.torch.__version__})

        def on_step_end(self, args, state, control, **kw):
            if log.step_end():
                control.should_training_stop = True

    cfg = GPT2Config(n_layer=s["layers"], n_embd=s["embd"], n_head=s["heads"], n_positions=s["seq"],
                     vocab_size=s["vocab"], use_cache=False)
    model = GPT2LMHeadModel(cfg)
    want = dict(output_dir=os.path.join(env.args.out_dir, "hf"), max_steps=10 ** 6,
                per_device_train_batch_size=s["batch"], learning_rate=1e-4, bf16=env.cuda, use_cpu=not env.cuda,
                save_strategy="no", report_to="none", disable_tqdm=True, dataloader_num_workers=0, seed=env.args.seed)
    import dataclasses
    if dataclasses.is_dataclass(TrainingArguments):  # keep to the fields this version has (say which it lacks)
        have = {f.name for f in dataclasses.fields(TrainingArguments)}
        env.dry += [f"TrainingArguments has no {k}" for k in want if k not in have]
        want = {k: v for k, v in want.items() if k in have}
    targs = TrainingArguments(**want)
    tr = Trainer(model=model, args=targs, train_dataset=Rows(10 ** 7, s["seq"], s["vocab"], env.args.seed),
                 callbacks=[Timing()])
    tr.train()


def loop_lightning(env, log):
    try:
        import lightning.pytorch as pl
    except ImportError:
        import pytorch_lightning as pl
    import torch
    from torch.utils.data import DataLoader
    s = env.shape

    class Lit(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.model = mini_gpt(s)

        def training_step(self, batch, batch_idx):
            return self.model(batch, batch.roll(-1, dims=1))

        def configure_optimizers(self):
            return torch.optim.AdamW(self.parameters(), lr=1e-4)

    class Timing(pl.Callback):
        def on_train_start(self, trainer, pl_module):
            log.begin(dry=env.dry, versions={"lightning": getattr(pl, "__version__", None) or sys.modules[
                pl.__name__.split(".")[0]].__version__, "torch": torch.__version__})

        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            if log.step_end():
                trainer.should_stop = True

    trainer = pl.Trainer(accelerator="gpu" if env.cuda else "cpu", devices=1, strategy="ddp",
                         precision="bf16-mixed" if env.cuda else "32-true", max_steps=10 ** 6, max_epochs=-1,
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, num_sanity_val_steps=0, limit_val_batches=0,
                         callbacks=[Timing()])
    data = DataLoader(RandomTokens(10 ** 7, s["seq"], s["vocab"], env.args.seed), batch_size=s["batch"])
    trainer.fit(Lit(), train_dataloaders=data)


def loop_compile(env, log):
    torch = env.torch
    from torch.nn.parallel import DistributedDataParallel as DDP
    env.init_pg()
    model = mini_gpt(env.shape).to(env.dev)
    if hasattr(torch, "compile"):
        model = torch.compile(model)
    else:
        env.dry.append("no torch.compile: eager")
    model = DDP(model, device_ids=[env.local] if env.cuda else None)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    log.begin(dry=env.dry, versions={"torch": torch.__version__})
    while True:
        x, y = env.batch()
        with env.autocast():
            loss = model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if log.step_end(loss=loss.item()):
            break


def loop_cudagraph(env, log):
    torch = env.torch
    model = mini_gpt(env.shape).to(env.dev)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4, capturable=env.cuda)
    sx, sy = env.batch()

    def step():
        with env.autocast(cache_enabled=False):
            loss = model(sx, sy)
        loss.backward()
        opt.step()
        return loss

    def new_batch():
        x, y = env.batch()
        sx.copy_(x)
        sy.copy_(y)

    log.begin(dry=env.dry, versions={"torch": torch.__version__})
    if not env.cuda:
        env.dry.append("no CUDA graphs on cpu: eager steps")
        while True:
            new_batch()
            opt.zero_grad(set_to_none=True)
            if log.step_end(loss=step().item()):
                return
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            new_batch()
            opt.zero_grad(set_to_none=True)
            if log.step_end(loss=step().item()):
                return
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    opt.zero_grad(set_to_none=True)
    t0 = time.monotonic_ns()
    with torch.cuda.graph(graph):
        static_loss = step()
    log.mark("captured", capture_ms=(time.monotonic_ns() - t0) / 1e6)
    log.prev = time.monotonic_ns()  # the capture is no iteration
    while True:
        new_batch()
        graph.replay()
        if log.step_end(loss=static_loss.item()):
            return


def loop_fsdp2(env, log):
    torch = env.torch
    env.init_pg()
    model = mini_gpt(env.shape).to(env.dev)
    import importlib
    fully_shard, why = None, None
    for name in ("torch.distributed.fsdp", "torch.distributed._composable.fsdp"):  # torch >= 2.6, 2.4-2.5
        try:
            m = importlib.import_module(name)
            fully_shard, MixedPrecisionPolicy = m.fully_shard, m.MixedPrecisionPolicy
            break
        except Exception as ex:  # absent, or (Debian's torch 1.13 on python 3.11) broken at import
            why = ex
    if fully_shard is None and env.cuda:
        raise RuntimeError(f"no fully_shard in torch {torch.__version__}: {why!r}")
    if fully_shard is not None:
        from torch.distributed.device_mesh import init_device_mesh
        mesh = init_device_mesh(env.dev.type, (env.world,))
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16 if env.cuda else torch.float32, reduce_dtype=torch.float32)
        for b in model.blocks:
            fully_shard(b, mesh=mesh, mp_policy=mp)
        fully_shard(model, mesh=mesh, mp_policy=mp)
    else:
        env.dry.append("no fully_shard: unsharded")
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    log.begin(dry=env.dry, versions={"torch": torch.__version__})
    while True:
        x, y = env.batch()
        loss = model(x, y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if log.step_end(loss=loss.item()):
            break


def loop_megatron(env, log):
    torch = env.torch
    from functools import partial

    from megatron.core import parallel_state
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.distributed.finalize_model_grads import finalize_model_grads
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.models.gpt.gpt_model import GPTModel
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.pipeline_parallel.schedules import get_forward_backward_func
    from megatron.core.tensor_parallel.random import model_parallel_cuda_manual_seed
    from megatron.core.timers import Timers
    from megatron.core.transformer.transformer_config import TransformerConfig
    s = env.shape
    # As examples/run_simple_mcore_train_loop.py initialises it, TP = PP = 1.
    torch.distributed.init_process_group(backend="nccl", rank=env.rank, world_size=env.world)
    parallel_state.initialize_model_parallel(1, 1)
    model_parallel_cuda_manual_seed(env.args.seed)
    tc = TransformerConfig(num_layers=s["layers"], hidden_size=s["embd"], num_attention_heads=s["heads"],
                           pipeline_dtype=torch.float32)
    gpt = GPTModel(config=tc, transformer_layer_spec=get_gpt_layer_local_spec(), vocab_size=s["vocab"],
                   max_sequence_length=s["seq"]).to(env.dev)
    gpt = DistributedDataParallel(config=tc, ddp_config=DistributedDataParallelConfig(
        grad_reduce_in_fp32=False, overlap_grad_reduce=False, use_distributed_optimizer=False), module=gpt)
    opt = get_megatron_optimizer(OptimizerConfig(optimizer="adam", lr=1e-4, clip_grad=1.0), [gpt])
    tc.finalize_model_grads_func = finalize_model_grads  # as megatron/training/training.py sets it
    fbf = get_forward_backward_func()
    timers = Timers(log_level=1, log_option="minmax")
    pos = torch.arange(s["seq"], device=env.dev).unsqueeze(0).expand(s["batch"], -1)

    def data():
        while True:
            x, y = env.batch()
            yield x, y

    def loss_func(loss_mask, output_tensor):
        losses = output_tensor.float().view(-1)
        loss = torch.sum(losses * loss_mask.view(-1)) / loss_mask.sum()
        return loss, {"lm loss": loss}

    def forward_step(it, model):
        x, y = next(it)
        return model(x, pos, None, labels=y), partial(loss_func, torch.ones_like(y, dtype=torch.float32))

    it = data()
    import megatron.core
    timers("interval-time", log_level=0).start(barrier=True)
    log.begin(dry=env.dry, versions={"megatron-core": megatron.core.__version__, "torch": torch.__version__})
    while True:
        gpt.zero_grad_buffer()
        opt.zero_grad()
        timers("forward-backward", log_level=1).start()
        losses = fbf(forward_step_func=forward_step, data_iterator=it, model=gpt, num_microbatches=1,
                     seq_length=s["seq"], micro_batch_size=s["batch"], decoder_seq_length=s["seq"],
                     forward_only=False)
        timers("forward-backward").stop()
        timers("optimizer", log_level=1).start()
        opt.step()
        timers("optimizer").stop()
        elapsed = timers("interval-time").elapsed(barrier=True)  # training_log's per-iteration time
        loss = losses[0]["lm loss"] if losses else None
        if log.step_end(own_ms=elapsed * 1000.0, loss=float(loss) if loss is not None else None):
            break
    try:  # Megatron's own summary of its timers, into the training log
        timers.log(["forward-backward", "optimizer"], normalizer=max(log.n, 1))
    except Exception as ex:
        print(f"timers.log: {ex!r}", flush=True)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--loop", choices=LOOPS, required=True)
    ap.add_argument("--shape", choices=sorted(SHAPES), default="small")
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--threads", type=int, default=1, help="(cpu) torch threads")
    ap.add_argument("--warm", type=int, default=10, help="iterations before the timed part")
    ap.add_argument("--duration", type=float, default=20, help="seconds of training after --warm")
    ap.add_argument("--max-steps", type=int, default=0, help="stop after this many iterations (0: no limit)")
    ap.add_argument("--profile-steps", type=int, default=0, help="profile this many iterations after --warm, then stop")
    ap.add_argument("--trace", help="Chrome trace of the profiled iterations")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--out-dir", default=".")
    args = ap.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)
    log = StepLog(os.path.join(args.out_dir, "steps.jsonl"), args.warm, args.duration, args.profile_steps,
                  args.trace or os.path.join(args.out_dir, "trace.json"), args.max_steps)
    t0 = time.monotonic()
    env = Env(args)
    import torch
    print(f"ext_loops: {args.loop} {env.shape} on {env.dev}, torch {torch.__version__}, pid {os.getpid()}",
          flush=True)
    err = None
    try:
        globals()["loop_" + args.loop](env, log)
    except BaseException as ex:  # the final line says why; the exit code too
        err = repr(ex)
        import traceback
        traceback.print_exc()
    dt = time.monotonic() - t0
    log.close(error=err, wall_s=round(dt, 2), dry=env.dry, torch=torch.__version__)
    print(f"ext_loops: {args.loop} done, {log.n} iterations, {dt:.1f} s, error {err}", flush=True)
    try:
        import torch.distributed as dist
        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()
    except Exception:
        pass
    return 1 if err else 0


if __name__ == "__main__":
    sys.exit(main())
