"""Every line an exercise check prints fits in 120 characters (verdict.LONGEST), read at a glance: the grading lines
called with worst-case injected inputs (a long hardware name, 5-digit figures, several problems), and every message
template in course_lib/exercises rendered with worst-case values, including those only a wrong answer prints. No
clock, no training."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from course_lib.exercises import Grading, core
from course_lib.measure import timing, verdict

EXERCISES = sorted((Path(__file__).resolve().parents[1] / "course_lib" / "exercises").glob("*.py"))
HARDWARE = "CPU Intel(R) Xeon(R) Platinum 8480+ (2 cores)"
NUMBER = "12,345"  # a formatted figure at its widest (5 digits)
WORD = "x" * 20  # a phrase or a name passed in and printed as it is
PHRASES = {"what", "op", "hardware"}  # the checks' parameters that hold a phrase or a name, not a figure
NAMES = "finished_pipeline_one, finished_pipeline_two"  # a joined list of the finished functions called
LONGEST_GRADE = "Exercise 1 (activation memory)"  # the longest name a check grades under


def long_lines(text: str) -> list[str]:
    """The lines of `text` over verdict.LONGEST, with their length."""
    return [f"{len(line)}: {line}" for line in text.splitlines() if len(line) > verdict.LONGEST]


def test_grading_lines_fit_for_long_names_hardware_and_5_digit_figures(capsys):
    """grade (met, missed, straddling), mechanism (several problems of several lines) and grade_prediction."""
    grading = Grading(time_failing=True)
    for base in ([12_345.0, 1.0, 99_999.0], [1.0, 1.0, 1.0], [99_999.0] * 3):
        grading.grade(LONGEST_GRADE, base, [1e-4, 1.0, 1e-4], 12_345.0, what="saved-for-backward bytes",
                      hardware=HARDWARE)
    grading.mechanism("Exercise 3", ["a" * 90 + "\n" + "b" * 110, "c" * 96])
    core.grade_prediction("Exercise 3", None, 1.0, 12_345.0, "seconds per batch")
    core.grade_prediction("Exercise 3", 12_345.0, 1e-4, 12_345.0, "seconds per batch", timing.duration)
    out = capsys.readouterr().out
    assert "straddle" in out and "\n  " + "b" * 110 in out  # a problem's further lines are indented
    assert not long_lines(out), "\n".join(long_lines(out))


# ---- every message template, rendered with worst-case values ------------------------------------------------------
def render(node: ast.AST, assigned: dict) -> str:
    """The text a string expression prints at its widest: a figure as NUMBER, a phrase parameter as WORD, a joined
    list as NAMES, a conditional as its longer branch, a name built earlier in the function as what it holds."""
    if isinstance(node, ast.Constant):
        return str(node.value)
    if isinstance(node, ast.JoinedStr):
        return "".join(render(v, assigned) for v in node.values)
    if isinstance(node, ast.FormattedValue):
        return render(node.value, assigned)
    if isinstance(node, ast.IfExp):
        return max(render(node.body, assigned), render(node.orelse, assigned), key=len)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        return render(node.left, assigned) + render(node.right, assigned)
    if isinstance(node, ast.Name) and node.id in assigned:  # without itself: `x = x if ... else ...` ends
        return render(assigned[node.id], {k: v for k, v in assigned.items() if k != node.id})
    if isinstance(node, ast.Name) and node.id in PHRASES:
        return WORD
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "join":
        return NAMES
    return NUMBER


def stringy(node: ast.AST) -> bool:
    """Whether an expression builds printed text (a string, an f-string, a conditional or a sum of them)."""
    return isinstance(node, (ast.JoinedStr, ast.IfExp, ast.BinOp)) or (
        isinstance(node, ast.Constant) and isinstance(node.value, str))


def name_of(fn: ast.FunctionDef) -> str:
    """What `name` holds in fn: LONGEST_GRADE in Grading.grade, else its default, else 'Exercise 1'."""
    if fn.name == "grade":
        return LONGEST_GRADE
    with_defaults = fn.args.args[len(fn.args.args) - len(fn.args.defaults):]
    found = [d.value for a, d in zip(with_defaults, fn.args.defaults)
             if a.arg == "name" and isinstance(d, ast.Constant)]
    return found[0] if found else "Exercise 1"


def messages(path: Path) -> list[tuple[int, str]]:
    """(line number, text at its widest) of every print and every mechanism problem (as Grading.mechanism prints
    it: 'Exercise 1 (mechanism): ' and its further lines indented) in one module."""
    found = []
    for fn in [n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.FunctionDef)]:
        assigned = {"name": ast.Constant(name_of(fn))}
        assigned |= {t.id: n.value for n in ast.walk(fn) if isinstance(n, ast.Assign) and stringy(n.value)
                     for t in n.targets if isinstance(t, ast.Name) and t.id != "problems"}
        for n in ast.walk(fn):
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id == "print":
                found += [(n.lineno, " ".join(render(a, assigned) for a in n.args if stringy(a)))]
            problems = []
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "append" and \
                    isinstance(n.func.value, ast.Name) and n.func.value.id == "problems":
                problems = n.args
            if isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "problems" for t in n.targets):
                listed = n.value.body if isinstance(n.value, ast.IfExp) else n.value
                problems = listed.elts if isinstance(listed, ast.List) else []
            found += [(p.lineno, "Exercise 1 (mechanism): " + render(p, assigned).replace("\n", "\n  "))
                      for p in problems]
    return found


def test_the_renderer_sees_the_checks_messages():
    """The scan finds the mechanism problems and prints of every check module (it is not vacuously short)."""
    texts = {p.name: [t for _, t in messages(p)] for p in EXERCISES}
    assert sum(t.startswith("Exercise 1 (mechanism): ") for ts in texts.values() for t in ts) >= 15
    assert any("anomaly detection is still on" in t for t in texts["training.py"])
    assert any(NAMES in t for t in texts["datapath.py"]) and any(WORD in t for t in texts["core.py"])


@pytest.mark.parametrize("path", EXERCISES, ids=[p.stem for p in EXERCISES])
def test_every_exercise_message_fits_in_120_characters(path):
    """Every print and mechanism problem of the module, at its widest, in lines of at most 120 characters."""
    long = [f"{path.name}:{n}: {line}" for n, text in messages(path) for line in long_lines(text)]
    assert not long, "\n".join(long)
