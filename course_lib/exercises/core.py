"""The grading framework of the measured exercises: a Grading object that grades measured costs and mechanism
findings (and keeps what it graded), and the probes a mechanism check uses without a clock.

A measured exercise asks for the lesson's technique, written by the learner, and its check verifies two things:
the mechanism (what the code does, checked without a clock: e.g. no call to the library's finished version) and the
measurement (the learner's code and the baseline measured alternately in the same run on the same hardware, passing
at a target ratio). In a notebook it is two cells: `# EXERCISE <n>` holding the starter the learner edits and
`# CHECK <n>` that sets `passed`. Reference solutions live in notebooks/solutions/NN_topic.py (cells.py)."""
from __future__ import annotations

import contextlib
import math
import statistics
import sys
from dataclasses import dataclass, field
from typing import Callable

from torch.overrides import TorchFunctionMode

from ..measure import verdict


@dataclass(frozen=True)
class Grade:
    """One grade() of measured costs: the ratio of medians (baseline / yours) against its target, and how firmly."""

    name: str
    ratio: float  # median(base) / median(mine)
    mine: float  # the median of the learner's costs
    low: float  # the lowest and highest per-round ratio
    high: float
    rounds: int
    past: int  # rounds whose own ratio reaches the target
    target: float
    passed: bool
    what: str  # what was measured, e.g. "time"
    hardware: str | None


@dataclass
class Grading:
    """How the checks grade, and what they graded: every grade() as a Grade in `grades`. time_failing=True lets a
    check time code whose mechanism fails (how scripts/exercise_margins.py times starters). Each check takes one
    (keyword `grading`) and makes a fresh one when given none: nothing is kept between checks unless the caller
    holds it."""
    time_failing: bool = False
    grades: list[Grade] = field(default_factory=list)

    def grade(self, name: str, base: list[float], mine: list[float], target: float, *, what: str = "time",
              hardware: str | None = None) -> bool:
        """Grade measured costs (lower is better; one per alternating round): passes when median(base) /
        median(mine) reaches `target`. verdict.against decides: that ratio of medians decides, and the count of
        rounds whose own ratio reaches the target shows how firmly; some but not all past it means the rounds
        straddle the target (a noisy machine: a re-run may differ). No clock here: tests inject the costs."""
        if not base or len(base) != len(mine):
            raise ValueError(f"{name}: need one baseline and one learner cost per round, got {len(base)} and "
                             f"{len(mine)}.")
        if min(mine) <= 0 or min(base) <= 0:
            raise ValueError(f"{name}: every {what} must be positive, got baseline {base}, yours {mine}.")
        ratio = statistics.median(base) / statistics.median(mine)
        got = verdict.against([b / m for b, m in zip(base, mine)], target, value=ratio)
        self.grades.append(Grade(name, ratio, statistics.median(mine), got.low, got.high, got.rounds, got.past, target,
                                 got.met, what, hardware))
        where = f" on {hardware}" if hardware else ""
        print(f"{name}: {'passed' if got.met else 'not yet'} ({what}: baseline / yours = {ratio:.2f}x, target >= "
              f"{target:g}x)")
        print(f"  {got.past} of {got.rounds} rounds past the target; per round {got.low:.2f}-{got.high:.2f}x{where}"
              if got.rounds > 1 else f"  measured once{where}")  # one round: a count, the same every time
        if got.straddles:
            print("  the rounds straddle the target (a busy machine?): re-run to confirm")
        return got.met

    def ratio_check(self, name: str, learner: Callable[[], float], baseline: Callable[[], float], target: float, *,
                    repeats: int = 3, what: str = "time", hardware: str | None = None) -> bool:
        """Measure baseline() and learner() alternately `repeats` times (each returns a cost, lower is better) and
        grade the medians; never raises for a miss (a notebook cell keeps running)."""
        if repeats < 1:
            raise ValueError(f"repeats must be at least 1, got {repeats}.")
        base, mine = [], []
        for _ in range(repeats):  # alternating rounds: a slow spell of the machine hits both sides alike
            base.append(float(baseline()))
            mine.append(float(learner()))
        return self.grade(name, base, mine, target, what=what, hardware=hardware)

    def mechanism(self, name: str, problems: list[str]) -> bool:
        """Print the mechanism verdict (no clock involved): each problem (its lines after the first, what to do,
        indented), or that the code does the lesson's work; True when the measurement may follow (no problem, or
        time_failing)."""
        for p in problems:  # a problem's first line, then its further lines (what to do) indented under it
            print(f"{name} (mechanism): " + p.replace("\n", "\n  "))
        if not problems:
            print(f"{name} (mechanism): passed")
            return True
        print(f"{name}: not yet (the speed is measured once the mechanism passes)")
        if self.time_failing:
            print(f"{name}: timed anyway (Grading(time_failing=True): a starter's speed for the margins table)")
        return self.time_failing


@contextlib.contextmanager
def forbidden(*functions: Callable):
    """While active, record every call of the given Python functions, however the caller reached them (a module
    attribute, a name imported into a notebook, a method); yields the list of their names as called. A check fails
    when the learner's code called the library's finished version of the lesson's technique.

    A profile hook (sys.setprofile) watches the functions' code objects: it sees a call through any name, which
    patching a module attribute does not, at the cost of one Python call per function call, whereas
    torch.profiler's Python tracer records every frame with its stack (heavier) and sys.monitoring needs Python 3.12.
    The hook lives only inside this block, on this thread; it passes each event on to the hook that was there before
    (an enclosing forbidden(), a profiler) and restores it on exit."""
    codes = {f.__code__: f.__qualname__ for f in functions if hasattr(f, "__code__")}
    called: list[str] = []
    previous = sys.getprofile()
    chained = previous if callable(previous) else None  # a Python hook; a C profiler's object is not called here

    def watch(frame, event, arg):
        if event == "call" and frame.f_code in codes:
            called.append(codes[frame.f_code])
        if chained is not None:
            chained(frame, event, arg)

    sys.setprofile(watch)
    try:
        yield called
    finally:
        sys.setprofile(previous)


class _CountCalls(TorchFunctionMode):
    """Counts the torch functions and tensor methods called while active."""

    def __init__(self):
        super().__init__()
        self.n = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.n += 1
        return func(*args, **(kwargs or {}))


def torch_calls(fn: Callable, *args) -> int:
    """How many torch functions and tensor methods fn(*args) calls (torch.overrides.TorchFunctionMode; no clock)."""
    with _CountCalls() as count:
        fn(*args)
    return count.n


MODEL_FACTOR = 2.0  # the step model's own target (issue 43): a prediction within 2x of the measured time


def prediction_tolerance(ceil, names: tuple[str, ...] = ("matmul fp32", "memory", "per op")) -> float:
    """How far a prediction from the ceilings may miss its measurement: the model's own factor (MODEL_FACTOR) times
    the widest spread (slowest / fastest block) of the ceilings it rests on, so a noisier machine allows more."""
    spreads = [max(c.values) / min(c.values) for n, c in ceil.rows.items() if n in names]
    return MODEL_FACTOR * max(spreads, default=1.0)


def grade_prediction(name: str, predicted, measured: float, tolerance: float, what: str = "speed-up",
                     shown: Callable[[float], str] = lambda v: f"{v:.3g}x") -> bool:
    """The learner's prediction against their own measurement: passes within `tolerance` either way (no clock).
    shown: how a value prints (a speed-up as '3.1x'; timing.duration for seconds)."""
    ok = isinstance(predicted, (int, float)) and not isinstance(predicted, bool) and math.isfinite(predicted) \
        and predicted > 0
    if not ok:
        print(f"{name} (prediction): write your predicted {what} as a positive number before you measure; got "
              f"{predicted!r}")
        return False
    ratio = max(predicted / measured, measured / predicted)
    passed = ratio <= tolerance
    print(f"{name} (prediction): {'passed' if passed else 'not yet'}: predicted {shown(predicted)}, measured "
          f"{shown(measured)} ({ratio:.2f}x apart, tolerance {tolerance:.2f}x)")
    return passed

