"""Issue 47, read at a glance: every prose line a lesson prints fits in 120 characters (verdict.LONGEST), not only the
verdict lines (tests/test_notebook_outputs.py's VERDICT_LINE): roofline.explain, the breakdown's notes, the exercise
checks' messages and the lessons' own prints. A table row is not prose: a markdown row ('|' first) keeps its columns
on one line and is rendered as a table (bench.Table). It covers tests/test_notebook_outputs.py's
test_committed_verdict_lines_are_short, which may go once this lands. (Pending until the lessons re-run after the
short lines landed: outputs from before them fail here.)"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from course_lib.measure import verdict

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def printed_lines(path: Path) -> list[tuple[int, str]]:
    """(cell index, line) of what a reader sees as text: every stream (print) and the plain-text form of every
    displayed or returned result (a bench.Table's markdown, a repr), line by line."""
    found = []
    for i, cell in enumerate(json.loads(path.read_text(encoding="utf-8"))["cells"]):
        for out in cell.get("outputs", []):
            text = out.get("text") if out.get("output_type") == "stream" else out.get("data", {}).get("text/plain")
            found += [(i, line) for line in "".join(text or "").splitlines()]
    return found


def prose(line: str) -> bool:
    """A line read as a sentence: anything but a markdown table row (its first non-blank character '|')."""
    return not line.lstrip().startswith("|")


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_every_printed_prose_line_fits_in_120_characters(path):
    """No printed prose line over verdict.LONGEST: one fact a line, a detail on an indented line of its own."""
    long = [f"cell {i}: {len(line)} characters: {line[:100]!r}" for i, line in printed_lines(path)
            if prose(line) and len(line) > verdict.LONGEST]
    assert not long, "\n".join(long)
