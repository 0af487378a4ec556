"""ImageClassifierModule: the training system around any backbone; the optimisers and schedules of lessons 02-08."""
from __future__ import annotations

import warnings

import lightning as L
import torch
from torch import nn
from torchmetrics import MeanMetric
from torchmetrics.classification import MulticlassAccuracy

from .models import build_model

# our batches are plain (images, labels) tuples, so the module's transfer_batch_to_device is the one meant
warnings.filterwarnings("ignore", message=".*overridden `transfer_batch_to_device`.*")
# Lightning 2.6 calls a torch pytree API that torch 2.14 deprecates; nothing a learner can change, so not shown
warnings.filterwarnings("ignore", message=r".*isinstance\(treespec, LeafSpec\)` is deprecated.*")


class ImageClassifierModule(L.LightningModule):
    """Cross-entropy classification with torchmetrics accuracy and a one-cycle schedule, for any backbone."""

    def __init__(self, backbone: str | nn.Module = "lenet", num_classes: int = 10, optimizer: str = "sgd",
                 lr: float = 0.05, momentum: float = 0.9, nesterov: bool = True, weight_decay: float = 5e-4,
                 label_smoothing: float = 0.0, schedule: str = "onecycle", warmup_fraction: float = 0.25,
                 channels_last: bool = False, compile: bool = False):
        super().__init__()
        # an nn.Module backbone is not a hyperparameter: reloading a checkpoint then needs it passed again
        self.save_hyperparameters(ignore=["backbone"] if isinstance(backbone, nn.Module) else None)
        if optimizer not in ("sgd", "adamw") or schedule not in ("onecycle", "constant"):
            raise ValueError(f"optimizer must be 'sgd' or 'adamw' and schedule 'onecycle' or 'constant', "
                             f"got {optimizer!r} and {schedule!r}.")
        self.model = backbone if isinstance(backbone, nn.Module) else build_model(backbone, num_classes=num_classes)
        if channels_last:  # (B, H, W, C) in memory: what tensor-core convolutions read fastest
            self.model = self.model.to(memory_format=torch.channels_last)
        if compile:  # in place, so checkpoint keys stay those of the eager model
            self.model.compile()
        self.criterion = nn.CrossEntropyLoss(label_smoothing=label_smoothing)
        # one metric pair per stage, so running states never mix; both accumulate on the device without syncing
        for stage in ("train", "val", "test"):
            setattr(self, f"{stage}_acc", MulticlassAccuracy(num_classes, average="micro", validate_args=False))
            setattr(self, f"{stage}_loss", MeanMetric(nan_strategy="disable"))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, 3, H, W) -> (B, classes)
        if self.hparams.channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        return self.model(x)

    def transfer_batch_to_device(self, batch, device: torch.device, dataloader_idx: int):
        x, y = batch  # our batches are always (images, labels): skip Lightning's generic collection walk
        return x.to(device, non_blocking=True), y.to(device, non_blocking=True)

    def _shared_step(self, batch, stage: str) -> torch.Tensor:
        """Loss for one batch; loss and accuracy accumulate on the device and are logged once per epoch."""
        x, y = batch
        logits = self(x)
        loss = self.criterion(logits, y)
        getattr(self, f"{stage}_acc").update(logits.detach(), y)
        # one value per sample gives the per-sample mean even when the last batch is smaller (weight= is dropped
        # by MeanMetric(nan_strategy="disable") in torchmetrics 1.9, issue #3434)
        getattr(self, f"{stage}_loss").update(loss.detach().expand(len(y)))
        return loss

    def _log_epoch(self, stage: str) -> None:
        """Log the epoch's mean loss and accuracy (one host sync per epoch; synced across processes under DDP)."""
        acc, loss = getattr(self, f"{stage}_acc"), getattr(self, f"{stage}_loss")
        self.log_dict({f"{stage}_loss": loss.compute(), f"{stage}_acc": acc.compute()}, prog_bar=True)
        acc.reset()
        loss.reset()

    def training_step(self, batch, batch_idx: int) -> torch.Tensor:
        return self._shared_step(batch, "train")

    def validation_step(self, batch, batch_idx: int) -> None:
        self._shared_step(batch, "val")

    def test_step(self, batch, batch_idx: int) -> None:
        self._shared_step(batch, "test")

    def predict_step(self, batch, batch_idx: int) -> torch.Tensor:
        return self(batch[0]).softmax(dim=-1)  # (B, classes) class probabilities

    def on_train_epoch_end(self) -> None:
        self._log_epoch("train")

    def on_validation_epoch_end(self) -> None:
        self._log_epoch("val")

    def on_test_epoch_end(self) -> None:
        self._log_epoch("test")

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        self._resumed_steps = [s.get("total_steps") for s in checkpoint.get("lr_schedulers", [])]

    def configure_optimizers(self):
        hp = self.hparams
        total = int(self.trainer.estimated_stepping_batches)
        if getattr(self, "_resumed_steps", None) and self._resumed_steps[0] not in (None, total):
            raise ValueError(f"The checkpoint's one-cycle schedule spans {self._resumed_steps[0]} steps but this run "
                             f"needs {total}. Resume with the same max_epochs, batch size and data as the interrupted "
                             f"run; to train longer, start a new run from its weights (load_from_checkpoint) or use "
                             f"schedule='constant'.")
        opt, sched = make_optimizer(self.parameters(), total, hp.optimizer,
                                    hp.lr, hp.momentum, hp.nesterov, hp.weight_decay, hp.schedule, hp.warmup_fraction)
        if sched is None:
            return opt
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}


def make_optimizer(params, total_steps: int, optimizer: str = "sgd", lr: float = 0.05, momentum: float = 0.9,
                   nesterov: bool = True, weight_decay: float = 5e-4, schedule: str = "onecycle",
                   warmup_fraction: float = 0.25):
    """The optimiser and per-step LR schedule shared by the Lightning module and the plain loop."""
    if optimizer == "sgd":
        opt = torch.optim.SGD(params, lr=lr, momentum=momentum, nesterov=nesterov, weight_decay=weight_decay)
    else:
        opt = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    if schedule == "constant":
        return opt, None
    if total_steps < 4:  # fast_dev_run and other smoke checks: OneCycleLR cannot split fewer steps into phases
        warnings.warn(f"One-cycle schedule skipped: the run has only {total_steps} optimizer steps (needs 4+); "
                      f"the learning rate stays at {lr}.")
        return opt, None
    # OneCycleLR divides by (warm-up steps - 1): very short runs (smoke tests) get at least 2 warm-up steps
    pct_start = min(0.5, max(warmup_fraction, 2 / max(total_steps, 1)))
    return opt, torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, pct_start=pct_start, total_steps=total_steps)


def lr_factor(step: int, total: int, warmup: float = 0.23, start: float = 0.2, end: float = 0.07) -> float:
    """Schedule multiplier: linear from `start` to 1 over the first `warmup` of the steps, then linear to `end`."""
    peak = max(1, round(warmup * total))
    if step < peak:
        return start + (1 - start) * step / peak
    return 1 + (end - 1) * min(1.0, (step - peak) / max(1, total - peak))


def make_speedrun_optimizer(net: nn.Module, total_steps: int, batch_size: int, lr: float, momentum: float,
                            weight_decay: float, bias_scale: float, warmup: float):
    """Nesterov SGD with BatchNorm biases at bias_scale x the LR, and its per-step warm-up/decay schedule.

    lr and weight_decay are given for batch 1024 and scale linearly with the batch (a fixed rate per image);
    weight_decay is lr x SGD's decay, the shrink it adds per step at peak LR, kept equal in both groups."""
    norm = {id(p) for m in net.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm) for p in m.parameters()}
    params = [p for p in net.parameters() if p.requires_grad]
    biases, weights = [p for p in params if id(p) in norm], [p for p in params if id(p) not in norm]
    lr = lr * batch_size / 1024
    decay = weight_decay * batch_size / 1024
    groups = [{"params": weights, "lr": lr, "weight_decay": decay / lr},  # SGD multiplies wd by the group's lr
              {"params": biases, "lr": lr * bias_scale, "weight_decay": decay / (lr * bias_scale)}]
    opt = torch.optim.SGD(groups, lr=lr, momentum=momentum, nesterov=True)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: lr_factor(step, total_steps, warmup))
    return opt, sched


def lookahead_decay(step: int, total: int, base: float = 0.95**5) -> float:
    """How much of the slow weights a lookahead update keeps: 0 early (no averaging), rising as the cube of progress."""
    return base * (step / total) ** 3


class Lookahead:
    """Slow copy of all float weights and BN statistics: update pulls it towards the net, then resets the net to it."""

    def __init__(self, net: nn.Module):
        self.fast = [t for t in net.state_dict().values() if t.is_floating_point()]  # share storage with the net
        self.slow = [t.detach().clone() for t in self.fast]

    @torch.no_grad()
    def update(self, decay: float) -> None:
        torch._foreach_lerp_(self.slow, self.fast, 1 - decay)  # slow += (1 - decay) (fast - slow)
        torch._foreach_copy_(self.fast, self.slow)  # decay=1 just copies the slow weights into the net
