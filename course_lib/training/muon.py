"""Muon, as airbench94_muon trains its conv filters: momentum, then the update orthogonalised by a few Newton-Schulz
iterations, each filter bank flattened to a matrix and its weights normalised first.

Source: Keller Jordan's airbench94_muon.py (github.com/KellerJordan/cifar10-airbench, commit f1c599c, MIT licence),
`zeropower_via_newtonschulz5` and `Muon`; the same update here, with the iteration's dtype chosen by the hardware.
"""
from __future__ import annotations

import torch

from ..base import hardware

#: airbench94_muon's quintic a x + b x^3 + c x^5: the steepest slope at 0 (a = 3.4445) that still keeps every singular
#: value of a unit-norm matrix inside NS_BAND after NS_STEPS steps, not the slower iteration that converges to exactly 1
NS_COEFFICIENTS = (3.4445, -4.7750, 2.0315)
NS_STEPS = 3  # airbench94_muon's iteration count
NS_EPS = 1e-7  # added to the norm: an all-zero update stays zero instead of NaN
#: where 3 exact steps put every singular value s with s / ||G||_F >= NS_BAND_FROM (the quintic's map iterated on a
#: fine grid of [NS_BAND_FROM, 1]: 0.682 to 1.202); smaller ones grow by at most a^3 = 41x and may stay below the band
NS_BAND = (0.68, 1.21)
NS_BAND_FROM = 0.02


def iteration_dtype(device: torch.device | str) -> torch.dtype:
    """bf16 where `device` computes it natively (hardware's facts: a GPU of compute capability 8.0+, a CPU with
    AVX512_BF16 or AMX), else fp32 (a T4, most CPUs), where emulated bf16 products would be slower than fp32."""
    device = torch.device(device)
    if device.type == "cuda":
        native = bool(hardware.facts().get("bf16_native"))
    else:
        native = hardware.cpu_bf16_native()
    return torch.bfloat16 if native else torch.float32


def describe(dtype: torch.dtype) -> str:
    """One line naming the iteration's dtype and why, for a lesson or a report to print."""
    why = "native bf16 on this hardware" if dtype == torch.bfloat16 else "no native bf16 here: bf16 would be emulated"
    return f"Newton-Schulz iteration in {str(dtype).removeprefix('torch.')} ({why})"


def newton_schulz(g: torch.Tensor, steps: int = NS_STEPS, coefficients: tuple[float, float, float] = NS_COEFFICIENTS,
                  eps: float = NS_EPS, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Orthogonalise a matrix (m, n): U S V^T -> U S' V^T with S' in NS_BAND, computed in `dtype`, returned in it."""
    if g.ndim != 2:
        raise ValueError(f"newton_schulz takes a matrix (m, n), got shape {tuple(g.shape)}: flatten a conv filter "
                         f"bank first, g.reshape(len(g), -1).")
    a, b, c = coefficients
    x = g.to(dtype)
    x = x / (x.norm() + eps)  # Frobenius norm >= the top singular value, so all of them start in [0, 1]
    tall = g.size(0) > g.size(1)
    if tall:  # work on the wide side: X X^T is the smaller Gram matrix
        x = x.T
    for _ in range(steps):
        gram = x @ x.T  # (m, m)
        x = a * x + (b * gram + c * gram @ gram) @ x  # each singular value s -> a s + b s^3 + c s^5
    return x.T if tall else x


def newton_schulz_batched(g: torch.Tensor, steps: int = NS_STEPS,
                          coefficients: tuple[float, float, float] = NS_COEFFICIENTS, eps: float = NS_EPS,
                          dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """newton_schulz on a stack of matrices (k, m, n) at once, each normalised by its own norm: one batched matmul
    per product instead of k (hiverge's vectorised Muon). Zero padding stays zero, so padded banks are exact."""
    if g.ndim != 3:
        raise ValueError(f"newton_schulz_batched takes a stack of matrices (k, m, n), got shape {tuple(g.shape)}.")
    a, b, c = coefficients
    x = g.to(dtype)
    x = x / (x.norm(dim=(1, 2), keepdim=True) + eps)  # each matrix to unit Frobenius norm
    tall = g.size(1) > g.size(2)
    if tall:
        x = x.transpose(1, 2)
    for _ in range(steps):
        gram = x @ x.transpose(1, 2)  # (k, m, m)
        x = a * x + (b * gram + c * gram @ gram) @ x
    return x.transpose(1, 2) if tall else x


def pad_stack(mats: list[torch.Tensor]) -> torch.Tensor:
    """Matrices of different shapes (m_i, n_i) zero-padded into one (k, max m, max n) tensor."""
    m, n = max(t.size(0) for t in mats), max(t.size(1) for t in mats)
    return torch.stack([torch.nn.functional.pad(t, (0, n - t.size(1), 0, m - t.size(0))) for t in mats])


def normalize_due(step: int, last: int, total: int | None, every: tuple[int, float]) -> bool:
    """Rescale the filters at this step? every (base, growth): after base + int(growth x step / total) steps since the
    last rescale (hiverge's (2, 15): every 2 steps early, every 17 late); (1, 0): every step (airbench94_muon)."""
    base, growth = every
    return step - last >= base + int(growth * step / max(1, total or 1))


def flatten_filters(t: torch.Tensor) -> torch.Tensor:
    """A conv filter bank (out, in, kh, kw) as the matrix (out, in x kh x kw) it applies to each input patch."""
    return t.reshape(len(t), -1)


class Muon(torch.optim.Optimizer):
    """airbench94_muon's optimiser for every tensor of 2+ dimensions, and Nesterov SGD for the rest, in one optimiser
    (Lightning's automatic optimisation takes one; airbench94_muon steps two, Muon and SGD, in the same order).

    A group with orthogonalize=True (conv filters, any matrix): Nesterov momentum on the raw gradient, then the
    weights rescaled to Frobenius norm sqrt(out) (the whole bank, as airbench94_muon; an average filter norm of 1), then
    the step -lr x newton_schulz(flattened update): its size is fixed by the iteration, whatever the gradient's scale,
    so BatchNorm after the conv sees only the filters' direction. orthogonalize=False: torch.optim.SGD's Nesterov
    step with weight_decay (tests/test_muon.py checks both against references).

    Why not torch.optim.Muon: it takes 2-D parameters only (a conv bank would need a flattening wrapper), always
    iterates in bf16 (emulated, slower than fp32, on a T4 or a CPU without native bf16) and does not normalise the
    weights; the iteration itself is the same (test). dtype: the iteration's, default iteration_dtype(the parameter's
    device)."""

    def __init__(self, params, lr: float = 0.24, momentum: float = 0.6, nesterov: bool = True,
                 weight_decay: float = 0.0, orthogonalize: bool = True, normalize: bool = True,
                 ns_steps: int = NS_STEPS, dtype: torch.dtype | None = None,
                 coefficients: tuple[float, float, float] = NS_COEFFICIENTS, batched: bool = False,
                 normalize_every: tuple[int, float] = (1, 0.0), total_steps: int | None = None,
                 filter_decay: float = 0.0):
        if lr < 0 or momentum < 0 or weight_decay < 0 or ns_steps < 1 or (nesterov and momentum <= 0):
            raise ValueError(f"Need lr, momentum, weight_decay >= 0, ns_steps >= 1 and momentum > 0 for Nesterov; got "
                             f"lr={lr}, momentum={momentum}, weight_decay={weight_decay}, ns_steps={ns_steps}.")
        defaults = dict(lr=lr, momentum=momentum, nesterov=nesterov, weight_decay=weight_decay,
                        orthogonalize=orthogonalize, normalize=normalize, ns_steps=ns_steps, dtype=dtype,
                        coefficients=tuple(coefficients), batched=batched, normalize_every=tuple(normalize_every),
                        filter_decay=filter_decay)
        super().__init__(params, defaults)
        self.total_steps = total_steps  # normalize_every's progress is steps / total_steps
        for group in self.param_groups:
            if group["orthogonalize"] and (group["weight_decay"] or any(p.ndim < 2 for p in group["params"])):
                raise ValueError("An orthogonalize=True group takes tensors of 2+ dimensions (matrices, conv filters) "
                                 "and no weight_decay (normalize fixes their scale); put biases and vectors in an "
                                 "orthogonalize=False group.")

    @torch.no_grad()
    def step(self, closure=None):
        """One update of every parameter that has a gradient."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, momentum = group["lr"], group["momentum"]
            # the step count and last rescale live in the group, so a checkpoint (state_dict) keeps them
            group["steps"], last = group.get("steps", 0) + 1, group.get("last_normalized", 0)
            due = group["normalize"] and normalize_due(group["steps"], last, self.total_steps, group["normalize_every"])
            group["last_normalized"] = group["steps"] if due else last
            if group["orthogonalize"] and group["batched"]:
                self._batched_step(group, due)
                continue
            for p in group["params"]:
                if p.grad is None:  # frozen this step (the whitening bias after its epochs)
                    continue
                g = p.grad if not group["weight_decay"] else p.grad.add(p, alpha=group["weight_decay"])
                state = self.state[p]
                if "momentum_buffer" not in state:
                    state["momentum_buffer"] = torch.zeros_like(g)
                buf = state["momentum_buffer"]
                buf.mul_(momentum).add_(g)
                g = g.add(buf, alpha=momentum) if group["nesterov"] else buf
                if group["orthogonalize"]:
                    if due:
                        p.mul_(len(p) ** 0.5 / p.norm())
                    dtype = group["dtype"] or self._dtype(p.device)
                    g = newton_schulz(flatten_filters(g), steps=group["ns_steps"], coefficients=group["coefficients"],
                                      dtype=dtype).reshape(p.shape)
                p.add_(g.to(p.dtype), alpha=-lr)
                if group["orthogonalize"] and group["filter_decay"]:
                    p.mul_(1 - lr * group["filter_decay"])
        return loss

    def _batched_step(self, group: dict, due: bool) -> None:
        """hiverge's vectorised Muon: every filter bank's momentum and Newton-Schulz in one padded (k, m, n) stack,
        the weights rescaled only when normalize_due, a decoupled decay lr x filter_decay after the step."""
        params = [p for p in group["params"] if p.grad is not None]
        if not params:
            return
        state = self.state[params[0]]  # one stacked buffer for the group, kept with its first tensor
        grads = pad_stack([flatten_filters(p.grad) for p in params])  # (k, max out, max in x 3 x 3)
        if "stacked_momentum" not in state:
            state["stacked_momentum"] = torch.zeros_like(grads)
        buf = state["stacked_momentum"].mul_(group["momentum"]).add_(grads)
        g = grads.add(buf, alpha=group["momentum"]) if group["nesterov"] else buf
        dtype = group["dtype"] or self._dtype(params[0].device)
        g = newton_schulz_batched(g, steps=group["ns_steps"], coefficients=group["coefficients"], dtype=dtype)
        if due:
            for p in params:
                p.mul_(len(p) ** 0.5 / p.norm())
        for p, u in zip(params, g):  # each bank's own corner of the padded stack
            out, fan = len(p), p[0].numel()
            p.add_(u[:out, :fan].reshape(p.shape).to(p.dtype), alpha=-group["lr"])
            if group["filter_decay"]:
                p.mul_(1 - group["lr"] * group["filter_decay"])

    def _dtype(self, device: torch.device) -> torch.dtype:
        """iteration_dtype per device, read once (hardware facts are not free)."""
        cache = self.__dict__.setdefault("_dtypes", {})
        if device not in cache:
            cache[device] = iteration_dtype(device)
        return cache[device]


__all__ = ["NS_COEFFICIENTS", "NS_STEPS", "NS_EPS", "NS_BAND", "NS_BAND_FROM", "iteration_dtype", "describe",
           "newton_schulz", "newton_schulz_batched", "pad_stack", "normalize_due", "flatten_filters", "Muon"]
