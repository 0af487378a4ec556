"""The plain-PyTorch training and evaluation loops that lesson 01 builds and lesson 02 races against Lightning."""
from __future__ import annotations

import time

import lightning as L
import torch
from torch import nn

from .optim import make_optimizer


def sync(device: torch.device | str) -> None:
    """Wait for queued GPU work, so a timer measures the work and not just its launch."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def train_plain(model: nn.Module, loader, epochs: int, device: str = "cpu", label_smoothing: float = 0.0,
                **opt_kwargs) -> list[dict]:
    """Train with the same optimiser and schedule as ImageClassifierModule; returns per-epoch loss and timing."""
    model.to(device).train()
    opt, sched = make_optimizer(model.parameters(), epochs * len(loader), **opt_kwargs)
    criterion = nn.CrossEntropyLoss(label_smoothing=label_smoothing)
    history = []
    for epoch in range(epochs):
        total_loss, correct, seen = torch.zeros((), device=device), torch.zeros((), device=device), 0
        sync(device)
        start = time.perf_counter()
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
            correct += (logits.detach().argmax(dim=1) == y).sum()
            seen += len(y)
        sync(device)
        seconds = time.perf_counter() - start
        history.append({"epoch": epoch, "loss": (total_loss / seen).item(), "acc": (correct / seen).item(), "seconds": seconds,
                        "images_per_s": seen / seconds})
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


def confusion_matrix(preds: torch.Tensor, labels: torch.Tensor, num_classes: int) -> torch.Tensor:
    """(true, predicted) counts as a (classes, classes) int64 tensor."""
    return torch.bincount(labels * num_classes + preds, minlength=num_classes**2).reshape(num_classes, num_classes)


class EpochTimer(L.Callback):
    """Wall time of each training epoch, validation excluded: the number lesson 02 compares with the plain loop."""

    def __init__(self):
        self.seconds: list[float] = []

    def _now(self, pl_module) -> float:
        sync(pl_module.device)
        return time.perf_counter()

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        self._start, self._val = self._now(pl_module), 0.0

    def on_validation_start(self, trainer, pl_module) -> None:
        self._val_start = self._now(pl_module)

    def on_validation_end(self, trainer, pl_module) -> None:
        if trainer.state.fn == "fit" and not trainer.sanity_checking:  # validation inside fit: not training time
            self._val += self._now(pl_module) - self._val_start

    def on_train_epoch_end(self, trainer, pl_module) -> None:
        self.seconds.append(self._now(pl_module) - self._start - self._val)
