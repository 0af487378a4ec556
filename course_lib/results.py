"""Measured results, written and read in one place: a lesson's figures (build/results/<lesson>.json, which the
course summary lists), its benchmark rows (build/results/bench-<lesson>.json), and the markdown reports the GPU
scripts write (docs/results/<gpu>*.md, or build/<script>-dryrun.md without a GPU), with their one file naming."""
from __future__ import annotations

import json
import re
import sys
import time
from pathlib import Path

from . import config, hardware
from .config import write_atomically


def file_name(text: str) -> str:
    """`text` (a GPU's name, say) as a file name: runs of anything but letters, digits, '.', '-', '_' become '_'."""
    return re.sub(r"[^A-Za-z0-9._-]+", "_", text.strip())


def figures_file(lesson: str) -> Path:
    """Where a lesson's recorded figures go: build/results/<lesson>.json."""
    return config.build_dir() / "results" / f"{file_name(lesson)}.json"


def record(lesson: str, name: str, value: float, unit: str = "", note: str = "") -> None:
    """Append one measured figure, with size and hardware, to the lesson's figures file (a re-run replaces it)."""
    path = figures_file(lesson)
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = [r for r in load(lesson) if r["name"] != name]  # re-running a cell replaces its figure
    rows.append({"name": name, "value": float(value), "unit": unit, "note": note, "size": config.run_size().name,
                 "hardware": hardware.label(), "time": time.strftime("%Y-%m-%d %H:%M:%S")})
    write_atomically(path, json.dumps(rows, indent=1))  # a reader in another process never sees half a file


def load(lesson: str) -> list[dict]:
    """The figures recorded for a lesson, in the order recorded, or [] if it has not run."""
    path = figures_file(lesson)
    return json.loads(path.read_text()) if path.exists() else []


def clear(lesson: str) -> None:
    """Forget a lesson's recorded figures (before it runs again, so none is stale)."""
    figures_file(lesson).unlink(missing_ok=True)


def save_rows(rows: list[dict], lesson: str, path: str | Path | None = None) -> Path:
    """Benchmark rows with hardware and versions to build/results/bench-<lesson>.json (or `path`), and each row's
    images/s recorded as one of the lesson's figures."""
    path = Path(path or config.build_dir() / "results" / f"bench-{file_name(lesson)}.json")
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, json.dumps({"lesson": lesson, "size": config.run_size().name, "hardware": hardware.facts(),
                                       "rows": rows}, indent=1))
    for r in rows:
        record(lesson, f"{r['name']} images/s", r["images_per_s"], "images/s",
               f"batch {r['batch_size']}, {r['precision']}, median step {r['step_ms']:.3g} ms")
    return path


def report_path(script: str, gpu: str | None, suffix: str = "") -> Path:
    """docs/results/<gpu><suffix>.md in the checkout for a GPU run; build/<script>-dryrun.md for a dry run (gpu None),
    kept out of docs/, whose figures are GPU figures."""
    if gpu is None:
        return config.build_dir() / f"{file_name(script)}-dryrun.md"
    root = config.repo_root()
    if root is None:
        raise FileNotFoundError(f"{script} writes its report to docs/results/ of the course checkout, and this "
                                f"course_lib is installed outside one: run it from a clone of {config.REPO_URL}.")
    return root / "docs" / "results" / f"{file_name(gpu)}{suffix}.md"


def write_report(path: str | Path, title: str, lines: list[str], info: dict | None = None) -> Path:
    """A markdown results file: title, the exact command, hardware, the given lines, then every library version."""
    info = info or hardware.facts()
    command = " ".join(["python", *sys.argv]) if sys.argv and sys.argv[0] else "(interactive)"
    text = [f"# {title}", "", f"Command: `{command}`", "", f"Hardware: {hardware.label(info)}", "", *lines,
            "", "Versions and hardware facts: " + ", ".join(f"{k} {v}" for k, v in info.items())]
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, "\n".join(text) + "\n")
    return path


class Report:
    """A write_report file rewritten whole whenever one of its sections changes, sections in `order`: a job cut off
    by its time limit keeps every figure it measured."""

    def __init__(self, path: str | Path, title: str, *, order: tuple[str, ...], info: dict | None = None):
        self.path, self.title, self.order, self.info, self.sections = Path(path), title, order, info, {}

    def set(self, key: str, lines: list[str]) -> None:
        """Replace section `key` (one of order) and rewrite the file."""
        if key not in self.order:
            raise KeyError(f"Section {key!r} is not one of this report's sections {self.order}.")
        self.sections[key] = lines
        body = [ln for k in self.order if k in self.sections for ln in [*self.sections[k], ""]]
        write_report(self.path, self.title, body, self.info)


def committed(pattern: str = "*-capstone.md", folder: str | Path | None = None) -> list[dict] | None:
    """The headline of every results file a GPU run committed under docs/results/ (file, title, hardware, the
    "## Comparison" bullets); None when this installation has no docs/ folder (installed without the checkout)."""
    root = config.repo_root()
    folder = Path(folder) if folder else root / "docs" / "results" if root else None
    if folder is None or not folder.is_dir():
        return None
    found = []
    for path in sorted(folder.glob(pattern)):
        lines = path.read_text().splitlines()
        start = lines.index("## Comparison") + 1 if "## Comparison" in lines else len(lines)
        end = next((i for i in range(start, len(lines)) if lines[i].startswith("## ")), len(lines))
        found.append({"file": path.name, "title": lines[0].lstrip("# ") if lines else path.name,
                      "hardware": next((ln for ln in lines if ln.startswith("Hardware: ")), "Hardware: not named"),
                      "comparison": [ln for ln in lines[start:end] if ln.startswith("- ")]})
    return found
