"""The plain-PyTorch training and evaluation loops that lesson 01 builds and lesson 02 races against Lightning."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from ..measure.timing import DeviceTimer
from .metrics import top1_accuracy
from .optim import make_optimizer


@dataclass(frozen=True)
class Epoch:
    """One epoch of train_plain: its index, mean training loss and accuracy, seconds and images per second."""

    epoch: int
    loss: float
    acc: float
    seconds: float
    images_per_s: float


def train_plain(model: nn.Module, loader, epochs: int, device: str = "cpu", label_smoothing: float = 0.0,
                **opt_kwargs) -> list[Epoch]:
    """Train with the same optimiser and schedule as ImageClassifierModule; returns per-epoch loss and timing."""
    model.to(device).train()
    opt, sched = make_optimizer(model.parameters(), epochs * len(loader), **opt_kwargs)
    criterion = nn.CrossEntropyLoss(label_smoothing=label_smoothing)
    history = []
    for epoch in range(epochs):
        total_loss, acc, seen = torch.zeros((), device=device), top1_accuracy().to(device), 0
        timer = DeviceTimer(device)  # CUDA events on a GPU: one synchronize per epoch, when it is read
        start = timer.mark()
        for x, y in loader:
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            logits = model(x)
            loss = criterion(logits, y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            if sched is not None:
                sched.step()
            total_loss += loss.detach() * len(y)  # sums stay on the device: no host sync per step
            acc.update(logits.detach(), y)
            seen += len(y)
        seconds = timer.seconds(start, timer.mark())
        history.append(Epoch(epoch, (total_loss / seen).item(), acc.compute().item(), seconds, seen / seconds))
    return history


@torch.no_grad()
def predict(model: nn.Module, loader, device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """Predicted and true labels for every sample in a loader, as two (N,) CPU tensors."""
    model.to(device).eval()
    preds, labels = [], []
    for x, y in loader:
        preds.append(model(x.to(device)).argmax(dim=1).cpu())
        labels.append(y)
    return torch.cat(preds), torch.cat(labels)

