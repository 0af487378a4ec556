"""Test-time augmentation, as airbench evaluates: logits averaged over the image, its mirror and 1-px shifts, and the
accuracy they give on uint8 images kept on the device."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from ..base import hardware
from ..data.ondevice import DeviceBatches
from .metrics import top1_accuracy


@torch.no_grad()
def tta_logits(model: nn.Module, x: torch.Tensor, level: int = 2) -> torch.Tensor:
    """Logits averaged over views: level 0 the image, 1 + its mirror, 2 + both shifted 1 px down-right and up-left."""
    logits = model(x)  # (B, classes)
    if level == 0:
        return logits
    logits = 0.5 * (logits + model(x.flip(3)))
    if level == 1:
        return logits
    shifted = model(shifted_views(x)).view(4, len(x), -1).mean(0)
    return 0.5 * logits + 0.5 * shifted


def shifted_views(x: torch.Tensor) -> torch.Tensor:
    """(B, 3, H, W) -> (4B, ...): x shifted 1 px down-right, up-left (reflect padding), then both mirrored."""
    down = F.pad(x, (1, 0, 1, 0), mode="reflect")[..., :-1, :-1]  # content moves 1 px right and down
    up = F.pad(x, (0, 1, 0, 1), mode="reflect")[..., 1:, 1:]
    return torch.cat([down, up, down.flip(3), up.flip(3)])


@torch.no_grad()
def selective_tta_logits(model: nn.Module, x: torch.Tensor, fraction: float = 0.25) -> torch.Tensor:
    """hiverge's selective TTA: plain logits for all; for the `fraction` of x least confident (lowest top softmax
    probability), the mean over six equal views (image, mirror, the four shifted_views) instead."""
    logits = model(x)  # (B, classes)
    k = int(len(x) * fraction)
    if k == 0:
        return logits
    pick = logits.softmax(1).amax(1).topk(k, largest=False, sorted=False).indices  # (k,) least confident
    xs = x[pick]
    views = torch.cat([xs, xs.flip(3), shifted_views(xs)])  # (6k, 3, H, W)
    out = logits.clone()
    out[pick] = model(views).view(6, k, -1).mean(0).to(out.dtype)
    return out


@torch.no_grad()
def evaluate_tta(model: nn.Module, images: torch.Tensor, labels: torch.Tensor, *, level: int = 2,
                 batch_size: int = 1000, precision: str | None = None, select: float = 1.0) -> float:
    """Accuracy of model on uint8 images (N, 3, H, W) with test-time augmentation; one host sync at the end.
    Autocast in `precision`'s dtype, as training ran (a Lightning precision through hardware.choose_precision: None is
    the policy, as for training). select < 1 (level 2): selective TTA on that fraction of each batch
    (selective_tta_logits)."""
    if level not in (0, 1, 2):
        raise ValueError(f"TTA level must be 0 (none), 1 (mirror) or 2 (mirror + shifts), got {level}.")
    dtype = hardware.autocast_dtype(hardware.choose_precision(precision))
    was_training, acc = model.training, top1_accuracy().to(images.device)
    model.eval()
    with torch.autocast(images.device.type, dtype=dtype or torch.bfloat16, enabled=dtype is not None):
        for x, y in DeviceBatches(images, labels, batch_size):
            use = level == 2 and select < 1
            acc.update(selective_tta_logits(model, x, select) if use else tta_logits(model, x, level), y)
    model.train(was_training)
    return acc.compute().item()
