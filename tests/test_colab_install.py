"""The lessons' install cell, run as Colab runs it, on a Python where course_lib is not importable."""
from __future__ import annotations

import ast
import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())

# runs the cell's code as a kernel would, with this checkout's editable install of course_lib hidden
RUN_CELL = """
import sys
sys.meta_path = [f for f in sys.meta_path if "editable" not in repr(f).lower()]
exec(open(sys.argv[1]).read())
import course_lib.config
print("imported from", course_lib.config.__file__)
"""


def install_cell() -> str:
    """The first code cell of lesson 00 (every lesson has the same one: tests/test_packaging.py)."""
    cells = json.loads((REPO / "notebooks" / "00_setup.ipynb").read_text())["cells"]
    return next("".join(c["source"]) for c in cells if c["cell_type"] == "code")


def checkout(tmp_path: Path) -> Path:
    """What a clone holds that the build reads, copied to tmp_path/checkout (a build in place would litter the repo)."""
    src = tmp_path / "checkout"
    shutil.copytree(REPO / "course_lib", src / "course_lib", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, src / name)
    return src


def test_install_cell_installs_the_course_from_a_local_checkout(tmp_path):
    """With course_lib missing, the cell pip-installs it (here from a local copy, offline) and the kernel imports it."""
    (tmp_path / "cell.py").write_text(install_cell())
    src = checkout(tmp_path)
    site = tmp_path / "site"  # stands in for the runtime's site-packages; its torch etc. are already installed
    env = {**os.environ, "COURSE_INSTALL_FROM": str(src), "PIP_TARGET": str(site), "PYTHONPATH": str(site),
           "PIP_NO_DEPS": "1", "PIP_NO_INDEX": "1", "PIP_NO_BUILD_ISOLATION": "0", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    run = lambda: subprocess.run([sys.executable, "-c", RUN_CELL, str(tmp_path / "cell.py")], cwd=tmp_path,  # noqa: E731
                                 env=env, capture_output=True, text=True, timeout=300)
    first = run()
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-3000:]
    assert f"Installing the course from {src}" in first.stdout
    assert f"imported from {site / 'course_lib' / 'config.py'}" in first.stdout
    second = run()  # installed now: the cell does nothing
    assert second.returncode == 0 and "Installing" not in second.stdout, second.stderr[-2000:]


# what would replace Colab's packages, or pull the development tools into its runtime
FORBIDDEN_PIP_ARGS = {"-U", "--upgrade", "--force-reinstall", "-I", "--ignore-installed", "--upgrade-strategy", "eager"}
DEV_TOOLS = {"jupyterlab", "notebook", "ipykernel", "nbclient", "nbval", "pytest", "ruff", "jupyter-server"}


def pip_args(cell: str) -> list[str]:
    """The string constants of the cell's subprocess.run([... "pip", "install", ...]) list."""
    for node in ast.walk(ast.parse(cell)):
        if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "run" and node.args:
            args = [a.value for a in getattr(node.args[0], "elts", []) if isinstance(a, ast.Constant)]
            if "pip" in args and "install" in args:
                return args
    raise AssertionError("the install cell has no subprocess.run([..., 'pip', 'install', ...])")


def test_install_cell_asks_pip_for_the_runtime_set_only(tmp_path):
    """The cell's own pip command, as a dry run with a report (offline, in this environment, where a torch that meets
    the bounds is installed): it plans to install course_lib alone, with no extra, and course_lib requires exactly
    [project] dependencies, none of them a development tool; the command never upgrades or reinstalls."""
    cell = install_cell()
    assert not FORBIDDEN_PIP_ARGS & set(pip_args(cell)) and not any("[" in a for a in pip_args(cell))
    (tmp_path / "cell.py").write_text(cell)
    src, report = checkout(tmp_path), tmp_path / "report.json"
    env = {**os.environ, "COURSE_INSTALL_FROM": str(src), "PIP_DRY_RUN": "1", "PIP_REPORT": str(report),
           "PIP_NO_INDEX": "1", "PIP_NO_BUILD_ISOLATION": "0", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    hide = "import sys; sys.meta_path = [f for f in sys.meta_path if 'editable' not in repr(f).lower()]; "
    run = subprocess.run([sys.executable, "-c", hide + "exec(open(sys.argv[1]).read())", str(tmp_path / "cell.py")],
                         cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    plan = json.loads(report.read_text())["install"]
    assert [canonicalize_name(p["metadata"]["name"]) for p in plan] == ["course-lib"], "pip would also install " + \
        str([p["metadata"]["name"] for p in plan])
    assert not plan[0].get("requested_extras")
    requires = [Requirement(r) for r in plan[0]["metadata"]["requires_dist"]]
    runtime = {canonicalize_name(r.name): r.specifier for r in requires if not r.marker}
    assert runtime == {canonicalize_name(r.name): r.specifier
                       for r in map(Requirement, PYPROJECT["project"]["dependencies"])}
    assert not DEV_TOOLS & set(runtime) and "torch" in runtime
    assert {canonicalize_name(r.name) for r in requires if r.marker} >= DEV_TOOLS - {"notebook", "jupyter-server"}
