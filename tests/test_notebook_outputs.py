"""The committed notebooks: full-size outputs that name their size and hardware, and no noise a reader must skip."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

NOTEBOOKS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("[0-9][0-9]_*.ipynb"))

# what a reader of the committed outputs should never see, and why
NOISE = {
    "Lightning's litlogger/litmodels tip": re.compile(r"💡 Tip|litlogger|litmodels"),
    "a per-Trainer device banner": re.compile(r"(GPU|TPU|HPU) available:"),
    "an absolute machine path": re.compile(r"(?<![\w.])/(work|root|home|tmp|usr|opt)/"),
    "a site-packages path": re.compile(r"site-packages"),
    "an ERROR line": re.compile(r"^ERROR|\bERROR:", re.M),
    "a Python warning": re.compile(r"\b\w*Warning: ", re.M),
    "a rank-prefixed print from DDP workers": re.compile(r"^\[rank\d+\]", re.M),
    "a C++ or torch log line": re.compile(r"^(USDT|STAGE|ERROR|INFO|WARNING):\d{4}-|^[WEI]\d{4} \d\d:\d\d:\d\d", re.M),
}


def output_texts(path: Path) -> list[tuple[int, str]]:
    """(cell index, text) for every text output of the notebook: streams, results and error tracebacks."""
    texts = []
    for i, cell in enumerate(json.loads(path.read_text())["cells"]):
        for out in cell.get("outputs", []):
            text = out.get("text") or out.get("data", {}).get("text/plain") or out.get("traceback") or ""
            texts.append((i, "".join(text)))
    return texts


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_committed_outputs_are_full_size_and_name_the_hardware(path):
    """The first output is the banner of a full-size run, naming the hardware."""
    texts = output_texts(path)
    assert texts, f"{path.name} has no outputs: run `make lessons`"
    first = texts[0][1]
    assert f"{path.stem} | run size: full | hardware: " in first, first[:300]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_committed_outputs_carry_no_noise(path):
    """No tips, banners, machine paths, ERROR lines, warnings or interleaved rank prints in any output."""
    found = [f"cell {i}: {why}: {m.group(0)!r}" for i, text in output_texts(path)
             for why, pattern in NOISE.items() for m in [pattern.search(text)] if m]
    assert not found, "\n".join(found)


# a figure a table should print in plain digits (7,770 images/s), not as 7.77e+03; 1e-8 rounding errors may stay
E_NOTATION = re.compile(r"(?<![\w.])\d\.\d+e\+0[3-9]\b")
# the words course_lib.verdict prints: every lesson that measures states at least one verdict from its run
VERDICT = re.compile(r"x (faster|slower) than|no difference beyond the spread|pt (higher|lower) than|"
                     r"(meets|misses) the target|in a single run: one run cannot show the spread")
MEASURED = [p for p in NOTEBOOKS if p.stem[:2] in {f"{n:02d}" for n in range(1, 9)}]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_committed_figures_are_plain_numbers(path):
    """No output prints a measured figure in e-notation where plain digits read better (7.77e+03)."""
    found = [f"cell {i}: {m.group(0)!r} in {text[max(0, m.start() - 60):m.end() + 20]!r}"
             for i, text in output_texts(path) for m in [E_NOTATION.search(text)] if m]
    assert not found, "\n".join(found)


@pytest.mark.parametrize("path", MEASURED, ids=[p.stem for p in MEASURED])
def test_committed_lessons_print_their_verdicts(path):
    """Lessons 01-08 print at least one verdict in course_lib.verdict's words, from the run itself."""
    assert any(VERDICT.search(text) for _, text in output_texts(path)), f"{path.name}: no verdict line printed"


def test_the_verdict_and_notation_patterns():
    """The patterns fire on verdict.py's own wording and on e-notation, and stay quiet on plain figures."""
    from course_lib import verdict

    assert VERDICT.search(verdict.compare([2, 2.1], [1, 1.1], "a", "b"))
    assert VERDICT.search(verdict.compare([1, 1.1], [1.05, 1.0], "a", "b"))
    assert VERDICT.search(verdict.target([2.5], 2, "a")) and VERDICT.search(verdict.compare([2], [1], "a", "b"))
    assert VERDICT.search(verdict.paired_accuracy([True, False], [False, False], "a", "b"))
    assert E_NOTATION.search("| eager | 1.54e+04 |") and not E_NOTATION.search("| eager | 15,400 | 2.24e-08 |")
    assert not E_NOTATION.search("largest 3.4e+38")


def test_the_scan_finds_each_kind_of_noise():
    """Each pattern fires on a sample of the noise it names and stays quiet on a clean line."""
    samples = {"Lightning's litlogger/litmodels tip": "💡 Tip: For seamless cloud logging, try installing litlogger",
               "a per-Trainer device banner": "GPU available: False, used: False",
               "an absolute machine path": "cache at /work/main/data/cache/train.pt",
               "a site-packages path": "lib/python3.11/site-packages/lightning/x.py:12",
               "an ERROR line": "ERROR: gpuGetDeviceCount failed with code 35",
               "a Python warning": "x.py:3: UserWarning: something",
               "a rank-prefixed print from DDP workers": "[rank1] loss 2.3",
               "a C++ or torch log line": "W1201 11:59:36.137000 25027 torch/utils/_pytree.py:630] <enum> is"}
    for why, text in samples.items():
        assert NOISE[why].search(text), why
    clean = "02_lightning | run size: full | hardware: CPU AMD EPYC (2 cores)\n3 epochs in 15.5 s (data ../shared)"
    assert not any(p.search(clean) for p in NOISE.values())
