"""Packaging and repository hygiene: dependency lists and the lock, the size switch, the repo URL, safe loading."""
from __future__ import annotations

import ast
import importlib.metadata
import importlib.util
import json
import re
import subprocess
import tomllib
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

from course_lib.base import config

REPO = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
REPO_URL = PYPROJECT["project"]["urls"]["Repository"]  # the one URL; the README and install cells must name it


def requirement_table(lines) -> dict:
    """{normalised name: (extras, specifier set)} for a list of requirement strings."""
    reqs = [Requirement(line) for line in lines]
    table = {canonicalize_name(r.name): (frozenset(r.extras), r.specifier) for r in reqs}
    assert len(table) == len(reqs), f"duplicate requirement in {lines}"
    return table


def environment_yml() -> dict:
    """environment.yml, parsed."""
    return yaml.safe_load((REPO / "environment.yml").read_text())


def test_environment_yml_installs_the_course_with_its_dev_extra():
    """environment.yml's pip section is the course itself with [dev]: pyproject.toml is the one list of ranges."""
    env = environment_yml()
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)
    assert pip == ["-e .[dev]"]


def test_one_python_floor_everywhere():
    """requires-python, ruff's target-version, environment.yml and the README all name Python 3.11 (tomllib)."""
    assert SpecifierSet(PYPROJECT["project"]["requires-python"]) == SpecifierSet(">=3.11")
    assert PYPROJECT["tool"]["ruff"]["target-version"] == "py311"
    assert "python=3.11" in environment_yml()["dependencies"]
    readme = (REPO / "README.md").read_text()
    assert "Python 3.11" in readme and not re.search(r"Python 3\.(?:[0-9]|10)\b", readme)


COMPROMISED_LIGHTNING = ("2.6.2", "2.6.3")  # malicious PyPI releases: GHSA-w37p-236h-pfx3, Lightning issue #21691
LOCK = REPO / "requirements" / "lock.txt"


def lock_pins() -> dict[str, tuple[str, list[str]]]:
    """{normalised name: (pinned version, [sha256 hashes])} of requirements/lock.txt (one entry per marker branch)."""
    pins: dict[str, list] = {}
    for block in re.split(r"\n(?=[A-Za-z0-9])", LOCK.read_text()):
        if block.startswith("#") or not block.strip():
            continue
        req = Requirement(block.split("\\")[0].strip())
        (spec,) = req.specifier  # exactly one ==
        assert spec.operator == "==", block[:80]
        pins.setdefault(canonicalize_name(req.name), []).append((spec.version, re.findall(r"sha256:([0-9a-f]{64})",
                                                                                            block)))
    return pins


def test_lightning_ranges_exclude_the_compromised_releases():
    """pyproject.toml admits current Lightning 2.x but never 2.6.2 or 2.6.3, and the lock pins neither."""
    _, spec = requirement_table(PYPROJECT["project"]["dependencies"])["lightning"]
    assert not any(spec.contains(v) for v in COMPROMISED_LIGHTNING), spec
    assert spec.contains("2.6.6") and not spec.contains("3.0.0"), spec
    assert all(v not in COMPROMISED_LIGHTNING for name in ("lightning", "pytorch-lightning")
               for v, _ in lock_pins()[name])


def test_lock_pins_every_package_with_hashes():
    """Every entry of the lock is one == pin with at least one sha256 (pip --require-hashes needs both)."""
    pins = lock_pins()
    assert len(pins) > 50  # torch's CUDA wheels, Lightning, JupyterLab: not a stub
    assert all(hashes for entries in pins.values() for _, hashes in entries)


def test_lock_pins_the_newest_stack_and_every_other_dependency_at_its_floor():
    """The lock (make test's stack) pins each runtime package that requirements/main.txt names at that version, inside
    its range, and every other direct dependency (runtime, dev, docs) at exactly its lower bound (make lock:
    lowest-direct with main.txt as constraints). The runtime floors are the floor stack's (tests/test_floor.py)."""
    pins = lock_pins()
    newest = {canonicalize_name(r.name): str(next(iter(r.specifier)).version) for r in map(
        Requirement, (ln for ln in (REPO / "requirements" / "main.txt").read_text().splitlines()
                      if ln.strip() and not ln.startswith("#")))}
    runtime = requirement_table(PYPROJECT["project"]["dependencies"])
    assert set(newest) <= set(runtime) and {"torch", "torchvision"} <= set(newest)
    declared = PYPROJECT["project"]["dependencies"] + sum(PYPROJECT["project"]["optional-dependencies"].values(), [])
    for name, (_, spec) in requirement_table(declared).items():
        floors = [s.version for s in spec if s.operator == ">="]
        assert len(floors) == 1, f"{name} needs one lower bound: {spec}"
        want = newest.get(name, floors[0])
        assert spec.contains(want) and [v for v, _ in pins[name]] == [want], f"{name}: lock {pins[name]}, want {want}"


@pytest.mark.parametrize("uv", ["", "/opt/uv/bin/uv"])
def test_make_venv_installs_the_lock_hash_checked(uv):
    """make venv (so make test, make course and CI) installs requirements/lock.txt with --require-hashes, by uv where
    it is installed and by pip otherwise, then the course without dependencies; a changed lock reinstalls."""
    plan = subprocess.run(["make", "-n", "-B", "venv", f"UV={uv}"], cwd=REPO, capture_output=True, text=True,
                          check=True).stdout
    installer = f"{uv} pip install --python .venv/bin/python" if uv else ".venv/bin/python -m pip install -q"
    assert f"{installer} --require-hashes -r requirements/lock.txt" in plan, plan
    assert f"{installer} --no-deps --no-build-isolation -e ." in plan, plan
    assert re.search(r"^\$\(STAMP\): .*\$\(LOCK\)", (REPO / "Makefile").read_text(), re.M)


def test_torch_torchvision_and_torchao_floors_are_built_for_each_other():
    """torchvision 0.N is the release for torch 2.(N-15), and torch's floor is one that the floor torchao loads its
    C++ kernels with (torchao states its minimum torch in its __init__; this environment holds the lock's torchao)."""
    runtime = requirement_table(PYPROJECT["project"]["dependencies"])
    floor = {name: Version(next(s.version for s in runtime[name][1] if s.operator == ">="))
             for name in ("torch", "torchvision", "torchao")}
    assert floor["torchvision"].minor == floor["torch"].minor + 15
    assert Version(importlib.metadata.version("torchao")) == floor["torchao"]
    init = Path(importlib.util.find_spec("torchao").origin).read_text()
    found = re.search(r'min_torch_version = _parse_version\("([0-9.]+)"\)', init)
    if found is None:
        pytest.skip("this torchao states no minimum torch version in its __init__")
    assert floor["torch"] >= Version(found[1]), f"torchao {floor['torchao']} needs torch >= {found[1]}"


@pytest.mark.parametrize("value, name, subset", [("smoke", "smoke", 2048), (" FULL ", "full", None)])
def test_run_size_follows_course_size(monkeypatch, value, name, subset):
    """COURSE_SIZE selects the run size (case and spaces ignored)."""
    monkeypatch.setenv("COURSE_SIZE", value)
    size = config.run_size()
    assert size.name == name and size.train_subset == subset


def test_run_size_defaults_to_full(monkeypatch):
    """Without COURSE_SIZE the run is the full course."""
    monkeypatch.delenv("COURSE_SIZE", raising=False)
    assert config.run_size() == config.SIZES["full"]


@pytest.mark.parametrize("native, subset, steps", [(True, 10_000, 50), (False, 2_000, 10)])
def test_lesson_04_full_size_follows_native_bf16(monkeypatch, native, subset, steps):
    """On a CPU, lesson 04's full size shrinks where bf16 is emulated (no native bf16 instructions), and only 04's."""
    monkeypatch.setenv("COURSE_SIZE", "full")
    monkeypatch.setattr(config.hardware, "cpu_bf16_native", lambda: native)
    size = config.run_size("04_mixed_precision", gpu=False)
    assert (size.train_subset, size.bench_steps, size.width) == (subset, steps, 0.25)
    assert config.run_size("03_gpu_and_data", gpu=False).bench_steps == 50
    assert config.run_size("04_mixed_precision", gpu=True) == config.SIZES["full"]


def test_invalid_run_size_names_the_variable(monkeypatch):
    """An unknown COURSE_SIZE raises ValueError naming COURSE_SIZE and the bad value."""
    monkeypatch.setenv("COURSE_SIZE", "huge")
    with pytest.raises(ValueError, match="COURSE_SIZE") as err:
        config.run_size()
    assert "huge" in str(err.value) and "smoke" in str(err.value)


def test_repo_url_in_readme():
    """The README links the repository URL of pyproject.toml."""
    assert REPO_URL in (REPO / "README.md").read_text()


def lessons() -> list[Path]:
    """The lesson notebooks, NN_topic.ipynb."""
    return sorted((REPO / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def install_cell(path: Path) -> str:
    """A lesson's first code cell: the guarded install cell."""
    cells = json.loads(path.read_text())["cells"]
    return next("".join(c["source"]) for c in cells if c["cell_type"] == "code")


def test_every_lesson_starts_with_the_same_guarded_install_cell():
    """Colab runs each notebook in its own runtime: every lesson's first code cell is the one install cell, verbatim."""
    paths = lessons()
    assert len(paths) == 9
    cells = {p.name: install_cell(p) for p in paths}
    assert len(set(cells.values())) == 1, f"install cells differ: {sorted(cells)}"
    cell = cells[paths[0].name]
    assert 'find_spec("course_lib") is None' in cell and "pip" in cell and "COURSE_INSTALL_FROM" in cell
    urls = re.findall(r"https://github\.com/[\w./-]+", cell)
    assert urls and all(u.rstrip("/.") == REPO_URL for u in urls)


def test_readme_opens_every_lesson_in_colab():
    """The README links each lesson to Colab at the repository's main branch."""
    readme = (REPO / "README.md").read_text()
    slug = REPO_URL.removeprefix("https://github.com/")
    for path in lessons():
        assert f"https://colab.research.google.com/github/{slug}/blob/main/notebooks/{path.name}" in readme, path.name


def source_texts():
    """(path, text) for every course_lib module and every notebook's code cells."""
    for path in sorted((REPO / "course_lib").rglob("*.py")):
        yield path, path.read_text()
    for path in sorted((REPO / "notebooks").glob("*.ipynb")):
        cells = json.loads(path.read_text())["cells"]
        yield path, "\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")


def test_no_deprecated_quantization_api():
    """No course code or notebook imports torch.ao.quantization (deprecated; use torchao)."""
    pattern = re.compile(r"torch\.ao\.quantization|from\s+torch\.ao\s+import\s+quantization")
    offenders = [str(p.relative_to(REPO)) for p, text in source_texts() if pattern.search(text)]
    assert offenders == []


def test_torch_load_uses_weights_only():
    """Every torch.load call in course_lib passes weights_only=True (no pickled code runs on load)."""
    calls, unsafe = 0, []
    for path in sorted((REPO / "course_lib").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "load"
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "torch"):
                calls += 1
                kw = {k.arg: k.value for k in node.keywords}
                if not (isinstance(kw.get("weights_only"), ast.Constant) and kw["weights_only"].value is True):
                    unsafe.append(f"{path.name}:{node.lineno}")
    assert calls >= 1  # the cache loader in data.py, so the scan is not vacuous
    assert unsafe == []


def test_no_bare_load_imported_from_torch():
    """course_lib never imports `load` from torch, which would hide calls from the scan above."""
    for path in sorted((REPO / "course_lib").rglob("*.py")):
        assert not re.search(r"from\s+torch\s+import\s+.*\bload\b", path.read_text()), path.name
