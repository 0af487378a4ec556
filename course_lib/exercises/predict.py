"""Lesson 00's exercise: predict an op's time from its work and this machine's ceilings, then measure it. Graded
within core.prediction_tolerance over the ceilings the prediction rests on, as every exercise's prediction is."""
from __future__ import annotations

import math
import statistics
from typing import Callable

import torch

from ..measure import ceilings, timing, verdict
from ..measure.roofline import bound, count, ops
from .core import prediction_tolerance

#: the ceilings the exercise rests on: its products (matmul or convolution, the faster), the add into a new output,
#: the fixed cost per op
PREDICTION_CEILINGS = ("matmul fp32", "conv fp32", "add fresh", "per op")


def grade_00(cases: dict[str, tuple[float, float]], factor: float, name: str = "Exercise 3") -> bool:
    """cases: {op: (predicted s, measured s)}. Passes when every prediction is within `factor` of its measured time,
    either way; prints each. No clock here: tests inject the times."""
    passed = True
    for op, (pred, meas) in cases.items():
        ok = pred is not None and isinstance(pred, (int, float)) and math.isfinite(pred) and pred > 0
        ratio = pred / meas if ok else float("nan")
        within = ok and 1 / factor <= ratio <= factor
        passed &= within
        shown = timing.duration(pred) if ok else repr(pred)
        print(f"{name}, {op}: predicted {shown}, measured {timing.duration(meas)}"
              + (f" ({verdict.number(ratio)}x)" if ok else " (not a positive number of seconds)")
              + (" ok" if within else f" outside {factor:.2f}x"))
    print(f"{name}: {'passed' if passed else 'not yet'} (every prediction within {factor:.2f}x of the measured time)")
    return passed


def factor_00(ceil: ceilings.Ceilings) -> float:
    """The exercise's tolerance: core.prediction_tolerance over PREDICTION_CEILINGS (2x on steady ceilings)."""
    return prediction_tolerance(ceil, PREDICTION_CEILINGS)


def cases_00(device: str = "cpu") -> dict[str, Callable[[], object]]:
    """Three ops, one per regime, each writing a new output, at every run size (a smaller matmul would measure a busy
    machine's thread wake-ups): a matmul, an add of 64 MiB operands and a loop of tiny multiplies."""
    n, elements = 1024 if device == "cpu" else 4096, 2**24
    a, b = torch.randn(n, n, device=device), torch.randn(n, n, device=device)
    x, y = torch.randn(elements, device=device), torch.randn(elements, device=device)
    tiny = torch.zeros(ceilings.TINY_ELEMENTS, device=device)

    def tiny_loop():
        z = tiny
        for _ in range(50):
            z = z * 1.01
    return {f"{n}x{n} fp32 matmul": lambda: a @ b, f"add of {elements:,} floats": lambda: x + y,
            "50 tiny multiplies": tiny_loop}


def check_00_prediction(predict: Callable, ceil: ceilings.Ceilings, factor: float | None = None) -> bool:
    """Lesson 00: predict(flops, bytes, ops, ceil) -> seconds for each of cases_00, graded against its measured
    median (timing.time_calls) within `factor` (None: factor_00(ceil)). Prints afterwards the time each ceiling
    alone allows (bytes at the fresh-output add's rate), so that a miss names the ceiling it should have used; all
    predictions None (not attempted): measures nothing and prints neither."""
    factor = factor or factor_00(ceil)
    cases, alone = {}, {}
    counted = {op: (fn, count(fn)) for op, fn in cases_00(ceil.device).items()}
    predicted = {op: predict(c.flops, c.bytes, c.n_ops, ceil) for op, (_, c) in counted.items()}
    if all(p is None for p in predicted.values()):  # not attempted: no measured times or ceilings to give it away
        print("Exercise 3: not attempted yet. Write predict_seconds above and re-run.")
        return False
    for op, (fn, c) in counted.items():
        b = bound(c.flops, c.bytes, c.n_ops, rate=ceil.rate(), bandwidth=ceil.elementwise(3, fresh=True),
                  per_op=ceil.per_op)
        alone[op] = (f"  {op}: {c.flops:,} FLOP, {c.bytes:,} bytes, {ops(c.n_ops)}; "
                     + ", ".join(f"{k} {timing.duration(s)}" for k, s in b.seconds.items()))
        measured = statistics.median(timing.time_calls(fn, min_run_time=ceilings.SECONDS[ceil.size]))
        cases[op] = (predicted[op], measured)
    passed = grade_00(cases, factor)
    print("each ceiling alone (bytes at the rate of an add into a new output):", *alone.values(), sep="\n")
    return passed
