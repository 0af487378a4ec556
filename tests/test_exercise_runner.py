"""The self-check helper of the exercises, and the course runner's summary."""
import pytest

from course_lib.entry.runner import lesson_paths, summary_markdown
from course_lib.exercises.warmups import check


def test_check_not_attempted_is_not_an_error(capsys):
    """A None answer prints a hint and returns None."""
    assert check("Ex", None, 3) is None
    assert "not attempted" in capsys.readouterr().out


def test_check_accepts_close_numbers_and_rejects_far_ones():
    """Numbers compare with a relative tolerance; a wrong answer raises."""
    assert check("Ex", 1.04, 1.0, rel_tol=0.05) is True
    with pytest.raises(AssertionError, match="not right yet"):
        check("Ex", 1.2, 1.0, rel_tol=0.05)


def test_check_compares_strings_exactly():
    """Non-numeric answers must be equal."""
    assert check("Ex", "cat", "cat") is True
    with pytest.raises(AssertionError):
        check("Ex", "dog", "cat")


def test_summary_names_hardware_status_and_figures():
    """The summary lists each lesson's result, wall time and figures with the hardware."""
    rows = [{"lesson": "00_setup", "ok": True, "seconds": 12.3, "error": None,
             "figures": [{"name": "fp32 matmul", "value": 130.0, "unit": "GFLOP/s"}]},
            {"lesson": "01_x", "ok": False, "seconds": 3.0, "error": "NameError: F", "figures": []}]
    text = summary_markdown(rows, "smoke", "CPU test (2 cores)")
    assert "CPU test (2 cores)" in text and "size smoke" in text
    assert "| 00_setup | pass | 12 s | fp32 matmul = 130 GFLOP/s |" in text
    assert "FAIL: NameError: F" in text


def test_lessons_are_found_in_course_order_and_nothing_else(tmp_path):
    """The runner picks NN_topic.ipynb files in number order: no checkpoints, scratch notebooks, solutions or other
    files, and 10 after 09."""
    for name in ("10_extra.ipynb", "02_b.ipynb", "00_a.ipynb", "scratch.ipynb", "1_short.ipynb", "03_c.py",
                 ".ipynb_checkpoints/00_a-checkpoint.ipynb", "solutions/01_x.ipynb", "09_z.ipynb"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("{}")
    assert [p.name for p in lesson_paths(tmp_path)] == ["00_a.ipynb", "02_b.ipynb", "09_z.ipynb", "10_extra.ipynb"]
