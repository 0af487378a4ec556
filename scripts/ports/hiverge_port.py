"""A port of hiverge's CIFAR-10 record (github.com/hiverge/cifar10-speedrun, cifar10_speedrun.py at commit 5cd49b1,
MIT licence) that runs on any device and dtype, used only to check the course's record rung (speedrun.RECORD)
against it (scripts/fidelity_muon_cpu.py --impl record-port). Not part of course_lib.

It follows cifar10_speedrun.py's `main` step by step: CifarNet (whitening conv with PyTorch's random bias, GELU,
three conv groups with SiLU and BatchNorm momentum 0.5566, max pool, head of unit-std weights over width), whitening
by SVD from the first 960 images, its vectorised Muon (the filter banks' Nesterov updates zero-padded into one 3-D
tensor, 3 batched Newton-Schulz steps with its own coefficients, the weights rescaled every 2 + int(15 x progress)
steps, a decoupled decay), Nesterov SGD on the rest, the summed loss with label smoothing 0.09, linear decay to 0
over ceil(7.59 epochs) of steps, the whitening bias's own decay over ceil(0.19 epochs); the loader's loop-free crop,
alternating flip and brightness/contrast jitter; selective TTA (six views, only for the 25 % least confident).
What differs, and why: images come in as uint8 tensors (N, 3, H, W) instead of train.pt on CUDA; fp16 and
channels_last are a parameter (dtype; the CPU check runs fp32), as is the iteration's dtype (hiverge: fp16 on the
GPU); no torch.compile and no warm-up run; momentum buffers in the weights' dtype (hiverge: fp16); `train` returns
accuracy and seconds instead of printing them.
"""
from __future__ import annotations

import math
import time

import torch
import torch.nn.functional as F
from torch import nn

HYP = {  # cifar10_speedrun.py's main(), as it writes them
    "batch_size": 1536, "bias_lr": 0.0573, "head_lr": 0.5415, "wd_per_image": 1.0418e-06, "sgd_momentum": 0.825,
    "muon_lr": 0.205, "muon_momentum": 0.655, "epochs": 7.59, "whiten_bias_epochs": 0.19, "label_smoothing": 0.09,
    "batchnorm_momentum": 0.5566, "widths": (64, 256, 256), "whiten_images": 960, "tta_fraction": 0.25,
    "ns_coefficients": (3.4576, -4.7391, 2.0843), "brightness": 0.1399, "contrast": 0.1308,
}
MEAN, STD = (0.4914, 0.4822, 0.4465), (0.247, 0.2435, 0.2616)


def newton_schulz_stack(X, dtype, progress):
    """_zeropower_via_newtonschulz5 on the padded stack X (k, D, K): each matrix scaled, normalised, 3 steps."""
    a, b, c = HYP["ns_coefficients"]
    X = X.to(dtype)
    target = 0.5012 * (1 - progress) + 0.0786 * progress  # undone by the normalisation after it, as in hiverge
    X = X * (target / (X.norm(dim=(1, 2), keepdim=True) + 1e-5))
    X = X / (X.norm(dim=(1, 2), keepdim=True) + 1e-5)
    transposed = X.size(1) > X.size(2)
    if transposed:
        X = X.transpose(1, 2)
    for _ in range(3):
        A = X @ X.transpose(1, 2)
        B = b * A + c * (A @ A)
        X = a * X + B @ X
    return X.transpose(1, 2) if transposed else X


class Muon(torch.optim.Optimizer):
    """hiverge's vectorised Muon (one group of 4-D filters), its iteration's dtype a parameter."""

    def __init__(self, params, lr, momentum, total_train_steps, weight_decay, dtype=torch.float32):
        super().__init__(params, dict(lr=lr, momentum=momentum))
        self.total, self.wd, self.dtype = total_train_steps, weight_decay, dtype
        self.step_count, self.last_norm_step = 0, 0
        ps = self.param_groups[0]["params"]
        self.max_D = max(p.shape[0] for p in ps)
        self.max_K = (max(p[0].numel() for p in ps) + 15) // 16 * 16  # padded to a multiple of 16, as hiverge

    @torch.no_grad()
    def step(self):
        self.step_count += 1
        group = self.param_groups[0]
        norm_freq = 2 + int(15 * self.step_count / self.total)
        ps = [p for p in group["params"] if p.grad is not None]
        bufs = []
        for p in ps:
            state = self.state[p]
            if "momentum_buffer" not in state:
                state["momentum_buffer"] = torch.zeros_like(p.grad)
            bufs.append(state["momentum_buffer"].mul_(group["momentum"]).add_(p.grad))
        nesterov = [p.grad.add(b, alpha=group["momentum"]) for p, b in zip(ps, bufs)]
        do_norm = self.step_count - self.last_norm_step >= norm_freq
        if do_norm:
            self.last_norm_step = self.step_count
            scales = [len(p) ** 0.5 / (p.norm() + 1e-07) for p in ps]
        X = torch.stack([F.pad(g.reshape(len(g), -1), (0, self.max_K - g[0].numel(), 0, self.max_D - len(g)))
                         for g in nesterov])
        X = newton_schulz_stack(X, self.dtype, self.step_count / max(1, self.total))
        for i, p in enumerate(ps):
            if do_norm:
                p.mul_(scales[i])
            p.add_(X[i, :len(p), :p[0].numel()].reshape(p.shape).to(p.dtype), alpha=-group["lr"])
            p.mul_(1 - group["lr"] * self.wd)


def batch_crop(images, crop_size):
    """hiverge's loop-free crop: one random offset in 0..2r per image and axis, gathered by index."""
    B, C, H, _ = images.shape
    r = (H - crop_size) // 2
    y = (torch.rand(B, device=images.device) * (2 * r + 1)).long().view(B, 1, 1, 1)
    x = (torch.rand(B, device=images.device) * (2 * r + 1)).long().view(B, 1, 1, 1)
    ar = torch.arange(crop_size, device=images.device)
    yi = (y + ar.view(1, 1, crop_size, 1)).expand(B, C, crop_size, crop_size)
    xi = (x + ar.view(1, 1, 1, crop_size)).expand(B, C, crop_size, crop_size)
    bi = torch.arange(B, device=images.device).view(B, 1, 1, 1).expand_as(yi)
    ci = torch.arange(C, device=images.device).view(1, C, 1, 1).expand_as(yi)
    return images[bi, ci, yi, xi]


class Loader:
    """hiverge's CifarLoader over uint8 tensors (N, 3, H, W) already on their device."""

    def __init__(self, images, labels, batch_size, train=True, dtype=torch.float32):
        mean = torch.tensor(MEAN, device=images.device, dtype=dtype).view(1, 3, 1, 1)
        std = torch.tensor(STD, device=images.device, dtype=dtype).view(1, 3, 1, 1)
        self.images, self.labels, self.batch_size, self.train = images.to(dtype) / 255, labels, batch_size, train
        self.normalize = lambda x: (x - mean) / std
        self.epoch, self.proc = 0, {}

    def __len__(self):
        n = len(self.images)
        return n // self.batch_size if self.train else math.ceil(n / self.batch_size)

    def __iter__(self):
        if self.epoch == 0:  # normalise, pre-flip a random half, pre-pad by reflection
            images = self.normalize(self.images)
            flip = (torch.rand(len(images), device=images.device) < 0.5).view(-1, 1, 1, 1)
            self.proc["pad"] = F.pad(torch.where(flip, images.flip(-1), images), (2,) * 4, "reflect")
        images = batch_crop(self.proc["pad"], self.images.shape[-2])
        if self.epoch % 2 == 1:
            images = images.flip(-1)
        shape = (len(images), 1, 1, 1)
        shift = (torch.rand(shape, device=images.device, dtype=images.dtype) * 2 - 1) * HYP["brightness"]
        scale = (torch.rand(shape, device=images.device, dtype=images.dtype) * 2 - 1) * HYP["contrast"] + 1
        images = (images + shift) * scale
        self.epoch += 1
        order = torch.randperm(len(images), device=images.device)
        for i in range(len(self)):
            idx = order[i * self.batch_size:(i + 1) * self.batch_size]
            yield images[idx], self.labels[idx]


class ConvGroup(nn.Module):
    def __init__(self, c_in, c_out):
        super().__init__()
        self.conv1, self.conv2 = (nn.Conv2d(c, c_out, 3, padding="same", bias=False) for c in (c_in, c_out))
        self.norm1, self.norm2 = (nn.BatchNorm2d(c_out, eps=1e-12, momentum=1 - HYP["batchnorm_momentum"])
                                  for _ in range(2))
        for n in (self.norm1, self.norm2):
            n.weight.requires_grad = False
        self.pool, self.activ = nn.MaxPool2d(2), nn.SiLU()

    def reset(self):
        for conv in (self.conv1, self.conv2):
            conv.reset_parameters()
            nn.init.dirac_(conv.weight.data[:conv.weight.size(1)])
        self.norm1.reset_parameters(), self.norm2.reset_parameters()

    def forward(self, x):
        x = self.activ(self.norm1(self.pool(self.conv1(x))))
        return self.activ(self.norm2(self.conv2(x)))


class CifarNet(nn.Module):
    def __init__(self, widths=HYP["widths"]):
        super().__init__()
        self.whiten = nn.Conv2d(3, 24, 2, padding=0, bias=True)
        self.whiten.weight.requires_grad = False
        self.layers = nn.Sequential(nn.GELU(), ConvGroup(24, widths[0]), ConvGroup(widths[0], widths[1]),
                                    ConvGroup(widths[1], widths[2]), nn.MaxPool2d(3))
        self.head = nn.Linear(widths[2], 10, bias=False)

    def reset(self):  # hiverge's reset(): every module's reset_parameters in order, then the head to unit std
        for m in self.modules():
            if isinstance(m, (nn.Conv2d, nn.Linear)) and not any(m is g.conv1 or m is g.conv2 for g in self.groups()):
                m.reset_parameters()
            elif isinstance(m, ConvGroup):
                m.reset()
        self.head.weight.data.mul_(1.0 / self.head.weight.data.std())

    def groups(self):
        return [m for m in self.layers if isinstance(m, ConvGroup)]

    def init_whiten(self, train_images, eps=0.0005):
        c, (h, w) = train_images.shape[1], self.whiten.weight.shape[2:]
        patches = train_images.unfold(2, h, 1).unfold(3, w, 1).transpose(1, 3).reshape(-1, c, h, w).float()
        flat = patches.view(len(patches), -1)
        U, S, _ = torch.svd(flat.t() @ flat / len(flat))
        scaled = (U * torch.rsqrt(S + eps).unsqueeze(0)).T.reshape(-1, c, h, w)
        self.whiten.weight.data[:] = torch.cat((scaled, -scaled)).to(self.whiten.weight)

    def forward(self, x, whiten_bias_grad=True):
        b = self.whiten.bias
        x = self.layers(F.conv2d(x, self.whiten.weight, b if whiten_bias_grad else b.detach()))
        x = x.view(len(x), -1)
        return self.head(x) / x.size(-1)


@torch.no_grad()
def evaluate(model, loader, selective=True):
    """Accuracy: plain logits, then (selective) the mean of six views for the least-confident quarter, as hiverge."""
    model.eval()
    images = loader.normalize(loader.images)
    logits = torch.cat([model(x) for x in images.split(2000)])
    if selective:
        k = int(len(images) * HYP["tta_fraction"])
        _, idx = torch.topk(F.softmax(logits, 1).max(1)[0], k, largest=False, sorted=False)
        parts = []
        for i in range(0, k, 2000):
            xb = images[idx[i:i + 2000]]
            padded = F.pad(xb, (1,) * 4, "reflect")
            base = torch.cat([xb, padded[:, :, 0:32, 0:32], padded[:, :, 2:34, 2:34]])
            views = torch.cat([base, base.flip(-1)])
            parts.append(model(views).view(6, len(xb), -1).mean(0))
        if parts:
            logits = logits.clone()
            logits[idx] = torch.cat(parts)
    return (logits.argmax(1) == loader.labels).float().mean().item()


def train(train_loader: Loader, test_loader: Loader, epochs: float = HYP["epochs"], widths=HYP["widths"],
          ns_dtype=torch.float32, timer=None, dtype=torch.float32, channels_last=False) -> dict:
    """cifar10_speedrun.py's main(): test accuracy with selective TTA and without, seconds of whitening + training +
    TTA (timer: a course_lib DeviceTimer, else a host clock). LRs per example of the summed loss, as hiverge.
    dtype, channels_last: the net's (hiverge: every layer fp16, channels_last; the loaders take the same dtype)."""
    device = train_loader.images.device
    mark = timer.mark if timer else time.perf_counter
    seconds = timer.seconds if timer else (lambda a, b: b - a)
    train_loader.epoch, bs = 0, train_loader.batch_size
    bias_lr, head_lr, wd = HYP["bias_lr"], HYP["head_lr"], HYP["wd_per_image"] * bs
    total = math.ceil(epochs * len(train_loader))
    whiten_steps = math.ceil(HYP["whiten_bias_epochs"] * len(train_loader))
    model = CifarNet(widths).to(device, dtype)
    model = model.to(memory_format=torch.channels_last) if channels_last else model
    model.reset()
    filters = [p for p in model.parameters() if len(p.shape) == 4 and p.requires_grad]
    norm_biases = [p for n, p in model.named_parameters() if "norm" in n and p.requires_grad]
    opt1 = torch.optim.SGD([dict(params=[model.whiten.bias], lr=bias_lr, weight_decay=wd / bias_lr),
                            dict(params=norm_biases, lr=bias_lr, weight_decay=wd / bias_lr),
                            dict(params=[model.head.weight], lr=head_lr, weight_decay=wd / head_lr)],
                           momentum=HYP["sgd_momentum"], nesterov=True)
    opt2 = Muon(filters, lr=HYP["muon_lr"], momentum=HYP["muon_momentum"], total_train_steps=total, weight_decay=wd,
                dtype=ns_dtype)
    initial = [g["lr"] for g in opt1.param_groups + opt2.param_groups]
    step, losses = 0, []
    start = mark()
    model.init_whiten(train_loader.normalize(train_loader.images[:HYP["whiten_images"]]))
    for _ in range(math.ceil(total / len(train_loader))):
        model.train()
        for inputs, labels in train_loader:
            loss = F.cross_entropy(model(inputs, whiten_bias_grad=step < whiten_steps), labels,
                                   label_smoothing=HYP["label_smoothing"], reduction="sum")
            loss.backward()
            groups = opt1.param_groups + opt2.param_groups
            groups[0]["lr"] = initial[0] * (1 - step / whiten_steps)
            for g, lr0 in zip(groups[1:], initial[1:]):
                g["lr"] = lr0 * (1 - step / total)
            for opt in (opt1, opt2):
                opt.step()
                opt.zero_grad(set_to_none=True)
            losses.append(loss.detach() / len(labels))
            step += 1
            if step >= total:
                break
    tta_acc = evaluate(model, test_loader)
    end = mark()
    plain_acc = evaluate(model, test_loader, selective=False)  # untimed, for the record
    return {"acc": tta_acc, "acc_no_tta": plain_acc, "time_s": seconds(start, end), "steps": step, "model": model,
            "losses": torch.stack(losses).float().cpu()}
