"""A port of airbench94's training (airbench 0.1.8: lib_airbench94.py and utils.py, MIT licence, Keller Jordan) that
runs on any device and dtype, used only to check the course's recipe against it (scripts/fidelity_cpu.py,
tests/test_fidelity.py). Not part of course_lib, and not what the GPU capstone times: that runs airbench itself.

It follows airbench's structure step by step: a Sequential net in airbench's layer order, a loader that pre-flips
and pre-pads on its first epoch and flips everything on odd epochs, uncentred whitening, the summed loss with
airbench's decoupled LR and decay, the triangle schedule, lookahead over the state dict, mirror + translate TTA.
What differs, and why: images come in as uint8 tensors (N, 3, H, W) instead of a train.pt file; the dtype is a
parameter (airbench: fp16 weights with fp32 BatchNorm on CUDA; fidelity_cpu.py runs it in fp32, or in fp16 with
--precision own, which a CPU without fp16 units emulates slowly); the run is timed with the course's DeviceTimer;
`train` returns accuracy and seconds instead of printing them.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

HYP = {  # airbench94's hyperparameters (lib_airbench94.py)
    "opt": {"train_epochs": 9.9, "batch_size": 1024, "lr": 11.5, "momentum": 0.85, "weight_decay": 0.0153,
            "bias_scaler": 64.0, "label_smoothing": 0.2, "whiten_bias_epochs": 3},
    "aug": {"flip": True, "translate": 2},
    "net": {"widths": (64, 256, 256), "batchnorm_momentum": 0.6, "scaling_factor": 1 / 9, "tta_level": 2},
}
MEAN, STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)


# ---- network ----

class Mul(nn.Module):
    def __init__(self, scale: float):
        super().__init__()
        self.scale = scale

    def forward(self, x):
        return x * self.scale


class BatchNorm(nn.BatchNorm2d):
    """airbench's BatchNorm: eps 1e-12, its momentum m means PyTorch's 1 - m, scale frozen at 1, bias trained."""

    def __init__(self, channels: int, momentum: float, eps: float = 1e-12):
        super().__init__(channels, eps=eps, momentum=1 - momentum)
        self.weight.requires_grad = False


class Conv(nn.Conv2d):
    """3x3 'same' conv without bias by default; after PyTorch's init, the first in_channels filters are the identity."""

    def __init__(self, c_in: int, c_out: int, kernel_size: int = 3, padding="same", bias: bool = False):
        super().__init__(c_in, c_out, kernel_size=kernel_size, padding=padding, bias=bias)

    def reset_parameters(self):
        super().reset_parameters()
        if self.bias is not None:
            self.bias.data.zero_()
        w = self.weight.data
        torch.nn.init.dirac_(w[:w.size(1)])


class ConvGroup(nn.Module):
    def __init__(self, c_in: int, c_out: int, momentum: float):
        super().__init__()
        self.conv1, self.pool, self.norm1 = Conv(c_in, c_out), nn.MaxPool2d(2), BatchNorm(c_out, momentum)
        self.conv2, self.norm2, self.activ = Conv(c_out, c_out), BatchNorm(c_out, momentum), nn.GELU()

    def forward(self, x):
        x = self.activ(self.norm1(self.pool(self.conv1(x))))
        return self.activ(self.norm2(self.conv2(x)))


def make_net(widths=HYP["net"]["widths"], momentum=HYP["net"]["batchnorm_momentum"], device="cpu",
             dtype=torch.float32, channels_last: bool = False) -> nn.Sequential:
    """airbench's make_net94: whitening conv (frozen weight, bias from zero), GELU, three groups, max pool, head."""
    net = nn.Sequential(
        Conv(3, 24, kernel_size=2, padding=0, bias=True), nn.GELU(),
        ConvGroup(24, widths[0], momentum), ConvGroup(widths[0], widths[1], momentum),
        ConvGroup(widths[1], widths[2], momentum),
        nn.MaxPool2d(3), nn.Flatten(), nn.Linear(widths[2], 10, bias=False), Mul(HYP["net"]["scaling_factor"]))
    net[0].weight.requires_grad = False
    net = net.to(device=device, dtype=dtype)
    if channels_last:
        net = net.to(memory_format=torch.channels_last)
    for m in net.modules():  # BatchNorm stays fp32 even when the rest is fp16
        if isinstance(m, BatchNorm):
            m.float()
    return net


# ---- data ----

def batch_flip_lr(x: torch.Tensor) -> torch.Tensor:
    mask = (torch.rand(len(x), device=x.device) < 0.5).view(-1, 1, 1, 1)
    return torch.where(mask, x.flip(-1), x)


def batch_crop(padded: torch.Tensor, size: int) -> torch.Tensor:
    """Each image cropped at a random offset of up to r px either way, per axis (airbench's masked copies, r <= 2)."""
    r = (padded.size(-1) - size) // 2
    shifts = torch.randint(-r, r + 1, size=(len(padded), 2), device=padded.device)
    out = torch.empty((len(padded), padded.size(1), size, size), device=padded.device, dtype=padded.dtype)
    for sy in range(-r, r + 1):
        for sx in range(-r, r + 1):
            mask = (shifts[:, 0] == sy) & (shifts[:, 1] == sx)
            out[mask] = padded[mask, :, r + sy:r + sy + size, r + sx:r + sx + size]
    return out


class Loader:
    """airbench's CifarLoader over tensors: uint8 images (N, 3, H, W) and labels, already on their device."""

    def __init__(self, images: torch.Tensor, labels: torch.Tensor, batch_size: int, train: bool = True,
                 aug: dict | None = None, altflip: bool = True, dtype=torch.float32):
        self.images = images.to(dtype) / 255
        self.labels, self.batch_size, self.train = labels, batch_size, train
        self.mean = torch.tensor(MEAN, device=images.device, dtype=dtype).view(1, 3, 1, 1)
        self.std = torch.tensor(STD, device=images.device, dtype=dtype).view(1, 3, 1, 1)
        self.aug, self.altflip, self.epoch, self.proc = aug or {}, altflip, 0, {}

    def normalize(self, x: torch.Tensor) -> torch.Tensor:
        return (x - self.mean) / self.std

    def __len__(self) -> int:
        n = len(self.images)
        return n // self.batch_size if self.train else math.ceil(n / self.batch_size)

    def __iter__(self):
        flip, pad = self.aug.get("flip", False), self.aug.get("translate", 0)
        if self.epoch == 0:  # normalise once, pre-flip a random half, pre-pad by reflection
            images = self.proc["norm"] = self.normalize(self.images)
            if flip:
                images = self.proc["flip"] = batch_flip_lr(images)
            if pad > 0:
                self.proc["pad"] = F.pad(images, (pad,) * 4, "reflect")
        if pad > 0:
            images = batch_crop(self.proc["pad"], self.images.shape[-2])
        else:
            images = self.proc["flip" if flip else "norm"]
        if flip:
            if self.altflip:
                if self.epoch % 2 == 1:
                    images = images.flip(-1)
            else:
                images = batch_flip_lr(images)
        self.epoch += 1
        order = (torch.randperm if self.train else torch.arange)(len(images), device=images.device)
        for i in range(len(self)):
            idx = order[i * self.batch_size:(i + 1) * self.batch_size]
            yield images[idx], self.labels[idx]


# ---- whitening, lookahead, schedule, TTA ----

def init_whitening_conv(layer: nn.Conv2d, train_images: torch.Tensor, eps: float = 5e-4) -> None:
    """Eigenvectors of the uncentred covariance of all 2x2 patches, largest first, scaled; and their negatives."""
    c, (h, w) = train_images.shape[1], layer.weight.shape[2:]
    patches = train_images.unfold(2, h, 1).unfold(3, w, 1).transpose(1, 3).reshape(-1, c, h, w).float()
    flat = patches.view(len(patches), -1)
    cov = flat.T @ flat / len(flat)
    eigenvalues, eigenvectors = torch.linalg.eigh(cov, UPLO="U")
    eigenvalues = eigenvalues.flip(0).view(-1, 1, 1, 1)
    eigenvectors = eigenvectors.T.reshape(c * h * w, c, h, w).flip(0)
    scaled = eigenvectors / torch.sqrt(eigenvalues + eps)
    layer.weight.data[:] = torch.cat((scaled, -scaled)).to(layer.weight.dtype)


class LookaheadState:
    def __init__(self, net: nn.Module):
        self.net_ema = {k: v.clone() for k, v in net.state_dict().items()}

    def update(self, net: nn.Module, decay: float) -> None:
        for ema, cur in zip(self.net_ema.values(), net.state_dict().values()):
            if cur.dtype in (torch.half, torch.float):
                ema.lerp_(cur, 1 - decay)
                cur.copy_(ema)


def triangle(steps: int, start: float = 0.0, end: float = 0.0, peak: float = 0.5) -> torch.Tensor:
    """Piecewise-linear factors for steps 0..steps: start -> 1 at int(peak x steps) -> end."""
    xp, fp = torch.tensor([0, int(peak * steps), steps]), torch.tensor([start, 1, end])
    x = torch.arange(1 + steps)
    m = (fp[1:] - fp[:-1]) / (xp[1:] - xp[:-1])
    b = fp[:-1] - m * xp[:-1]
    idx = (torch.sum(torch.ge(x[:, None], xp[None, :]), 1) - 1).clamp(0, len(m) - 1)
    return m[idx] * x + b[idx]


@torch.no_grad()
def infer(model: nn.Module, loader: Loader, tta_level: int = 0) -> torch.Tensor:
    def mirror(x):
        return 0.5 * model(x) + 0.5 * model(x.flip(-1))

    def mirror_translate(x):
        padded = F.pad(x, (1,) * 4, "reflect")
        shifted = [mirror(padded[:, :, 0:32, 0:32]), mirror(padded[:, :, 2:34, 2:34])]
        return 0.5 * mirror(x) + 0.5 * torch.stack(shifted).mean(0)

    model.eval()
    fn = [lambda x: model(x).clone(), mirror, mirror_translate][tta_level]
    return torch.cat([fn(x) for x in loader.normalize(loader.images).split(2000)])


def evaluate(model: nn.Module, loader: Loader, tta_level: int = 0) -> float:
    return (infer(model, loader, tta_level).argmax(1) == loader.labels).float().mean().item()


# ---- training ----

def train(train_loader: Loader, test_loader: Loader, epochs: float = HYP["opt"]["train_epochs"],
          widths=HYP["net"]["widths"], label_smoothing: float = HYP["opt"]["label_smoothing"],
          learning_rate: float = HYP["opt"]["lr"], bias_scaler: float = HYP["opt"]["bias_scaler"],
          momentum: float = HYP["opt"]["momentum"], weight_decay: float = HYP["opt"]["weight_decay"],
          whiten_bias_epochs: int = HYP["opt"]["whiten_bias_epochs"], lookahead: bool = True,
          dtype=torch.float32, timer=None) -> dict:
    """airbench's train(): returns test accuracy with TTA (level 2) and without, the trained net, and the seconds
    of whitening + training + TTA (timer: a course_lib DeviceTimer, else a host clock), as airbench counts them."""
    import time

    device = train_loader.images.device
    mark = timer.mark if timer else time.perf_counter
    seconds = timer.seconds if timer else (lambda a, b: b - a)
    train_loader.epoch = 0
    batch_size = train_loader.batch_size
    kilostep_scale = 1024 * (1 + 1 / (1 - momentum))  # Nesterov's step gain, per 1024 examples of summed loss
    lr = learning_rate / kilostep_scale
    wd = weight_decay * batch_size / kilostep_scale
    lr_biases = lr * bias_scaler
    loss_fn = nn.CrossEntropyLoss(label_smoothing=label_smoothing, reduction="none")
    total_train_steps = math.ceil(len(train_loader) * epochs)

    model = make_net(widths, device=device, dtype=dtype, channels_last=device.type == "cuda")
    norm_biases = [p for k, p in model.named_parameters() if "norm" in k and p.requires_grad]
    other = [p for k, p in model.named_parameters() if "norm" not in k and p.requires_grad]
    optimizer = torch.optim.SGD([dict(params=norm_biases, lr=lr_biases, weight_decay=wd / lr_biases),
                                 dict(params=other, lr=lr, weight_decay=wd / lr)], momentum=momentum, nesterov=True)
    schedule = triangle(total_train_steps, start=0.2, end=0.07, peak=0.23)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda i: schedule[i])
    alpha = 0.95 ** 5 * (torch.arange(total_train_steps + 1) / total_train_steps) ** 3
    state = LookaheadState(model) if lookahead else None

    start = mark()
    init_whitening_conv(model[0], train_loader.normalize(train_loader.images[:5000]))
    steps, losses = 0, []
    for epoch in range(math.ceil(epochs)):
        model[0].bias.requires_grad = epoch < whiten_bias_epochs
        model.train()
        for inputs, labels in train_loader:
            outputs = model(inputs)
            loss = loss_fn(outputs, labels).sum()
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            scheduler.step()
            losses.append(loss.detach() / len(labels))
            steps += 1
            if state is not None and steps % 5 == 0:
                state.update(model, decay=alpha[steps].item())
            if steps >= total_train_steps:
                if state is not None:
                    state.update(model, decay=1.0)
                break
    trained = mark()
    tta_acc = evaluate(model, test_loader, tta_level=2)
    end = mark()
    plain_acc = evaluate(model, test_loader, tta_level=0)  # untimed, for the record
    return {"acc": tta_acc, "acc_no_tta": plain_acc, "time_s": seconds(start, end),
            "train_s": seconds(start, trained), "steps": steps, "model": model,
            "losses": torch.stack(losses).float().cpu()}
