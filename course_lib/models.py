"""Plain nn.Module backbones: the seeds' SimpleCNN, the classic LeNet-style CIFAR CNN, and a small ResNet."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class SimpleCNN(nn.Module):
    """The seed articles' one-conv net: conv 3->16, ReLU, 2x2 max-pool, linear 16*16*16 -> 10."""

    def __init__(self, num_classes: int = 10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 16, kernel_size=3, padding=1)
        self.pool = nn.MaxPool2d(2, 2)
        self.fc = nn.Linear(16 * 16 * 16, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, 3, 32, 32)
        x = self.pool(F.relu(self.conv1(x)))  # (B, 16, 16, 16)
        return self.fc(torch.flatten(x, 1))  # (B, classes)


class LeNet(nn.Module):
    """The classic CIFAR-10 tutorial CNN: conv 6 and 16 (5x5) with pooling, then fc 120, 84, classes."""

    def __init__(self, num_classes: int = 10):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 6, 5)
        self.conv2 = nn.Conv2d(6, 16, 5)
        self.pool = nn.MaxPool2d(2, 2)
        self.fc1 = nn.Linear(16 * 5 * 5, 120)
        self.fc2 = nn.Linear(120, 84)
        self.fc3 = nn.Linear(84, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, 3, 32, 32)
        x = self.pool(F.relu(self.conv1(x)))  # (B, 6, 14, 14)
        x = self.pool(F.relu(self.conv2(x)))  # (B, 16, 5, 5)
        x = torch.flatten(x, 1)  # (B, 400): flatten, not view(-1, 400), so a wrong shape fails loudly
        x = F.relu(self.fc1(x))
        x = F.relu(self.fc2(x))
        return self.fc3(x)  # (B, classes)


def conv_bn(c_in: int, c_out: int) -> nn.Sequential:
    """3x3 conv (no bias: BatchNorm supplies it), BatchNorm, ReLU."""
    return nn.Sequential(nn.Conv2d(c_in, c_out, 3, padding=1, bias=False), nn.BatchNorm2d(c_out), nn.ReLU(inplace=True))


class Residual(nn.Module):
    """x + f(x) with two conv_bn blocks."""

    def __init__(self, c: int):
        super().__init__()
        self.f = nn.Sequential(conv_bn(c, c), conv_bn(c, c))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.f(x)


class ResNet9(nn.Module):
    """The ResNet-9 used by the fast CIFAR-10 DAWNBench entries; `width` scales every layer (64 is the original)."""

    def __init__(self, num_classes: int = 10, width: int = 64):
        super().__init__()
        w = width
        self.net = nn.Sequential(
            conv_bn(3, w),  # (B, w, 32, 32)
            conv_bn(w, 2 * w), nn.MaxPool2d(2), Residual(2 * w),  # (B, 2w, 16, 16)
            conv_bn(2 * w, 4 * w), nn.MaxPool2d(2),  # (B, 4w, 8, 8)
            conv_bn(4 * w, 8 * w), nn.MaxPool2d(2), Residual(8 * w),  # (B, 8w, 4, 4)
            nn.AdaptiveMaxPool2d(1), nn.Flatten(),  # (B, 8w)
            nn.Linear(8 * w, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, 3, 32, 32)
        return self.net(x)  # (B, classes)


MODELS = {"simple_cnn": SimpleCNN, "lenet": LeNet, "resnet9": ResNet9}


def build_model(name: str, **kwargs) -> nn.Module:
    """A backbone by name: one of MODELS."""
    if name not in MODELS:
        raise ValueError(f"Unknown model {name!r}; choose one of {sorted(MODELS)}.")
    return MODELS[name](**kwargs)


def count_parameters(model: nn.Module) -> int:
    """Trainable parameters."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
