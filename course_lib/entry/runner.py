"""`python -m course_lib.entry.runner`: run every lesson top to bottom and write build/summary.md (`make course`)."""
from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError
from traitlets.config import Config

from ..base import config, hardware, lessons, results

ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")  # terminal colour and cursor codes (Jupyter's tracebacks carry them)


def plain(text: str) -> str:
    """Text without terminal codes (results.markdown_table escapes a cell's pipes)."""
    return ANSI.sub("", text)


def lesson_paths(folder: Path) -> list[Path]:
    """The lesson notebooks, NN_topic.ipynb, in course order."""
    return sorted(folder.glob("[0-9][0-9]_*.ipynb"))


def kernel_config(sockets: str) -> Config:
    """Kernels on local socket files where the OS has them (over TCP, ipykernel 7 warns at every start that its
    traffic is unencrypted); absolute paths, because the kernel runs in the notebook's folder."""
    config_ = Config()
    if os.name == "posix":
        config_.KernelManager.transport, config_.KernelManager.ip = "ipc", str(Path(sockets) / "kernel")
    return config_


def run_lesson(path: Path, out_dir: Path, inplace: bool, timeout: int) -> dict:
    """Execute one notebook in its own folder; save it executed; return status, wall time and figures."""
    results.clear(path.stem)  # no stale figures
    nb = nbformat.read(path, as_version=4)
    start, error = time.perf_counter(), None
    with tempfile.TemporaryDirectory(prefix="course_kernel_") as sockets:
        client = NotebookClient(nb, timeout=timeout, kernel_name="python3", config=kernel_config(sockets),
                                resources={"metadata": {"path": str(path.parent)}})
        try:
            client.execute()
        except CellExecutionError as err:
            error = ANSI.sub("", str(err)).strip().splitlines()[-1]
    seconds = time.perf_counter() - start
    out_dir.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, out_dir / path.name)
    if inplace and error is None:
        nbformat.write(nb, path)
    return {"lesson": path.stem, "ok": error is None, "seconds": seconds, "error": error,
            "figures": results.load(path.stem)}


@dataclass(frozen=True)
class LessonRun:
    """A lesson's committed full-size run: its wall seconds, on which hardware, when (docs/results/lesson-times.json,
    which the README's lesson table and the GPU estimator read)."""
    lesson: str
    seconds: float
    size: str
    hardware: str
    time: str
    figures: tuple[results.Figure, ...] = ()  # what the lesson recorded (results.record): its spec's figures at least

    def figure(self, name: str) -> results.Figure:
        """The recorded figure `name`; an error naming the lesson and the re-run where it is missing."""
        found = next((f for f in self.figures if f.name == name), None)
        if found is None:
            raise ValueError(f"{self.lesson}'s committed run recorded no figure {name!r}: re-run it (make lessons).")
        return found


TIMES_FILE = "lesson-times.json"  # in docs/results/: the committed runs' LessonRun records, one per lesson
README_BLOCK = "lessons"  # the README's marked block (results.block_markers) that lesson_table fills


def times_file() -> Path:
    """docs/results/lesson-times.json of this checkout."""
    return (config.repo_root() or Path(".")) / "docs" / "results" / TIMES_FILE


def committed_runs() -> dict[str, LessonRun]:
    """{lesson: its committed full-size run} (times_file)."""
    return {r["lesson"]: LessonRun(**{**r, "figures": tuple(results.Figure(**f) for f in r.get("figures", []))})
            for r in results.read_json(times_file(), [])}


def lesson_table(runs: dict[str, LessonRun]) -> list[str]:
    """The README's lesson table: a row per lesson spec (base.lessons), its committed CPU time, a Colab link."""
    colab = "https://colab.research.google.com/github/" + config.REPO_URL.removeprefix("https://github.com/")
    rows = [[f"[{le.name}](notebooks/{le.name}.ipynb)", le.topic, le.status,
             f"{runs[le.name].seconds:.0f} s" if le.name in runs else "not run yet",
             f"[open]({colab}/blob/main/notebooks/{le.name}.ipynb)"] for le in lessons.LESSONS]
    return results.markdown_table(["lesson", "topic", "status", "full size, 2-core CPU", "Colab"], rows)


def commit_runs(rows: list[dict], size: str, machine: str) -> None:
    """After `--inplace` at full size on a CPU: the passing lessons' runs, with the figures they recorded, into
    times_file (what the GPU estimator reads: no regex on printed text) and the README's table."""
    runs = committed_runs()
    runs.update({r["lesson"]: LessonRun(r["lesson"], round(r["seconds"]), size, machine, time.strftime("%Y-%m-%d"),
                                        tuple(results.Figure(**f) for f in r.get("figures", [])))
                 for r in rows if r["ok"] and r["lesson"] in lessons.BY_NAME})
    results.write_json(times_file(), [asdict(runs[name]) for name in lessons.names() if name in runs])
    results.replace_block(times_file().parents[2] / "README.md", README_BLOCK, lesson_table(runs))


def summary_markdown(rows: list[dict], size: str, machine: str) -> str:
    """The course summary: per lesson pass/fail, wall time and the figures it measured."""
    table = []
    for r in rows:
        figs = "; ".join(f"{f['name']} = {results.with_unit(format(f['value'], '.4g'), f['unit'])}"
                         for f in r["figures"]) or "-"
        status = "pass" if r["ok"] else f"FAIL: {plain(r['error'] or '')}"
        if r.get("earlier"):
            status += f" (earlier run, {r['earlier']})"
        table.append([r["lesson"], status, f"{r['seconds']:.0f} s", figs])
    head = [f"# Course run: size {size}, {time.strftime('%Y-%m-%d %H:%M')}", "", f"Hardware: {machine}", ""]
    return "\n".join(head + results.markdown_table(["lesson", "result", "wall time", "figures measured"], table)) \
        + "\n"


def merge_rows(previous: dict | None, rows: list[dict], size: str, machine: str) -> list[dict]:
    """This run's rows, plus the rows of an earlier run (same size and hardware) for the lessons not run now, each
    marked with when it ran: running one lesson updates its line of the summary instead of replacing the summary."""
    if not previous or previous.get("size") != size or previous.get("hardware") != machine:
        return rows
    now = {r["lesson"] for r in rows}
    kept = [{**r, "earlier": r.get("earlier") or previous["time"]} for r in previous["rows"] if r["lesson"] not in now]
    return sorted(kept + rows, key=lambda r: r["lesson"])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("lessons", nargs="*", help="lesson names or numbers to run (default: all)")
    parser.add_argument("--notebooks", default=str((config.repo_root() or Path(".")) / "notebooks"))
    parser.add_argument("--inplace", action="store_true", help="also write outputs back into notebooks/")
    parser.add_argument("--timeout", type=int, default=3600, help="seconds allowed per cell")
    parser.add_argument("--readme", action="store_true", help="only rewrite the README's lesson table from the "
                        "lesson specs (course_lib/base/lessons.py) and the committed runs, then stop")
    args = parser.parse_args(argv)
    if args.readme:
        results.replace_block(times_file().parents[2] / "README.md", README_BLOCK, lesson_table(committed_runs()))
        return 0
    size, machine = config.run_size().name, hardware.label()
    paths = [p for p in lesson_paths(Path(args.notebooks))
             if not args.lessons or any(p.stem.startswith(k) for k in args.lessons)]
    if not paths:
        raise SystemExit(f"No lessons matching {args.lessons or 'NN_*.ipynb'} in {args.notebooks}.")
    unknown = [p.stem for p in paths if p.stem not in lessons.BY_NAME]
    if unknown and Path(args.notebooks).resolve() == (config.repo_root() or Path(".")).resolve() / "notebooks":
        raise SystemExit(f"No spec for {unknown} in course_lib/base/lessons.py: a lesson is its notebook and its spec.")
    print(f"Running {len(paths)} lessons, size {size}, on {machine}", flush=True)
    rows = []
    for i, path in enumerate(paths, 1):
        print(f"[{i}/{len(paths)}] {path.stem} ...", end=" ", flush=True)
        rows.append(run_lesson(path, config.build_dir() / "notebooks", args.inplace, args.timeout))
        print(f"{'pass' if rows[-1]['ok'] else 'FAIL'} in {rows[-1]['seconds']:.0f} s"
              + (f": {rows[-1]['error']}" if rows[-1]["error"] else ""), flush=True)
    record = config.build_dir() / "summary.json"  # every lesson's latest row, so partial runs merge
    ran, rows = rows, merge_rows(results.read_json(record), rows, size, machine)
    results.write_json(record, {"size": size, "hardware": machine, "time": time.strftime("%Y-%m-%d %H:%M"),
                                "rows": rows})
    summary = summary_markdown(rows, size, machine)
    results.write_text(config.build_dir() / "summary.md", summary)
    if args.inplace and size == "full" and not hardware.has_gpu():
        commit_runs(ran, size, machine)  # the README's CPU column: the committed notebooks' own runs
    print("\n" + summary + f"\nExecuted notebooks and this summary are in {config.build_dir()}/")
    return 0 if all(r["ok"] for r in ran) else 1


if __name__ == "__main__":
    sys.exit(main())
