"""The verdict's words follow the numbers: faster, slower, within noise, a single run, a target met or missed."""
from __future__ import annotations

import pytest

from course_lib import verdict


def test_faster_when_every_run_of_a_beats_every_run_of_b():
    """Throughputs whose ranges do not overlap: 'faster', the median ratio and its range, n."""
    text = verdict.compare([170, 180, 175], [100, 105, 102], "compiled", "eager")
    assert text.startswith("compiled is 1.72x faster than eager")
    assert "range 1.62–1.80x, n=3" in text


def test_slower_names_the_factor_the_other_way():
    """a at 0.68x of b reads '1.47x slower', with the range turned round too."""
    text = verdict.compare([68, 67, 69], [100, 101, 99], "bf16-mixed", "fp32")
    assert text.startswith("bf16-mixed is 1.47x slower than fp32"), text


def test_overlapping_ranges_are_within_noise():
    """A 3 % gap inside a 10 % run-to-run range is no difference."""
    text = verdict.compare([103, 95, 108], [100, 97, 105], "barebones", "quiet Trainer")
    assert verdict.NOISE in text and "3 runs" in text
    assert "faster" not in text and "slower" not in text


def test_times_lower_is_better():
    """Seconds: the one that takes less time is faster."""
    text = verdict.compare([1.0, 1.1, 1.05], [2.0, 2.1, 2.2], "fast", "slow", higher_is_better=False)
    assert text.startswith("fast is 2.00x faster than slow")


def test_paired_rounds_use_per_round_ratios():
    """Interleaved rounds: a drift that moves both sides cancels, so a steady 1.1x is called; unpaired it is noise."""
    a, b = [110, 220, 330], [100, 200, 300]
    assert "1.10x faster" in verdict.compare(a, b, "A", "B", paired=True)
    assert "rounds 1.10–1.10x" in verdict.compare(a, b, "A", "B", paired=True)
    assert verdict.NOISE in verdict.compare(a, b, "A", "B")
    with pytest.raises(ValueError, match="as many runs"):
        verdict.compare([1, 2], [1], "A", "B", paired=True)


def test_a_single_run_is_no_verdict():
    """One run each: the factor is reported, and the line says it cannot show the spread."""
    text = verdict.compare([200], [100], "A", "B")
    assert "2.00x faster" in text and "single run" in text and "no verdict" in text


def test_difference_exceeding_the_band_is_called():
    """Accuracy means 1 pt apart with 0.1 pt scatter: called 'lower'; the same gap with 2 pt scatter is noise."""
    tight = verdict.difference([92.0, 92.1, 91.9], [93.0, 93.1, 92.9], "QAT", "fp32", unit=" pt")
    assert tight.startswith("QAT is 1.00 pt lower than fp32"), tight
    loose = verdict.difference([90.0, 94.0, 92.0], [95.0, 91.0, 93.0], "QAT", "fp32", unit=" pt")
    assert verdict.NOISE in loose and "-1.00 pt" in loose


def test_difference_of_single_runs_against_a_seed_spread():
    """One run per ladder rung, judged by the seed loop's std: +0.7 pt is noise at std 0.62, +3 pt is not."""
    assert verdict.NOISE in verdict.difference([93.4], [92.7], "rung 2", "rung 1", unit=" pt", noise=0.62)
    called = verdict.difference([95.7], [92.7], "rung 2", "rung 1", unit=" pt", noise=0.62)
    assert called.startswith("rung 2 is 3.00 pt higher than rung 1") and "std 0.62 pt" in called
    assert "no verdict" in verdict.difference([93.4], [92.7], "rung 2", "rung 1")


def test_target_met_and_missed():
    """The median decides; the line counts the runs past the goal; 'at most' for lower-is-better targets."""
    met = verdict.target([2.1, 2.5, 1.9], 2.0, "speedup")
    assert met.startswith("speedup meets the target of at least 2.00x") and "2 of 3 runs" in met
    missed = verdict.target([1.9, 1.8, 2.05], 2.0, "speedup")
    assert missed.startswith("speedup misses the target of at least 2.00x") and "1 of 3 runs" in missed
    assert "meets the target of at most 1.05x" in verdict.target([1.02], 1.05, "overhead", higher_is_better=False)
    assert "single run" in verdict.target([1.02], 1.05, "overhead", higher_is_better=False)


def test_number_is_plain():
    """Tables show 7,770 and 0.0123, never e-notation."""
    assert verdict.number(7770.4) == "7,770"
    assert verdict.number(13952.0) == "13,952"
    assert verdict.number(0.012345) == "0.0123"
    assert verdict.number(1.3549) == "1.35"
    assert "e" not in verdict.number(1.5e4)
    assert verdict.number(2.24e-08) == "2.24e-08"  # a rounding error stays readable


def test_spread_reports_one_run_as_such():
    """The seed-loop summary: mean ± std (min–max, n runs), and '(1 run)' alone."""
    assert verdict.spread([1.0, 2.0, 3.0]) == "2.00 ± 1.00 (1.00–3.00, 3 runs)"
    assert verdict.spread([1.5], unit=" s") == "1.50 s (1 run)"


def test_direction_agrees_with_the_words():
    """direction() is compare()'s decision as a number: +1 faster, -1 slower, 0 noise, None for one run."""
    assert verdict.direction([170, 180, 175], [100, 105, 102]) == 1
    assert verdict.direction([68, 67, 69], [100, 101, 99]) == -1
    assert verdict.direction([103, 95, 108], [100, 97, 105]) == 0
    assert verdict.direction([1.0, 1.1], [2.0, 2.1], higher_is_better=False) == 1
    assert verdict.direction([200], [100]) is None


def test_paired_accuracy_counts_only_the_images_that_differ():
    """Same 1,000 images: 30 more right of 40 discordant is a difference; 3 more of 40 is within the test noise."""
    base = [True] * 500 + [False] * 500
    better = base[:]
    for i in range(500, 535):  # 35 images B gets wrong and A right ...
        better[i] = True
    for i in range(0, 5):  # ... and 5 the other way: +30 images, 40 discordant
        better[i] = False
    assert verdict.paired_accuracy(better, base, "pruned", "fp32").startswith("pruned is 3.00 pt higher than fp32")
    close = base[:]
    for i in range(500, 522):
        close[i] = True
    for i in range(0, 18):
        close[i] = False
    text = verdict.paired_accuracy(close, base, "QAT", "PTQ")
    assert verdict.NOISE in text and "+0.40 pt" in text and "one training run each" in text
    with pytest.raises(ValueError, match="same"):
        verdict.paired_accuracy([True], [True, False], "a", "b")
