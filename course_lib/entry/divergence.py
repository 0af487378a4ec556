"""A fit whose training loss is no longer finite (a learning rate too high): found on the device at every step, without
a host read per step, and stopped with the remedy before a checkpoint is written from its weights."""
from __future__ import annotations

from collections.abc import Mapping

import lightning as L
import torch

from ..base.errors import DivergedError


class StopOnDivergence(L.Callback):
    """Stops a fit at the first training loss that is not finite, raising DivergedError (step, loss and remedies named).

    Each step's check stays on the device (the first non-finite step and its loss are kept there, no host sync); the
    host reads it every `every` steps (default: the Trainer's log_every_n_steps), before each validation and at each
    training epoch's end, so the run stops before the epoch's checkpoints are written. Lightning's detect_anomaly
    checks every backward op instead, at many times a step's cost."""

    def __init__(self, every: int | None = None):
        self.every = every
        self._step: torch.Tensor | None = None  # on the device: the first step whose loss was not finite, -1: none yet
        self._loss: torch.Tensor | None = None  # on the device: that step's loss

    def on_train_start(self, trainer, pl_module) -> None:
        self._step = torch.full((), -1, dtype=torch.long, device=pl_module.device)
        self._loss = torch.zeros((), device=pl_module.device)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx: int) -> None:
        loss = outputs.get("loss") if isinstance(outputs, Mapping) else outputs
        if not isinstance(loss, torch.Tensor) or self._step is None:
            return  # a step that returned no loss (manual optimisation may) has nothing to check
        loss = loss.detach().float()
        first = ~torch.isfinite(loss) & (self._step < 0)
        self._step = torch.where(first, trainer.global_step, self._step)  # global_step counts this step already
        self._loss = torch.where(first, loss, self._loss)
        if trainer.global_step % (self.every or trainer.log_every_n_steps or 1) == 0:
            self.check(trainer, pl_module)

    def on_validation_start(self, trainer, pl_module) -> None:
        self.check(trainer, pl_module)

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        self.check(trainer, pl_module)

    def check(self, trainer, pl_module) -> None:
        """One host read: raise DivergedError if a step's loss was not finite since training started."""
        if self._step is None or trainer.sanity_checking or int(self._step) < 0:
            return
        step, loss, lr = int(self._step), self._loss.item(), pl_module.hparams.get("lr")
        done = trainer.current_epoch  # epochs finished before the one that diverged: their checkpoints stand
        given = f", this run's: {lr:g}" if isinstance(lr, (int, float)) else ""
        kept = (f"The checkpoints of epoch {done} and before are kept as they were; none is written from the diverged "
                f"weights. A new learning rate needs a new run (--run_name <another name>); clipping can resume this "
                f"one (--ckpt_path last)." if done else "No checkpoint was written: the run had not finished an epoch.")
        raise DivergedError(f"Training diverged: the loss of step {step} (epoch {done + 1}) is {loss}, and every step "
                            f"after it would train on NaN, so the run stopped. Lower the learning rate (--model.lr"
                            f"{given}), e.g. 10x, or clip the gradients (--trainer.gradient_clip_val 1.0). {kept}")
