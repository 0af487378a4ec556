"""scripts/estimate_gpu_times.py: it runs, its FLOP counts are positive and grow with the run size, and the README's
T4/H100 estimate columns are exactly what it computes (so the two cannot drift apart)."""
import sys
from pathlib import Path

import pytest

from course_lib.base import results

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "scripts" / "estimate_gpu_times.py"


@pytest.fixture(scope="module")
def est():
    """The script, imported as a module."""
    from scripts import estimate_gpu_times

    return estimate_gpu_times


@pytest.fixture(scope="module")
def full(est):
    """Estimates at full size (what the README shows)."""
    return est.estimates("full")


@pytest.fixture(scope="module")
def smoke(est):
    """Estimates at smoke size."""
    return est.estimates("smoke")


def test_script_runs_and_prints_every_lesson(est, smoke, monkeypatch, capsys):
    """The documented command (`scripts/estimate_gpu_times.py --size smoke`, its main() run here, in this process)
    asks for the smoke-size estimates and prints a row for each lesson (the estimates are computed once, by the
    fixture, as the script would)."""
    sizes = []
    monkeypatch.setattr(est, "estimates", lambda size: sizes.append(size) or smoke)
    monkeypatch.setattr(sys, "argv", [str(SCRIPT), "--size", "smoke"])
    est.main()
    out = capsys.readouterr().out
    assert sizes == ["smoke"]
    for lesson in est.LESSONS:
        assert f"| {lesson} |" in out


def test_flops_positive_and_growing_with_run_size(est, full, smoke):
    """Every lesson counts positive FLOPs on both GPUs; full size counts more than smoke size wherever the lesson's
    work depends on the size (lesson 00's matmuls do not)."""
    for lesson in est.LESSONS:
        for gpu in est.GPUS:
            f, s = full[lesson][gpu][0]["flops"], smoke[lesson][gpu][0]["flops"]
            assert s > 0 and f > 0, (lesson, gpu)
            assert f > s or (lesson == "00_setup" and f == s), (lesson, gpu, f, s)


def test_ranges_are_ordered(full):
    """For every item: 0 <= lower bound <= fast estimate <= slow estimate."""
    for lesson, by_gpu in full.items():
        for gpu, (_, items) in by_gpu.items():
            for it in items:
                assert 0 <= it.lower <= it.fast + 1e-9 <= it.slow + 2e-9, (lesson, gpu, it)


def test_span_rounds_outwards(est):
    """Ranges are rounded outwards: 5 s steps below 90 s, whole minutes above."""
    assert est.span(4.0, 14.0) == "5-15 s"
    assert est.span(53.0, 111.0) == "50 s-2 min"
    assert est.span(855.0, 3401.0) == "14-57 min"


def test_readme_table_is_the_scripts(est, full):
    """The README's estimate block is exactly readme_table's lines for the full-size estimates, marked as estimates."""
    readme = REPO / "README.md"
    assert results.read_block(readme, est.README_BLOCK) == est.readme_table(est.readme_cells(full)), \
        "run scripts/estimate_gpu_times.py --write"
    assert "docs/results/gpu-estimates.md" in readme.read_text() and "T4 (estimate)" in readme.read_text()


def test_cpu_wall_times_come_from_the_committed_runs(est):
    """cpu_wall_s reads each lesson's committed run (runner.committed_runs, which the README's lesson table shows)."""
    for lesson in est.LESSONS:
        assert est.cpu_wall_s(lesson) > 0, lesson


def test_the_estimator_prices_the_specs_sections(est, full):
    """lesson_items is the start plus each spec section's work, priced in the notebook's order: no lesson of its own
    (a section added to a lesson's spec is counted with nothing else changed). A section without work says why."""
    import inspect

    from course_lib.base import lessons

    assert "if lesson ==" not in inspect.getsource(est)
    for lesson in est.LESSONS:
        spec = lessons.get(lesson)
        assert spec.sections and all(s.note or s.work is not type(s).work for s in spec.sections), lesson
        for gpu, e in ((g, est.Estimator(g)) for g in est.GPUS):
            run = est.run_of(lesson, e)
            work = [w for s in spec.sections for w in s.work(run)]
            assert [it.what for it in full[lesson][gpu][1][2:]] == [w.what for w in work], (lesson, gpu)


def test_sections_read_only_figures_their_specs_name(est):
    """Every committed figure a spec section reads is named in that lesson's spec (lessons.Lesson.figures), so the
    committed runs keep it (test_lesson_spec checks they do)."""
    import dataclasses

    from course_lib.base import lessons

    read = set()
    for lesson in est.LESSONS:
        for gpu in est.GPUS:
            e = est.Estimator(gpu)
            run = est.run_of(lesson, e)
            spy = dataclasses.replace(run, figure=lambda name, fig, f=run.figure: read.add((name, fig)) or f(name, fig))
            for section in lessons.get(lesson).sections:
                section.work(spy)
    assert read and all(fig in lessons.get(name).figures for name, fig in read), read
