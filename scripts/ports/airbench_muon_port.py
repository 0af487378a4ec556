"""A port of airbench94_muon's training (github.com/KellerJordan/cifar10-airbench, airbench94_muon.py at commit
f1c599c, MIT licence, Keller Jordan) that runs on any device and dtype, used only to check the course's Muon recipe
against it (scripts/fidelity_muon_cpu.py, tests/test_muon.py). Not part of course_lib, and not what the GPU capstone
times: that runs airbench94_muon.py itself (scripts/gpu_capstone.py).

It follows airbench94_muon's `main` step by step: CifarNet (whitening conv with PyTorch's random bias, GELU, three
conv groups, max pool, head of unit-std weights over width), its Muon (Nesterov momentum, weights normalised, update
orthogonalised by 3 Newton-Schulz steps) on the conv filters and Nesterov SGD on the rest, the summed loss, linear
decay to 0, the whitening bias's own decay over 3 epochs. The loader, the batch crop, the conv groups and TTA are
airbench94's, taken from scripts/airbench_port.py (airbench94_muon.py has the same code).
What differs, and why: images come in as uint8 tensors (N, 3, H, W) instead of train.pt on CUDA; the dtype is a
parameter (airbench94_muon: fp16 weights with fp32 BatchNorm, Newton-Schulz in bf16, all on CUDA; the CPU check runs
fp32 with the iteration in fp32); no torch.compile; `train` returns accuracy and seconds instead of printing them.
"""
from __future__ import annotations

import math
import time

import torch
import torch.nn.functional as F
from torch import nn

from .airbench_port import BatchNorm, Conv, ConvGroup, Loader, evaluate  # the port beside it

HYP = {  # airbench94_muon's settings, as its main() writes them
    "batch_size": 2000, "bias_lr": 0.053, "head_lr": 0.67, "wd_per_image": 2e-6, "sgd_momentum": 0.85,
    "muon_lr": 0.24, "muon_momentum": 0.6, "epochs": 8, "whiten_bias_epochs": 3, "label_smoothing": 0.2,
    "batchnorm_momentum": 0.6, "widths": (64, 256, 256), "tta_level": 2, "ns_steps": 3,
    "ns_coefficients": (3.4445, -4.7750, 2.0315), "aug": {"flip": True, "translate": 2},
}


def zeropower_via_newtonschulz5(G, steps=3, eps=1e-7, dtype=torch.bfloat16):
    """airbench94_muon's iteration; dtype: bf16 there."""
    assert len(G.shape) == 2
    a, b, c = HYP["ns_coefficients"]
    X = G.to(dtype)
    X = X / (X.norm() + eps)
    if G.size(0) > G.size(1):
        X = X.T
    for _ in range(steps):
        A = X @ X.T
        B = b * A + c * A @ A
        X = a * X + B @ X
    if G.size(0) > G.size(1):
        X = X.T
    return X


class Muon(torch.optim.Optimizer):
    """airbench94_muon's Muon, with the iteration's dtype a parameter."""

    def __init__(self, params, lr=1e-3, momentum=0, nesterov=False, dtype=torch.bfloat16):
        super().__init__(params, dict(lr=lr, momentum=momentum, nesterov=nesterov))
        self.dtype = dtype

    @torch.no_grad()
    def step(self):
        for group in self.param_groups:
            lr, momentum = group["lr"], group["momentum"]
            for p in group["params"]:
                g = p.grad
                if g is None:
                    continue
                state = self.state[p]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(g)
                buf = state["momentum_buffer"]
                buf.mul_(momentum).add_(g)
                g = g.add(buf, alpha=momentum) if group["nesterov"] else buf
                p.data.mul_(len(p.data) ** 0.5 / p.data.norm())  # normalize the weight
                update = zeropower_via_newtonschulz5(g.reshape(len(g), -1), dtype=self.dtype).view(g.shape)
                p.data.add_(update.to(p.dtype), alpha=-lr)


class CifarNet(nn.Module):
    """airbench94_muon's CifarNet (widths a parameter)."""

    def __init__(self, widths=HYP["widths"], momentum=HYP["batchnorm_momentum"]):
        super().__init__()
        self.whiten = nn.Conv2d(3, 24, 2, padding=0, bias=True)
        self.whiten.weight.requires_grad = False
        self.layers = nn.Sequential(nn.GELU(), ConvGroup(24, widths[0], momentum),
                                    ConvGroup(widths[0], widths[1], momentum),
                                    ConvGroup(widths[1], widths[2], momentum), nn.MaxPool2d(3))
        self.head = nn.Linear(widths[2], 10, bias=False)

    def reset(self):
        for m in self.modules():
            if type(m) in (nn.Conv2d, Conv, BatchNorm, nn.Linear):
                m.reset_parameters()
        w = self.head.weight.data
        w *= 1 / w.std()

    def init_whiten(self, train_images, eps=5e-4):
        c, (h, w) = train_images.shape[1], self.whiten.weight.shape[2:]
        patches = train_images.unfold(2, h, 1).unfold(3, w, 1).transpose(1, 3).reshape(-1, c, h, w).float()
        patches_flat = patches.view(len(patches), -1)
        est_patch_covariance = (patches_flat.T @ patches_flat) / len(patches_flat)
        eigenvalues, eigenvectors = torch.linalg.eigh(est_patch_covariance, UPLO="U")
        eigenvectors_scaled = eigenvectors.T.reshape(-1, c, h, w) / torch.sqrt(eigenvalues.view(-1, 1, 1, 1) + eps)
        self.whiten.weight.data[:] = torch.cat((eigenvectors_scaled, -eigenvectors_scaled)).to(self.whiten.weight)

    def forward(self, x, whiten_bias_grad=True):
        b = self.whiten.bias
        x = F.conv2d(x, self.whiten.weight, b if whiten_bias_grad else b.detach())
        x = self.layers(x)
        x = x.view(len(x), -1)
        return self.head(x) / x.size(-1)


def make_model(widths=HYP["widths"], device="cpu", dtype=torch.float32) -> CifarNet:
    """CifarNet on device: dtype everywhere but BatchNorm (fp32), as airbench94_muon's .half() with BN .float()."""
    model = CifarNet(widths).to(device)
    for m in model.modules():
        if isinstance(m, BatchNorm):
            m.float()
        elif not list(m.children()):
            m.to(dtype)
    return model


def train(train_loader: Loader, test_loader: Loader, epochs: float = HYP["epochs"], widths=HYP["widths"],
          dtype=torch.float32, ns_dtype=torch.float32, timer=None, init=None) -> dict:
    """airbench94_muon's main(): test accuracy with TTA (level 2) and without, the net, and the seconds of whitening
    + training + TTA as airbench counts them (timer: a course_lib DeviceTimer, else a host clock). The LRs are
    airbench's own, per example of the summed loss: a smaller batch takes smaller steps, as airbench would.
    init(model): called after the whitening, before the first step (None in airbench; the stage check,
    scripts/fidelity_muon_stages.py, loads the course's initial weights there to train both loops from one start)."""
    device = train_loader.images.device
    mark = timer.mark if timer else time.perf_counter
    seconds = timer.seconds if timer else (lambda a, b: b - a)
    train_loader.epoch = 0
    batch_size, bias_lr, head_lr = train_loader.batch_size, HYP["bias_lr"], HYP["head_lr"]
    wd = HYP["wd_per_image"] * batch_size
    total_train_steps = math.ceil(epochs * len(train_loader))
    whiten_bias_train_steps = math.ceil(HYP["whiten_bias_epochs"] * len(train_loader))
    model = make_model(widths, device, dtype)
    filter_params = [p for p in model.parameters() if len(p.shape) == 4 and p.requires_grad]
    norm_biases = [p for n, p in model.named_parameters() if "norm" in n and p.requires_grad]
    param_configs = [dict(params=[model.whiten.bias], lr=bias_lr, weight_decay=wd / bias_lr),
                     dict(params=norm_biases, lr=bias_lr, weight_decay=wd / bias_lr),
                     dict(params=[model.head.weight], lr=head_lr, weight_decay=wd / head_lr)]
    optimizer1 = torch.optim.SGD(param_configs, momentum=HYP["sgd_momentum"], nesterov=True)
    optimizer2 = Muon(filter_params, lr=HYP["muon_lr"], momentum=HYP["muon_momentum"], nesterov=True, dtype=ns_dtype)
    optimizers = [optimizer1, optimizer2]
    for opt in optimizers:
        for group in opt.param_groups:
            group["initial_lr"] = group["lr"]
    model.reset()
    step, losses = 0, []
    start = mark()
    model.init_whiten(train_loader.normalize(train_loader.images[:5000]))
    if init is not None:
        init(model)
    for _ in range(math.ceil(total_train_steps / len(train_loader))):
        model.train()
        for inputs, labels in train_loader:
            outputs = model(inputs, whiten_bias_grad=(step < whiten_bias_train_steps))
            loss = F.cross_entropy(outputs, labels, label_smoothing=HYP["label_smoothing"], reduction="sum")
            loss.backward()
            for group in optimizer1.param_groups[:1]:
                group["lr"] = group["initial_lr"] * (1 - step / whiten_bias_train_steps)
            for group in optimizer1.param_groups[1:] + optimizer2.param_groups:
                group["lr"] = group["initial_lr"] * (1 - step / total_train_steps)
            for opt in optimizers:
                opt.step()
            model.zero_grad(set_to_none=True)
            losses.append(loss.detach() / len(labels))
            step += 1
            if step >= total_train_steps:
                break
    trained = mark()
    tta_acc = evaluate(model, test_loader, tta_level=HYP["tta_level"])
    end = mark()
    plain_acc = evaluate(model, test_loader, tta_level=0)  # untimed, for the record
    return {"acc": tta_acc, "acc_no_tta": plain_acc, "time_s": seconds(start, end),
            "train_s": seconds(start, trained), "steps": step, "model": model,
            "losses": torch.stack(losses).float().cpu()}
