"""Every measured exercise, end to end: the notebooks' EXERCISE/CHECK cells are in place and numbered in order, and
each reference solution passes its full check once, measured, with generous bars (timing never fails `make test`:
the real targets are graded in `make course`; the starters and shortcuts fail the clock-free mechanism checks in
tests/test_exercise_checks.py)."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from course_lib import exercises
from course_lib.exercises import Grading, compute, inference, solution

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
NUMBERED = re.compile(r'^# (?:EXERCISE|CHECK) (\d+)\b|"Exercise (\d+)"', re.M)
GENEROUS = 0.5  # "not slower than half the baseline": a loaded 2-core machine cannot break it, a broken solution does


LESSONS = sorted(NOTEBOOKS.glob("0[0-8]_*.ipynb"))
CASES = [(p, n) for p in LESSONS for n in exercises.exercise_cells(p)]


def test_lessons_keep_their_measured_exercises():
    """Lessons 01-08 each carry an EXERCISE/CHECK pair with a solution file; a CHECK never loads the solution."""
    lessons = {p.stem for p, _ in CASES}
    assert lessons >= {p.stem for p in LESSONS if not p.stem.startswith("00")}
    for path, number in CASES:
        cells = exercises.exercise_cells(path)[number]
        assert set(cells) == {"EXERCISE", "CHECK"}, f"{path.name} exercise {number}"
        assert "solutions" not in cells["CHECK"]
        assert (NOTEBOOKS / "solutions" / f"{path.stem}.py").exists()


@pytest.mark.parametrize("path", LESSONS, ids=[p.stem[:2] for p in LESSONS])
def test_exercises_are_numbered_1_2_3_in_order(path):
    """The exercise numbers in the code cells (marks and the names the checks print) run 1, 2, 3... in order."""
    seen: list[int] = []
    for cell in json.loads(path.read_text())["cells"]:
        if cell["cell_type"] == "code":
            for m in NUMBERED.finditer("".join(cell["source"])):
                n = int(m.group(1) or m.group(2))
                if n not in seen:
                    seen.append(n)
    assert seen == list(range(1, len(seen) + 1)), f"{path.name}: exercises in the order {seen}"


def test_warm_up_checks_show_no_answer():
    """A warm-up's check call passes the lesson's objects to exercises.warmups; it never writes the expression."""
    for path in LESSONS:
        for cell in json.loads(path.read_text())["cells"]:
            src = "".join(cell["source"])
            if cell["cell_type"] == "code" and re.search(r"answer_\d+ = None", src):
                assert "warmups." in src and "check(" not in src, f"{path.name}: {src[:80]!r}"


# ---- one measured run of every solution, generous bars --------------------------------------------------------
def test_01_solution_measured():
    assert exercises.check_01_loop(solution("01_pytorch_baseline")["train"], target=GENEROUS) is True


# lesson 02: no measured run here. Its rounds are 35 LeNet steps of a few ms, and on a loaded 2-core machine their
# per-round ratios spread over 0.3-17x, so even a generous bar could fail; its mechanism is tested in
# tests/test_exercise_checks.py and its timing is graded in `make course`.


def test_03_solution_measured():
    # the data wait is a fraction of one run's own time, but a busy core still lengthens it (CI missed the lesson's
    # 35 % once): here a bar only a pipeline that starves the step can miss; the lesson grades its own in make course
    assert exercises.check_03_data_wait(solution("03_gpu_and_data")["make_data"], target=GENEROUS,
                                        max_wait=0.9) is True


def test_04_starter_fails_and_solution_passes():
    """Saved-for-backward bytes are counted, not timed: the lesson's own target, deterministic; the grades land in
    the Grading the caller passes."""
    assert exercises.check_04_activation_memory(compute.plain_train_step) is False
    grading = Grading()
    assert exercises.check_04_activation_memory(solution("04_mixed_precision")["train_step"], grading=grading) is True
    assert [g["passed"] for g in grading.grades] == [True]


def test_05_solution_measured():
    assert exercises.check_05_fusion(solution("05_compile_and_tuning")["activation"], target=GENEROUS)


def test_06_solution_measured():
    assert exercises.check_06_allreduce(solution("06_ddp")["average_gradients"], target=GENEROUS) is True


def test_07_solution_measured_through_a_trained_network():
    """A quickly trained ResNet-9 (width 8, 48 steps) and real held-out images: the agreement bar is the lesson's."""
    net, calib, held_out = inference.inputs_07()
    assert exercises.check_07_inference(solution("07_quantization")["quantize"], net, calib, held_out,
                                        target=GENEROUS) is True


def test_08_solution_measured():
    assert exercises.check_08_batch_augment(solution("08_capstone")["augment"], target=GENEROUS) is True
