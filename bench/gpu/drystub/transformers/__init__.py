"""A stand-in for transformers' GPT2Config and GPT2LMHeadModel, for the CPU
dry runs of bench/gpu (DRY=1) on a machine whose torch has no transformers.
The scripts put this folder on PYTHONPATH only when `import transformers`
fails and DRY is set; the GPU machine always uses the real package."""
import types

import torch
import torch.nn as nn
import torch.nn.functional as F

__version__ = "0-drystub"


class GPT2Config:
    def __init__(self, n_layer=12, n_embd=768, n_head=12, n_positions=1024, vocab_size=50257, **_):
        self.n_layer, self.n_embd, self.n_head = n_layer, n_embd, n_head
        self.n_positions, self.vocab_size = n_positions, vocab_size


class _Block(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(c.n_embd), nn.LayerNorm(c.n_embd)
        self.attn = nn.MultiheadAttention(c.n_embd, c.n_head, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(c.n_embd, 4 * c.n_embd), nn.GELU(), nn.Linear(4 * c.n_embd, c.n_embd))

    def forward(self, x, mask):
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class GPT2LMHeadModel(nn.Module):
    def __init__(self, c):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(c.vocab_size, c.n_embd), nn.Embedding(c.n_positions, c.n_embd)
        self.h = nn.ModuleList([_Block(c) for _ in range(c.n_layer)])
        self.ln_f = nn.LayerNorm(c.n_embd)
        self.lm_head = nn.Linear(c.n_embd, c.vocab_size, bias=False)

    def forward(self, input_ids, labels=None):
        t = input_ids.shape[1]
        mask = torch.triu(torch.full((t, t), float("-inf"), device=input_ids.device), 1)
        x = self.wte(input_ids) + self.wpe(torch.arange(t, device=input_ids.device))
        for b in self.h:
            x = b(x, mask)
        logits = self.lm_head(self.ln_f(x))
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(), labels[:, 1:].reshape(-1))
        return types.SimpleNamespace(loss=loss, logits=logits)
