"""The self-check helper of the exercises, and the course runner's summary."""
import pytest

from course_lib.runner import lesson_paths, summary_markdown
from course_lib.warmups import check


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


def test_lessons_are_found_in_course_order():
    """The runner finds NN_topic notebooks sorted by number."""
    from pathlib import Path

    names = [p.stem for p in lesson_paths(Path(__file__).resolve().parents[1] / "notebooks")]
    assert names[:3] == ["00_setup", "01_pytorch_baseline", "02_lightning"]
    assert names == sorted(names)
