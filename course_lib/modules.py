"""The course's LightningModules: what every classifier system shares, and ImageClassifierModule for any backbone."""
from __future__ import annotations

import warnings

import lightning as L
import torch
from torch import nn
from torchmetrics import MeanMetric

from .models import build_model, top1_accuracy
from .optim import make_optimizer

STAGES = ("train", "val", "test")


class ClassifierSystem(L.LightningModule):
    """A net trained with cross-entropy; loss and accuracy accumulate on the device and are logged once per epoch.

    Subclasses call save_hyperparameters() and add configure_optimizers; this class owns the rest of the loop."""

    def __init__(self, net: nn.Module, num_classes: int = 10, label_smoothing: float = 0.0,
                 channels_last: bool = False, compile: bool = False):
        super().__init__()
        if channels_last:  # (B, H, W, C) in memory: what tensor-core convolutions read fastest
            net = net.to(memory_format=torch.channels_last)
        if compile:  # in place, so checkpoint keys stay those of the eager net
            net.compile()
        self.net, self._channels_last = net, channels_last
        self.epoch_metrics: dict[str, torch.Tensor] = {}  # the last epoch's loss and accuracy per stage
        self.criterion = nn.CrossEntropyLoss(label_smoothing=label_smoothing)
        # one metric pair per stage, so running states never mix; both accumulate on the device without syncing
        for stage in STAGES:
            setattr(self, f"{stage}_acc", top1_accuracy(num_classes))
            setattr(self, f"{stage}_loss", MeanMetric(nan_strategy="disable"))

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, 3, H, W) -> (B, classes)
        if self._channels_last:
            x = x.contiguous(memory_format=torch.channels_last)
        return self.net(x)

    def _logits(self, x: torch.Tensor, stage: str) -> torch.Tensor:
        """The logits a stage scores; SpeedrunModule tests with test-time augmentation instead."""
        return self(x)

    def _shared_step(self, batch, stage: str) -> torch.Tensor:
        """Loss for one batch; its loss and accuracy join the stage's running metrics on the device."""
        x, y = batch
        logits = self._logits(x, stage)
        loss = self.criterion(logits, y)
        getattr(self, f"{stage}_acc").update(logits.detach(), y)
        # one value per sample gives the per-sample mean even when the last batch is smaller (weight= is dropped
        # by MeanMetric(nan_strategy="disable") in torchmetrics 1.9, issue #3434)
        getattr(self, f"{stage}_loss").update(loss.detach().expand(len(y)))
        return loss

    def training_step(self, batch, batch_idx: int) -> torch.Tensor:
        return self._shared_step(batch, "train")

    def validation_step(self, batch, batch_idx: int) -> None:
        self._shared_step(batch, "val")

    def test_step(self, batch, batch_idx: int) -> None:
        self._shared_step(batch, "test")

    def _log_epoch(self, stage: str) -> None:
        """Log the epoch's mean loss and accuracy (one host sync per epoch; synced across processes under DDP);
        under Trainer(barebones=True), which forbids self.log, they are only kept in self.epoch_metrics."""
        acc, loss = getattr(self, f"{stage}_acc"), getattr(self, f"{stage}_loss")
        metrics = {f"{stage}_loss": loss.compute(), f"{stage}_acc": acc.compute()}
        self.epoch_metrics.update(metrics)
        if not self.trainer.barebones:
            self.log_dict(metrics, prog_bar=True)
        acc.reset()
        loss.reset()

    def on_train_epoch_end(self) -> None:
        self._log_epoch("train")

    def on_validation_epoch_end(self) -> None:
        self._log_epoch("val")

    def on_test_epoch_end(self) -> None:
        self._log_epoch("test")


class ImageClassifierModule(ClassifierSystem):
    """Any backbone with SGD or AdamW and a one-cycle schedule: lessons 02-07's training system."""

    def __init__(self, backbone: str | nn.Module = "lenet", num_classes: int = 10, optimizer: str = "sgd",
                 lr: float = 0.05, momentum: float = 0.9, nesterov: bool = True, weight_decay: float = 5e-4,
                 label_smoothing: float = 0.0, schedule: str = "onecycle", warmup_fraction: float = 0.25,
                 channels_last: bool = False, compile: bool = False, classes: list[str] | None = None):
        if optimizer not in ("sgd", "adamw") or schedule not in ("onecycle", "constant"):
            raise ValueError(f"optimizer must be 'sgd' or 'adamw' and schedule 'onecycle' or 'constant', "
                             f"got {optimizer!r} and {schedule!r}.")
        net = backbone if isinstance(backbone, nn.Module) else build_model(backbone, num_classes=num_classes)
        super().__init__(net, num_classes, label_smoothing, channels_last, compile)
        # an nn.Module backbone is not a hyperparameter: reloading a checkpoint then needs it passed again
        self.save_hyperparameters(ignore=["backbone"] if isinstance(backbone, nn.Module) else None)

    def setup(self, stage: str) -> None:
        """At fit, record the data's class names in the hyperparameters, so every checkpoint carries the index of each
        class. More classes than the head has outputs fail; fewer are trained, with a warning (outputs go unused)."""
        classes = getattr(self.trainer.datamodule, "classes", None)
        if stage != "fit" or not classes:
            return
        hp = self.hparams
        if len(classes) != hp.num_classes:
            message = (f"The training data have {len(classes)} classes ({', '.join(classes)}) but the model's head has "
                       f"num_classes={hp.num_classes} outputs. Pass num_classes={len(classes)} (CLI: "
                       f"--model.num_classes {len(classes)}).")
            if len(classes) > hp.num_classes:
                raise ValueError(message)
            warnings.warn(message + " Its other outputs are never a right answer; grading it on a test folder "
                          "will be refused.", stacklevel=2)
        if hp.classes is not None and list(hp.classes) != list(classes):
            raise ValueError(f"The model was trained on classes {list(hp.classes)} but these data have {classes}. "
                             f"Train it on data with the same classes, or start a new model.")
        hp.classes = list(classes)

    @property
    def model(self) -> nn.Module:
        """The backbone (the name lessons 02-07 use for it)."""
        return self.net

    def predict_step(self, batch, batch_idx: int) -> torch.Tensor:
        return self(batch[0]).softmax(dim=-1)  # (B, classes) class probabilities

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

    def on_load_checkpoint(self, checkpoint: dict) -> None:
        self._resumed_steps = [s.get("total_steps") for s in checkpoint.get("lr_schedulers", [])]
