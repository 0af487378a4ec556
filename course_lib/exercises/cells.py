"""Where the exercises live: the lessons' `# EXERCISE <n>` / `# CHECK <n>` code cells, the starters they hold, and
the reference solutions in notebooks/solutions/NN_topic.py (read from a checkout of the course repository)."""
from __future__ import annotations

import json
import re
import runpy
from pathlib import Path

from ..base import config

MARK = re.compile(r"^# (EXERCISE|CHECK) (\d+)\b")  # the first line of an exercise's starter and check cells


def notebooks_folder() -> Path:
    """The checkout's notebooks/ (lessons, and solutions/ with the reference solutions)."""
    root = config.repo_root()
    if root is None or not (root / "notebooks" / "solutions").is_dir():
        raise FileNotFoundError("the lessons' exercise cells and solutions are read from a checkout of the course "
                                "repository (notebooks/solutions/): run this from a git clone")
    return root / "notebooks"


def exercise_cells(path: Path) -> dict[str, dict[str, str]]:
    """{exercise number: {"EXERCISE": starter source, "CHECK": check source}} of one lesson notebook."""
    found: dict[str, dict[str, str]] = {}
    for cell in json.loads(Path(path).read_text())["cells"]:
        src = "".join(cell["source"])
        m = MARK.match(src) if cell["cell_type"] == "code" else None
        if m:
            found.setdefault(m.group(2), {})[m.group(1)] = src
    return found


def starter(lesson: str, number: int) -> dict:
    """The namespace of lesson `lesson`'s (e.g. "02") EXERCISE `number` cell, run as the learner first sees it."""
    path = next(notebooks_folder().glob(f"{lesson[:2]}_*.ipynb"))
    src = exercise_cells(path)[str(number)]["EXERCISE"]
    ns: dict = {}
    exec(compile(src, f"<{path.stem} EXERCISE {number}>", "exec"), ns)
    return ns


def solution(lesson: str) -> dict:
    """The namespace of the reference solution notebooks/solutions/NN_topic.py of lesson `lesson` (e.g. "02")."""
    return runpy.run_path(str(next((notebooks_folder() / "solutions").glob(f"{lesson[:2]}_*.py"))))
