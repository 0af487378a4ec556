"""Lesson 08's recipe: airbench94's training as a LightningModule, its plain-PyTorch twin, and test-time
augmentation. tests/test_fidelity.py checks it against a port of airbench94, piece by piece and step for step."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields

import lightning as L
import torch
import torch.nn.functional as F
from lightning.pytorch.plugins.precision import MixedPrecision
from torch import nn
from torchmetrics import MeanMetric

from . import config, runs
from .models import WIDTHS, AirNet, init_whitening, top1_accuracy
from .modules import ClassifierSystem
from .ondevice import DeviceBatches
from .optim import Lookahead, lookahead_decay, make_speedrun_optimizer
from .timing import DeviceTimer

#: airbench94's training length: ceil(9.9 x steps per epoch) steps (426 of batch 1024 on 45,000 images)
EPOCHS = 9.9
_NESTEROV_GAIN = 1 + 1 / (1 - 0.85)  # airbench94 divides its LR and decay by this (momentum 0.85's step gain)


def total_steps(epochs: float, steps_per_epoch: int) -> int:
    """Optimiser steps of a run of `epochs` (fractional allowed) epochs: ceil(epochs x steps per epoch), airbench's
    rule; the last epoch stops early when epochs is fractional."""
    if epochs <= 0 or steps_per_epoch < 1:
        raise ValueError(f"Need epochs > 0 and steps_per_epoch >= 1, got {epochs} and {steps_per_epoch}.")
    return math.ceil(epochs * steps_per_epoch)


@dataclass(frozen=True)
class Recipe:
    """The speedrun's settings: SpeedrunModule's hyperparameters (its defaults come from here) and the twin's."""

    widths: tuple[int, int, int] = WIDTHS  # channels of AirNet's three conv groups
    batch_size: int = 1024  # images per step; lr and weight_decay below are per batch 1024 and scale with it
    label_smoothing: float = 0.2
    lr: float = 11.5 / _NESTEROV_GAIN  # = 1.5: airbench94's 11.5 per 1024 summed-loss examples, for a mean loss
    momentum: float = 0.85
    weight_decay: float = 0.0153 / _NESTEROV_GAIN  # = 1.996e-3, the shrink per step at peak LR (lr x SGD's decay)
    bias_scale: float = 64.0  # BatchNorm biases learn this many times faster
    warmup: float = 0.23  # fraction of the steps spent warming the LR up
    lookahead_every: int = 5  # steps between lookahead updates; 0: off
    tta_level: int = 2  # 0: plain test, 1: + mirror, 2: + 1-px shifts
    whiten_bias_epochs: int = 3  # epochs the whitening bias trains before it freezes
    channels_last: bool = False
    compile: bool = False

    def __post_init__(self):
        object.__setattr__(self, "widths", tuple(self.widths))  # a list from a checkpoint or YAML
        if (not 0 <= self.label_smoothing < 1 or min(self.lookahead_every, self.whiten_bias_epochs) < 0
                or self.tta_level not in (0, 1, 2) or self.batch_size < 1):
            raise ValueError(f"Need 0 <= label_smoothing < 1, lookahead_every >= 0 (0 = off), whiten_bias_epochs >= 0, "
                             f"tta_level in (0, 1, 2) and batch_size >= 1; got {self.label_smoothing}, "
                             f"{self.lookahead_every}, {self.whiten_bias_epochs}, {self.tta_level}, {self.batch_size}.")


@torch.no_grad()
def tta_logits(model: nn.Module, x: torch.Tensor, level: int = 2) -> torch.Tensor:
    """Logits averaged over views: level 0 the image, 1 + its mirror, 2 + both shifted 1 px down-right and up-left."""
    logits = model(x)  # (B, classes)
    if level == 0:
        return logits
    logits = 0.5 * (logits + model(x.flip(3)))
    if level == 1:
        return logits
    down = F.pad(x, (1, 0, 1, 0), mode="reflect")[..., :-1, :-1]  # content moves 1 px right and down
    up = F.pad(x, (0, 1, 0, 1), mode="reflect")[..., 1:, 1:]
    shifted = model(torch.cat([down, up, down.flip(3), up.flip(3)])).view(4, len(x), -1).mean(0)
    return 0.5 * logits + 0.5 * shifted


AMP_DTYPES = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}  # autocast's dtype per Lightning precision


@torch.no_grad()
def evaluate_tta(model: nn.Module, images: torch.Tensor, labels: torch.Tensor, level: int = 2,
                 batch_size: int = 1000, bf16: bool = False, precision: str | None = None) -> float:
    """Accuracy of model on uint8 images (N, 3, H, W) with test-time augmentation; one host sync at the end.
    Autocast in `precision`'s dtype (bf16=True: bf16-mixed), as training ran."""
    if level not in (0, 1, 2):
        raise ValueError(f"TTA level must be 0 (none), 1 (mirror) or 2 (mirror + shifts), got {level}.")
    dtype = AMP_DTYPES.get(precision or ("bf16-mixed" if bf16 else "32-true"))
    was_training, acc = model.training, top1_accuracy().to(images.device)
    model.eval()
    with torch.autocast(images.device.type, dtype=dtype or torch.bfloat16, enabled=dtype is not None):
        for x, y in DeviceBatches(images, labels, batch_size):
            acc.update(tta_logits(model, x, level), y)
    model.train(was_training)
    return acc.compute().item()


class SpeedrunModule(ClassifierSystem):
    """The airbench-style recipe: label smoothing, Nesterov SGD with warm-up/decay, bias LR, lookahead, TTA.

    whiten_images: uint8 training images (N, 3, 32, 32) that set the whitening layer when a fit starts on an
    unwhitened net (for example SpeedrunDataModule's train_set.images); not a hyperparameter, so not saved."""

    def __init__(self, widths: tuple[int, int, int] = Recipe.widths, batch_size: int = Recipe.batch_size,
                 label_smoothing: float = Recipe.label_smoothing, lr: float = Recipe.lr,
                 momentum: float = Recipe.momentum, weight_decay: float = Recipe.weight_decay,
                 bias_scale: float = Recipe.bias_scale, warmup: float = Recipe.warmup,
                 lookahead_every: int = Recipe.lookahead_every, tta_level: int = Recipe.tta_level,
                 whiten_bias_epochs: int = Recipe.whiten_bias_epochs, channels_last: bool = Recipe.channels_last,
                 compile: bool = Recipe.compile, whiten_images: torch.Tensor | None = None):
        recipe = Recipe(widths, batch_size, label_smoothing, lr, momentum, weight_decay, bias_scale, warmup,
                        lookahead_every, tta_level, whiten_bias_epochs, channels_last, compile)  # validates
        super().__init__(AirNet(recipe.widths), 10, label_smoothing, channels_last, compile)
        self.save_hyperparameters(ignore=["whiten_images"])
        self.whiten_images, self.step_losses, self.lookahead = whiten_images, [], None

    @property
    def recipe(self) -> Recipe:
        """The hyperparameters as a Recipe (the twin's settings); changing hparams changes it."""
        return Recipe(**{f.name: self.hparams[f.name] for f in fields(Recipe)})

    def _logits(self, x: torch.Tensor, stage: str) -> torch.Tensor:
        return tta_logits(self, x, self.hparams.tta_level) if stage == "test" else self(x)

    def training_step(self, batch, batch_idx: int) -> torch.Tensor:
        loss = self._shared_step(batch, "train")
        self.step_losses.append(loss.detach())  # a device scalar: no sync; read after training
        return loss

    def configure_optimizers(self):
        hp, total = self.hparams, int(self.trainer.estimated_stepping_batches)
        self.net.whiten.bias.requires_grad_(True)  # a new fit trains it again, though the last one froze it
        opt, sched = make_speedrun_optimizer(self.net, total, hp.batch_size, hp.lr, hp.momentum, hp.weight_decay,
                                             hp.bias_scale, hp.warmup)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    def on_train_start(self) -> None:
        if not bool(self.net.whitened):  # one host read, before the first step
            if self.whiten_images is None:
                raise ValueError("SpeedrunModule sets its whitening layer from training images before the first "
                                 "step: pass whiten_images=<uint8 (N, 3, 32, 32) training images>, e.g. "
                                 "SpeedrunDataModule's train_set.images, or call models.init_whitening first.")
            init_whitening(self.net, self.whiten_images)
        self.lookahead = Lookahead(self.net) if self.hparams.lookahead_every else None
        self.step_losses, self.total_steps = [], int(self.trainer.estimated_stepping_batches)

    def on_train_epoch_start(self) -> None:
        train_bias = self.current_epoch < self.hparams.whiten_bias_epochs  # then frozen: a settled input shift
        self.net.whiten.bias.requires_grad_(train_bias)

    def on_train_batch_start(self, batch, batch_idx: int) -> None:
        if batch_idx == 0 and len(batch[1]) != self.hparams.batch_size:  # the LR is scaled for this batch size
            raise ValueError(f"The training batches hold {len(batch[1])} images but batch_size="
                             f"{self.hparams.batch_size} sets the learning rate: pass batch_size={len(batch[1])} "
                             f"to SpeedrunModule.")

    def on_train_batch_end(self, outputs, batch, batch_idx: int) -> None:
        step, every = self.trainer.global_step, self.hparams.lookahead_every  # global_step counts this step
        if self.lookahead is not None and step % every == 0:
            self.lookahead.update(lookahead_decay(step, self.total_steps))

    def on_train_end(self) -> None:
        if self.lookahead is not None:
            self.lookahead.update(1.0)  # the result is the slow weights


def fresh_weights(module: SpeedrunModule, seed: int) -> None:
    """Load the initial weights of an AirNet built under `seed` into the module's net, in place (compiled stays so)."""
    L.seed_everything(seed, verbose=False)
    module.net.load_state_dict(AirNet(module.hparams.widths).state_dict())  # copies into the existing tensors


def make_trainer(epochs: float, precision: str | None = None, steps_per_epoch: int | None = None,
                 **kwargs) -> L.Trainer:
    """A Trainer for timing: no validation, logger, checkpoints or progress bar; precision from choose_precision.

    Fractional epochs (airbench's 9.9, EPOCHS) need steps_per_epoch (len of the training batches): the Trainer then
    stops after total_steps(epochs, steps_per_epoch) steps, and the LR schedule spans exactly those."""
    if epochs != int(epochs) and steps_per_epoch is None:
        raise ValueError(f"epochs={epochs} is fractional: pass steps_per_epoch=len(<training batches>) so the Trainer "
                         f"can stop after ceil(epochs x steps_per_epoch) steps.")
    steps = total_steps(epochs, steps_per_epoch) if steps_per_epoch else -1
    kwargs = {"max_epochs": math.ceil(epochs), "max_steps": steps, **kwargs}
    if config.choose_precision(precision) == "16-mixed" and (kwargs.get("accelerator") == "cpu"
                                                             or not torch.cuda.is_available()):
        # the policy chose fp16 (a GPU without bf16, emulated on a CPU by the tests): Lightning would quietly swap
        # 16-mixed for bf16-mixed on a CPU, so its fp16 plugin is passed explicitly, with the GradScaler("cpu")
        fp16 = {"precision": None, "plugins": [MixedPrecision("16-mixed", "cpu")]}
        return L.Trainer(**{**runs.trainer_kwargs(None, "32-true", timing=True, **kwargs), **fp16})
    return runs.trainer(None, precision, timing=True, **kwargs)


def train_twin(net: AirNet, batches: DeviceBatches, epochs: float, recipe: Recipe = Recipe(),
               precision: str | None = None) -> dict:
    """Plain-PyTorch twin of SpeedrunModule: same optimiser, schedule, lookahead and metrics, no Lightning.

    Whitens from the batches' images (unless net is whitened already); fractional epochs stop after
    total_steps(epochs, len(batches)) steps. A net compiled by an earlier call stays compiled (not recompiled).
    Returns per-step losses (tensor), per-epoch seconds and the trained net."""
    precision = config.choose_precision(precision)  # clear error if this hardware lacks it
    if batches.batch_size != recipe.batch_size:
        raise ValueError(f"The batches hold {batches.batch_size} images but the recipe's batch_size is "
                         f"{recipe.batch_size}: pass Recipe(batch_size={batches.batch_size}, ...).")
    dtype, device, r = AMP_DTYPES.get(precision), batches.images.device, recipe
    # fp16 (a T4's choice) needs loss scaling, as Lightning's 16-mixed does: GradScaler on this device type
    scaler = torch.amp.GradScaler(device.type, enabled=precision == "16-mixed")
    net = net.to(device).train()
    net = net.to(memory_format=torch.channels_last) if r.channels_last else net
    if not bool(net.whitened):
        init_whitening(net, batches.images)
    if r.compile and getattr(net, "_compiled_call_impl", None) is None:
        net.compile()
    total = total_steps(epochs, len(batches))
    net.whiten.bias.requires_grad_(True)  # in the optimiser even if an earlier run froze it
    opt, sched = make_speedrun_optimizer(net, total, r.batch_size, r.lr, r.momentum, r.weight_decay, r.bias_scale,
                                         r.warmup)
    criterion = nn.CrossEntropyLoss(label_smoothing=r.label_smoothing)
    # nan_strategy="disable", as the module's metrics: the default NaN check is a host sync (`if nans.any()`) per update
    acc, mean_loss = top1_accuracy().to(device), MeanMetric(nan_strategy="disable").to(device)
    lookahead, timer = (Lookahead(net) if r.lookahead_every else None), DeviceTimer(device)
    losses, marks, step = [], [], 0
    for epoch in range(math.ceil(epochs)):
        batches.set_epoch(epoch)
        net.whiten.bias.requires_grad_(epoch < r.whiten_bias_epochs)
        marks.append(timer.mark())
        for x, y in batches:
            x = x.contiguous(memory_format=torch.channels_last) if r.channels_last else x
            with torch.autocast(device.type, dtype=dtype or torch.bfloat16, enabled=dtype is not None):
                logits = net(x)
                loss = criterion(logits, y)
            acc.update(logits.detach(), y)  # the module's per-step metric work, so the timings compare
            mean_loss.update(loss.detach().expand(len(y)))
            opt.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()  # disabled: loss.backward(), opt.step()
            scaler.step(opt)
            scaler.update()
            sched.step()
            step += 1
            losses.append(loss.detach())
            if lookahead is not None and step % r.lookahead_every == 0:
                lookahead.update(lookahead_decay(step, total))
            if step == total:  # a fractional last epoch ends here
                break
        acc.compute(), mean_loss.compute(), acc.reset(), mean_loss.reset()  # read once per epoch, as the module logs
        marks.append(timer.mark())
    if lookahead is not None:
        lookahead.update(1.0)
    epoch_s = [timer.seconds(a, b) for a, b in zip(marks[::2], marks[1::2])]
    return {"losses": torch.stack(losses).float().cpu(), "epoch_s": epoch_s, "net": net, "recipe": asdict(r),
            "precision": precision, "loss_scale": scaler.get_scale() if scaler.is_enabled() else None}


__all__ = ["EPOCHS", "total_steps", "Recipe", "tta_logits", "evaluate_tta", "SpeedrunModule", "fresh_weights",
           "make_trainer", "train_twin"]
