"""Measured results, written and read in one place: a lesson's figures (build/results/<lesson>.json, which the
course summary lists), its benchmark rows (build/results/bench-<lesson>.json), the markdown reports the GPU
scripts write (docs/results/<gpu>*.md, or build/<script>-dryrun.md without a GPU), with their one file naming, and
the plain writers and readers (text, JSON, JSON lines, a marked block of a markdown file) every other results file
goes through: each write is atomic (config.write_atomically) and creates its folder."""
from __future__ import annotations

import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from . import config, hardware
from .config import file_name, write_atomically  # noqa: F401  (file_name: results.file_name for callers)
from .errors import CourseError
from .records import BenchRow


def write_text(path: str | Path, text: str) -> Path:
    """Write a results file whole (its folder created; atomic: a reader in another process never sees half a file)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(path, text)
    return path


def write_json(path: str | Path, data) -> Path:
    """`data` as an indented JSON results file (write_text)."""
    return write_text(path, json.dumps(data, indent=1))


def read_json(path: str | Path, default=None):
    """A JSON results file's content, or `default` where the file does not exist."""
    path = Path(path)
    return json.loads(path.read_text()) if path.exists() else default


def append_row(path: str | Path, row: dict) -> None:
    """Add one JSON line to a runs file (one row per run; earlier rows are kept)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        f.write(json.dumps(row) + "\n")


def read_rows(path: str | Path) -> list[dict]:
    """The rows of a JSON-lines runs file, in the order appended ([] where it does not exist)."""
    path = Path(path)
    return [json.loads(ln) for ln in path.read_text().splitlines() if ln.strip()] if path.exists() else []


def with_unit(number: str, unit: str) -> str:
    """A formatted number and its unit: '12.6 s', but '1.22x slower' (a factor's x sits on its number); '8' alone."""
    factor = unit == "x" or unit.startswith("x ")
    return " ".join(filter(None, (number + "x", unit[2:])) if factor else filter(None, (number, unit)))


def markdown_table(header: list, rows: list[list]) -> list[str]:
    """The lines of a markdown table, the one writer of them: header, rule, a line per row; each cell as text on one
    line, its pipes escaped."""
    cells = lambda row: " | ".join(str(c).replace("|", "\\|").replace("\n", " ") for c in row)  # noqa: E731
    return [f"| {cells(header)} |", "|" + "---|" * len(header), *[f"| {cells(r)} |" for r in rows]]


def block_markers(name: str) -> tuple[str, str]:
    """The two comment lines that enclose a generated block of a markdown file (invisible when rendered)."""
    return f"<!-- {name}: start (generated; do not edit by hand) -->", f"<!-- {name}: end -->"


def replace_block(path: str | Path, name: str, lines: list[str]) -> Path:
    """Replace the lines between block `name`'s markers in a markdown file with `lines`; the rest stays as it is."""
    path = Path(path)
    text, (start, end) = path.read_text().splitlines(), block_markers(name)
    if start not in text or end not in text:
        raise CourseError(f"{path} has no block {name!r}: put the lines {start!r} and {end!r} where it goes.")
    i, j = text.index(start), text.index(end)
    return write_text(path, "\n".join([*text[:i + 1], *lines, *text[j:]]) + "\n")


def read_block(path: str | Path, name: str) -> list[str]:
    """The lines between block `name`'s markers in a markdown file ([] where it has none)."""
    text, (start, end) = Path(path).read_text().splitlines(), block_markers(name)
    return text[text.index(start) + 1:text.index(end)] if start in text and end in text else []


def figures_file(lesson: str) -> Path:
    """Where a lesson's recorded figures go: build/results/<lesson>.json."""
    return config.build_dir() / "results" / f"{file_name(lesson)}.json"


@dataclass(frozen=True)
class Figure:
    """One measured figure as a lesson records it (record) and a committed run keeps it (runner.LessonRun): its
    value, unit and note, the spread of its runs where it has one, the size and hardware it comes from."""
    name: str
    value: float
    unit: str = ""
    note: str = ""
    size: str = ""
    hardware: str = ""
    time: str = ""
    low: float | None = None  # the slowest and fastest run's figure, where the figure is a median of runs
    high: float | None = None


def record(lesson: str, name: str, value: float, unit: str = "", note: str = "",
           spread: tuple[float, float] | None = None) -> None:
    """Append one measured figure, with size and hardware (and spread: its runs' lowest and highest, where it is a
    median of runs), to the lesson's figures file (a re-run replaces it)."""
    rows = [r for r in load(lesson) if r["name"] != name]  # re-running a cell replaces its figure
    low, high = (float(v) for v in spread) if spread else (None, None)
    rows.append(asdict(Figure(name, float(value), unit, note, config.run_size().name, hardware.label(),
                              time.strftime("%Y-%m-%d %H:%M:%S"), low, high)))
    write_json(figures_file(lesson), rows)


def load(lesson: str) -> list[dict]:
    """The figures recorded for a lesson, in the order recorded, or [] if it has not run."""
    return read_json(figures_file(lesson), [])


def clear(lesson: str) -> None:
    """Forget a lesson's recorded figures (before it runs again, so none is stale)."""
    figures_file(lesson).unlink(missing_ok=True)


def step_text(step_ms: float) -> str:
    """A step time in plain digits, never e-notation: 4.0 -> '4 ms', 12.34 -> '12.3 ms', 1234 -> '1,234 ms'."""
    return f"{step_ms:,.0f} ms" if step_ms >= 100 else f"{step_ms:.3g} ms"


def bench_file(lesson: str) -> Path:
    """Where a lesson's (or GPU script's) benchmark rows go: build/results/bench-<lesson>.json."""
    return config.build_dir() / "results" / f"bench-{file_name(lesson)}.json"


def save_rows(rows: list[BenchRow], lesson: str, path: str | Path | None = None) -> Path:
    """Benchmark rows (BenchRow.to_json) with hardware and versions to bench_file(lesson) (or `path`), and each row's
    images/s recorded as one of the lesson's figures."""
    path = write_json(path or bench_file(lesson), {"lesson": lesson, "size": config.run_size().name,
                                                   "hardware": hardware.facts(), "rows": [r.to_json() for r in rows]})
    for r in rows:
        spread = (r.images_per_s_min, r.images_per_s_max) if r.images_per_s_min is not None else None
        record(lesson, f"{r.name} images/s", r.images_per_s, "images/s",
               f"batch {r.batch_size}, {r.precision}, median step {step_text(r.step_ms)}", spread)
    return path


def load_rows(path: str | Path) -> list[BenchRow]:
    """The benchmark rows of a save_rows file (bench_file(lesson) for a lesson's), as BenchRows ([] where none)."""
    return [BenchRow.from_json(r) for r in read_json(path, {"rows": []})["rows"]]


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


def command_line() -> str:
    """The command that started this process as a reader would retype it: `python -m scripts.NAME args` for a module
    run with -m (every script), `python path args` otherwise; '(interactive)' without one."""
    if not sys.argv or not sys.argv[0]:
        return "(interactive)"
    main = sys.modules.get("__main__")
    spec, file = getattr(main, "__spec__", None), getattr(main, "__file__", None)
    as_module = spec is not None and file is not None and Path(file).resolve() == Path(sys.argv[0]).resolve()
    head = ["-m", spec.name.removesuffix(".__main__")] if as_module else [sys.argv[0]]
    return " ".join(["python", *head, *sys.argv[1:]])


def write_report(path: str | Path, title: str, lines: list[str], info: dict | None = None) -> Path:
    """A markdown results file: title, the exact command, hardware, the given lines, then every library version."""
    info = info or hardware.facts()
    command = command_line()
    text = [f"# {title}", "", f"Command: `{command}`", "", f"Hardware: {hardware.label(info)}", "", *lines,
            "", "Versions and hardware facts: " + ", ".join(f"{k} {v}" for k, v in info.items())]
    return write_text(path, "\n".join(text) + "\n")


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
