"""The prepared GPU scripts: CI has no GPU to run them, so at least their imports and options must stay valid."""
import ast
import importlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
# the three GPU checks the README names, and any other gpu_*.py: a named one gone fails the run below
SCRIPTS = sorted({REPO / "scripts" / f"{name}.py" for name in ("gpu_check", "gpu_ddp_check", "gpu_capstone")}
                 | set((REPO / "scripts").glob("gpu_*.py")))


# runs each script as `python -m scripts.NAME --help` would from the checkout's root, in one process (one torch
# import), with course_lib's editable install hidden: a GPU machine runs the scripts from a plain checkout
WITHOUT_INSTALL = """
import runpy, sys
sys.meta_path = [f for f in sys.meta_path if "editable" not in repr(f).lower()]
for module in sys.argv[1:]:
    sys.argv = [module, "--help"]
    for name in [m for m in sys.modules if m.split(".")[0] in ("course_lib", "scripts")]:
        del sys.modules[name]
    try:
        runpy.run_module(module, run_name="__main__", alter_sys=True)
    except SystemExit as done:
        print(f"exit {done.code}: {module}")
"""


def test_gpu_scripts_run_from_a_checkout_without_install(tmp_path):
    """`python -m scripts.<script> --help` from the checkout's root, course_lib not installed: imports resolve (no
    sys.path edits in scripts/), usage prints."""
    modules = [f"scripts.{path.stem}" for path in SCRIPTS]
    res = subprocess.run([sys.executable, "-c", WITHOUT_INSTALL, *modules], cwd=REPO, capture_output=True, text=True,
                         timeout=300, env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    assert res.returncode == 0, res.stderr[-2000:]
    for module in modules:
        assert f"exit 0: {module}" in res.stdout, res.stdout[-2000:] + res.stderr[-2000:]
    assert res.stdout.count("usage:") == len(SCRIPTS)


#: the packages whose names are modules: course_lib's layers (from course_lib.base import config, hardware)
LAYER_PACKAGES = {f"course_lib.{p.name}" for p in (Path(__file__).parents[1] / "course_lib").iterdir()
                  if (p / "__init__.py").is_file() and p.name != "exercises"}
ALL_SCRIPTS = [p for p in sorted((Path(__file__).parents[1] / "scripts").glob("*.py"))  # the helpers they import too
               if "from course_lib." in p.read_text()]


@pytest.mark.parametrize("path", ALL_SCRIPTS, ids=[p.stem for p in ALL_SCRIPTS])
def test_gpu_script_uses_only_existing_course_lib_names(path):
    """Every `module.name` the script uses on a course_lib module exists (a rename would otherwise surface on a GPU)."""
    tree = ast.parse(path.read_text())
    modules = {a.asname or a.name: importlib.import_module(f"{node.module}.{a.name}")
               for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module in LAYER_PACKAGES
               for a in node.names}
    used = {(n.value.id, n.attr) for n in ast.walk(tree)
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id in modules}
    assert used, f"{path.name} uses no course_lib module attributes: the check would test nothing"
    missing = sorted(f"{m}.{a}" for m, a in used if not hasattr(modules[m], a))
    assert not missing, f"{path.name} uses names course_lib does not have: {missing}"


def test_child_env_lets_a_child_process_import_course_lib_without_install(tmp_path):
    """config.child_env() puts this checkout on PYTHONPATH: a child in another folder imports course_lib from it."""
    from course_lib.base import config

    code = ("import sys; sys.meta_path = [f for f in sys.meta_path if 'editable' not in repr(f).lower()]; "
            "import course_lib.base.config as c; print(c.__file__)")
    hidden = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                            env={k: v for k, v in config.child_env().items() if k != "PYTHONPATH"})
    assert hidden.returncode != 0  # the check is live: without PYTHONPATH the hidden install is not found
    res = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True,
                         env=config.child_env())
    assert res.returncode == 0, res.stderr[-2000:]
    assert Path(res.stdout.strip()) == Path(config.__file__).resolve()


def test_gpu_reports_go_under_the_repository_from_any_folder(tmp_path, monkeypatch):
    """Run from another folder, a GPU script's report is still the repository's docs/results/<gpu><suffix>.md (a
    relative docs/results would land in the current folder); a dry run's goes to build/, out of docs/."""
    from course_lib.base import config, results

    monkeypatch.chdir(tmp_path)
    assert results.report_path("gpu_check", "NVIDIA H200") == REPO / "docs" / "results" / "NVIDIA_H200.md"
    assert results.report_path("gpu_ddp_check", "Tesla T4", suffix="-ddp") == REPO / "docs/results/Tesla_T4-ddp.md"
    assert results.report_path("gpu_check", None) == config.build_dir() / "gpu_check-dryrun.md"
    monkeypatch.setattr(config, "repo_root", lambda: None)  # installed without the checkout: no docs/ to write to
    with pytest.raises(FileNotFoundError, match="run it from a clone"):
        results.report_path("gpu_check", "NVIDIA H200")


def test_make_subset_from_a_tensor_file_names_the_remedy(tmp_path, monkeypatch):
    """--make-subset cuts a subset from an image folder; with COURSE_DATA already a .pt file it says to carry that
    file, instead of failing on <file>/train."""
    from scripts import gpu_check
    carried = tmp_path / "cifar10-15k.pt"
    carried.write_bytes(b"")
    monkeypatch.setenv("COURSE_DATA", str(carried))
    with pytest.raises(ValueError, match="Carry that file as it is"):
        gpu_check.make_subset(tmp_path / "out.pt", 10)
    assert not (tmp_path / "out.pt").exists()


def test_gpu_check_runs_the_step_model_against_its_ceilings(monkeypatch):
    """gpu_check's step-model section on a CPU (the code path a GPU runs, device cpu, injected ceilings and times):
    one explain line per native format among fp32, bf16 and fp16, each naming the prediction and the measured time."""
    from course_lib.measure import ceilings, opcount, timing

    monkeypatch.setattr(timing, "time_calls", lambda fn, **kw: [1e-3] * 4)  # no clock: every call 1 ms
    monkeypatch.setattr(opcount, "_floors", {})

    from scripts import gpu_check

    ceil = ceilings.Ceilings("test machine", "cpu", "smoke", 1, "t", {
        "matmul fp32": ceilings.summarise("matmul fp32", "compute", 1e11, [1.0]),
        "memory": ceilings.summarise("memory", "memory", 1e10, [1.0]),
        "per op": ceilings.summarise("per op", "overhead", 1, [3e-6])})
    lines = gpu_check.step_model_lines(ceil, batch=2, width=4)
    assert len(lines) == 1 and lines[0].startswith("- ResNet-9 width 4, batch 2, fp32:")
    assert "the model predicts" in lines[0] and "measured 1.00 ms" in lines[0]


def test_no_script_edits_sys_path():
    """scripts/ is a package run with `python -m`: no file of it puts a folder on sys.path."""
    edits = [p.name for p in (REPO / "scripts").rglob("*.py") if "sys.path.insert" in p.read_text()]
    assert not edits, edits
