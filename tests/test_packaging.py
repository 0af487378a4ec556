"""Packaging and repository hygiene: dependency lists agree, the size switch, the repo URL, safe loading."""
from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest
import tomllib
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from course_lib import config

REPO = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


def requirement_table(lines) -> dict:
    """{normalised name: (extras, specifier set)} for a list of requirement strings."""
    reqs = [Requirement(line) for line in lines]
    table = {canonicalize_name(r.name): (frozenset(r.extras), r.specifier) for r in reqs}
    assert len(table) == len(reqs), f"duplicate requirement in {lines}"
    return table


def test_environment_yml_pip_list_equals_pyproject_dependencies():
    """environment.yml's pip section (minus `-e .`) names the same packages and versions as pyproject.toml."""
    env = yaml.safe_load((REPO / "environment.yml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)
    assert "-e ." in pip  # the course itself is installed editable
    assert requirement_table([p for p in pip if p != "-e ."]) == requirement_table(PYPROJECT["project"]["dependencies"])


def test_requirement_table_sees_specifier_differences():
    """The comparison above notices a changed bound or a missing extra."""
    assert requirement_table(["lightning>=2.4,<3"]) == requirement_table(["Lightning<3, >=2.4"])
    assert requirement_table(["lightning>=2.4,<3"]) != requirement_table(["lightning>=2.4"])
    assert requirement_table(["jsonargparse[signatures]>=4.27"]) != requirement_table(["jsonargparse>=4.27"])


COMPROMISED_LIGHTNING = ("2.6.2", "2.6.3")  # malicious PyPI releases: GHSA-w37p-236h-pfx3, Lightning issue #21691


def test_both_dependency_lists_exclude_the_compromised_lightning_releases():
    """pyproject.toml and environment.yml admit current Lightning 2.x but never 2.6.2 or 2.6.3."""
    env = yaml.safe_load((REPO / "environment.yml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)
    for lines in (PYPROJECT["project"]["dependencies"], [p for p in pip if p != "-e ."]):
        _, spec = requirement_table(lines)["lightning"]
        assert not any(spec.contains(v) for v in COMPROMISED_LIGHTNING), spec
        assert spec.contains("2.6.6") and spec.contains("2.4.0"), spec


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


def test_invalid_run_size_names_the_variable(monkeypatch):
    """An unknown COURSE_SIZE raises ValueError naming COURSE_SIZE and the bad value."""
    monkeypatch.setenv("COURSE_SIZE", "huge")
    with pytest.raises(ValueError, match="COURSE_SIZE") as err:
        config.run_size()
    assert "huge" in str(err.value) and "smoke" in str(err.value)


def test_repo_url_in_pyproject():
    """config.REPO_URL is the project's repository URL in pyproject.toml."""
    assert config.REPO_URL.startswith("https://github.com/")
    assert config.REPO_URL in PYPROJECT["project"]["urls"].values()


def test_repo_url_in_readme():
    """The README links the same repository URL."""
    readme = REPO / "README.md"
    if not readme.exists():
        pytest.skip("README.md not written yet")
    assert config.REPO_URL in readme.read_text()


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
    assert urls and all(u.rstrip("/.") == config.REPO_URL for u in urls)


def test_readme_opens_every_lesson_in_colab():
    """The README links each lesson to Colab at config.REPO_URL's main branch."""
    readme = (REPO / "README.md").read_text()
    slug = config.REPO_URL.removeprefix("https://github.com/")
    for path in lessons():
        assert f"https://colab.research.google.com/github/{slug}/blob/main/notebooks/{path.name}" in readme, path.name


def source_texts():
    """(path, text) for every course_lib module and every notebook's code cells."""
    for path in sorted((REPO / "course_lib").glob("*.py")):
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
    for path in sorted((REPO / "course_lib").glob("*.py")):
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
    for path in sorted((REPO / "course_lib").glob("*.py")):
        assert not re.search(r"from\s+torch\s+import\s+.*\bload\b", path.read_text()), path.name
