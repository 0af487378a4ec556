"""Test-time augmentation, as airbench evaluates: logits averaged over the image, its mirror and 1-px shifts, and the
accuracy they give on uint8 images kept on the device."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from . import hardware
from .metrics import top1_accuracy
from .ondevice import DeviceBatches


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


@torch.no_grad()
def evaluate_tta(model: nn.Module, images: torch.Tensor, labels: torch.Tensor, *, level: int = 2,
                 batch_size: int = 1000, precision: str = "32-true") -> float:
    """Accuracy of model on uint8 images (N, 3, H, W) with test-time augmentation; one host sync at the end.
    Autocast in `precision`'s dtype (a Lightning precision), as training ran."""
    if level not in (0, 1, 2):
        raise ValueError(f"TTA level must be 0 (none), 1 (mirror) or 2 (mirror + shifts), got {level}.")
    dtype = hardware.autocast_dtype(precision)
    was_training, acc = model.training, top1_accuracy().to(images.device)
    model.eval()
    with torch.autocast(images.device.type, dtype=dtype or torch.bfloat16, enabled=dtype is not None):
        for x, y in DeviceBatches(images, labels, batch_size):
            acc.update(tta_logits(model, x, level), y)
    model.train(was_training)
    return acc.compute().item()
