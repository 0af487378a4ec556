"""course_lib.base.results: the one writer, file naming and reader of measured results, round trip by round trip."""
from __future__ import annotations

import importlib.machinery
import json
import sys
import types
from dataclasses import replace

import pytest
import torch

from course_lib.base import hardware, results
from course_lib.base.errors import CourseError
from course_lib.base.records import BenchRow

ROW = BenchRow("x", 123.5, step_ms=4.0, peak_mem_mb=1.0, data_wait=0.0, warmup_s=0.0, steps=1, batch_size=8,
               device="cpu", precision="32-true")


@pytest.fixture
def build(tmp_path, monkeypatch):
    """A fresh build folder (COURSE_BUILD) for the results written by the test."""
    monkeypatch.setenv("COURSE_BUILD", str(tmp_path))
    monkeypatch.setenv("COURSE_SIZE", "smoke")
    return tmp_path


def test_file_name_is_the_one_naming():
    """Spaces, slashes and other runs of unsafe characters become one '_'; safe names stay as they are."""
    assert results.file_name("NVIDIA H100 80GB HBM3") == "NVIDIA_H100_80GB_HBM3"
    assert results.file_name(" Tesla T4 ") == "Tesla_T4"
    assert results.file_name("A/B (x)") == "A_B_x_"
    assert results.file_name("04_mixed-precision.v2") == "04_mixed-precision.v2"


def test_record_and_load_round_trip(build):
    """Figures come back in order with size and hardware; re-recording a name replaces it; clear forgets them."""
    assert results.load("99_test") == []
    results.record("99_test", "a", 1, "s", "first")
    results.record("99_test", "b", 2.5)
    results.record("99_test", "a", 3, "s", "again")  # a re-run cell replaces its figure
    figures = results.load("99_test")
    assert [(f["name"], f["value"], f["unit"], f["note"]) for f in figures] == [("b", 2.5, "", ""),
                                                                              ("a", 3.0, "s", "again")]
    assert {f["size"] for f in figures} == {"smoke"} and {f["hardware"] for f in figures} == {hardware.label()}
    assert results.figures_file("99_test") == build / "results" / "99_test.json"
    assert results.load("other") == []  # lessons do not see each other's figures
    results.clear("99_test")
    assert results.load("99_test") == [] and not results.figures_file("99_test").exists()


def test_save_rows_writes_the_rows_and_records_their_throughput(build):
    """The rows file holds the rows, size and hardware facts; each row's images/s becomes one of the figures."""
    path = results.save_rows([ROW, replace(ROW, name="y", images_per_s=50.0)], "99_test")
    assert path == build / "results" / "bench-99_test.json"
    data = json.loads(path.read_text())
    assert data["rows"][0] == ROW.to_json() and data["lesson"] == "99_test" and data["size"] == "smoke"
    assert data["hardware"]["torch"] == torch.__version__
    assert [(f["name"], f["value"]) for f in results.load("99_test")] == [("x images/s", 123.5),
                                                                        ("y images/s", 50.0)]
    assert "batch 8, 32-true, median step 4 ms" in results.load("99_test")[0]["note"]
    # a step time in plain digits, never e-notation (1,234 ms was '1.23e+03 ms')
    results.save_rows([replace(ROW, step_ms=1234.0)], "99_test")
    assert {f["name"]: f["note"] for f in results.load("99_test")}["x images/s"].endswith("median step 1,234 ms")


def test_write_report_layout_is_what_committed_reads(build, monkeypatch):
    """write_report: title, command, hardware, lines, versions; committed() gives back title, hardware, comparison."""
    monkeypatch.setattr(sys, "argv", ["/repo/scripts/gpu_x.py", "--seeds", "2"])
    main = types.ModuleType("__main__")  # as `python -m scripts.gpu_x --seeds 2` starts it
    main.__spec__, main.__file__ = importlib.machinery.ModuleSpec("scripts.gpu_x", None), "/repo/scripts/gpu_x.py"
    monkeypatch.setitem(sys.modules, "__main__", main)
    info = {"gpu": "GPU X", "gpu_count": 1, "cuda": "13.0", "torch": "2.x"}
    lines = ["## (a) part", "- a: 1", "", "## Comparison", "- time, b / a: 1.2x ± 0.1x", "## (d) later", "- d: 4"]
    path = results.write_report(results.report_path("gpu_x", None), "Run on GPU X", lines, info)
    text = path.read_text().splitlines()
    assert text[:6] == ["# Run on GPU X", "", "Command: `python -m scripts.gpu_x --seeds 2`", "",
                        "Hardware: 1x GPU X (CUDA 13.0)", ""]
    assert text[-1] == "Versions and hardware facts: gpu GPU X, gpu_count 1, cuda 13.0, torch 2.x"
    monkeypatch.setattr(sys, "argv", ["tool.py", "-x"])  # a file run as a script (not the __main__ module above)
    assert results.command_line() == "python tool.py -x"
    assert results.committed("gpu_x-dryrun.md", build) == [
        {"file": "gpu_x-dryrun.md", "title": "Run on GPU X", "hardware": "Hardware: 1x GPU X (CUDA 13.0)",
         "comparison": ["- time, b / a: 1.2x ± 0.1x"]}]


def test_committed_none_without_docs_and_empty_without_gpu_runs(tmp_path):
    assert results.committed(folder=tmp_path / "absent") is None  # installed without the checkout
    assert results.committed(folder=tmp_path) == []  # no GPU run committed yet
    (tmp_path / "x-capstone.md").write_text("# partial\n\nHardware: GPU X\n\n## (a) airbench94 itself\n- a: 1\n")
    assert results.committed(folder=tmp_path) == [
        {"file": "x-capstone.md", "title": "partial", "hardware": "Hardware: GPU X", "comparison": []}]


def test_report_rewrites_sections_in_order(build):
    """Sections set in any order are written in the report's order; an unknown section is an error, not lost."""
    report = results.Report(build / "r.md", "T", order=("setup", "a", "b"), info={"cpu": "C", "cpu_cores": 2})
    report.set("b", ["## b", "- b: 2"])
    report.set("setup", ["Data: here"])
    text = (build / "r.md").read_text()
    assert text.index("Data: here") < text.index("## b") and "Hardware: CPU C (2 cores)" in text
    report.set("setup", ["Data: there"])  # replaced, not appended
    assert "Data: here" not in (build / "r.md").read_text()
    with pytest.raises(KeyError, match="not one of this report's sections"):
        report.set("c", [])


def test_replace_block_rewrites_only_between_its_markers(tmp_path):
    """A generated block is replaced whole, the text around it kept; a file without the markers names them."""
    start, end = results.block_markers("table")
    doc = tmp_path / "doc.md"
    doc.write_text(f"intro\n{start}\nold\n{end}\noutro\n")
    results.replace_block(doc, "table", ["| a |", "| 1 |"])
    assert doc.read_text() == f"intro\n{start}\n| a |\n| 1 |\n{end}\noutro\n"
    assert results.read_block(doc, "table") == ["| a |", "| 1 |"] and results.read_block(doc, "other") == []
    with pytest.raises(CourseError, match="<!-- other: start"):
        results.replace_block(doc, "other", [])


def test_json_and_rows_round_trip(tmp_path):
    """write_json/read_json (a missing file gives the default) and append_row/read_rows, folders created."""
    assert results.read_json(tmp_path / "none.json", {}) == {} and results.read_rows(tmp_path / "none.jsonl") == []
    results.write_json(tmp_path / "a" / "x.json", {"k": [1, 2]})
    assert results.read_json(tmp_path / "a" / "x.json") == {"k": [1, 2]}
    for i in range(2):
        results.append_row(tmp_path / "b" / "runs.jsonl", {"seed": i})
    assert results.read_rows(tmp_path / "b" / "runs.jsonl") == [{"seed": 0}, {"seed": 1}]


def test_with_unit_puts_a_factors_x_on_its_number():
    assert results.with_unit("1.54", "x") == "1.54x"
    assert results.with_unit("1.22", "x slower") == "1.22x slower"
    assert results.with_unit("12.6", "s") == "12.6 s"
    assert results.with_unit("3", "xyz") == "3 xyz"  # a unit that merely starts with x is not a factor
    assert results.with_unit("8", "") == "8"


def test_a_cpus_label_leaves_out_trademarks_clocks_and_filler_words():
    """Every figure's hardware line names the CPU short enough to fit a 120-character line: 'Intel(R) Xeon(R)
    Processor' prints as 'Intel Xeon'; a name with nothing to drop is kept whole."""
    assert hardware.cpu_name("Intel(R) Xeon(R) Processor") == "Intel Xeon"
    assert hardware.cpu_name(" Intel(R) Xeon(R) CPU @ 2.20GHz\n") == "Intel Xeon"
    assert hardware.cpu_name("AMD EPYC 7B13 64-Core Processor") == "AMD EPYC 7B13 64-Core"
    assert hardware.cpu_name("Intel(R) Xeon(R) Platinum 8480+") == "Intel Xeon Platinum 8480+"
    assert hardware.cpu_name("AMD EPYC") == "AMD EPYC" and hardware.cpu_name("CPU") == "CPU"
