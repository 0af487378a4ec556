"""One decision of precision (issue 45, item 4): hardware.choose_precision decides, every entry point calls it with
the same default (None: the hardware's policy), and no module of course_lib names a precision on its own."""
from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import pytest

import course_lib
from course_lib.base import hardware
from course_lib.benchmark import bench
from course_lib.entry import cli
from course_lib.parallel import scaling
from course_lib.training import experiments, runs, speedrun, tta
from course_lib.training.twin import Twin

ROOT = Path(course_lib.__file__).parent
#: Lightning's precision names, full and short, as string literals ("32", "16" and "bf16" alone name formats too
#: often, e.g. flops' peak tables, so the short names count only where an argument is called precision)
NAMES = re.compile(r"^(?:16|32|64|bf16|transformer-engine)(?:-mixed|-true|-float16)?$")
FULL = re.compile(r"^(?:16|32|64|bf16)-(?:mixed|true)$")


def modules() -> list[Path]:
    """Every course_lib module but hardware's, the one home of the precision names."""
    return sorted(p for p in ROOT.rglob("*.py") if p.name != "hardware.py")


def test_no_module_but_hardware_names_a_precision():
    """A precision name written out anywhere else in course_lib is a decision taken there: refused."""
    found = []
    for path in modules():
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and FULL.match(node.value):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.value!r}")
            if isinstance(node, ast.keyword) and node.arg == "precision" and isinstance(node.value, ast.Constant):
                if node.value.value is not None:
                    found.append(f"{path.relative_to(ROOT)}:{node.lineno} precision={node.value.value!r}")
    assert not found, f"precision names outside hardware.py (use hardware.choose_precision): {found}"


def test_no_trainer_is_built_outside_the_one_wiring_point():
    """Lightning Trainers are built by runs.trainer (which calls the decision) or by LightningCLI (cli.py, whose
    --trainer.precision goes through the decision): a new `Trainer(` elsewhere would pick its own precision."""
    def builds(path: Path) -> bool:
        calls = (n.func for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.Call))
        return any(getattr(f, "id", getattr(f, "attr", None)) == "Trainer" for f in calls)
    builders = {p.relative_to(ROOT).as_posix() for p in modules() if builds(p)}
    assert builders <= {"training/runs.py"}, f"Trainers built outside runs.py: {sorted(builders)}"


@pytest.mark.parametrize("entry, parameter", [
    (runs.trainer_kwargs, "precision"), (runs.trainer, "precision"), (speedrun.make_trainer, "precision"),
    (Twin.fit, "precision"), (experiments.run_seed, "precision"), (experiments.seed_runs, "precision"),
    (experiments.compare_twin, "precision"), (tta.evaluate_tta, "precision"),
])
def test_every_training_entry_point_defaults_to_the_policy(entry, parameter):
    """None, the policy, is every entry point's default; benchmark rows (bench, scaling) name the fp32 baseline."""
    assert inspect.signature(entry).parameters[parameter].default is None


def test_benchmark_rows_default_to_the_named_baseline():
    """A benchmark row that names no precision runs hardware.BASELINE, an explicit request through the decision."""
    assert inspect.signature(bench.bench).parameters["precision"].default == hardware.BASELINE
    assert bench.BenchConfig("x").precision == hardware.BASELINE == bench.BenchConfig.of({"name": "x"}).precision
    assert inspect.signature(scaling.measure).parameters["precision"].default == hardware.BASELINE


def test_every_entry_point_decides_alike(hardware_class, monkeypatch):
    """The Trainer builders, the CLI's check and the FLOP summary give the same answer as the decision, by default
    and for a request, on each hardware class."""
    for cls in ("cpu-avx2", "cpu-avx512-bf16"):
        hardware_class(cls)
        policy = hardware.choose_precision()
        assert runs.trainer_kwargs(precision=None, accelerator="cpu")["precision"] == policy
        assert cli.CourseCLI._checked_precision(None, "cpu") == policy
        assert runs.trainer_kwargs(precision="32", accelerator="cpu")["precision"] == "32-true"
        summary = experiments.flop_summary(widths=(8, 16, 16), batch_size=8, steps=1, epoch_s=1.0)
        assert hardware.number_format(policy) in summary.peak_text or summary.peak_tflops is None
