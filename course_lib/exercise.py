"""Exercises: the grading framework of the measured exercises (each lesson's checks: 01-02, the loop and the
Trainer, in exercise_training.py; 03 and 08, the data path, in exercise_data.py; 04-07, whose levers are the
hardware's, in exercise_hardware.py; the warm-ups' answers in warmups.py).

A measured exercise asks for the lesson's technique, written by the learner, and its check verifies two things:
the mechanism (what the code does, checked without a clock: e.g. no call to the library's finished version) and the
measurement (the learner's code and the baseline measured alternately in the same run on the same hardware, passing
at a target ratio). In a notebook it is two cells: `# EXERCISE <n>` holding the starter the learner edits and
`# CHECK <n>` that sets `passed`. Reference solutions live in notebooks/solutions/NN_topic.py."""
from __future__ import annotations

import contextlib
import json
import re
import runpy
import statistics
from pathlib import Path
from typing import Callable

from . import verdict

MARK = re.compile(r"^# (EXERCISE|CHECK) (\d+)\b")  # the first line of an exercise's starter and check cells
_RECORDINGS: list[dict] = []  # the open recording() contexts, innermost last (empty outside scripts/tests)


def grade(name: str, base: list[float], mine: list[float], target: float, what: str = "time",
          hardware: str | None = None) -> bool:
    """Grade measured costs (lower is better; one per alternating round): passes when median(base) / median(mine)
    reaches `target`. As verdict.target reports a target, the median decides and the count of rounds whose own
    ratio reaches the target shows how firmly; some but not all past it means the rounds straddle the target (a
    noisy machine: a re-run may differ). No clock here: tests inject the costs."""
    if not base or len(base) != len(mine):
        raise ValueError(f"{name}: need one baseline and one learner cost per round, got {len(base)} and {len(mine)}.")
    if min(mine) <= 0 or min(base) <= 0:
        raise ValueError(f"{name}: every {what} must be positive, got baseline {base}, yours {mine}.")
    ratio = statistics.median(base) / statistics.median(mine)
    rounds = sorted(b / m for b, m in zip(base, mine))
    passed, firm = ratio >= target, verdict.past(rounds, target)
    for rec in _RECORDINGS:
        rec["grades"].append({"name": name, "ratio": ratio, "low": rounds[0], "high": rounds[-1], "rounds": len(base),
                              "past": firm, "target": target, "passed": passed, "what": what, "hardware": hardware})
    where = f" on {hardware}" if hardware else ""
    slower = f"; yours is {verdict.factor(ratio)} than the baseline" if ratio < 1 else ""
    print(f"{name}: the baseline's {what} / yours = {ratio:.2f}x{where} (target >= {target:g}x; per round "
          f"{rounds[0]:.2f}-{rounds[-1]:.2f}x, {firm} of {len(base)} rounds at or past the target): "
          f"{'passed' if passed else 'not yet'}{slower}"
          + ("; the rounds straddle the target (a busy machine?): re-run to confirm" if 0 < firm < len(base) else ""))
    return passed


def ratio_check(name: str, learner: Callable[[], float], baseline: Callable[[], float], target: float,
                repeats: int = 3, what: str = "time", hardware: str | None = None) -> bool:
    """Measure baseline() and learner() alternately `repeats` times (each returns a cost, lower is better) and
    grade the medians; never raises for a miss (a notebook cell keeps running)."""
    if repeats < 1:
        raise ValueError(f"repeats must be at least 1, got {repeats}.")
    base, mine = [], []
    for _ in range(repeats):  # alternating rounds: a slow spell of the machine hits both sides alike
        base.append(float(baseline()))
        mine.append(float(learner()))
    return grade(name, base, mine, target, what, hardware)


@contextlib.contextmanager
def forbidden(*functions: Callable):
    """While active, record every call of the given Python functions, however the caller reached them (a module
    attribute, a name imported into a notebook, a method); yields the list of their names as called. A check fails
    when the learner's code called the library's finished version of the lesson's technique."""
    import sys

    codes = {f.__code__: f.__qualname__ for f in functions if hasattr(f, "__code__")}
    called: list[str] = []
    previous = sys.getprofile()

    def watch(frame, event, arg):
        if event == "call" and frame.f_code in codes:
            called.append(codes[frame.f_code])

    sys.setprofile(watch)
    try:
        yield called
    finally:
        sys.setprofile(previous)


def torch_calls(fn: Callable, *args) -> int:
    """How many torch functions and tensor methods fn(*args) calls (torch.overrides.TorchFunctionMode; no clock)."""
    from torch.overrides import TorchFunctionMode

    class Count(TorchFunctionMode):
        n = 0

        def __torch_function__(self, func, types, args=(), kwargs=None):
            Count.n += 1
            return func(*args, **(kwargs or {}))

    with Count():
        fn(*args)
    return Count.n


def mechanism(name: str, problems: list[str]) -> bool:
    """Print the mechanism verdict (no clock involved): each problem, or that the code does the lesson's work."""
    for p in problems:
        print(f"{name} (mechanism): {p}")
    if problems:
        print(f"{name}: not yet (the speed is measured once the mechanism passes)")
    if not problems:
        print(f"{name} (mechanism): passed")
    if problems and any(rec["time_failing"] for rec in _RECORDINGS):
        print(f"{name}: timed anyway (recording(time_failing=True): a starter's speed for the margins table)")
        return True
    return not problems


@contextlib.contextmanager
def recording(time_failing: bool = False):
    """While active, collect every grade() as a dict (name, ratio, low, high, rounds, past, target, passed, what,
    hardware); time_failing=True lets a check time code whose mechanism fails (how scripts/exercise_margins.py times
    starters)."""
    rec = {"grades": [], "time_failing": time_failing}
    _RECORDINGS.append(rec)
    try:
        yield rec["grades"]
    finally:
        _RECORDINGS.remove(rec)


def notebooks_folder() -> Path:
    """The checkout's notebooks/ (lessons, and solutions/ with the reference solutions)."""
    from . import config

    root = config.repo_root()
    if root is None or not (root / "notebooks" / "solutions").is_dir():
        raise FileNotFoundError("the lessons' exercise cells and solutions are read from a checkout of the course "
                                "repository (notebooks/solutions/): run this from a git clone")
    return root / "notebooks"


def exercise_cells(path: Path) -> dict[str, dict[str, str]]:
    """{exercise number: {"EXERCISE": starter source, "CHECK": check source}} of one lesson notebook."""
    found: dict[str, dict[str, str]] = {}
    for cell in json.loads(Path(path).read_text())["cells"]:
        src = "".join(cell["source"])
        m = MARK.match(src) if cell["cell_type"] == "code" else None
        if m:
            found.setdefault(m.group(2), {})[m.group(1)] = src
    return found


def starter(lesson: str, number: int) -> dict:
    """The namespace of lesson `lesson`'s (e.g. "02") EXERCISE `number` cell, run as the learner first sees it."""
    path = next(notebooks_folder().glob(f"{lesson[:2]}_*.ipynb"))
    src = exercise_cells(path)[str(number)]["EXERCISE"]
    ns: dict = {}
    exec(compile(src, f"<{path.stem} EXERCISE {number}>", "exec"), ns)
    return ns


def solution(lesson: str) -> dict:
    """The namespace of the reference solution notebooks/solutions/NN_topic.py of lesson `lesson` (e.g. "02")."""
    return runpy.run_path(str(next((notebooks_folder() / "solutions").glob(f"{lesson[:2]}_*.py"))))
