"""The lessons' install cell, run as Colab runs it, on a Python where course_lib is not importable."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# runs the cell's code as a kernel would, with this checkout's editable install of course_lib hidden
RUN_CELL = """
import sys
sys.meta_path = [f for f in sys.meta_path if "editable" not in repr(f).lower()]
exec(open(sys.argv[1]).read())
import course_lib.config
print("imported from", course_lib.config.__file__)
"""


def test_install_cell_installs_the_course_from_a_local_checkout(tmp_path):
    """With course_lib missing, the cell pip-installs it (here from a local copy, offline) and the kernel imports it."""
    cells = json.loads((REPO / "notebooks" / "00_setup.ipynb").read_text())["cells"]
    (tmp_path / "cell.py").write_text(next("".join(c["source"]) for c in cells if c["cell_type"] == "code"))
    src = tmp_path / "checkout"  # what a clone holds that the build reads; building in place would litter the repo
    shutil.copytree(REPO / "course_lib", src / "course_lib", ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, src / name)
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
