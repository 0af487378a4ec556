"""Exercises: warm-ups that compare an answer with what the lesson computed, and speed or memory exercises graded
by measurement, where the learner's code and the baseline are measured alternately in the same run on the same
hardware, and the check passes when the learner reaches a target ratio.

A lesson's speed exercise is two cells: one that starts with `# EXERCISE <n>` holding the starter code the learner
edits, and one that starts with `# CHECK <n>` that sets `passed` from a check function below. Reference solutions
live in notebooks/solutions/NN_topic.py; tests/test_exercises.py runs every check with the starter (it must fail)
and with the solution (it must pass)."""
from __future__ import annotations

import math
import statistics
from typing import Callable


def check(name: str, answer, expected, rel_tol: float = 0.05) -> bool | None:
    """Warm-up: compare a learner's answer with the expected value; None means not attempted yet (no error)."""
    if answer is None:
        print(f"{name}: not attempted yet. Replace the None above with your answer and re-run.")
        return None
    if isinstance(expected, (int, float)) and not isinstance(expected, bool):
        ok = math.isclose(float(answer), float(expected), rel_tol=rel_tol)
    else:
        ok = answer == expected
    if not ok:
        raise AssertionError(f"{name}: {answer!r} is not right yet (hint: it should be close to what the lesson "
                             f"measured or computed). Try again.")
    print(f"{name}: correct.")
    return True


def ratio_check(name: str, learner: Callable[[], float], baseline: Callable[[], float], target: float,
                repeats: int = 3, what: str = "time", hardware: str | None = None) -> bool:
    """Measure baseline() and learner() alternately `repeats` times; each returns a cost (seconds, bytes, ...;
    lower is better). Passes when median(baseline) / median(learner) reaches `target`; prints the verdict with the
    spread of the per-round ratios, and never raises for a miss (a notebook cell keeps running)."""
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}.")
    base, mine = [], []
    for _ in range(repeats):  # alternating rounds: a slow spell of the machine hits both sides alike
        base.append(float(baseline()))
        mine.append(float(learner()))
    if min(mine) <= 0:
        raise ValueError(f"{name}: the learner's {what} must be positive, got {mine}.")
    ratio = statistics.median(base) / statistics.median(mine)
    rounds = sorted(b / m for b, m in zip(base, mine))
    passed = ratio >= target
    where = f" on {hardware}" if hardware else ""
    print(f"{name}: {ratio:.2f}x less {what} than the baseline{where} (target >= {target:g}x; per round "
          f"{rounds[0]:.2f}-{rounds[-1]:.2f}x, {repeats} rounds): {'passed' if passed else 'not yet'}")
    return passed
