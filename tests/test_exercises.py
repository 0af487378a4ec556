"""Every measured exercise: its check fails with the lesson's unchanged starter code and passes with the reference
solution in notebooks/solutions/, both at the size the tests run (smoke in `make test`)."""
from __future__ import annotations

import json
import re
import runpy
from pathlib import Path

import pytest

from course_lib import exercise

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
MARK = re.compile(r"^# (EXERCISE|CHECK) (\d+)\b")


def exercise_cells(path: Path) -> dict[str, dict[str, str]]:
    """{exercise number: {"EXERCISE": starter source, "CHECK": check source}} of one lesson."""
    found: dict[str, dict[str, str]] = {}
    for cell in json.loads(path.read_text())["cells"]:
        src = "".join(cell["source"])
        m = MARK.match(src) if cell["cell_type"] == "code" else None
        if m:
            found.setdefault(m.group(2), {})[m.group(1)] = src
    return found


CASES = [(p, n) for p in sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb")) for n in exercise_cells(p)]


def run_check(check_src: str, namespace: dict) -> bool:
    """Run a CHECK cell in the namespace holding the learner's (or the solution's) code; its `passed` value."""
    ns = dict(namespace)
    exec(compile(check_src, "<check cell>", "exec"), ns)
    assert isinstance(ns.get("passed"), bool), "a CHECK cell must set `passed` to the check's True/False"
    return ns["passed"]


@pytest.mark.parametrize("path, number", CASES, ids=[f"{p.stem[:2]}-{n}" for p, n in CASES])
def test_check_fails_on_the_starter_and_passes_on_the_solution(path, number):
    """The starter cell as committed does not reach the target; the reference solution does."""
    cells = exercise_cells(path)[number]
    assert set(cells) == {"EXERCISE", "CHECK"}, f"{path.name} exercise {number} needs an EXERCISE and a CHECK cell"
    assert "solutions" not in cells["CHECK"], "the check cell must load the learner's code, never the solution"
    starter: dict = {}
    exec(compile(cells["EXERCISE"], "<starter cell>", "exec"), starter)
    assert run_check(cells["CHECK"], starter) is False
    solution = runpy.run_path(str(NOTEBOOKS / "solutions" / f"{path.stem}.py"))
    assert run_check(cells["CHECK"], solution) is True


def test_lessons_keep_their_measured_exercises():
    """Lessons 01-08 each carry at least one EXERCISE/CHECK pair with a solution file."""
    lessons = {p.stem for p, _ in CASES}
    expected = {p.stem for p in NOTEBOOKS.glob("0[1-8]_*.ipynb")}
    assert lessons >= expected, f"missing: {sorted(expected - lessons)}"
    for stem in lessons:
        assert (NOTEBOOKS / "solutions" / f"{stem}.py").exists(), stem


def test_ratio_check_passes_at_the_target_and_not_below(capsys):
    """The ratio of medians decides; the verdict line names the target and the per-round spread."""
    costs = iter([4.0, 1.0, 4.0, 2.0, 4.0, 1.0])  # baseline, learner, ... : medians 4 and 1
    assert exercise.ratio_check("Ex", lambda: next(costs), lambda: next(costs), target=3.0) is True
    out = capsys.readouterr().out
    assert "4.00x" in out and "target >= 3x" in out and "2.00-4.00x" in out and "passed" in out
    assert exercise.ratio_check("Ex", lambda: 1.0, lambda: 2.0, target=3.0, repeats=2) is False
    assert "not yet" in capsys.readouterr().out
