"""The lessons' install cell, run as Colab runs it: on a Python where course_lib is not importable, and as a pip dry
run against Colab's own package versions (requirements/colab.txt), where it must keep Colab's torch and torchvision.
Also the check that stops a lesson when an NVIDIA driver is loaded but torch cannot use the GPU."""
from __future__ import annotations

import ast
import importlib.metadata
import json
import os
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from course_lib.base import hardware

REPO = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
OFFLINE = {"PIP_NO_INDEX": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1", "PIP_NO_BUILD_ISOLATION": "0"}

# runs the cell's code as a kernel would, with this checkout's editable install of course_lib hidden, and keeps what
# the cell's pip printed on stdout (its JSON report) in the file argv[2]
RUN_CELL = """
import subprocess, sys
sys.meta_path = [f for f in sys.meta_path if "editable" not in repr(f).lower()]
_run = subprocess.run
def _keep_report(*args, **kwargs):
    done = _run(*args, **kwargs)
    open(sys.argv[2], "w").write(done.stdout or "")
    return done
subprocess.run = _keep_report
exec(open(sys.argv[1]).read())
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


def run_cell(python: str, tmp_path: Path, env: dict, then: str = "") -> tuple[subprocess.CompletedProcess, list]:
    """Run the install cell (then the code `then`) with `python`; its output and pip's planned installs (metadata)."""
    (tmp_path / "cell.py").write_text(install_cell())
    report = tmp_path / "report.json"
    report.unlink(missing_ok=True)
    run = subprocess.run([python, "-c", RUN_CELL + then, str(tmp_path / "cell.py"), str(report)], cwd=tmp_path,
                         env={**os.environ, **env}, capture_output=True, text=True, timeout=300)
    text = report.read_text() if report.exists() else ""
    plan = [p["metadata"] for p in json.loads(text)["install"]] if text.strip() else []
    return run, plan


def test_install_cell_installs_the_course_from_a_local_checkout(tmp_path):
    """With course_lib missing, the cell pip-installs it (here from a local copy, offline), says what it installed and
    how long it took, and the kernel imports it; run again, it does nothing."""
    src = checkout(tmp_path)
    site = tmp_path / "site"  # stands in for the runtime's site-packages; its torch etc. are already installed
    env = {**OFFLINE, "COURSE_INSTALL_FROM": str(src), "PIP_TARGET": str(site), "PYTHONPATH": str(site),
           "PIP_NO_DEPS": "1"}
    then = "import course_lib.base.config\nprint('imported from', course_lib.base.config.__file__)"
    first, plan = run_cell(sys.executable, tmp_path, env, then)
    assert first.returncode == 0, first.stdout[-2000:] + first.stderr[-3000:]
    assert f"Installing the course from {src}" in first.stdout
    assert re.search(r"Installed in \d+ s: course_lib \S+ -> 0\.1\.0", first.stdout), first.stdout  # new on Colab
    assert f"imported from {site / 'course_lib' / 'base' / 'config.py'}" in first.stdout
    second, _ = run_cell(sys.executable, tmp_path, env, then)  # installed now: the cell does nothing
    assert second.returncode == 0 and "Installing" not in second.stdout, second.stderr[-2000:]


def test_install_cell_reports_pip_failing(tmp_path):
    """A pip that fails (here: a source that does not exist) stops the cell with pip's own message shown."""
    run, _ = run_cell(sys.executable, tmp_path, {**OFFLINE, "COURSE_INSTALL_FROM": str(tmp_path / "nowhere")})
    assert run.returncode != 0 and "pip could not install the course" in run.stderr
    assert "nowhere" in run.stdout  # pip's error, printed by the cell


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
    """The cell's own pip command, as a dry run (offline, in this environment, where a torch that meets the bounds is
    installed): it plans to install course_lib alone, with no extra, and course_lib requires exactly [project]
    dependencies, none of them a development tool; the command never upgrades or reinstalls."""
    cell = install_cell()
    assert not FORBIDDEN_PIP_ARGS & set(pip_args(cell)) and not any("[" in a for a in pip_args(cell))
    env = {**OFFLINE, "COURSE_INSTALL_FROM": str(checkout(tmp_path)), "PIP_DRY_RUN": "1"}
    run, plan = run_cell(sys.executable, tmp_path, env)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    assert [canonicalize_name(p["name"]) for p in plan] == ["course-lib"], f"pip would also install {plan}"
    requires = [Requirement(r) for r in plan[0]["requires_dist"]]
    runtime = {canonicalize_name(r.name): r.specifier for r in requires if not r.marker}
    assert runtime == {canonicalize_name(r.name): r.specifier
                       for r in map(Requirement, PYPROJECT["project"]["dependencies"])}
    assert not DEV_TOOLS & set(runtime) and "torch" in runtime
    assert {canonicalize_name(r.name) for r in requires if r.marker} >= DEV_TOOLS - {"notebook", "jupyter-server"}


def colab_versions() -> dict[str, str]:
    """{normalised name: version} of requirements/colab.txt: what Colab's GPU runtime ships of the course's closure."""
    lines = (REPO / "requirements" / "colab.txt").read_text().splitlines()
    return {canonicalize_name(r.name): str(next(iter(r.specifier)).version)
            for r in (Requirement(ln) for ln in lines if ln.strip() and not ln.startswith("#"))}


def runtime_closure() -> set[str]:
    """Every distribution that course_lib's runtime dependencies pull in, as this environment installed them."""
    todo, seen = [Requirement(r) for r in PYPROJECT["project"]["dependencies"]], {}
    while todo:
        req = todo.pop()
        name, extras = canonicalize_name(req.name), set(req.extras)
        if name in seen and extras <= seen[name]:
            continue
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue  # a dependency for another platform or Python
        seen[name] = seen.get(name, set()) | extras
        for dep in map(Requirement, dist.requires or []):
            if dep.marker is None or any(dep.marker.evaluate({"extra": e}) for e in ["", *seen[name]]):
                todo.append(dep)
    return set(seen)


def stub_wheel(name: str, folder: Path) -> None:
    """A wheel holding only the metadata of this environment's `name` (its version and requirements), for pip to
    resolve against offline: what the registry would offer, as far as a dry run reads it."""
    dist = importlib.metadata.distribution(name)
    stem = f"{re.sub(r'[-_.]+', '_', name)}-{dist.version}"
    with zipfile.ZipFile(folder / f"{stem}-py3-none-any.whl", "w") as whl:
        whl.writestr(f"{stem}.dist-info/METADATA", dist.read_text("METADATA"))
        whl.writestr(f"{stem}.dist-info/WHEEL", "Wheel-Version: 1.0\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        whl.writestr(f"{stem}.dist-info/RECORD", "")


def colab_runtime(tmp_path: Path, versions: dict[str, str]) -> str:
    """A venv standing in for Colab's runtime: pip, and each package of `versions` registered as installed (metadata
    only, without requirements). Returns its Python."""
    env = tmp_path / "colab"
    subprocess.run([sys.executable, "-m", "venv", str(env)], check=True, capture_output=True)
    python = str(env / "bin" / "python")
    purelib = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"], check=True,
                             capture_output=True, text=True).stdout.strip()
    for name, version in versions.items():
        info = Path(purelib) / f"{re.sub(r'[-_.]+', '_', name)}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
        (info / "INSTALLER").write_text("pip\n")
        (info / "RECORD").write_text("")
    return python


@pytest.mark.parametrize("torchao", ["listed", "at the floor"])
def test_install_cell_on_colab_keeps_torch_and_torchvision(tmp_path, torchao):
    """The cell, run in a stand-in for Colab's runtime (its versions of every package of the course's closure that it
    ships, requirements/colab.txt) with pip resolving offline against the metadata of the lock's releases: the plan
    adds Lightning, torchmetrics and jsonargparse, never replaces torch or torchvision, and upgrades torchao only where
    Colab's is older than the floor. Python here is 3.11 and Colab's 3.13; packages' own requirements of Colab's
    installed packages are not modelled (their metadata is not published)."""
    versions = colab_versions()
    floors = {canonicalize_name(r.name): next(s.version for s in r.specifier if s.operator == ">=")
              for r in map(Requirement, PYPROJECT["project"]["dependencies"])}
    if torchao == "at the floor":
        versions["torchao"] = floors["torchao"]
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    for name in runtime_closure():
        stub_wheel(name, wheels)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(wheels),
                    str(checkout(tmp_path))], check=True, capture_output=True, env={**os.environ, **OFFLINE})
    course = next(wheels.glob("course_lib-*.whl"))
    env = {**OFFLINE, "COURSE_INSTALL_FROM": str(course), "PIP_FIND_LINKS": str(wheels), "PIP_DRY_RUN": "1"}
    run, plan = run_cell(colab_runtime(tmp_path, versions), tmp_path, env)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-3000:]
    planned = {canonicalize_name(m["name"]): m["version"] for m in plan}
    assert not {"torch", "torchvision"} & set(planned), f"the cell would replace Colab's torch/torchvision: {planned}"
    assert {"course-lib", "lightning", "torchmetrics", "jsonargparse"} <= set(planned)
    replaced = {name: (versions[name], planned[name]) for name in set(planned) & set(versions)}
    if torchao == "listed":
        assert replaced == {"torchao": (versions["torchao"], floors["torchao"])}
        assert f"torchao {versions['torchao']} -> {floors['torchao']}" in run.stdout
    else:
        assert replaced == {}
    assert "Installed in" in run.stdout


DRIVER_TEXT = "NVRM version: NVIDIA UNIX Open Kernel Module for x86_64  550.54.15  Release Build  (dvs-builder)\n"


def test_nvidia_driver_version_is_read_from_proc_text():
    """The driver's version from /proc/driver/nvidia/version text, both spellings of the kernel module line."""
    assert hardware.nvidia_driver(DRIVER_TEXT) == "550.54.15"
    assert hardware.nvidia_driver("NVRM version: NVIDIA UNIX x86_64 Kernel Module  580.65.06  Sun Jul 27\n") == \
        "580.65.06"


@pytest.mark.parametrize("driver, built_for, usable, visible, expected", [
    (None, "13.0", False, None, None),  # no NVIDIA driver: a CPU machine, nothing to say
    ("550.54.15", "12.8", True, None, None),  # CUDA works
    ("550.54.15", "13.0", False, "", None),  # GPUs hidden on purpose
    ("550.54.15", "13.0", False, None, "needs NVIDIA driver 580.65.06 or newer; this machine's driver is 550.54.15"),
    ("550.54.15", None, False, None, "is a CPU-only build"),
    ("580.65.06", "13.0", False, "0", "torch.cuda.is_available() is False"),
])
def test_cuda_problem_names_the_cause_and_the_fix(driver, built_for, usable, visible, expected):
    """A loaded driver that torch cannot use is named with its cause and a fix (on Colab: a fresh runtime keeps
    Colab's torch) and the way to run on the CPU on purpose; nothing is said where CUDA works or no driver is loaded."""
    problem = hardware.cuda_problem(driver, built_for, usable, visible)
    if expected is None:
        assert problem is None
    else:
        assert expected in problem and "Fix:" in problem and "CUDA_VISIBLE_DEVICES=''" in problem


def test_check_cuda_raises_where_the_driver_is_too_old(monkeypatch, tmp_path):
    """check_cuda reads the driver and asks torch; an unusable GPU stops the lesson with the message (never a silent
    CPU run), and a hidden one passes."""
    proc = tmp_path / "version"
    proc.write_text(DRIVER_TEXT)
    monkeypatch.setattr(hardware, "NVIDIA_DRIVER", proc)
    monkeypatch.setattr(hardware.torch.version, "cuda", "13.0")
    monkeypatch.setattr(hardware.subprocess, "run", lambda *a, **k: subprocess.CompletedProcess(a, 0, "False\n", ""))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    with pytest.raises(RuntimeError, match="driver is 550.54.15"):
        hardware.check_cuda()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    hardware.check_cuda()
