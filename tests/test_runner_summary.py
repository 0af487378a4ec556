"""`python -m course_lib.entry.runner` writes build/summary.md without terminal codes, and a run of some lessons updates
their rows while keeping the others' (marked as earlier)."""
from __future__ import annotations

import pytest

from course_lib.base import config
from course_lib.entry import runner


@pytest.fixture
def fake_lessons(tmp_path, monkeypatch):
    """Two lesson files and a run_lesson that 'executes' them with a given outcome, without a kernel."""
    for name in ("00_setup", "01_baseline"):
        (tmp_path / f"{name}.ipynb").write_text("{}")
    outcome = {}

    def run_lesson(path, out_dir, inplace, timeout):
        out_dir.mkdir(parents=True, exist_ok=True)  # as the real one does when it saves the executed notebook
        ok, error = outcome.get(path.stem, (True, None))
        return {"lesson": path.stem, "ok": ok, "seconds": 1.0, "error": error, "figures": []}

    monkeypatch.setattr(runner, "run_lesson", run_lesson)
    return tmp_path, outcome


def test_summary_has_no_terminal_codes(fake_lessons):
    folder, outcome = fake_lessons
    outcome["01_baseline"] = (False, "\x1b[0;31mNameError\x1b[0m: name 'F' is not defined")
    assert runner.main(["--notebooks", str(folder)]) == 1
    text = (config.build_dir() / "summary.md").read_text()
    assert "\x1b" not in text and "FAIL: NameError: name 'F' is not defined" in text


def test_one_lesson_run_keeps_the_other_rows(fake_lessons):
    folder, outcome = fake_lessons
    (config.build_dir() / "summary.json").unlink(missing_ok=True)
    outcome["01_baseline"] = (False, "ValueError: x")
    runner.main(["--notebooks", str(folder)])
    outcome["01_baseline"] = (True, None)
    assert runner.main(["01", "--notebooks", str(folder)]) == 0
    text = (config.build_dir() / "summary.md").read_text()
    assert "| 00_setup | pass (earlier run" in text and "| 01_baseline | pass |" in text
    assert "ValueError" not in text


def test_error_cells_escape_table_pipes():
    assert runner.plain("a | b\x1b[1m") == "a | b"
    rows = [{"lesson": "01_x", "ok": False, "seconds": 1.0, "error": "a | b\nc", "figures": []}]
    assert "| 01_x | FAIL: a \\| b c | 1 s | - |" in runner.summary_markdown(rows, "smoke", "CPU")


def test_summary_puts_a_factors_x_on_its_number():
    """The summary writes '1.485x slower' as the lessons do, not '1.485 x slower'; other units keep their space."""
    row = {"lesson": "05_x", "ok": True, "seconds": 1.0, "error": None,
           "figures": [{"name": "a", "value": 1.485, "unit": "x slower"}, {"name": "b", "value": 12.6, "unit": "s"},
                       {"name": "c", "value": 3, "unit": ""}]}
    text = runner.summary_markdown([row], "smoke", "test machine")
    assert "a = 1.485x slower; b = 12.6 s; c = 3 |" in text
