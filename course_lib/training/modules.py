"""The course's LightningModules: what every classifier system shares, and ImageClassifierModule for any backbone."""
from __future__ import annotations

import warnings

import lightning as L
import torch
from torch import nn
from torchmetrics import MetricCollection

from ..base.errors import CourseError
from .metrics import epoch_metrics
from .models import MODELS, build_model
from .optim import LENET, make_optimizer

STAGES = ("train", "val", "test")


class ClassifierSystem(L.LightningModule):
    """A net trained with cross-entropy; loss and accuracy accumulate on the device as torchmetrics objects, which
    self.log hands to the Trainer: it computes them once per epoch (synced across processes under DDP) and resets them.

    Under Trainer(barebones=True), which forbids self.log, the epoch-end hooks compute and reset them by hand into
    self.epoch_metrics instead (empty under any other Trainer: read trainer.callback_metrics there).
    Subclasses call save_hyperparameters() and add configure_optimizers; this class owns the rest of the loop."""

    def __init__(self, net: nn.Module, num_classes: int = 10, label_smoothing: float = 0.0,
                 channels_last: bool = False, compile: bool = False):
        super().__init__()
        if channels_last:  # (B, H, W, C) in memory: what tensor-core convolutions read fastest
            net = net.to(memory_format=torch.channels_last)
        if compile:  # in place, so checkpoint keys stay those of the eager net
            net.compile()
        self.net, self._channels_last = net, channels_last
        self.epoch_metrics: dict[str, torch.Tensor] = {}  # barebones only: the last epoch's loss and accuracy
        self.criterion = nn.CrossEntropyLoss(label_smoothing=label_smoothing)
        # one collection per stage, so running states never mix; logged as train_acc, train_loss, val_acc, ...
        metrics = epoch_metrics(num_classes)
        self.train_metrics, self.val_metrics, self.test_metrics = (metrics.clone(prefix=f"{s}_") for s in STAGES)

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
        metrics = self.stage_metrics(stage)
        metrics["acc"].update(logits.detach(), y)  # each member its own inputs: no MetricCollection.update
        # one value per sample gives the per-sample mean even when the last batch is smaller (weight= is dropped
        # by MeanMetric(nan_strategy="disable") in torchmetrics 1.9, issue #3434)
        metrics["loss"].update(loss.detach().expand(len(y)))
        if self._logs():  # the Metric objects themselves: no value is read here, so no host sync
            self.log_dict(metrics, on_step=False, on_epoch=True, prog_bar=True)
        return loss

    def stage_metrics(self, stage: str) -> MetricCollection:
        """The stage's collection ("acc", "loss"; computed under the names f"{stage}_acc", f"{stage}_loss")."""
        return {"train": self.train_metrics, "val": self.val_metrics, "test": self.test_metrics}[stage]

    def _logs(self) -> bool:
        """Whether self.log may run: under a Trainer, except Trainer(barebones=True); not in a step called by hand
        outside any Trainer (lesson 02 compares one training_step with its inline module's)."""
        try:
            return not self.trainer.barebones
        except RuntimeError:  # Lightning's "not attached to a Trainer"
            return False

    def training_step(self, batch, batch_idx: int) -> torch.Tensor:
        return self._shared_step(batch, "train")

    def validation_step(self, batch, batch_idx: int) -> None:
        self._shared_step(batch, "val")

    def test_step(self, batch, batch_idx: int) -> None:
        self._shared_step(batch, "test")

    def _barebones_epoch_end(self, stage: str) -> None:
        """Under Trainer(barebones=True) only: the epoch's loss and accuracy into self.epoch_metrics (one host sync
        per epoch, when they are read), then reset, as the Trainer does for logged metrics."""
        if not self.trainer.barebones:
            return
        metrics = self.stage_metrics(stage)
        self.epoch_metrics.update(metrics.compute())  # {f"{stage}_acc": ..., f"{stage}_loss": ...}
        metrics.reset()

    def on_train_epoch_end(self) -> None:
        self._barebones_epoch_end("train")

    def on_validation_epoch_end(self) -> None:
        self._barebones_epoch_end("val")

    def on_test_epoch_end(self) -> None:
        self._barebones_epoch_end("test")


def check_classes(classes: list[str] | None, num_classes: int) -> None:
    """More class names than the head has outputs fail; fewer train, with a warning (the other outputs go unused)."""
    if not classes or len(classes) == num_classes:
        return
    message = (f"The training data have {len(classes)} classes ({', '.join(classes)}) but the model's head has "
               f"num_classes={num_classes} outputs. Pass num_classes={len(classes)} (CLI: "
               f"--model.num_classes {len(classes)}).")
    if len(classes) > num_classes:
        raise CourseError(message)
    warnings.warn(message + " Its other outputs are never a right answer; grading it on a test folder will be "
                  "refused.", stacklevel=3)


class ImageClassifierModule(ClassifierSystem):
    """Any backbone with SGD or AdamW and a one-cycle schedule: lessons 02-07's training system. All settings but the
    backbone are keyword-only, by default LeNet's recipe (optim.LENET); LightningCLI sets each from YAML or a flag
    (--model.lr 0.1). `classes`: the data's class names in label order, recorded in every checkpoint (the CLI links
    them from the DataModule; in Python pass datamodule.classes): the module never reads the DataModule."""

    def __init__(self, backbone: str | nn.Module = "lenet", *, num_classes: int = 10,
                 optimizer: str = LENET.optimizer, lr: float = LENET.lr, momentum: float = LENET.momentum,
                 nesterov: bool = LENET.nesterov, weight_decay: float = LENET.weight_decay,
                 label_smoothing: float = 0.0, schedule: str = LENET.schedule,
                 warmup_fraction: float = LENET.warmup_fraction, channels_last: bool = False, compile: bool = False,
                 classes: list[str] | None = None):
        if optimizer not in ("sgd", "adamw") or schedule not in ("onecycle", "constant"):
            raise CourseError(f"optimizer must be 'sgd' or 'adamw' and schedule 'onecycle' or 'constant', "
                              f"got {optimizer!r} and {schedule!r}.")
        if isinstance(backbone, str) and backbone not in MODELS:  # models.py imports torch alone: the check is here
            raise CourseError(f"Unknown model {backbone!r}; choose one of {sorted(MODELS)}.")
        check_classes(classes, num_classes)
        net = backbone if isinstance(backbone, nn.Module) else build_model(backbone, num_classes=num_classes)
        super().__init__(net, num_classes, label_smoothing, channels_last, compile)
        # an nn.Module backbone is not a hyperparameter: reloading a checkpoint then needs it passed again
        self.save_hyperparameters(ignore=["backbone"] if isinstance(backbone, nn.Module) else None)

    def configure_optimizers(self):
        hp = self.hparams
        opt, sched = make_optimizer(self.parameters(), int(self.trainer.estimated_stepping_batches),
                                    optimizer=hp.optimizer, lr=hp.lr, momentum=hp.momentum, nesterov=hp.nesterov,
                                    weight_decay=hp.weight_decay, schedule=hp.schedule,
                                    warmup_fraction=hp.warmup_fraction)
        if sched is None:
            return opt
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    def on_train_start(self) -> None:
        """A resumed fit's one-cycle schedule must span this run's steps. The Trainer restores the checkpoint's
        schedule after configure_optimizers and before this hook, so the live scheduler is compared with the run, not
        a value some other hook left behind (load_from_checkpoint then a new, longer fit is fine)."""
        if self.trainer.ckpt_path is None:  # a fresh fit: its schedule was built for it (a Tuner trial shortens it)
            return
        total = int(self.trainer.estimated_stepping_batches)
        for scheduler in self.trainer.lr_scheduler_configs:
            spans = getattr(scheduler.scheduler, "total_steps", total)  # OneCycleLR's length, restored with its state
            if spans != total:
                raise CourseError(f"The checkpoint's one-cycle schedule spans {spans} steps but this run needs "
                                  f"{total}. Resume with the same max_epochs, batch size and data as the interrupted "
                                  f"run; to train longer, start a new run from its weights (load_from_checkpoint) or "
                                  f"use schedule='constant'.")

    def predict_step(self, batch, batch_idx: int) -> torch.Tensor:
        return self(batch[0]).softmax(dim=-1)  # (B, classes) class probabilities
