"""Reference solution for lesson 08's exercise 2: the per-image augmentation as batch operations (one normalisation
and one pad for the whole batch, two gathers for every image's window, torch.where for the mirrors), and its speed-up
predicted first: each version's ops counted (roofline.count) and summed against the ceilings (roofline.step_model:
each op's bytes at the bandwidth its size allows, no faster than its floor, plus the fixed cost per op; floors=True
times the pads, gathers and mirrors alone at their shapes, and a copy of every other op's bytes). The starter pays
the fixed cost for every op of every image; the batch version pays it a dozen times and moves the same bytes."""
import torch
import torch.nn.functional as F

from course_lib.data.data import CIFAR10_MEAN, CIFAR10_STD
from course_lib.exercises.datapath import per_image_augment  # the starter, kept under its own name
from course_lib.measure import roofline


def augment(x, shifts, flips, pad=2):
    """uint8 (B, C, H, W) -> normalised float (B, C, H, W): each image's window at (shifts[0, i], shifts[1, i]) of
    its reflect-padded copy, mirrored where flips[i]."""
    b, c, h, w = x.shape
    mean = torch.tensor(CIFAR10_MEAN, device=x.device)[:, None, None]
    std = torch.tensor(CIFAR10_STD, device=x.device)[:, None, None]
    z = (x.float().div_(255) - mean) / std  # the whole batch at once
    z = F.pad(z, (pad,) * 4, mode="reflect")  # (B, C, H + 2 pad, W + 2 pad)
    rows = (shifts[0][:, None] + torch.arange(h, device=x.device))[:, None, :, None]  # (B, 1, H, 1)
    z = z.gather(2, rows.expand(b, c, h, w + 2 * pad))  # each image's H rows from its own offset
    cols = (shifts[1][:, None] + torch.arange(w, device=x.device))[:, None, None, :]  # (B, 1, 1, W)
    z = z.gather(3, cols.expand(b, c, h, w))  # then its W columns
    return torch.where(flips[:, None, None, None], z.flip(3), z)


def predict_speedup(ceil, x, shifts, flips, pad=2):
    """The starter's predicted seconds over augment's, on the check's batch, from the ceilings alone."""
    def seconds(fn) -> float:
        return roofline.step_model(roofline.count(fn, x, shifts, flips, pad, floors=True), ceil).predicted
    return seconds(per_image_augment) / seconds(augment)
