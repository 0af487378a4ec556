"""Every import is declared: the lessons import only [project] dependencies, the tools also the extras (dev, docs).

Import names map to distributions through importlib.metadata.packages_distributions() of this environment (the one
`make venv` builds from the lock, where every declared package is installed). The standard library, course_lib
itself and the scripts' and tests' own modules need no declaration.
"""
from __future__ import annotations

import ast
import importlib.metadata
import json
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())

# Imported but never installed, each with the reason. Kept exact: an entry nothing imports any more fails below.
NOT_INSTALLED = {
    "airbench": "scripts/airbench_carry.py imports a carried copy of airbench 0.1.8 from its folder on the GPU machine",
}


def declared(requirements: list[str]) -> set[str]:
    """Normalised distribution names of a list of requirement strings."""
    return {canonicalize_name(Requirement(r).name) for r in requirements}


RUNTIME = declared(PYPROJECT["project"]["dependencies"])
# The tools may use every extra: dev (lessons in JupyterLab, tests, lint) and docs (the website and its browser test).
DEV = set().union(*(declared(reqs) for reqs in PYPROJECT["project"]["optional-dependencies"].values()))


def own_modules() -> set[str]:
    """Top-level names that are the repository's own: course_lib, the scripts package, every module of scripts/ and
    tests/."""
    own = {p.stem for folder in ("scripts", "tests") for p in (REPO / folder).rglob("*.py")}
    return {"course_lib", "scripts"} | own


def imports_of(source: str) -> set[str]:
    """Top-level names of the absolute imports in Python source (relative imports are first-party)."""
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


def notebook_code(path: Path) -> str:
    """A notebook's code cells as one Python source, IPython magics and shell lines dropped."""
    cells = json.loads(path.read_text())["cells"]
    lines = [line for c in cells if c["cell_type"] == "code" for line in "".join(c["source"]).splitlines()]
    return "\n".join(line for line in lines if not line.lstrip().startswith(("%", "!")))


def sources() -> dict[str, list[tuple[str, str]]]:
    """{'runtime' | 'dev': [(relative path, source)]}: the lessons' code, and the tools' (runner, scripts, tests)."""
    runtime, dev = [], []
    for path in sorted((REPO / "course_lib").rglob("*.py")):
        # course_lib.entry.runner is `make course`'s notebook executor: a tool, not something a lesson imports
        (dev if path.name == "runner.py" else runtime).append((path, path.read_text()))
    runtime += [(p, p.read_text()) for p in sorted((REPO / "notebooks" / "solutions").glob("*.py"))]
    runtime += [(p, notebook_code(p)) for p in sorted((REPO / "notebooks").glob("*.ipynb"))]
    dev += [(p, p.read_text()) for folder in ("scripts", "tests") for p in sorted((REPO / folder).rglob("*.py"))]
    return {scope: [(str(p.relative_to(REPO)), text) for p, text in items] for scope, items in
            (("runtime", runtime), ("dev", dev))}


def undeclared(files: list[tuple[str, str]], allowed: set[str], providers: dict[str, list[str]],
               exempt=frozenset(NOT_INSTALLED)) -> list[str]:
    """'path: name (provided by ...)' for each third-party import that no distribution in `allowed` provides."""
    skip = set(sys.stdlib_module_names) | own_modules() | set(exempt)
    found = []
    for path, text in files:
        for name in sorted(imports_of(text) - skip):
            dists = {canonicalize_name(d) for d in providers.get(name, [])}
            if not dists & allowed:
                found.append(f"{path}: {name} (provided by {sorted(dists) or 'nothing installed'})")
    return found


@pytest.fixture(scope="module")
def providers() -> dict[str, list[str]]:
    """{import name: [distributions]} of this environment."""
    return importlib.metadata.packages_distributions()


def test_the_lessons_import_only_runtime_dependencies(providers):
    """course_lib (but its runner), the notebooks and their solutions import only [project] dependencies; the same
    scan with no list allowed flags the lessons' torch and lightning imports (it sees what it checks)."""
    runtime = sources()["runtime"]
    assert undeclared(runtime, RUNTIME, providers) == [], (
        "add the distribution to [project] dependencies in pyproject.toml, then run make lock")
    flagged = " ".join(undeclared(runtime, set(), providers))
    assert all(f": {name} (provided by" in flagged for name in ("torch", "lightning", "torchao", "PIL")), flagged[:300]


def test_the_tools_import_only_declared_dependencies(providers):
    """course_lib.entry.runner, scripts/ and tests/ import only what [project] dependencies or the extras provide; the
    same scan flags the tests' pytest imports against the runtime list, and scripts' airbench without its exemption."""
    dev = sources()["dev"]
    assert undeclared(dev, RUNTIME | DEV, providers) == [], (
        "add the distribution to [project.optional-dependencies] dev in pyproject.toml, then run make lock")
    assert any(f.startswith("tests/") and f.endswith(": pytest (provided by ['pytest'])")
               for f in undeclared(dev, RUNTIME, providers))
    assert any(f.startswith("scripts/") and f.endswith(": airbench (provided by nothing installed)")
               for f in undeclared(dev, RUNTIME | DEV, providers, exempt=set()))


def test_every_exemption_is_still_imported():
    """Each NOT_INSTALLED name is imported somewhere and provided by no installed distribution."""
    imported = set().union(*(imports_of(text) for files in sources().values() for _, text in files))
    assert set(NOT_INSTALLED) <= imported
    assert not set(NOT_INSTALLED) & set(importlib.metadata.packages_distributions())


def test_dev_extra_holds_no_runtime_package():
    """A distribution is in one list only: [dev] never repeats a runtime dependency with another range."""
    assert RUNTIME & DEV == set()
