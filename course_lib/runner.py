"""`python -m course_lib.runner`: execute every lesson top to bottom and write build/summary.md (`make course`)."""
from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
import time
from pathlib import Path

import nbformat
from nbclient import NotebookClient
from nbclient.exceptions import CellExecutionError
from traitlets.config import Config

from . import config, hardware, results

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


def summary_markdown(rows: list[dict], size: str, machine: str) -> str:
    """The course summary: per lesson pass/fail, wall time and the figures it measured."""
    table = []
    for r in rows:
        figs = "; ".join(f"{f['name']} = {f['value']:.4g}{(' ' + f['unit']) if f['unit'] else ''}"
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
    args = parser.parse_args(argv)
    size, machine = config.run_size().name, hardware.label()
    paths = [p for p in lesson_paths(Path(args.notebooks))
             if not args.lessons or any(p.stem.startswith(k) for k in args.lessons)]
    if not paths:
        raise SystemExit(f"No lessons matching {args.lessons or 'NN_*.ipynb'} in {args.notebooks}.")
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
    print("\n" + summary + f"\nExecuted notebooks and this summary are in {config.build_dir()}/")
    return 0 if all(r["ok"] for r in ran) else 1


if __name__ == "__main__":
    sys.exit(main())
