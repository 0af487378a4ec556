"""Issue 43, item 5: no lesson code cell pasted into an exercise's answer cell passes its check, nor does any one-token
shortcut the learner review named; each reference solution, its prediction measured exactly as predicted, passes.
No clock: the measured costs are injected (a solution's own prediction, so only the mechanism and the prediction
decide), the sizes are the checks' small ones. Lesson 06 spawns processes per check: its paste is tested in
tests/test_exercises.py."""
from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
import torch

from course_lib.exercises import compute, datapath, exercise_cells, predict, solution, starter, training
from course_lib.measure import ceilings, roofline

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
SPREAD = 1.1  # every fake ceiling's slowest block over its fastest: a tolerance of 2.2x


def fake_ceil() -> ceilings.Ceilings:
    """Ceilings with a known spread and every row the solutions read (no clock)."""
    rows = {name: ceilings.Ceiling(name, kind, (value, value * SPREAD), capacity=capacity)
            for name, kind, value, capacity in (
                ("matmul fp32", "compute", 1e11, 0), ("memory", "memory", 3e10, 0),
                ("memory cache", "memory", 1e11, 16 * 2**20), ("add reused", "memory", 3e10, 0),
                ("add fresh", "memory", 8e9, 0), ("per op", "overhead", 3e-6, 0))}
    return ceilings.Ceilings("test machine", "cpu", "full", 2, torch.__version__, rows)


@pytest.fixture(autouse=True)
def no_floor_timing(monkeypatch):
    """Floors (roofline.count(floors=True): the solutions of 02, 03 and 08) as a fixed figure in a cache of this
    test's own: no clock, one prediction, and no fake floor left for other tests."""
    from course_lib.measure import opcount

    monkeypatch.setattr(opcount, "_best", lambda fn: 1e-5)
    monkeypatch.setattr(opcount, "replay", lambda chain, died: {c[0]: 1e-5 for c in chain if not c[4]})
    monkeypatch.setattr(opcount, "_floors", {})


def passes(check, *args, **kwargs) -> bool:
    """The check's verdict; an answer that raises has not passed (a notebook shows the error, passed stays unset)."""
    try:
        return bool(check(*args, **kwargs))
    except Exception:
        return False


# ---- how each lesson's answer is graded, with injected costs ---------------------------------------------------
def grade_00(ns: dict, ceil, counted) -> bool:
    """00: every op's prediction against a measurement equal to the reference solution's prediction."""
    mine, ref = ns["predict_seconds"], solution("00")["predict_seconds"]
    cases = {op: (mine(c.flops, c.bytes, c.n_ops, ceil), ref(c.flops, c.bytes, c.n_ops, ceil)) for op, c in counted}
    return predict.grade_00(cases, predict.factor_00(ceil))


def grade_01(ns, ceil) -> bool:
    ref = solution("01")["predict_speedup"](ceil)

    def timer(fn):  # the starter measured at exactly the solution's predicted multiple of the learner's classifier
        from course_lib.exercises import forbidden
        with forbidden(training.one_at_a_time) as called:
            fn()
        return ref * 1e-3 if called else 1e-3
    return passes(training.check_01_batching, ns["classify"], ns["predict_speedup"], ceil=ceil, timer=timer,
                  target=1.0)


def grade_02(ns, ceil, data) -> bool:
    step = _02_step(ceil)  # seconds per step measured with the learner's settings: the solution's prediction
    return passes(training.check_02_trainer, ns["trainer_settings"], ns["predict_step_seconds"], ceil=ceil,
                  data=data, times=([2 * step / 64] * 3, [step / 64] * 3))


_steps: dict = {}


def _02_step(ceil) -> float:
    """The solution's predicted step (its floors are timed once per process: kept, so every grade sees one figure)."""
    if id(ceil) not in _steps:
        _steps[id(ceil)] = solution("02")["predict_step_seconds"](ceil)
    return _steps[id(ceil)]


def grade_03(ns, ceil) -> bool:
    mine = solution("03")["predict_batch_seconds"](ceil, 256)  # measured exactly as the solution predicts
    found = {"base": [3 * mine] * 3, "mine": [mine] * 3, "waits": [0.05] * 3}
    return passes(datapath.check_03_data_wait, ns["make_data"], ns["predict_batch_seconds"], ceil=ceil,
                  measured=found)


def grade_04(ns, ceil) -> bool:
    ratio = solution("04")["predict_time_ratio"](ceil)
    return passes(compute.check_04_activation_memory, ns["train_step"], ns["predict_time_ratio"], ceil=ceil,
                  times=([1.0, 1.0], [ratio, ratio]))


_refs: dict = {}


def grade_08(ns, ceil) -> bool:
    x, shifts, flips = datapath.inputs_08(2)
    if id(ceil) not in _refs:  # the solution's prediction, counted once per ceilings
        _refs[id(ceil)] = solution("08")["predict_speedup"](ceil, x, shifts, flips, 2)
    ref = _refs[id(ceil)]
    return passes(datapath.check_08_batch_augment, ns["augment"], ns["predict_speedup"], ceil=ceil,
                  timer=lambda fn: ref * 1e-3 if fn is datapath.per_image_augment else 1e-3)


# ---- what a paste brings: every function a lesson cell defines, tried as the answer -----------------------------
class _Lenient(dict):
    """A namespace in which a lesson's own names (BATCH_SIZE, DEVICE...) read as None while a pasted def runs."""

    def __missing__(self, key):
        return None


def lesson_functions(lesson: str, arity: int) -> list[tuple[str, object]]:
    """(cell and name, function) of every top-level def of lesson's code cells, EXERCISE/CHECK cells aside, that can
    take `arity` positional arguments: the code a learner could paste into the answer cell and call by its name."""
    path = next(NOTEBOOKS.glob(f"{lesson}_*.ipynb"))
    found = []
    for i, cell in enumerate(json.loads(path.read_text())["cells"]):
        src = "".join(cell["source"])
        if cell["cell_type"] != "code" or src.startswith(("# EXERCISE", "# CHECK")):
            continue
        keep = [s for s in ast.parse(src).body if isinstance(s, (ast.FunctionDef, ast.Import, ast.ImportFrom))]
        glob, local = {"__name__": "pasted"}, _Lenient()
        for stmt in keep:  # the cell's imports and defs; the rest of the cell needs the lesson's run
            try:
                exec(compile(ast.Module([stmt], []), f"<{path.stem} cell {i}>", "exec"), glob, local)
            except Exception:
                continue
        glob.update(local)  # the pasted functions see the cell's imports and each other, as in the notebook
        for stmt in keep:
            if isinstance(stmt, ast.FunctionDef) and stmt.name in local:
                a = stmt.args
                pos = len(a.posonlyargs) + len(a.args)
                if pos - len(a.defaults) <= arity <= pos or (a.vararg and pos - len(a.defaults) <= arity):
                    found.append((f"cell {i} {stmt.name}", local[stmt.name]))
    return found


#: lesson: (exercise, the answer's technique function, its arity, the prediction's name)
ANSWERS = {"01": (1, "classify", 2, "predict_speedup"), "02": (3, "trainer_settings", 0, "predict_step_seconds"),
           "03": (1, "make_data", 2, "predict_batch_seconds"), "04": (1, "train_step", 3, "predict_time_ratio"),
           "08": (2, "augment", 4, "predict_speedup")}


def grade(lesson: str, ns: dict, ceil, data=None) -> bool:
    """The lesson's check on ns's answer, costs injected."""
    return {"01": lambda: grade_01(ns, ceil), "02": lambda: grade_02(ns, ceil, data),
            "03": lambda: grade_03(ns, ceil), "04": lambda: grade_04(ns, ceil),
            "08": lambda: grade_08(ns, ceil)}[lesson]()


@pytest.fixture(scope="module")
def trainer_data():
    return training.inputs_02()


@pytest.mark.parametrize("lesson", sorted(ANSWERS))
def test_pasted_lesson_cells_fail_and_the_solution_passes(lesson, trainer_data):
    """The starter (every cell that defines none of the answer's names leaves it in place: no lesson cell does) and
    each function the lesson defines, pasted as the answer beside the solution's own prediction, fail; the solution
    passes, and fails without its prediction."""
    number, name, arity, told = ANSWERS[lesson]
    ceil, sol = fake_ceil(), solution(lesson)
    path = next(NOTEBOOKS.glob(f"{lesson}_*.ipynb"))
    answer_names = set(starter(lesson, number))
    for cell in json.loads(path.read_text())["cells"]:  # a paste that rebinds an answer's name would need its own case
        src = "".join(cell["source"])
        if cell["cell_type"] == "code" and not src.startswith(("# EXERCISE", "# CHECK")):
            bound = {n.name for n in ast.walk(ast.parse(src)) if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
            assert not bound & {name, told}, f"{path.name}: a lesson cell defines {bound & {name, told}}"
    data = trainer_data if lesson == "02" else None
    assert not grade(lesson, {name: starter(lesson, number)[name], told: sol[told]}, ceil, data), "the starter"
    for where, fn in lesson_functions(lesson, arity):
        assert not grade(lesson, {name: fn, told: sol[told]}, ceil, data), f"{lesson} {where} pasted passed"
    assert grade(lesson, {name: sol[name], told: sol[told]}, ceil, data), f"{lesson}: the solution failed"
    assert not grade(lesson, {name: sol[name], told: starter(lesson, number)[told]}, ceil, data), "no prediction"
    assert answer_names >= {name, told}


@pytest.fixture(scope="module")
def counted_00():
    return [(op, roofline.count(fn)) for op, fn in predict.cases_00("cpu").items()]


def test_00_pasted_functions_and_one_ceiling_alone_fail_the_solution_passes(counted_00):
    """Lesson 00's answer is the prediction itself: the starter, any function of the lesson taking its four
    arguments, and each single ceiling alone fail; the solution passes (measured as it predicts)."""
    ceil = fake_ceil()
    assert grade_00({"predict_seconds": solution("00")["predict_seconds"]}, ceil, counted_00)
    assert not passes(grade_00, {"predict_seconds": starter("00", 3)["predict_seconds"]}, ceil, counted_00)
    for _, fn in lesson_functions("00", 4):
        assert not passes(grade_00, {"predict_seconds": fn}, ceil, counted_00)
    alone = [lambda f, b, n, c: f / c.rate("fp32"), lambda f, b, n, c: b / c.elementwise(3, True),
             lambda f, b, n, c: n * c.per_op]
    for fn in alone:
        assert not grade_00({"predict_seconds": fn}, ceil, counted_00)


# ---- the one-token shortcuts the learner review named -------------------------------------------------------
def test_03_more_workers_fail_even_with_the_solutions_prediction(capsys):
    """03: `num_workers=2` in the starter moves the decoding into workers: refused, whatever the prediction."""
    from course_lib.data import jpeg

    ceil = fake_ceil()
    workers = lambda b, s: jpeg.JpegDataModule(b, subset=s, num_workers=2)  # noqa: E731
    assert not grade_03({"make_data": workers, "predict_batch_seconds": solution("03")["predict_batch_seconds"]},
                        ceil)
    assert "DataLoader workers decoded" in capsys.readouterr().out


def test_01_bigger_batch_and_learning_rate_fail_even_with_the_solutions_prediction():
    """01: the old answer (a bigger batch and a higher learning rate in a training loop) labels nothing."""
    def old_shortcut(net, images):
        opt = torch.optim.SGD(net.parameters(), lr=0.05)
        for chunk in images.split(32):
            opt.zero_grad()
            net(chunk).sum().backward()
            opt.step()
    assert not grade_01({"classify": old_shortcut, "predict_speedup": solution("01")["predict_speedup"]},
                        fake_ceil())


def test_08_and_03_predictions_off_by_more_than_the_tolerance_fail():
    """The solutions' technique with a prediction 3x off (past 2.2x) fails; within it passes."""
    ceil = fake_ceil()
    sol8, sol3 = solution("08"), solution("03")
    x, shifts, flips = datapath.inputs_08(2)
    ref = sol8["predict_speedup"](ceil, x, shifts, flips, 2)
    for factor, expected in ((3.0, False), (1 / 3, False), (2.0, True)):
        off = lambda c, *a, k=factor: k * ref  # noqa: E731
        assert grade_08({"augment": sol8["augment"], "predict_speedup": off}, ceil) is expected, factor
        off3 = lambda c, b, k=factor: k * sol3["predict_batch_seconds"](c, b)  # noqa: E731
        assert grade_03({"make_data": sol3["make_data"], "predict_batch_seconds": off3}, ceil) is expected, factor


def test_02_prediction_is_graded_against_the_measured_step(trainer_data):
    """02: the solution's settings with a wild prediction fail; a slower-than-1.5x gain fails though predicted."""
    ceil, sol = fake_ceil(), solution("02")
    wild = lambda c: 100.0  # noqa: E731  (seconds per step)
    assert not grade_02({"trainer_settings": sol["trainer_settings"], "predict_step_seconds": wild}, ceil,
                        trainer_data)
    same = passes(training.check_02_trainer, sol["trainer_settings"], lambda c: 0.005, ceil=ceil, data=trainer_data,
                  times=([0.005 / 64] * 3, [0.005 / 64] * 3))
    assert not same
    exact = passes(training.check_02_trainer, sol["trainer_settings"], lambda c: 0.005, ceil=ceil, data=trainer_data,
                   times=([0.010 / 64] * 3, [0.005 / 64] * 3))
    assert exact


def test_exercise_cells_name_the_prediction_first():
    """02, 03 and 08's starters define the prediction function (returning None until the learner writes it) and the
    check cell passes it on."""
    for lesson, (number, _, _, told) in ANSWERS.items():
        if lesson in ("02", "03", "08"):
            assert starter(lesson, number)[told] is not None
            path = next(NOTEBOOKS.glob(f"{lesson}_*.ipynb"))
            assert told in exercise_cells(path)[str(number)]["CHECK"]
