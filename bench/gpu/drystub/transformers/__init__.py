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


# The Trainer's surface that bench/gpu/ext_loops.py uses (callbacks with
# on_train_begin/on_step_end, control.should_training_stop, max_steps).
class TrainingArguments:
    def __init__(self, output_dir=None, max_steps=-1, per_device_train_batch_size=8, learning_rate=5e-5, **_):
        self.output_dir, self.max_steps = output_dir, max_steps
        self.per_device_train_batch_size, self.learning_rate = per_device_train_batch_size, learning_rate


class TrainerCallback:
    pass


class Trainer:
    def __init__(self, model=None, args=None, train_dataset=None, callbacks=None, **_):
        self.model, self.args, self.train_dataset = model, args, train_dataset
        self.callbacks = list(callbacks or [])

    def _call(self, event, state, control):
        for cb in self.callbacks:
            fn = getattr(cb, event, None)
            if fn is not None:
                fn(self.args, state, control, model=self.model)

    def train(self):
        from torch.utils.data import DataLoader
        state = types.SimpleNamespace(global_step=0)
        control = types.SimpleNamespace(should_training_stop=False)
        opt = torch.optim.AdamW(self.model.parameters(), lr=self.args.learning_rate)
        self.model.train()
        self._call("on_train_begin", state, control)
        for batch in DataLoader(self.train_dataset, batch_size=self.args.per_device_train_batch_size):
            loss = self.model(**batch).loss
            loss.backward()
            if torch.isnan(loss):  # the Trainer's logging_nan_inf_filter: a sync every step
                pass
            opt.step()
            opt.zero_grad(set_to_none=True)
            state.global_step += 1
            self._call("on_step_end", state, control)
            if control.should_training_stop or state.global_step >= self.args.max_steps > 0:
                break
        return types.SimpleNamespace(global_step=state.global_step)
