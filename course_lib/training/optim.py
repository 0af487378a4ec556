"""Optimisers, learning-rate schedules and lookahead: lesson 02's SGD + one-cycle and lesson 08's speedrun recipe."""
from __future__ import annotations

import warnings
from dataclasses import dataclass

import torch
from torch import nn

from .muon import Muon


@dataclass(frozen=True)
class OneCycleRecipe:
    """Lessons 01-07's optimiser settings: SGD or AdamW with a per-step one-cycle (or constant) learning rate."""

    optimizer: str = "sgd"  # or "adamw"
    lr: float = 0.05  # the one-cycle peak, found by a small sweep on LeNet at batch_size images per step
    momentum: float = 0.9
    nesterov: bool = True
    weight_decay: float = 5e-4
    schedule: str = "onecycle"  # or "constant"
    warmup_fraction: float = 0.25  # of the steps, spent rising to the peak
    batch_size: int = 64  # the batch lr was tuned at; lessons that change the batch scale lr linearly with it


#: LeNet's recipe (lesson 02), the one home of its numbers: make_optimizer's and ImageClassifierModule's defaults,
#: configs/lenet.yaml (tests/test_modules.py checks it) and the lessons' PEAK_LR read it
LENET = OneCycleRecipe()


def make_optimizer(params, total_steps: int, *, optimizer: str = LENET.optimizer, lr: float = LENET.lr,
                   momentum: float = LENET.momentum, nesterov: bool = LENET.nesterov,
                   weight_decay: float = LENET.weight_decay, schedule: str = LENET.schedule,
                   warmup_fraction: float = LENET.warmup_fraction):
    """The optimiser and per-step LR schedule shared by the Lightning module and the plain loop."""
    if optimizer == "sgd":
        opt = torch.optim.SGD(params, lr=lr, momentum=momentum, nesterov=nesterov, weight_decay=weight_decay)
    else:
        opt = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay)
    if schedule == "constant":
        return opt, None
    if total_steps < 4:  # fast_dev_run and other smoke checks: OneCycleLR cannot split fewer steps into phases
        warnings.warn(f"One-cycle schedule skipped: the run has only {total_steps} optimizer steps (needs 4+); "
                      f"the learning rate stays at {lr}.", stacklevel=2)
        return opt, None
    # OneCycleLR divides by (warm-up steps - 1): very short runs (smoke tests) get at least 2 warm-up steps
    pct_start = min(0.5, max(warmup_fraction, 2 / max(total_steps, 1)))
    return opt, torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, pct_start=pct_start, total_steps=total_steps)


def lr_factor(step: int, total: int, warmup: float = 0.23, start: float = 0.2, end: float = 0.07) -> float:
    """Schedule multiplier: linear from `start` to 1 over the first `warmup` of the steps, then linear to `end`.

    The peak is at step int(warmup x total), airbench94's triangle (426 steps: 97, not round()'s 98)."""
    peak = max(1, int(warmup * total))
    if step < peak:
        return start + (1 - start) * step / peak
    return 1 + (end - 1) * min(1.0, (step - peak) / max(1, total - peak))


def make_speedrun_optimizer(net: nn.Module, *, total_steps: int, batch_size: int, lr: float, momentum: float,
                            weight_decay: float, bias_scale: float, warmup: float):
    """Nesterov SGD with BatchNorm biases at bias_scale x the LR, and its per-step warm-up/decay schedule.

    lr and weight_decay are given for batch 1024 and scale linearly with the batch (a fixed rate per image);
    weight_decay is lr x SGD's decay, the shrink it adds per step at peak LR, kept equal in both groups."""
    batchnorms = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm)
    norm = {id(p) for m in net.modules() if isinstance(m, batchnorms) for p in m.parameters()}
    params = [p for p in net.parameters() if p.requires_grad]
    biases, weights = [p for p in params if id(p) in norm], [p for p in params if id(p) not in norm]
    lr = lr * batch_size / 1024
    decay = weight_decay * batch_size / 1024
    groups = [{"params": weights, "lr": lr, "weight_decay": decay / lr},  # SGD multiplies wd by the group's lr
              {"params": biases, "lr": lr * bias_scale, "weight_decay": decay / (lr * bias_scale)}]
    opt = torch.optim.SGD(groups, lr=lr, momentum=momentum, nesterov=True)
    # not SequentialLR of two LinearLRs: the same triangle, but LinearLR updates the LR multiplicatively step by step,
    # which drifts from lr_factor's closed form by up to ~3e-15 (relative) over 426 steps, and the fidelity tests follow
    # airbench94 step for step
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: lr_factor(step, total_steps, warmup))
    return opt, sched


def make_muon_speedrun_optimizer(net: nn.Module, *, total_steps: int, whiten_bias_steps: int, batch_size: int,
                                 lr: float, momentum: float, weight_decay: float, bias_scale: float,
                                 filter_lr: float, filter_momentum: float, dtype: torch.dtype | None = None,
                                 **filter_options):
    """airbench94_muon's groups in one muon.Muon: conv filters (4-D, trainable) by Muon at filter_lr; the other
    weights (the head) and BatchNorm biases by Nesterov SGD as make_speedrun_optimizer sets them; net.whiten.bias at
    the biases' LR, decaying to 0 over whiten_bias_steps. Every LR decays linearly to 0 over total_steps, no warm-up.

    filter_lr is not scaled with the batch: the orthogonalised step's size does not depend on the gradient's.
    filter_options: more muon.Muon settings for the filters' group (coefficients, batched, normalize_every,
    filter_decay: hiverge's record)."""
    batchnorms = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d, nn.SyncBatchNorm)
    norm = {id(p) for m in net.modules() if isinstance(m, batchnorms) for p in m.parameters()}
    whiten_bias = net.whiten.bias
    params = [p for p in net.parameters() if p.requires_grad or p is whiten_bias]  # the bias trains its epochs
    filters = [p for p in params if p.ndim == 4]
    biases = [p for p in params if id(p) in norm]
    others = [p for p in params if p.ndim != 4 and id(p) not in norm and p is not whiten_bias]
    lr, decay = lr * batch_size / 1024, weight_decay * batch_size / 1024  # per image, as make_speedrun_optimizer
    sgd = dict(orthogonalize=False, momentum=momentum)
    groups = [dict(params=filters, lr=filter_lr, momentum=filter_momentum, weight_decay=0.0, orthogonalize=True,
                   **filter_options),
              dict(params=others, lr=lr, weight_decay=decay / lr, **sgd),
              dict(params=biases, lr=lr * bias_scale, weight_decay=decay / (lr * bias_scale), **sgd),
              dict(params=[whiten_bias], lr=lr * bias_scale, weight_decay=decay / (lr * bias_scale), **sgd)]
    opt = Muon(groups, dtype=dtype, total_steps=total_steps)
    whole, bias = (lambda step: linear_decay(step, total_steps)), (lambda step: linear_decay(step, whiten_bias_steps))
    return opt, torch.optim.lr_scheduler.LambdaLR(opt, [whole, whole, whole, bias])


def linear_decay(step: int, total: int) -> float:
    """Schedule multiplier 1 - step/total, floored at 0: airbench94_muon's, from the first step."""
    return max(0.0, 1 - step / max(1, total))


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
        for slow, fast in zip(self.slow, self.fast):  # a few dozen tensors every few steps: a loop costs nothing
            slow.lerp_(fast, 1 - decay)  # slow += (1 - decay) (fast - slow)
            fast.copy_(slow)  # decay=1 just copies the slow weights into the net
