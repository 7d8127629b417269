#!/usr/bin/env python3
"""CPU check of train.py's hand-written tensor parallelism (no GPU needed).

Two gloo ranks run TPGPT with TP=2 in float64; rank 0 gathers the shards,
assembles the unsharded model (TP=1) and compares logits and the gradients
of replicated parameters. Exit status 0 when they agree to 1e-9.

  python3 bench/gpu/tp_check.py [PORT]
"""
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import train  # noqa: E402

D, HEADS, LAYERS, VOCAB, SEQ = 32, 4, 2, 50, 16


def check(rank, port):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    group = dist.new_group([0, 1])
    torch.manual_seed(0)
    tp_model = train.TPGPT(VOCAB, D, LAYERS, HEADS, SEQ, 2, group).double()
    g = torch.Generator()
    g.manual_seed(10 + rank)
    with torch.no_grad():
        for p in tp_model.parameters():
            if getattr(p, "tp_shard", False):
                p.normal_(0, 0.1, generator=g)
    idx = torch.randint(0, VOCAB, (3, SEQ), generator=torch.Generator().manual_seed(5))
    out = tp_model(idx)
    out.pow(2).sum().backward()
    shards = {}
    for n, p in tp_model.named_parameters():
        if getattr(p, "tp_shard", False):
            parts = [torch.zeros_like(p) for _ in range(2)]
            dist.all_gather(parts, p.detach().contiguous())
            shards[n] = parts
    if rank == 0:
        full = train.TPGPT(VOCAB, D, LAYERS, HEADS, SEQ, 1, None).double()
        fp = dict(full.named_parameters())
        per = (HEADS // 2) * (D // HEADS)
        with torch.no_grad():
            for n, p in tp_model.named_parameters():
                if not getattr(p, "tp_shard", False):
                    fp[n].copy_(p)
            for n, parts in shards.items():
                if n.endswith(("qkv.weight", "qkv.bias")):  # rows are [q|k|v] x local heads
                    fp[n].copy_(torch.cat([x.view(3, per, *x.shape[1:]) for x in parts], 1).reshape(fp[n].shape))
                elif n.endswith(("proj.weight", "fc2.weight")):  # row-parallel: input columns sharded
                    fp[n].copy_(torch.cat(parts, 1))
                else:  # column-parallel fc1: output rows sharded
                    fp[n].copy_(torch.cat(parts, 0))
        ref = full(idx)
        ref.pow(2).sum().backward()
        errs = {"logits": (ref - out).abs().max().item()}
        tp_params = dict(tp_model.named_parameters())
        for n, p in fp.items():
            if not getattr(tp_params[n], "tp_shard", False):
                errs["grad " + n] = (p.grad - tp_params[n].grad).abs().max().item()
        worst = max(errs, key=errs.get)
        print(f"TP=2 vs unsharded, float64: logits max |diff| {errs['logits']:.3g}; "
              f"{len(errs) - 1} replicated gradients, worst {worst} {errs[worst]:.3g}")
        bad = max(errs.values()) >= 1e-9
    else:
        bad = False
    dist.destroy_process_group()
    if bad:
        sys.exit(1)


if __name__ == "__main__":
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 29655
    try:
        mp.spawn(check, args=(port,), nprocs=2)
    except mp.ProcessExitedException as e:
        print("MISMATCH or failure:", e)
        sys.exit(1)
    print("ok")
