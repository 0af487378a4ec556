"""The measured exercises' margins (issue 20): for each lesson 01-08, its check run once with the starter (the
notebook's EXERCISE cell, timed even though its mechanism fails) and once with the reference solution
(notebooks/solutions/NN_topic.py), at the size COURSE_SIZE chooses, on this machine. One table row per lesson: the
bar, both ratios with their per-round spread, the margin (solution / bar), pass or fail, hardware, size and rounds.

    COURSE_SIZE=smoke .venv/bin/python -m scripts.exercise_margins [--lessons 02 07]

Each lesson runs in a fresh process, as in its own kernel. A margin below 1.25 (issue 20's floor) is flagged. Run
it on a quiet machine: another process's load lands in the rounds' spread. Timing here never fails a test; `make
test` grades the mechanisms without a clock."""
from __future__ import annotations

import argparse
import contextlib
import io
import subprocess
import sys

from course_lib import exercises
from course_lib.base import config, hardware
from course_lib.exercises import Grade, Grading, inference
from course_lib.measure import timing
from course_lib.training import runs

MIN_MARGIN = 1.25  # issue 20: each solution clears its bar by at least this factor

# lesson: (check, exercise number, the function the learner writes)
EXERCISES = {
    "01": (exercises.check_01_batching, 1, "classify"),
    "02": (exercises.check_02_trainer, 3, "trainer_settings"),
    "03": (exercises.check_03_data_wait, 1, "make_data"),
    "04": (exercises.check_04_activation_memory, 1, "train_step"),
    "05": (exercises.check_05_fusion, 1, "activation"),
    "06": (exercises.check_06_allreduce, 3, "average_gradients"),
    "07": (exercises.check_07_inference, 2, "quantize"),
    "08": (exercises.check_08_batch_augment, 2, "augment"),
}
#: the prediction each lesson's exercise asks for first, passed after the check's inputs (the solution's, the starter's)
PREDICTORS = {"01": "predict_speedup", "02": "predict_step_seconds", "03": "predict_batch_seconds",
              "04": "predict_time_ratio", "05": "predict_speedup", "07": "predict_speedup", "08": "predict_speedup"}


def graded(lesson: str, fn, inputs: tuple, *, time_failing: bool) -> tuple[bool | None, list[Grade], str]:
    """(the check's verdict, its recorded grades, its printed output) for one learner function; an error is a
    verdict of None with the error as output (a starter that cannot even run, e.g. 05's graph break)."""
    check = EXERCISES[lesson][0]
    out = io.StringIO()
    grading = Grading(time_failing=time_failing)
    with contextlib.redirect_stdout(out):
        try:
            verdict = check(fn, *inputs, grading=grading)
        except Exception as err:  # reported in the row, never hidden: the other lessons still run
            first = str(err).strip().splitlines()[0] if str(err).strip() else ""
            return None, grading.grades, f"{type(err).__name__}: {first}"
    return bool(verdict), grading.grades, out.getvalue()


def ratio_text(grades: list[Grade]) -> str:
    """'2.31x (2.10-2.52)' of the main grade (the first), or 'not timed'."""
    if not grades:
        return "not timed"
    g = grades[0]
    return f"{g.ratio:.2f}x ({g.low:.2f}-{g.high:.2f})"


def row(lesson: str, size: str) -> tuple[str, float | None]:
    """One markdown table row for `lesson`, and the solution's margin (None where it was not timed)."""
    _, number, name = EXERCISES[lesson]
    inputs = inference.inputs_07() if lesson == "07" else ()
    told = PREDICTORS.get(lesson)
    mine = exercises.solution(lesson)
    inputs_starter = (*inputs, exercises.starter(lesson, number)[told]) if told else inputs
    inputs = (*inputs, mine[told]) if told else inputs
    with timing.Stopwatch() as both:  # the starter's check and the solution's (each check times on its device itself)
        _, starter_grades, starter_out = graded(lesson, exercises.starter(lesson, number)[name], inputs_starter,
                                                time_failing=True)
        passed, grades, out = graded(lesson, mine[name], inputs, time_failing=False)
    if not grades:  # the solution failed its mechanism or raised: say why, from its own output
        last = [line for line in out.strip().splitlines() if line.strip()][-1:] or ["no output"]
        return f"| {lesson} | | {ratio_text(starter_grades)} | not timed | | FAIL: {last[0][:80]} | | {size} | |", None
    g = grades[0]
    margin = g.ratio / g.target
    others = "; ".join(f"{o.name}: {o.ratio:.2f}x / {o.target:g}x" for o in grades[1:])
    verdict = ("pass" if passed else "FAIL") + (f" (margin < {MIN_MARGIN})" if margin < MIN_MARGIN else "")
    if starter_grades and starter_grades[0].ratio >= g.target:
        verdict += "; the STARTER reaches the bar"
    return (f"| {lesson} | {g.target:g}x {g.what} | {ratio_text(starter_grades)} | {ratio_text(grades)} | "
            f"{margin:.2f} | {verdict}{' (' + others + ')' if others else ''} | {g.hardware or hardware.label()} | "
            f"{size} | {g.rounds} rounds, {both.seconds:.0f} s |"), margin


def main(argv: list[str] | None = None) -> None:
    """Print the margins table for the chosen lessons."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lessons", nargs="*", default=sorted(EXERCISES), choices=sorted(EXERCISES))
    parser.add_argument("--row", choices=sorted(EXERCISES), help=argparse.SUPPRESS)  # one row, in this process
    args = parser.parse_args(argv)
    runs.quiet_lightning()
    size = config.run_size().name
    if args.row:
        print(row(args.row, size)[0], flush=True)
        return
    every = timing.Stopwatch().start()  # the lessons' processes, one after another
    print(f"Exercise margins on {hardware.label()}, run size {size} (ratio: baseline's cost / yours, median of the "
          f"rounds, per-round range in brackets; margin: solution's ratio / bar, floor {MIN_MARGIN})\n")
    print("| lesson | bar | starter | solution | margin | verdict | hardware | size | runs |")
    print("|---|---|---|---|---|---|---|---|---|")
    for lesson in args.lessons:  # each in a fresh process, as each lesson's check runs in its own kernel: an earlier
        # check's threads, workers and compiled graphs then cannot slow (or warm) a later one
        done = subprocess.run([sys.executable, "-m", "scripts.exercise_margins", "--row", lesson], capture_output=True,
                              text=True, env=config.child_env())  # child_env: this checkout on PYTHONPATH
        rows = [line for line in done.stdout.splitlines() if line.startswith(f"| {lesson} |")]
        why = (done.stderr.strip().splitlines() or ["no output"])[-1][:120]
        print(rows[-1] if rows else f"| {lesson} | | | | | ERROR: {why} | | {size} | |", flush=True)
    print(f"\n{len(args.lessons)} lessons in {every.elapsed():.0f} s")


if __name__ == "__main__":
    main()
