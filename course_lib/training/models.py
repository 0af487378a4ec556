"""Plain nn.Module backbones: the seeds' SimpleCNN, the classic LeNet-style CIFAR CNN, a small ResNet, AirNet."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

WIDTHS = (64, 256, 256)  # channels of the three conv groups, as in airbench94
WHITEN_IMAGES = 5000  # airbench94 sets its whitening filters from the first 5,000 training images


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


class ConvGroup(nn.Module):
    """conv3x3 -> maxpool2 -> BN -> GELU -> conv3x3 -> BN -> GELU: (B, c_in, H, W) -> (B, c_out, H//2, W//2)."""

    def __init__(self, c_in: int, c_out: int, bn_momentum: float, bn_eps: float = 1e-12, act=F.gelu):
        super().__init__()
        self.act = act  # F.gelu (airbench) or F.silu (hiverge's record)
        self.conv1 = nn.Conv2d(c_in, c_out, 3, padding=1, bias=False)  # no bias: BatchNorm supplies one
        self.conv2 = nn.Conv2d(c_out, c_out, 3, padding=1, bias=False)
        # eps 1e-12 as airbench94 (PyTorch's default is 1e-5): the batch variance alone sets the scale
        self.norm1 = nn.BatchNorm2d(c_out, eps=bn_eps, momentum=bn_momentum)
        self.norm2 = nn.BatchNorm2d(c_out, eps=bn_eps, momentum=bn_momentum)
        for conv in (self.conv1, self.conv2):  # first c_in filters start as the identity: the net starts near a skip
            nn.init.dirac_(conv.weight.data[:conv.in_channels])
        for norm in (self.norm1, self.norm2):  # scale fixed at 1 (the next conv rescales anyway); only the bias learns
            norm.weight.requires_grad_(False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.act(self.norm1(F.max_pool2d(self.conv1(x), 2)))
        return self.act(self.norm2(self.conv2(x)))


class AirNet(nn.Module):
    """airbench94's net: a frozen 2x2 patch-whitening conv (its bias trains from zero) and GELU, three conv groups,
    global max pool, linear head with a fixed output scale. bn_momentum is PyTorch's (airbench's 0.6 is 1 - 0.4)."""

    def __init__(self, widths: tuple[int, int, int] = WIDTHS, num_classes: int = 10, scale: float = 1 / 9,
                 bn_momentum: float = 0.4, bn_eps: float = 1e-12, activation: str = "gelu"):
        super().__init__()
        if len(widths) != 3 or min(widths) < 1:
            raise ValueError(f"widths must be three positive channel counts, e.g. {WIDTHS}; got {widths}.")
        self.whiten = nn.Conv2d(3, 24, 2)  # (B, 3, 32, 32) -> (B, 24, 31, 31); filters set by init_whitening
        self.whiten.weight.requires_grad_(False)  # frozen: a fixed change of basis, not a learned layer
        nn.init.zeros_(self.whiten.bias)  # trained from zero for the first epochs (Recipe.whiten_bias_epochs)
        self.register_buffer("whitened", torch.tensor(False))  # saved in checkpoints, so reloads skip the init
        c = [24, *widths]
        act = {"gelu": F.gelu, "silu": F.silu}[activation]  # the groups'; the whitening's stays GELU (as hiverge)
        self.groups = nn.Sequential(*(ConvGroup(c[i], c[i + 1], bn_momentum, bn_eps, act) for i in range(3)))
        self.head = nn.Linear(widths[-1], num_classes, bias=False)
        self.scale = scale  # small logits at init: with label smoothing, a calm start for a high learning rate

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # (B, 3, 32, 32) normalised
        x = self.groups(F.gelu(self.whiten(x)))  # (B, 24, 31, 31) -> 15 -> 7 -> (B, widths[-1], 3, 3)
        # global max pool -> (B, widths[-1]); a pooling op, not amax, whose compiled bf16 backward gave NaN on a CPU
        x = F.adaptive_max_pool2d(x, 1).flatten(1)
        return self.head(x) * self.scale  # (B, classes)


@torch.no_grad()
def init_whitening(net: AirNet, images: torch.Tensor, max_images: int = WHITEN_IMAGES, eps: float = 5e-4,
                   largest_first: bool = True) -> None:
    """Set net.whiten to the eigenvectors of the 2x2 patches' second-moment matrix (uncentred, as airbench94),
    largest eigenvalue first (airbench94, hiverge's SVD; largest_first=False: smallest first, airbench94_muon's eigh
    order, which decides what a first group narrower than 24 channels passes on), each scaled to unit output
    variance, and their negatives; its bias to zero.

    images: the net's own input, float (N, 3, H, W) training images normalised as for training (e.g.
    data.to_float(uint8_images[:5000])); the net knows nothing of the data's statistics."""
    if images.ndim != 4 or images.shape[1] != 3 or len(images) == 0 or not images.is_floating_point():
        raise ValueError(f"init_whitening needs normalised float training images shaped (N, 3, H, W), got "
                         f"{images.dtype} {tuple(images.shape)}. Normalise uint8 images first: "
                         f"init_whitening(net, data.to_float(images[:5000])).")
    outer, n = torch.zeros(12, 12, dtype=torch.float64, device=images.device), 0
    for chunk in images[:max_images].split(500):  # chunks: the patches of 5,000 images would take 0.5 GB
        p = chunk.unfold(2, 2, 1).unfold(3, 2, 1)  # (b, 3, H-1, W-1, 2, 2)
        p = p.permute(0, 2, 3, 1, 4, 5).reshape(-1, 12).double()  # one row per patch, ordered like a conv filter
        outer, n = outer + p.T @ p, n + len(p)
    eigval, eigvec = torch.linalg.eigh(outer / n)  # (12, 12) second moments; ascending eigenvalues, vectors in columns
    if largest_first:  # airbench94 flips eigh's ascending order; airbench94_muon keeps it
        eigval, eigvec = eigval.flip(0), eigvec.flip(1)
    eigvec = eigvec * eigvec.gather(0, eigvec.abs().argmax(0, keepdim=True)).sign()  # fix signs: deterministic
    filters = eigvec.T / (eigval.clamp_min(0) + eps).sqrt()[:, None]  # (12, 12): each output has unit second moment
    weight = torch.cat([filters, -filters])  # (24, 12): +/- pairs, so the GELU after them keeps both signs
    net.whiten.weight.copy_(weight.reshape(24, 3, 2, 2))
    net.whiten.bias.zero_()  # airbench's: no centring; the bias learns the shift in the first epochs
    net.whitened.fill_(True)


MODELS = {"simple_cnn": SimpleCNN, "lenet": LeNet, "resnet9": ResNet9}  # AirNet needs init_whitening: not by name


def build_model(name: str, **kwargs) -> nn.Module:
    """A backbone by name: one of MODELS."""
    if name not in MODELS:
        raise ValueError(f"Unknown model {name!r}; choose one of {sorted(MODELS)}.")
    return MODELS[name](**kwargs)


def count_parameters(model: nn.Module) -> int:
    """Trainable parameters."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)
