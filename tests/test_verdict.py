"""The verdict's words follow the numbers and the rule: faster, slower, no difference, no practical difference, too
few rounds to judge, a target met or missed, each in one short line with its evidence in .detail (the error rates
themselves: tests/test_verdict_rates.py)."""
from __future__ import annotations

import itertools
import math

import pytest

from course_lib.measure import significance, verdict

FAST = [170, 180, 175, 172, 178, 176]  # six interleaved rounds of images/s
SLOW = [100, 105, 102, 101, 104, 103]


def test_faster_when_every_round_favours_a():
    """Six paired rounds all on one side: the sign test's 2 x (1/2)^6 = 3.1 %, so 'faster', with its interval."""
    text = verdict.compare(FAST, SLOW, "compiled", "eager", paired=True)
    assert text == "compiled: 1.71x faster than eager (sure: 6 of 6 rounds)", text
    assert text.called == 1 and "sign test" in text.detail and "97 % interval 1.70x–1.72x faster" in text.detail
    assert "false-positive rate 3.1 %, at most 5 %" in text.detail


def test_slower_names_the_factor_the_other_way():
    """a at 0.58x of b reads '1.72x slower', its interval turned round too: every factor is >= 1."""
    text = verdict.compare(SLOW, FAST, "eager", "compiled", paired=True)
    assert text == "eager: 1.71x slower than compiled (sure: 6 of 6 rounds)", text
    assert "1.70x–1.72x slower" in text.detail and text.called == -1


def test_one_round_on_the_other_side_is_no_verdict_at_six_rounds():
    """Five of six rounds is what a fair coin does 2 x 7/64 = 22 % of the time: no difference, ratio still k >= 1."""
    a = [110, 111, 109, 112, 108, 95]
    text = verdict.compare(a, [100] * 6, "barebones", "the Trainer", paired=True)
    assert text == "barebones vs the Trainer: no difference (median 1.10x faster, 6 rounds)", text
    assert "5 of 6 rounds faster" in text.detail and "from 1.05x slower to 1.12x faster" in text.detail
    assert verdict.direction(a, [100] * 6, paired=True) == 0


def test_too_few_rounds_say_so_instead_of_guessing():
    """Three rounds cannot reach 5 % (all three on one side: 25 %): the line says how many it needs."""
    text = verdict.compare(FAST[:3], SLOW[:3], "compiled", "eager", paired=True)
    assert text == "compiled vs eager: too few rounds to judge (3 rounds, need 6)", text
    assert "compiled 1.71x faster in the median round" in text.detail and text.called is None
    assert "needs 6 to keep its false-positive rate at most 5 %" in text.detail
    assert verdict.direction(FAST[:3], SLOW[:3], paired=True) is None
    assert "(1 run each, need 4 a side)" in verdict.compare([200], [100], "A", "B")


def test_a_small_sure_gap_is_no_practical_difference():
    """1.02x in every round: beyond the spread, but under the 5 % worth calling; smallest=0 calls it."""
    a, b = [102, 204, 306, 408, 510, 612], [100, 200, 300, 400, 500, 600]
    text = verdict.compare(a, b, "A", "B", paired=True)
    assert text == "A vs B: no practical difference (sure: under 5 % faster; 6 rounds)", text
    slower = verdict.compare(b, a, "B", "A", paired=True)  # the direction is kept: the gap is sure
    assert slower == "B vs A: no practical difference (sure: under 5 % slower; 6 rounds)", slower
    assert "under the 5 % worth calling" in text.detail
    assert verdict.direction(a, b, paired=True) == 0
    assert verdict.compare(a, b, "A", "B", paired=True, smallest=0).startswith("A: 1.02x faster than B (sure:")


def test_times_lower_is_better():
    """Seconds: the one that takes less time is faster, by B's time over A's."""
    text = verdict.compare([1.0, 1.1, 1.05, 1.0], [2.0, 2.1, 2.2, 2.0], "fast", "slow", higher_is_better=False)
    assert text == "fast: 2.00x faster than slow (sure: 16 of 16 run pairs)", text
    assert "rank-sum test" in text.detail and "4 runs each" in text.detail


def test_paired_rounds_cancel_a_shared_drift_unpaired_runs_do_not():
    """A steady 1.1x under a drift that moves both sides: called paired; unpaired the runs overlap."""
    b = [100, 200, 300, 150, 250, 120]
    a = [1.1 * x for x in b]
    assert verdict.compare(a, b, "A", "B", paired=True).startswith("A: 1.10x faster than B")
    assert verdict.NOISE in verdict.compare(a, b, "A", "B")
    with pytest.raises(ValueError, match="as many runs"):
        verdict.compare([1, 2], [1], "A", "B", paired=True)


def test_unpaired_runs_use_the_rank_sum_interval():
    """Four runs a side that do not overlap: 2 / C(8, 4) = 2.9 %, called; the ratio is the median pairwise one."""
    text = verdict.compare([10.0, 10.5, 11.0, 10.2], [5.0, 5.1, 5.2, 5.3], "A", "B")
    assert text == "A: 2.01x faster than B (sure: 16 of 16 run pairs)", text
    assert "4 runs each: 16 of 16 run pairs faster; 97 % interval 1.89x–2.20x faster" in text.detail, text.detail


def test_difference_of_means_by_students_t():
    """Accuracy means 1 pt apart with 0.1 pt scatter: called; the same gap with 2 pt scatter is noise."""
    tight = verdict.difference([92.0, 92.1, 91.9], [93.0, 93.1, 92.9], "QAT", "fp32", unit=" pt")
    assert tight == "QAT: 1.00 pt lower than fp32 (sure: outside ± 0.24 pt, 3 runs each)", tight
    assert "Student's t, 3 runs each" in tight.detail and tight.called == -1
    loose = verdict.difference([90.0, 94.0, 92.0], [95.0, 91.0, 93.0], "QAT", "fp32", unit=" pt")
    assert verdict.NOISE in loose and "-1.00 pt" in loose and loose.called == 0
    small = verdict.difference([92.0, 92.1, 91.9], [93.0, 93.1, 92.9], "QAT", "fp32", unit=" pt", smallest=2)
    assert verdict.PRACTICAL in small


def test_difference_of_single_runs_against_a_seed_spread():
    """One run per speedrun step, judged by a 5-seed std (t with 4 df): +0.7 pt is noise at std 0.62, +3 pt is
    not."""
    quiet = verdict.difference([93.4], [92.7], "step 2", "step 1", unit=" pt", noise=0.62, noise_runs=5)
    assert verdict.NOISE in quiet
    called = verdict.difference([95.7], [92.7], "step 2", "step 1", unit=" pt", noise=0.62, noise_runs=5)
    assert called.startswith("step 2: 3.00 pt higher than step 1 (sure:") and "std 0.62 pt over 5 runs" in called.detail
    assert "too few runs to judge" in verdict.difference([93.4], [92.7], "step 2", "step 1")
    with pytest.raises(ValueError, match="noise_runs"):
        verdict.difference([93.4], [92.7], "step 2", "step 1", noise=0.62)


def test_target_median_decides_and_the_count_shows_how_firmly():
    """The median decides (or the caller's own value, a ratio of medians); the count of rounds past the goal shows
    how firmly and whether they straddle it; <= for lower-is-better targets; no measurement is an error."""
    met = verdict.against([2.1, 2.5, 1.9], 2.0)
    assert met.met and met.value == 2.1 and (met.past, met.rounds, met.low, met.high) == (2, 3, 1.9, 2.5)
    assert met.straddles
    missed = verdict.against([1.9, 1.8, 2.05], 2.0)
    assert not missed.met and missed.past == 1
    assert verdict.against([1.9, 1.8], 2.0, value=2.0).met and not verdict.against([1.9, 1.8], 2.0).straddles
    assert verdict.against([1.02], 1.05, higher_is_better=False).met
    assert not verdict.against([1.07], 1.05, higher_is_better=False).met
    with pytest.raises(ValueError, match="at least one measurement"):
        verdict.against([], 2.0)


def test_target_line_says_met_or_missed():
    """The GPU reports' line: the speed-up to two decimals against its target, met at or past it, else MISSED."""
    assert verdict.target_line("A / B", 2.0, 2.0) == "A / B = 2.00x (target 2.0x): met"
    assert verdict.target_line("A / B", 1.494, 1.5) == "A / B = 1.49x (target 1.5x): MISSED"


def test_number_is_plain():
    """Tables show 7,770 and 0.0123, never e-notation."""
    assert verdict.number(7770.4) == "7,770"
    assert verdict.number(13952.0) == "13,952"
    assert verdict.number(0.012345) == "0.0123"
    assert verdict.number(1.3549) == "1.35"
    assert "e" not in verdict.number(1.5e4)
    assert verdict.number(2.24e-08) == "2.24e-08"  # a rounding error stays readable


def test_times_rates_and_counts_read_in_human_units():
    """Times in ns, µs, ms or s and FLOP rates in MFLOP/s, GFLOP/s or TFLOP/s, never e-notation; '1 op'; a bench
    table's data_wait as a percentage, as the lessons write it."""
    from course_lib.benchmark import bench
    from course_lib.measure import roofline, timing

    assert [timing.duration(s) for s in (1.14e-08, 4.27e-4, 0.0306, 8.03)] == ["11.4 ns", "427 µs", "30.6 ms", "8.03 s"]
    assert timing.flop_rate(7.02e10) == "70.2 GFLOP/s" and timing.flop_rate(1.35e12) == "1.35 TFLOP/s"
    assert "e" not in timing.duration(1.14e-14) and roofline.ops(1) == "1 op" and roofline.ops(50) == "50 ops"
    # a range names a shared unit once, keeps two units apart, and is one figure where both ends print alike
    assert [timing.span(*pair) for pair in (("6.32 ms", "7.10 ms"), ("980 µs", "1.20 ms"), ("0.12", "3.45"),
                                             ("1.2", "1.2"))] == ["6.32–7.10 ms", "980 µs–1.20 ms", "0.12–3.45", "1.2"]
    row = {"name": "a", "images_per_s": 1000.0, "data_wait": 0.156}
    assert "| a | 1,000 | 16 % |" in bench.table([row], ["name", "images_per_s", "data_wait"])


def test_spread_reports_one_run_as_such():
    """The seed-loop summary: mean ± std (min–max, n runs), and '(1 run)' alone."""
    assert verdict.spread([1.0, 2.0, 3.0]) == "2.00 ± 1.00 (1.00–3.00, 3 runs)"
    assert verdict.spread([1.5], unit=" s") == "1.50 s (1 run)"


def test_direction_agrees_with_the_words():
    """direction() is compare()'s decision as a number: +1 faster, -1 slower, 0 noise, None too few."""
    assert verdict.direction(FAST, SLOW, paired=True) == 1
    assert verdict.direction(SLOW, FAST, paired=True) == -1
    assert verdict.direction([1.0, 1.1, 1.0, 1.05], [2.0, 2.1, 2.2, 2.0], higher_is_better=False) == 1
    assert verdict.direction([200], [100]) is None


def test_outcome_is_the_lines_call_without_the_names():
    """.outcome is the one wording a table's cell uses: what the line calls, never 'no difference' for a sure gap."""
    small = ([102, 204, 306, 408, 510, 612], [100, 200, 300, 400, 500, 600])  # 1.02x every round: under 5 %
    cases = [(verdict.compare(FAST, SLOW, "A", "B", paired=True), "1.71x faster"),
             (verdict.compare(SLOW, FAST, "A", "B", paired=True), "1.71x slower"),
             (verdict.compare(*small, "A", "B", paired=True), verdict.PRACTICAL),
             (verdict.compare([110, 111, 109, 112, 108, 95], [100] * 6, "A", "B", paired=True), verdict.NOISE),
             (verdict.compare(FAST[:3], SLOW[:3], "A", "B", paired=True), "too few rounds to judge"),
             (verdict.compare([200], [100], "A", "B"), "too few runs to judge"),
             (verdict.difference([93.4, 93.5, 93.6], [92.4, 92.5, 92.6], "A", "B", unit=" pt"), "1.00 pt higher"),
             (verdict.difference([93.4], [92.7], "A", "B"), "too few runs to judge")]
    for text, outcome in cases:
        assert text.outcome == outcome and outcome in text, (text, text.outcome)


def test_paired_accuracy_is_the_exact_mcnemar_test():
    """Same 1,000 images: 35 to 5 of 40 discordant is a difference (p < 0.001); 22 to 18 is within the test noise."""
    base = [True] * 500 + [False] * 500
    better = base[:]
    for i in range(500, 535):  # 35 images B gets wrong and A right ...
        better[i] = True
    for i in range(0, 5):  # ... and 5 the other way: +30 images, 40 discordant
        better[i] = False
    text = verdict.paired_accuracy(better, base, "pruned", "fp32")
    assert text == "pruned: 3.00 pt higher than fp32 (sure: 35 of 40 differing images)", text
    assert text.outcome == "3.00 pt higher"
    assert "exact McNemar test, 1,000 test images" in text.detail and "one training run each" in text.detail
    close = base[:]
    for i in range(500, 522):
        close[i] = True
    for i in range(0, 18):
        close[i] = False
    text = verdict.paired_accuracy(close, base, "QAT", "PTQ")
    assert text == "QAT vs PTQ: no difference (50.40 % vs 50.00 %, 1,000 test images)", text
    assert text.outcome == verdict.NOISE
    assert "22 go to QAT" in text.detail and "one training run each" in text.detail
    with pytest.raises(ValueError, match="same"):
        verdict.paired_accuracy([True], [True, False], "a", "b")


def test_the_exact_null_distributions_match_brute_force():
    """The rank-sum counts are every ordering counted; the sign cut and t quantiles match the tables."""
    for m, n in [(2, 4), (3, 3), (4, 3), (3, 5)]:
        counts = [0] * (m * n + 1)
        for where in itertools.combinations(range(m + n), m):  # positions of a's runs among all, ascending
            counts[sum(sum(j < i and j not in where for j in range(m + n)) for i in where)] += 1
        assert counts == significance.rank_sum_counts(m, n), (m, n)
    assert [significance.sign_cut(n) for n in (5, 6, 8, 9)] == [None, 0, 0, 1]
    assert significance.rank_cut(3, 3)[0] is None and significance.rank_cut(4, 4)[0] == 0
    assert significance.rank_cut(9, 9)[0] == 17  # the published two-sided 5 % critical value for 9 and 9
    for df, t in [(1, 12.706), (2, 4.303), (4, 2.776), (8, 2.306), (30, 2.042)]:  # two-sided 5 % t tables
        assert math.isclose(significance.t_critical(df, 0.05), t, abs_tol=1e-3), df


def test_factor_writes_every_ratio_as_k_at_least_one():
    """One convention for ratios, in printed verdicts and in results rows: k >= 1, then 'faster' or 'slower'."""
    assert verdict.factor(1.72) == "1.72x faster" and verdict.factor(1 / 1.72) == "1.72x slower"
    k, unit = verdict.factor_parts(0.5)
    assert (k, unit) == (2.0, "x slower") and verdict.factor_parts(3.0, "smaller", "larger") == (3.0, "x smaller")


def test_no_difference_is_called_against_the_medians():
    """Twelve rounds, ten of them 1.1x in a's favour, but its two losing rounds fall where the machine was fast: the
    sign test's interval excludes 1, yet a's median is below b's, so a table of medians would contradict the words.
    The rule calls nothing there (a stricter rule: its false-positive rate stays within the interval's)."""
    b = [float(x) for x in range(1, 11)] + [50.0, 60.0]
    a = [1.1 * x for x in range(1, 11)] + [5.0, 6.0]
    iv = verdict.interval(a, b, paired=True)
    assert iv.lo > 1 and verdict.medians_ratio(a, b) < 1  # the interval alone would call 'faster'
    assert verdict.direction(a, b, paired=True) == 0
    line = verdict.compare(a, b, "A", "B", paired=True)
    assert verdict.NOISE in line and "disagree" in line and "faster than" not in line
    assert "the medians' ratio is 1.13x slower" in line.detail, line.detail


# the lessons' longest names (03's data-path rows, 06's process layouts, 07's models, 08's steps)
NAMES = [("uint8 cache, num_workers=0", "JPEG, 2 workers, persistent"),
         ("JPEG, 2 workers, persistent", "JPEG, num_workers=2"),
         ("data on the device", "the DataLoader with num_workers=0"),
         ("2 processes x 1 thread, DDP", "1 process x 2 threads"),
         ("keeping the loss on the device", "one .item() per step"),
         ("LitLeNet, barebones", "the plain loop"), ("pruned 90%", "unpruned fp32"),
         ("the course's Muon step (f)", "airbench94_muon (e)"), ("training time", "the step before")]


def test_every_verdict_line_is_short():
    """Every kind of line, for the lessons' longest names, fits in LONGEST (120) characters: read at a glance."""
    rounds = [[170.0, 180, 175, 172, 178, 176], [100.0, 105, 102, 101, 104, 103], [110.0, 111, 109, 112, 108, 95],
              [102.0, 204, 306, 408, 510, 612], [100.0, 200, 300, 400, 500, 600], [1e5, 2e5, 3e5, 4e5, 5e5, 6e5]]
    right = [True] * 1_600 + [False] * 400
    models = [right, [not r if i % 7 == 0 else r for i, r in enumerate(right)], [False] * 2_000]
    lines = []
    for a, b in NAMES:
        for x, y in itertools.permutations(rounds, 2):
            for kwargs in ({"paired": True}, {}, {"higher_is_better": False}, {"paired": True, "smallest": 0}):
                lines += [verdict.compare(x, y, a, b, **kwargs), verdict.compare(x[:3], y[:3], a, b, **kwargs)]
            if max(x + y) > 1e3:  # differences in the lessons' units: seconds and points, under a thousand
                continue
            lines += [verdict.difference(x, y, a, b, unit=" s"), verdict.difference(x[:1], y[:1], a, b, unit=" s"),
                      verdict.difference(x[:1], y[:1], a, b, unit=" s", noise=3e4, noise_runs=5),
                      verdict.difference(x, y, a, b, unit=" s", smallest=0.05 * max(y))]
        lines += [verdict.paired_accuracy(m, n, a, b) for m, n in itertools.permutations(models, 2)]
    long = [f"{len(t)}: {t}" for t in lines if len(t) > verdict.LONGEST]
    assert not long, "\n".join(long[:5])
    assert all(t.detail for t in lines) and len(verdict.FOOTNOTE) < 800


def test_the_footnote_explains_the_rule_once():
    """FOOTNOTE names what 'sure' means, its 5 % false-positive rate, why six rounds and why the interval is 97 %."""
    for words in ("sure", "5 %", "6 of 6", "3.1 %", "97 %", "rank-sum", "Student's t", "no difference"):
        assert words in verdict.FOOTNOTE, words
    assert round(100 * significance.sign_level(6, 0)) == 97 and significance.paired_need() == 6


def test_no_difference_states_no_direction_for_a_ratio_that_rounds_to_one():
    """A median round of 1.003x would print '1.00x slower': a direction the figure does not have (issue 47)."""
    a, b = [100.3, 99.0, 101.5, 100.2, 98.9, 100.4], [100.0] * 6
    line = verdict.compare(a, b, "pruned", "fp32", paired=True)
    assert line == "pruned vs fp32: no difference (median under 1 % apart, 6 rounds)", line
    assert "1.00x" not in line


def test_no_difference_says_when_rounds_and_medians_point_different_ways():
    """Not called, the median round 1.04x slower but the table's medians the other way: the line says they disagree
    instead of printing a direction the table contradicts."""
    b = [10.0, 20.0, 30.0, 40.0, 50.0, 60.0]
    a = [9.7, 19.5, 45.0, 55.0, 49.0, 58.5]  # a loses 4 of 6 rounds by 2-3 %, yet a's median 47 > b's 35
    assert verdict.interval(a, b, paired=True).mid < 1 < verdict.medians_ratio(a, b)
    line = verdict.compare(a, b, "A", "B", paired=True)
    assert line == "A vs B: no difference (rounds and medians disagree; 6 rounds)", line

