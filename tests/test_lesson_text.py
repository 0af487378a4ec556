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


@pytest.mark.parametrize("line", [
    "on this CPU bf16-mixed ran at 1.35x fp32's images/s",
    "the small CNN trained at 13,952 images/s at batch 64",
    "a step took 12.5 ms against 9 ms",
    "copying reached 11.2 GB/s",
    "the matmul ran at 132 GFLOP/s",
    "compile made it 1.66× slower",
])
def test_a_measured_figure_fails(line):
    """Speeds, step times, bandwidths, FLOP rates and decimal ratios are caught."""
    assert quoted_figures(line) == [line]


@pytest.mark.parametrize("line", [
    "The exercise passes at at least 2x the baseline's images/s.",
    "the check needs ≥ 1.5x",
    "a T4 peaks at 65 TFLOP/s in fp16 ([data sheet](https://www.nvidia.com/t4))",
    "PCIe 4.0 x16 carries about 32 GB/s (https://en.wikipedia.org/wiki/PCI_Express)",
    "bf16 halves the bytes; expect 2x on tensor cores and 1x on a CPU without bf16",
    "batch 64, 3 epochs, 10,000 images",
])
def test_targets_sources_and_plain_counts_pass(line):
    """A target, a figure with its link on the line, a whole-number factor and a count are not measurements."""
    assert quoted_figures(line) == []
