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
    assert not found, "print these from the run (course_lib.measure.verdict) or link their source:\n" + "\n".join(found)


MAX_LESSON_WORDS = 2500  # markdown words a learner reads in one lesson, code fences excluded
MAX_CELL_WORDS = 250  # one markdown cell, read without scrolling back
MAX_TABLE_COLUMNS = 6  # a printed table read at a glance (bench.MAX_COLUMNS)
IN_HOUSE = re.compile(r"seed articles?|\bseed \d{3}\b|course's seeds|\bthe seeds'? (?:two|article|post)", re.I)
FENCE = re.compile(r"```.*?```", re.S)


def markdown_cells(path: Path) -> list[tuple[int, str]]:
    """(index, source) of each markdown cell of a notebook."""
    cells = json.loads(path.read_text())["cells"]
    return [(i, "".join(c["source"])) for i, c in enumerate(cells) if c["cell_type"] == "markdown"]


def words(markdown: str) -> int:
    """Words of markdown prose, counted as whitespace-separated tokens (a table's '|' counts, as a reader's eye and the
    issue's count take it), with code fences left out."""
    return len(FENCE.sub("", markdown).split())


def table_widths(text: str) -> list[int]:
    """The column count of every markdown table row (a line starting and ending with '|') in `text`."""
    return [line.count("|") - 1 for line in map(str.strip, text.splitlines())
            if len(line) > 1 and line.startswith("|") and line.endswith("|")]


def test_words_and_table_widths_are_counted():
    """The counters: fences excluded, every table row measured."""
    assert words("one two\n```python\nx = 1 2 3\n```\nthree | --- |") == 6
    assert table_widths("| a | b |\n|---|---|\nnot | a row\n| 1 | 2 | 3 |") == [2, 2, 3]


@pytest.mark.parametrize("path", LESSONS, ids=[p.stem for p in LESSONS])
def test_lesson_markdown_fits_the_word_bars(path):
    """At most MAX_LESSON_WORDS words of markdown per lesson and MAX_CELL_WORDS per markdown cell."""
    cells = markdown_cells(path)
    total = sum(words(src) for _, src in cells)
    long = [f"cell {i}: {words(src)} words" for i, src in cells if words(src) > MAX_CELL_WORDS]
    assert total <= MAX_LESSON_WORDS and not long, f"{total} words (bar {MAX_LESSON_WORDS}); " + "; ".join(long)


@pytest.mark.parametrize("path", LESSONS, ids=[p.stem for p in LESSONS])
def test_lesson_markdown_has_no_in_house_words(path):
    """Sources are named by what they are ("a widely shared blog post on ..."), not by the course's own labels."""
    found = [f"cell {i}: {m.group(0)!r}" for i, src in markdown_cells(path) for m in IN_HOUSE.finditer(src)]
    assert not found, "name the blog post by what it is: " + "; ".join(found)


@pytest.mark.parametrize("path", LESSONS, ids=[p.stem for p in LESSONS])
def test_lesson_tables_have_at_most_six_columns(path):
    """Markdown tables and the committed outputs' printed tables: at most MAX_TABLE_COLUMNS columns."""
    wide = []
    for i, cell in enumerate(json.loads(path.read_text())["cells"]):
        texts = ["".join(cell["source"])] if cell["cell_type"] == "markdown" else [  # each text on its own lines
            "\n".join(("".join(out.get("text", "")), "".join(out.get("data", {}).get("text/plain", "")),
                       "".join(out.get("data", {}).get("text/markdown", "")))) for out in cell.get("outputs", [])]
        wide += [f"cell {i}: {n} columns" for text in texts for n in table_widths(text) if n > MAX_TABLE_COLUMNS]
    assert not wide, "split the table or plot it: " + "; ".join(sorted(set(wide)))


@pytest.mark.parametrize("path", LESSONS, ids=[p.stem for p in LESSONS])
def test_nbval_markers_are_tags_not_comments(path):
    """nbval's markers live in cell metadata tags (nbval-check-output, ...), out of the reader's sight."""
    found = [f"cell {i}" for i, cell in enumerate(json.loads(path.read_text())["cells"])
             if cell["cell_type"] == "code" and re.search(r"^\s*#\s*NBVAL_", "".join(cell["source"]), re.M)]
    assert not found, "move the # NBVAL_ comment to the cell's metadata tags: " + ", ".join(found)


GLOSSARY = Path(__file__).resolve().parents[1] / "docs" / "glossary.md"
GLOSSARY_LINK = "../docs/glossary.md#"  # from notebooks/NN.ipynb, on GitHub and on the website alike
# the course's own words and the terms used before they are explained: glossary anchor -> how a lesson writes it
GLOSSARY_TERMS = {
    "rung": re.compile(r"\brungs?\b", re.I), "ladder": re.compile(r"\bladder\b", re.I),
    "twin": re.compile(r"\btwins?\b", re.I), "quiet-trainer": re.compile(r"quiet Trainer", re.I),
    "precision-policy": re.compile(r"\bpolic(?:y|ies)\b", re.I), "noisy": re.compile(r"\bNOISY\b"),
    "ns_band": re.compile(r"NS_BAND|Newton.Schulz band", re.I), "seed-loop": re.compile(r"seed loops?", re.I),
    "roofline": re.compile(r"roofline", re.I), "data_wait": re.compile(r"data_wait"),
    "tensor-cores": re.compile(r"tensor.cores?", re.I), "pt2e": re.compile(r"PT2E"),
    "optimiser-closure": re.compile(r"\bclosures?\b", re.I), "sign-test": re.compile(r"sign test", re.I),
    "rank-sum-test": re.compile(r"rank-sum", re.I), "students-t": re.compile(r"Student's t\b"),
    "mcnemars-test": re.compile(r"McNemar"), "floor": re.compile(r"\bfloors?\b"),
    "pt": re.compile(r"\d pt\b|percentage points?"), "ddp-cost-model": re.compile(r"DDP cost model"),
}
LINK = re.compile(r"\[([^\]]*)\]\(([^)\s]*)\)")


def slug(heading: str) -> str:
    """MyST's anchor for a heading (myst_heading_anchors in docs/site/conf.py): lower case, punctuation other than
    '-' and '_' dropped, spaces as '-'."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def unlinked_first_uses(cells: list[tuple[int, str]]) -> list[str]:
    """For each glossary term a lesson uses, its first use outside a heading: fine when it sits inside a link to its
    glossary entry, else listed ('cell i: term')."""
    found = []
    for anchor, pattern in GLOSSARY_TERMS.items():
        for i, src in cells:
            body = "\n".join("" if line.lstrip().startswith("#") else line for line in src.split("\n"))
            m = pattern.search(body)
            if m is None:
                continue
            linked = any(link.start() <= m.start() < link.end() and link.group(2) == GLOSSARY_LINK + anchor
                         for link in LINK.finditer(body))
            if not linked:
                found.append(f"cell {i}: {m.group(0)!r} (link it to {GLOSSARY_LINK}{anchor})")
            break
    return found


def test_glossary_lookup_finds_an_unlinked_term():
    """The check itself: an unlinked first use is listed; a linked one, or a later unlinked use, is not."""
    cells = [(0, "# The twin\nWe race a [twin](../docs/glossary.md#twin)."), (1, "The twin again; the roofline.")]
    assert unlinked_first_uses(cells) == ["cell 1: 'roofline' (link it to ../docs/glossary.md#roofline)"]


def test_the_glossary_defines_every_term():
    """docs/glossary.md (published on the website) has a heading for every term the lessons must link."""
    anchors = {slug(line.lstrip("#")) for line in GLOSSARY.read_text().splitlines() if line.startswith("## ")}
    assert set(GLOSSARY_TERMS) <= anchors, sorted(set(GLOSSARY_TERMS) - anchors)


@pytest.mark.parametrize("path", LESSONS, ids=[p.stem for p in LESSONS])
def test_in_house_words_are_linked_to_the_glossary_at_first_use(path):
    """A lesson's first use of each glossary term (outside headings) links its entry on the glossary page, and no
    lesson calls the blog posts 'articles'."""
    cells = markdown_cells(path)
    found = unlinked_first_uses(cells)
    found += [f"cell {i}: {m.group(0)!r} (say 'blog post')" for i, src in cells
              for m in re.finditer(r"\barticles?\b", src, re.I)]
    assert not found, "\n".join(found)


@pytest.mark.parametrize("path", LESSONS, ids=[p.stem for p in LESSONS])
def test_printed_outputs_use_only_words_the_lesson_defines(path):
    """A glossary term in a lesson's committed output appears only where the lesson's markdown links its entry, and no
    output calls the blog posts 'articles' (the words a reader sees printed, not only the prose)."""
    from test_notebook_outputs import output_texts

    prose = "\n".join(src for _, src in markdown_cells(path))
    found = [f"cell {i}: {m.group(0)!r} printed, but the lesson never links {GLOSSARY_LINK}{anchor}"
             for i, text in output_texts(path) for anchor, pattern in GLOSSARY_TERMS.items()
             for m in [pattern.search(text)] if m and GLOSSARY_LINK + anchor not in prose]
    found += [f"cell {i}: {m.group(0)!r} printed (say 'blog post')" for i, text in output_texts(path)
              for m in re.finditer(r"\barticles?\b", text, re.I)]
    assert not found, "\n".join(found)
