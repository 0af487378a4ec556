"""Lesson 08's recipe: airbench94's training as a LightningModule (its plain-PyTorch twin: twin.py; test-time
augmentation: tta.py). tests/test_fidelity.py checks it against a port of airbench94, step for step."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import lightning as L
import torch
from torch import nn

from ..data import data
from . import runs
from .models import WHITEN_IMAGES, WIDTHS, AirNet, init_whitening
from .modules import ClassifierSystem
from .muon import NS_COEFFICIENTS
from .optim import Lookahead, lookahead_decay, make_muon_speedrun_optimizer, make_speedrun_optimizer
from .tta import evaluate_tta, selective_tta_logits, tta_logits  # noqa: F401  (speedrun.evaluate_tta: re-exported)

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
    """The speedrun's settings, their one home: SpeedrunModule's one hyperparameter and the twin's."""

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
    whiten_bias_epochs: float = 3  # epochs the whitening bias trains before it freezes (its LR reaches 0)
    channels_last: bool = False
    compile: bool = False
    epochs: float = EPOCHS  # the recipe's training length (callers pass it to run_seed, make_trainer, Twin.fit)
    optimizer: str = "sgd"  # "muon": conv filters by muon.Muon (filter_lr, filter_momentum), the rest by SGD
    schedule: str = "triangle"  # "linear": 1 down to 0 from the first step, no warm-up (airbench94_muon)
    filter_lr: float = 0.0  # Muon's step size; not scaled with the batch
    filter_momentum: float = 0.0
    head: str = "fixed"  # "fixed": logits x 1/9 (airbench94); "width": head weights of std 1, logits / widths[-1]
    #: the whitening bias's start: "zero" (airbench94) or "uniform" (airbench94_muon's nn.Conv2d draw, U(+-1/sqrt(12)))
    whiten_bias: str = "zero"
    whiten_order: str = "largest"  # the whitening filters' eigenvalue order; "smallest": airbench94_muon's
    # hiverge's record (RECORD); these defaults are airbench94's and airbench94_muon's
    activation: str = "gelu"  # the conv groups' ("silu")
    bn_momentum: float = 0.4  # PyTorch's BatchNorm momentum: airbench's 0.6 is 1 - 0.4
    jitter: tuple[float, float] = (0.0, 0.0)  # per training image: brightness + U(+-b), then contrast x U(1 +- c)
    whiten_images: int = WHITEN_IMAGES  # training images the whitening reads
    tta_select: float = 1.0  # < 1: tta.selective_tta_logits on that fraction of each test batch
    ns_coefficients: tuple[float, float, float] = NS_COEFFICIENTS  # muon: the Newton-Schulz quintic
    muon_batched: bool = False  # muon: every filter bank's iteration in one padded batched matmul
    normalize_every: tuple[int, float] = (1, 0.0)  # muon.normalize_due's (base, growth); (1, 0): every step
    filter_decay: float = 0.0  # muon: the filters' decoupled decay at peak LR, per batch 1024

    def __post_init__(self):
        for name in ("widths", "jitter", "ns_coefficients", "normalize_every"):  # lists from a checkpoint or YAML
            object.__setattr__(self, name, tuple(getattr(self, name)))
        kinds = {("sgd", "triangle", "fixed"), ("muon", "linear", "width")}
        if (self.optimizer, self.schedule, self.head) not in kinds:
            raise ValueError(f"optimizer, schedule, head: airbench94's sgd, triangle, fixed or airbench94_muon's muon, "
                             f"linear, width (MUON); got {self.optimizer}, {self.schedule}, {self.head}.")
        ok = dict(whiten_bias=("zero", "uniform"), activation=("gelu", "silu"), whiten_order=("largest", "smallest"))
        if bad := {k: getattr(self, k) for k, v in ok.items() if getattr(self, k) not in v}:
            raise ValueError(f"Recipe choices (airbench94's first; airbench94_muon's, hiverge's): {ok}; got {bad}.")
        if (not 0 <= self.label_smoothing < 1 or min(self.lookahead_every, self.whiten_bias_epochs) < 0
                or self.tta_level not in (0, 1, 2) or self.batch_size < 1):
            raise ValueError(f"Need 0 <= label_smoothing < 1, lookahead_every >= 0 (0 = off), whiten_bias_epochs >= 0, "
                             f"tta_level in (0, 1, 2) and batch_size >= 1; got {self.label_smoothing}, "
                             f"{self.lookahead_every}, {self.whiten_bias_epochs}, {self.tta_level}, {self.batch_size}.")


# checkpoints hold the Recipe: let load_from_checkpoint's torch.load(weights_only=True) rebuild this class (only this)
torch.serialization.add_safe_globals([Recipe])

#: airbench94_muon (github.com/KellerJordan/cifar10-airbench, airbench94_muon.py at f1c599c, MIT), written once: its
#: summed-loss LRs x 1024 are mean-loss LRs per batch of 1024 (the same update): head 0.67, biases 0.053, decay 2e-6
MUON = Recipe(batch_size=2000, epochs=8, optimizer="muon", schedule="linear", head="width", lr=0.67 * 1024,
              bias_scale=0.053 / 0.67, momentum=0.85, weight_decay=2e-6 * 1024, filter_lr=0.24, filter_momentum=0.6,
              warmup=0.0, lookahead_every=0, label_smoothing=0.2, whiten_bias_epochs=3, tta_level=2,
              whiten_bias="uniform", whiten_order="smallest")
#: hiverge's record (github.com/hiverge/cifar10-speedrun, cifar10_speedrun.py at 5cd49b1, MIT), in MUON's units
RECORD = Recipe(**{**asdict(MUON), **dict(
    batch_size=1536, epochs=7.59, lr=0.5415 * 1024, bias_scale=0.0573 / 0.5415, momentum=0.825, label_smoothing=0.09,
    weight_decay=1.0418e-6 * 1024, filter_lr=0.205, filter_momentum=0.655, whiten_bias_epochs=0.19, activation="silu",
    bn_momentum=1 - 0.5566, jitter=(0.1399, 0.1308), whiten_images=960, whiten_order="largest", tta_select=0.25,
    muon_batched=True, ns_coefficients=(3.4576, -4.7391, 2.0843), normalize_every=(2, 15.0),
    filter_decay=1.0418e-6 * 1024)})


def recipe_net(recipe: Recipe) -> AirNet:
    """A fresh AirNet for the recipe: airbench94's head scale 1/9 or airbench94_muon's unit-std head over width; the
    whitening bias zero or airbench94_muon's draw (whiten_bias), taken last: a seed's other weights stay the same."""
    kw = dict(bn_momentum=recipe.bn_momentum, activation=recipe.activation)
    if recipe.head == "fixed":
        net = AirNet(recipe.widths, **kw)
    else:
        net = AirNet(recipe.widths, scale=1 / recipe.widths[-1], **kw)
        net.head.weight.data /= net.head.weight.data.std()  # unit-std head weights, as airbench94_muon's reset()
    if recipe.whiten_bias == "uniform":  # nn.Conv2d.reset_parameters' bias: U(+-1/sqrt(fan_in)), fan_in 3 x 2 x 2
        bound = 1 / math.sqrt(net.whiten.weight[0].numel())
        nn.init.uniform_(net.whiten.bias.data, -bound, bound)
    return net


@torch.no_grad()
def whiten_from(net: AirNet, images: torch.Tensor, recipe: Recipe = Recipe()) -> None:
    """Set net's whitening filters from the first recipe.whiten_images uint8 training images (N, 3, 32, 32), in its
    whiten_order; the bias zero (airbench94), or kept (whiten_bias 'uniform': airbench94_muon sets the filters only)."""
    bias, x = net.whiten.bias.detach().clone(), data.to_float(images[:recipe.whiten_images])  # (n, 3, 32, 32), normed
    init_whitening(net, x, len(x), largest_first=recipe.whiten_order == "largest")
    if recipe.whiten_bias == "uniform":
        net.whiten.bias.copy_(bias)


def recipe_optimizer(net: nn.Module, recipe: Recipe, total_steps: int, steps_per_epoch: int | None = None):
    """The module's and the twin's one optimiser and schedule, make_speedrun_optimizer's or the Muon recipe's."""
    if recipe.optimizer == "muon":
        if steps_per_epoch is None:
            raise ValueError("The Muon recipe's whitening bias decays over whiten_bias_epochs: pass steps_per_epoch.")
        return make_muon_speedrun_optimizer(
            net, total_steps=total_steps, whiten_bias_steps=math.ceil(recipe.whiten_bias_epochs * steps_per_epoch),
            batch_size=recipe.batch_size, lr=recipe.lr, momentum=recipe.momentum, weight_decay=recipe.weight_decay,
            bias_scale=recipe.bias_scale, filter_lr=recipe.filter_lr, filter_momentum=recipe.filter_momentum,
            coefficients=recipe.ns_coefficients, batched=recipe.muon_batched, normalize_every=recipe.normalize_every,
            filter_decay=recipe.filter_decay * recipe.batch_size / 1024)
    return make_speedrun_optimizer(net, total_steps=total_steps, batch_size=recipe.batch_size, lr=recipe.lr,
                                   momentum=recipe.momentum, weight_decay=recipe.weight_decay,
                                   bias_scale=recipe.bias_scale, warmup=recipe.warmup)


class SpeedrunModule(ClassifierSystem):
    """The airbench-style recipe: label smoothing, Nesterov SGD with warm-up/decay, bias LR, lookahead, TTA.

    recipe: every setting, kept as .recipe and recorded by save_hyperparameters, so checkpoints reload it and
    LightningCLI sets its fields (--model.recipe.lr 0.5). Those that build the net are read once; the others when
    used (module.recipe = dataclasses.replace(module.recipe, tta_level=2) changes the next test). An unwhitened net
    is whitened when a fit starts, from the training batches' images (DeviceBatches.images)."""

    def __init__(self, recipe: Recipe = Recipe()):
        super().__init__(recipe_net(recipe), num_classes=10, label_smoothing=recipe.label_smoothing,
                         channels_last=recipe.channels_last, compile=recipe.compile)
        self.save_hyperparameters()  # Lightning's record for checkpoints (under LightningCLI, the parsed config)
        self.recipe, self.step_losses, self.lookahead = recipe, [], None

    def _logits(self, x: torch.Tensor, stage: str) -> torch.Tensor:
        r = self.recipe  # selective TTA (hiverge) where tta_select < 1
        return self(x) if stage != "test" else (selective_tta_logits(self, x, r.tta_select) if r.tta_select < 1
                                                 else tta_logits(self, x, r.tta_level))

    def training_step(self, batch, batch_idx: int) -> torch.Tensor:
        loss = self._shared_step(jittered(batch, self.recipe), "train")
        self.step_losses.append(loss.detach())  # a device scalar: no sync; read after training
        return loss

    def configure_optimizers(self):
        self.net.whiten.bias.requires_grad_(True)  # a new fit trains it again, though the last one froze it
        total = int(self.trainer.estimated_stepping_batches)  # also loads the data: num_training_batches is set
        opt, sched = recipe_optimizer(self.net, self.recipe, total, int(self.trainer.num_training_batches))
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    def on_train_start(self) -> None:
        if not bool(self.net.whitened):  # one host read, before the first step
            images = getattr(self.trainer.train_dataloader, "images", None)  # the data's, not a hyperparameter
            if images is None:
                raise ValueError("SpeedrunModule whitens from the training images before the first step, and these "
                                 "batches have no .images: train on DeviceBatches (the speedrun batching's, "
                                 "ondevice.Speedrun), or call speedrun.whiten_from(module.net, <uint8 (N, 3, 32, 32) "
                                 "images>) first.")
            whiten_from(self.net, images, self.recipe)
        self.lookahead = Lookahead(self.net) if self.recipe.lookahead_every else None
        self.step_losses, self.total_steps = [], int(self.trainer.estimated_stepping_batches)

    def on_train_epoch_start(self) -> None:
        train_bias = self.current_epoch < self.recipe.whiten_bias_epochs  # then frozen: a settled input shift
        self.net.whiten.bias.requires_grad_(train_bias)

    def on_train_batch_start(self, batch, batch_idx: int) -> None:
        expected = self.recipe.batch_size
        if batch_idx == 0 and len(batch[1]) != expected:  # the LR is scaled for this batch size
            raise ValueError(f"The training batches hold {len(batch[1])} images but the recipe's batch_size="
                             f"{expected} sets the learning rate: pass Recipe(batch_size={len(batch[1])}, ...) "
                             f"to SpeedrunModule.")

    def on_train_batch_end(self, outputs, batch, batch_idx: int) -> None:
        step, every = self.trainer.global_step, self.recipe.lookahead_every  # global_step counts this step
        if self.lookahead is not None and step % every == 0:
            self.lookahead.update(lookahead_decay(step, self.total_steps))

    def on_train_end(self) -> None:
        if self.lookahead is not None:
            self.lookahead.update(1.0)  # the result is the slow weights


def jittered(batch: tuple, recipe: Recipe) -> tuple:
    """(x, y), x (B, C, H, W) normalised, with the recipe's jitter per image (x + U(-b, b)) U(1 - c, 1 + c), if any."""
    (b, c), (x, y) = recipe.jitter, batch
    draws = torch.rand(2, len(x), 1, 1, 1, device=x.device, dtype=x.dtype) * 2 - 1 if b or c else None  # in [-1, 1)
    return batch if draws is None else ((x + b * draws[0]) * (1 + c * draws[1]), y)


def fresh_weights(module: SpeedrunModule, seed: int) -> None:
    """Load the initial weights of an AirNet built under `seed` into the module's net, in place (compiled stays so)."""
    L.seed_everything(seed, verbose=False)
    module.net.load_state_dict(recipe_net(module.recipe).state_dict())  # copies into the existing tensors


def make_trainer(epochs: float, precision: str | None = None, steps_per_epoch: int | None = None,
                 **kwargs) -> L.Trainer:
    """runs.trainer's timing Trainer (no validation, logger, checkpoints or progress bar; precision from
    choose_precision) for `epochs` of the recipe, kwargs more settings. Fractional epochs (EPOCHS) need steps_per_epoch
    (len of the training batches): the Trainer stops after total_steps(epochs, steps_per_epoch)."""
    if epochs != int(epochs) and steps_per_epoch is None:
        raise ValueError(f"epochs={epochs} is fractional: pass steps_per_epoch=len(<training batches>) so the Trainer "
                         f"can stop after ceil(epochs x steps_per_epoch) steps.")
    steps = total_steps(epochs, steps_per_epoch) if steps_per_epoch else -1
    return runs.trainer(None, precision, timing=True, **{"max_epochs": math.ceil(epochs), "max_steps": steps, **kwargs})


__all__ = ["EPOCHS", "total_steps", "Recipe", "MUON", "RECORD", "jittered", "recipe_net", "recipe_optimizer",
           "whiten_from", "tta_logits", "evaluate_tta", "SpeedrunModule", "fresh_weights", "make_trainer"]
