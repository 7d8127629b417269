"""lightning.pytorch's surface that bench/gpu/ext_loops.py uses:
LightningModule (training_step, configure_optimizers), Callback
(on_train_start, on_train_batch_end), Trainer(...).fit with should_stop."""
import torch
import torch.nn as nn


class LightningModule(nn.Module):
    pass


class Callback:
    pass


class Trainer:
    def __init__(self, max_steps=-1, callbacks=None, **_):
        self.max_steps, self.callbacks = max_steps, list(callbacks or [])
        self.should_stop = False
        self.global_step = 0

    def _call(self, event, *a):
        for cb in self.callbacks:
            fn = getattr(cb, event, None)
            if fn is not None:
                fn(self, *a)

    def fit(self, module, train_dataloaders=None):
        opt = module.configure_optimizers()
        module.train()
        self._call("on_train_start", module)
        for i, batch in enumerate(train_dataloaders):
            loss = module.training_step(batch, i)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            self.global_step += 1
            self._call("on_train_batch_end", module, loss, batch, i)
            if self.should_stop or self.global_step >= self.max_steps > 0:
                break
