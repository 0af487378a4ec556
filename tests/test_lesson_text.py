"""Lesson markdown (00-08) quotes no figure of one machine's run: speeds, step times, bandwidths, FLOP rates and decimal
ratios are printed by code from the reader's run. A target ("at least 2x") passes, and so does an outside figure
with its source link on the same line. The same rule as the before-stop hook's check (/work/shared/hooks)."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

LESSONS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("0[0-8]_*.ipynb"))

# a measured-looking figure: a number with a speed/time/bandwidth/FLOP-rate unit, or a ratio with decimals (1.35x)
FIGURE = re.compile(r"(?<![\w.×])(\d[\d,]*(?:\.\d+)?\s?(?:img/s|images/s|samples/s|ms\b|µs\b|GB/s|MB/s|"
                    r"[GT]FLOP/s|FLOP/s|it/s|s/epoch|s per (?:step|epoch))"
                    r"|\d+\.\d+\s?(?:×|x)(?![\w×\d]))")
# the words just before a figure that make it a target, not a measurement
TARGET = re.compile(r"(at least|at most|target|passes at|needs?|within|≥|≤|>=|<=)\W{0,3}\**\s*$", re.I)
SOURCE = re.compile(r"https?://|data sheet")


def quoted_figures(markdown: str) -> list[str]:
    """The lines of `markdown` that quote a measured-looking figure with neither a target word nor a source."""
    bad = []
    for line in markdown.splitlines():
        if SOURCE.search(line):
            continue
        if any(not TARGET.search(line[:m.start()]) for m in FIGURE.finditer(line)):
            bad.append(line.strip())
    return bad


@pytest.mark.parametrize("path", LESSONS, ids=[p.stem for p in LESSONS])
def test_lesson_markdown_quotes_no_measured_figure(path):
    """Every markdown cell of lessons 00-08 passes quoted_figures."""
    found = [f"cell {i}: {line[:120]}" for i, cell in enumerate(json.loads(path.read_text())["cells"])
             if cell["cell_type"] == "markdown" for line in quoted_figures("".join(cell["source"]))]
    assert not found, "print these from the run (course_lib.verdict) or link their source:\n" + "\n".join(found)
