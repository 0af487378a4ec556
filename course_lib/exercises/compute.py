"""Measured exercises of one device's compute: activation memory (lesson 04: saved-for-backward bytes counted, not
timed) and kernel fusion (lesson 05: one compiled graph, timed against the eager starter). Graded as core.py
grades."""
from __future__ import annotations

import copy
import statistics
from dataclasses import dataclass, field
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from ..base import hardware
from ..benchmark import bench
from ..measure import timing, verdict
from ..training import models
from .core import Grading, grade_prediction, prediction_tolerance

# ---- lesson 04: fewer bytes saved for backward, the same gradients -----------------------------------------------
EX04_MAX_GRAD_ERROR = 0.05  # relative; fp32 checkpointing: ~1e-6; micro-batches in training mode: ~1
EX04_TARGET = 4.0  # fewer saved bytes than the plain step; section 5's per-block checkpointing reaches about 3x


def plain_train_step(net, x, y) -> None:
    """The starter of lesson 04's exercise: one forward and backward over the whole batch."""
    F.cross_entropy(net(x), y).backward()


@dataclass
class _Side:
    """One side of lesson 04's comparison: its own copy of the net, its step, and what its steps cost."""
    net: nn.Module
    step: Callable
    seconds: list[float] = field(default_factory=list)  # one figure per timed round (times())
    peak_mib: float = 0.0  # CUDA peak memory of its counted step

    def run(self, x, y) -> None:
        """One step from zeroed gradients (each timed step does the same work)."""
        self.net.zero_grad(set_to_none=True)
        self.step(self.net, x, y)

    def saved_bytes(self, x, y) -> int:
        """Saved-for-backward bytes of one step (no clock: a count); on CUDA its peak memory is recorded too."""
        if x.is_cuda:
            torch.cuda.reset_peak_memory_stats()  # the allocator counts on the host: no synchronize needed for it
        held = bench.saved_bytes_peak(lambda: self.run(x, y))
        if x.is_cuda:
            self.peak_mib = torch.cuda.max_memory_allocated() / 2**20
        return max(held, 1)


EX04_ROUNDS = 6  # alternating timed rounds: the fewest the sign test can call a difference from


def _04_times(base: _Side, mine: _Side, x, y, rounds: int = EX04_ROUNDS, min_run_time: float = 0.1) -> None:
    """Both sides' seconds per step: one untimed step each first (allocations, kernel choice), then `rounds` rounds,
    each side a few blocks of steps (timing.time_calls; the round's median block), which side goes first swapping
    every round, so a slow spell of the machine hits both alike."""
    for side in (base, mine):
        side.run(x, y)
    for r in range(rounds):
        for side in ((base, mine) if r % 2 == 0 else (mine, base)):
            blocks = timing.time_calls(lambda side=side: side.run(x, y), min_run_time=min_run_time)
            side.seconds.append(statistics.median(blocks))


def _04_gradient_error(base: _Side, mine: _Side) -> float | None:
    """The largest relative difference between the two sides' gradients; None if the learner left one unset."""
    grads = [(a.grad, b.grad) for a, b in zip(base.net.parameters(), mine.net.parameters())]
    if any(b is None for _, b in grads):
        return None
    return max(((b - a).norm() / a.norm().clamp_min(1e-12)).item() for a, b in grads)


def _04_report(base: _Side, mine: _Side, *, batch: int, err: float) -> None:
    """Print the gradients' agreement and, on CUDA, the peak memory of both sides."""
    print(f"  batch {batch}: gradients match the plain step's to {err:.1e} (relative, limit {EX04_MAX_GRAD_ERROR}): "
          f"{'same effective batch' if err <= EX04_MAX_GRAD_ERROR else 'NOT the same gradients'}")
    if hardware.gpu_count():
        print(f"  CUDA peak memory (torch.cuda.max_memory_allocated): {base.peak_mib:,.0f} MiB -> "
              f"{mine.peak_mib:,.0f} MiB")
    else:
        print("  no GPU: the bytes are what autograd saved for backward, counted by saved_tensors_hooks\n"
              "  (not the process's whole memory)")


def _04_time_ratio(plain_s: list[float], mine_s: list[float]) -> float:
    """Your step's time over the plain one's, the median of the paired rounds' ratios (verdict.interval's mid), with
    the verdict and both medians printed."""
    print(f"  time per step {timing.duration(statistics.median(plain_s))} -> "
          f"{timing.duration(statistics.median(mine_s))}, {len(plain_s)} alternating rounds\n  "
          + verdict.compare(mine_s, plain_s, "your step", "the plain step", higher_is_better=False, paired=True))
    return verdict.interval(mine_s, plain_s, paired=True).mid


def check_04_activation_memory(train_step: Callable, predict_time_ratio: Callable | None = None, *,
                               batch_size: int | None = None, target: float = EX04_TARGET, ceil=None,
                               times: tuple[list, list] | None = None, grading: Grading | None = None) -> bool:
    """Lesson 04: train_step(net, x, y) must hold >= `target`x fewer saved-for-backward bytes than a plain step on
    the same batch of a ResNet-9 in training mode, with the same gradients; predict_time_ratio(ceil), written first
    from the ceilings, is the learner's predicted time of their step over the plain one, graded against the measured
    ratio (alternating rounds, _04_times) within core.prediction_tolerance(ceil). times: injected (plain, yours)
    seconds per step, one per round (tests: no clock)."""
    grading = grading or Grading()
    cuda = hardware.gpu_count() > 0
    device = "cuda" if cuda else "cpu"
    batch = batch_size or (256 if cuda else 32)
    torch.manual_seed(0)
    # (B, 3, 32, 32) -> (B, 10); training mode: BatchNorm normalises with the batch's own statistics, so micro-batches
    # (section 5's accumulation) change the gradients, and per-block checkpointing (section 5) saves about 3x: the
    # target asks for a variant the lesson does not show
    net = models.ResNet9(width=64 if cuda else 8).to(device).train()
    x = torch.randn(batch, 3, 32, 32, device=device)
    y = torch.randint(0, 10, (batch,), device=device)
    base, mine = _Side(net, plain_train_step), _Side(copy.deepcopy(net), train_step)
    passed = grading.ratio_check("Exercise 1 (activation memory)", lambda: mine.saved_bytes(x, y),
                                 lambda: base.saved_bytes(x, y), target, repeats=1, what="saved-for-backward bytes",
                                 hardware=hardware.label())  # a count, the same every time: one pass
    err = _04_gradient_error(base, mine)
    if err is None:
        print("  the learner's step left some parameters without a gradient: it must train the whole net")
        return False
    _04_report(base, mine, batch=batch, err=err)
    if not (passed and err <= EX04_MAX_GRAD_ERROR):
        return False
    from ..measure import ceilings

    ceil = ceil or ceilings.load(device, verbose=False)
    if times is None:
        _04_times(base, mine, x, y)
    measured = _04_time_ratio(*(times or (base.seconds, mine.seconds)))
    predicted = predict_time_ratio(ceil) if predict_time_ratio else None
    return grade_prediction("Exercise 1", predicted, measured, prediction_tolerance(ceil), "time ratio")


# ---- lesson 05: one graph, fused --------------------------------------------------------------------------------
CLIP = 4.0  # lesson 05's exercise clips the normalised values at 4 standard deviations
EX05_TOLERANCE = 1e-3  # y's absolute and relative tolerance, and peak's relative one, against the eager starter


def eager_chain(x):
    """The starter of lesson 05's exercise: row normalisation, a clip decided on the host, scale and shift, tanh
    GELU; returns (y, the largest |z| before clipping as a float). Under torch.compile it breaks the graph twice."""
    mean = x.mean(dim=-1, keepdim=True)
    centred = x - mean
    var = (centred * centred).mean(dim=-1, keepdim=True)
    z = centred * torch.rsqrt(var + 1e-5)
    peak = z.abs().max().item()  # read back to the host: a sync, and a graph break
    if peak > CLIP:  # a Python branch on a tensor's value: Dynamo cannot trace past it either
        z = z.clamp(-CLIP, CLIP)
    z = z * 1.5 + 0.1  # scale and shift
    return 0.5 * z * (1.0 + torch.tanh(0.7978845608 * (z + 0.044715 * z * z * z))), peak  # tanh GELU


def inputs_05() -> torch.Tensor:
    """The check's (rows, 2048) float32 input on the device: seeded, wide enough that some |z| exceed CLIP."""
    device = "cuda" if hardware.gpu_count() else "cpu"
    torch.manual_seed(0)
    return torch.randn(4096 if device == "cuda" else 512, 2048, device=device) * 2


def mechanism_05(compiled: Callable, x: torch.Tensor, *, grading: Grading) -> bool:
    """No clock: the compiled function's first call traces as one graph (fullgraph) and matches the eager starter."""
    watch = timing.Stopwatch(x.device).start()
    try:
        y, peak = compiled(x)
        first_call_s = watch.stop()
        error = None
    except Exception as err:  # Dynamo's own message is written for PyTorch's developers: say what it means
        data_dependent = any(w in str(err) for w in ("data-dependent", "data dependent", "item()", "unhinted"))
        error = "Python branches on a value read back from the device" if data_dependent else type(err).__name__
    problems = []
    if error is not None:
        problems.append(f"torch.compile(fullgraph=True) could not trace it as one graph\nwhy: {error}\nkeep the "
                        f"values on the device (a 0-d tensor, not .item()) and replace the Python branch by tensor ops")
    else:
        print(f"Exercise 1: compiled as one graph; first call (compile) took {first_call_s:.1f} s")
        ref, ref_peak = eager_chain(x)
        tol = EX05_TOLERANCE
        if not (torch.allclose(y, ref, atol=tol, rtol=tol) and abs(float(peak) - ref_peak) <= tol * ref_peak):
            problems.append("the results differ from the starter's: it must compute the same y and the same peak")
    return grading.mechanism("Exercise 1", problems)


def check_05_fusion(fn: Callable, predict_speedup: Callable | None = None, *, target: float = 1.3,
                    measure: bool = True, ceil=None, timer: Callable | None = None,
                    grading: Grading | None = None) -> bool:
    """Lesson 05: the check compiles fn itself with torch.compile(fullgraph=True); fn(x) -> (y, peak) must compile
    as one graph (no graph break, no host read-back) and match the eager starter (y within 1e-3, float(peak));
    compiled, it must take >= `target`x less time than the eager starter, timed after the compile, and
    predict_speedup(ceil, x), written first from the ceilings, must land within core.prediction_tolerance(ceil) of
    that measured speed-up. timer(f) -> seconds of one call of f(x) (tests inject one)."""
    grading, x = grading or Grading(), inputs_05()
    torch.compiler.reset()  # a clean slate: earlier compiles in this process do not count
    compiled = torch.compile(fn, fullgraph=True)  # fullgraph: a graph break is an error, not a silent split
    ok = mechanism_05(compiled, x, grading=grading)
    if not (ok and measure):
        return ok

    def cost(f) -> float:
        """Seconds per call of f's fastest block of calls (a busy machine only ever adds time)."""
        return timer(f) if timer else min(timing.time_calls(lambda: f(x)))

    fast = grading.ratio_check("Exercise 1 (fusion)", lambda: cost(compiled), lambda: cost(eager_chain), target,
                               repeats=3, what="time", hardware=hardware.label())
    from ..measure import ceilings

    ceil = ceil or ceilings.load(x.device.type, verbose=False)
    predicted = predict_speedup(ceil, x) if predict_speedup else None
    told = grade_prediction("Exercise 1", predicted, grading.grades[-1].ratio, prediction_tolerance(ceil))
    return bool(ok and fast and told)
