"""Lesson 08's plain-PyTorch twin of SpeedrunModule (speedrun.py): the same recipe trained without Lightning, and
its fit as a typed record (TwinFit), what experiments.compare_twin sets beside the module's run."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn

from ..base import hardware
from ..data import ondevice
from ..measure.timing import DeviceTimer
from .metrics import mean_loss, top1_accuracy
from .models import AirNet
from .optim import Lookahead, lookahead_decay
from .speedrun import Recipe, jittered, recipe_optimizer, total_steps, whiten_from


@dataclass(frozen=True)
class TwinFit:
    """One Twin.fit: its per-step losses (a CPU float tensor), per-epoch seconds, the trained net (the twin's own, in
    place), the recipe and precision it trained with, and fp16's final loss scale (None without a scaler)."""

    losses: torch.Tensor
    epoch_s: tuple[float, ...]
    net: AirNet
    recipe: Recipe
    precision: str
    loss_scale: float | None = None


class Twin:
    """Plain-PyTorch twin of SpeedrunModule: same net, optimiser, schedule, lookahead and metrics, no Lightning. Built
    once, as the module is (channels_last, one torch.compile handle for all fits): new weights go into .net in place."""

    def __init__(self, net: AirNet, recipe: Recipe = Recipe()):
        self.recipe = recipe
        self.net = net.to(memory_format=torch.channels_last) if recipe.channels_last else net
        self.forward = torch.compile(self.net) if recipe.compile else self.net  # shares .net's parameters

    def fit(self, batches: ondevice.DeviceBatches, epochs: float, precision: str | None = None) -> TwinFit:
        """Train on the batches: whitens from their images (unless .net is whitened already); fractional epochs stop
        after total_steps(epochs, len(batches)) steps. Returns the fit: per-step losses, per-epoch seconds, the net."""
        precision, r = hardware.choose_precision(precision), self.recipe  # the policy: the module's Trainer picks alike
        if batches.batch_size != r.batch_size:
            raise ValueError(f"The batches hold {batches.batch_size} images but the recipe's batch_size is "
                             f"{r.batch_size}: pass Recipe(batch_size={batches.batch_size}, ...).")
        dtype, device = hardware.autocast_dtype(precision), batches.images.device
        net = self.net.to(device)
        # fp16 (a T4's choice) needs loss scaling, as Lightning's 16-mixed does: GradScaler on this device type
        scaler = torch.amp.GradScaler(device.type, enabled=dtype == torch.float16)
        net.train()
        if not bool(net.whitened):
            whiten_from(net, batches.images, r)
        total = total_steps(epochs, len(batches))
        net.whiten.bias.requires_grad_(True)  # in the optimiser even if an earlier run froze it
        opt, sched = recipe_optimizer(net, r, total, len(batches))
        criterion = nn.CrossEntropyLoss(label_smoothing=r.label_smoothing)
        # as the module's metrics: no host sync per update (mean_loss has no NaN check)
        acc, loss_mean = top1_accuracy().to(device), mean_loss().to(device)
        lookahead, timer = (Lookahead(net) if r.lookahead_every else None), DeviceTimer(device)
        losses, marks, step = [], [], 0
        for epoch in range(math.ceil(epochs)):
            batches.set_epoch(epoch)
            net.whiten.bias.requires_grad_(epoch < r.whiten_bias_epochs)
            marks.append(timer.mark())
            for x, y in map(lambda b: jittered(b, r), batches):
                x = x.contiguous(memory_format=torch.channels_last) if r.channels_last else x
                with torch.autocast(device.type, dtype=dtype or torch.bfloat16, enabled=dtype is not None):
                    logits = self.forward(x)
                    loss = criterion(logits, y)
                acc.update(logits.detach(), y)  # the module's per-step metric work, so the timings compare
                loss_mean.update(loss.detach().expand(len(y)))
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
            acc.compute(), loss_mean.compute(), acc.reset(), loss_mean.reset()  # once per epoch, as the module logs
            marks.append(timer.mark())
        if lookahead is not None:
            lookahead.update(1.0)
        epoch_s = [timer.seconds(a, b) for a, b in zip(marks[::2], marks[1::2])]
        return TwinFit(torch.stack(losses).float().cpu(), tuple(epoch_s), net, r, precision,
                       scaler.get_scale() if scaler.is_enabled() else None)
