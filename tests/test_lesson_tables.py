"""Lesson tables a reader takes in at a glance (issue 47): results tables are displayed through the one home
(bench.show / bench.show_rows, rendered as tables in Jupyter, Colab and on the site), never printed by hand as pipe
text; and every lesson's "what to expect" table names at least one GPU figure with its source's link."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

LESSONS = sorted((Path(__file__).resolve().parents[1] / "notebooks").glob("0[0-8]_*.ipynb"))

# a string literal that is a markdown table row ("| a | b |", f"| {x} | ...") or rule ("|---|"), or a table
# writer's text handed to print instead of to display (bench.table, results.markdown_table, roofline.layer_lines)
HAND_TABLE = re.compile(r"""[fr]?["'](?:\\n)*\|[ -][^"'\n]*\||---\||print\(.*\b(?:bench\.table|markdown_table|"""
                        r"""layer_lines)\(""")
GPU = re.compile(r"\b(?:T4|V100|A100|A10|L4|H100|H200|B200|RTX \d+|GPU)s?\b")
LINK = re.compile(r"\]\(https?://")


def code_cells(path: Path) -> list[tuple[int, str]]:
    """(index, source) of every code cell."""
    cells = json.loads(path.read_text())["cells"]
    return [(i, "".join(c["source"])) for i, c in enumerate(cells) if c["cell_type"] == "code"]


def hand_tables(source: str) -> list[str]:
    """The lines of a code cell's source that print a table by hand."""
    return [line.strip() for line in source.splitlines() if HAND_TABLE.search(line)]


def test_hand_printed_tables_are_found():
    """The pattern: table rows, rules and a printed table writer are found; a '|' used as a separator is not."""
    assert hand_tables('print("| measure | value |\\n|---|---|")')
    assert hand_tables('    print(f"| {name} | {bits} |")')
    assert hand_tables('print("ResNet9:\\n" + bench.table(rows))')
    assert hand_tables('print("\\n".join(roofline.layer_lines(rows)))')
    assert not hand_tables('print("shape", shape, "| NCHW strides", stride)')
    assert not hand_tables('bench.show_rows(rows, note="Hardware: CPU | size full")')


@pytest.mark.parametrize("path", LESSONS, ids=[p.stem for p in LESSONS])
def test_lessons_print_no_table_by_hand(path):
    """A results table goes through bench.show / bench.show_rows (a rendered table), not print of pipe text."""
    found = [f"cell {i}: {line}" for i, src in code_cells(path) for line in hand_tables(src)]
    assert not found, "display it with bench.show_rows (or bench.show): " + "; ".join(found)


def expect_rows(path: Path) -> list[str]:
    """The rows of the lesson's "what to expect" table (the first markdown cell that has one)."""
    for cell in json.loads(path.read_text())["cells"][:4]:
        text = "".join(cell["source"])
        if cell["cell_type"] == "markdown" and "what to expect" in text.lower():
            after = text[text.lower().index("what to expect"):]
            return [ln for ln in after.splitlines() if ln.startswith("|") and not set(ln) <= set("|-: ")][1:]
    return []


@pytest.mark.parametrize("path", LESSONS, ids=[p.stem for p in LESSONS])
def test_what_to_expect_has_a_cited_gpu_row(path):
    """At least one row names a GPU, links its source and says the figure is the source's, not the course's."""
    rows = expect_rows(path)
    cited = [r for r in rows if GPU.search(r) and LINK.search(r) and re.search(r"source", r)]
    assert rows and cited, f"{path.stem}: no 'what to expect' row with a GPU, a link and 'the source's figure'"


def test_measures_reads_as_plain_words_and_numbers():
    """bench.measures: '1 op' (not '1 ops'), whole numbers with separators, the note in brackets, no e-notation."""
    from course_lib.benchmark import bench

    rows = bench.measures([{"name": "kernels", "value": 1.0, "unit": "ops or fused C++ kernels"},
                           {"name": "images", "value": 1024.0, "unit": "images", "note": "last size"},
                           {"name": "rate", "value": 0.0011, "unit": ""}])
    assert [r["value"] for r in rows] == ["1 op or fused C++ kernel", "1,024 images", "0.00110"]
    assert rows[1]["measure"] == "images (last size)"
    table = bench.rows_table(rows)
    assert table.splitlines()[:2] == ["| measure | value |", "|---|---|"] and table._repr_markdown_() == str(table)
