"""Verdicts in words from measured figures: faster, slower or no difference, called by a rule whose false-positive
rate is known (at most ALPHA = 5 %), a measured figure against a target (met or missed: the one rule, against()),
spreads and plain numbers, so a lesson's conclusion is printed from its run. Each verdict is one short Verdict
line in one wording of how sure ("compiled: 1.71x faster than eager (sure: 6 of 6 rounds)"); its `.detail` names
the test, the interval and the counts, and FOOTNOTE explains the rule once.

The rule. A difference is called only when (1) the exact interval of the ratio (or difference) excludes "no change":
the sign test over paired rounds, the rank-sum test over unpaired runs, Student's t for means (measure.significance,
each at LEVEL = 4 %, whatever the noise, for Student's t normal noise), and (2) the ratio is at least MIN_EFFECT from 1
(else "no practical difference"). With too few rounds to reach that rate the line says so and names how many it
needs. One convention: "A: k.kkx faster (or slower) than B" with k >= 1, and every other line gives its ratio so.
"""
from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from typing import Sequence

from . import significance
from .significance import ALPHA, LEVEL

NOISE = "no difference"  # the rule could not be sure of one (not: the two are equal)
PRACTICAL = "no practical difference"
TOO_FEW = "too few"  # "too few rounds to judge" (paired) or "too few runs to judge"
MIN_EFFECT = 0.05  # the smallest speed difference worth calling: 5 % (below it, "no practical difference")
SURE = "sure"  # the one word for how sure a called difference is: "(sure: 6 of 6 rounds)"
LONGEST = 120  # the most characters a printed verdict line may take (tests/test_verdict.py checks the lessons' names)

FOOTNOTE = (
    "How sure: a line says 'sure' only where the course's rule calls a difference, and the rule calls one where "
    "nothing differs at most 5 % of the time (its false-positive rate). Speeds are measured in paired rounds, both "
    "sides back to back, and the sign test asks how often a fair coin would put that many rounds on one side: 6 of "
    "6 happens 2 x (1/2)^6 = 3.1 % of the time, so 6 rounds is the fewest that can be sure, and their interval "
    "covers 100 - 3.1 = 97 % (the test's own step, not a chosen level). Unpaired runs (the rank-sum test) and "
    "accuracies (Student's t, McNemar's test) keep the same 5 %. 'no difference' means the rule could not be sure, "
    "not that the two are equal; 'no practical difference' means a sure gap under 5 %."
)


class Verdict(str):
    """A short verdict line (the str) with `detail`, its test, interval and counts, `called`: +1 (a better), -1
    (b better), 0 (no (practical) difference) or None (too few rounds), and `outcome`, the line's call without the
    names ('1.72x faster', 'no difference', 'no practical difference'): the one wording for a table's cell."""

    def __new__(cls, line: str, detail: str, called: int | None, outcome: str) -> "Verdict":
        self = super().__new__(cls, line)
        self.detail, self.called, self.outcome = detail, called, outcome
        return self


def number(value: float, digits: int = 3) -> str:
    """A plain number to `digits` significant figures, thousands separated (7,770 not 7.77e+03); only a magnitude
    below 1e-4 (a rounding error, say) keeps e-notation, where plain digits would be a row of zeros."""
    if value == 0 or not math.isfinite(value):
        return f"{value:g}"
    if abs(value) < 1e-4:
        return f"{value:.{digits}g}"
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(value))))
    return f"{round(value, decimals):,.{decimals}f}"


def spread(values: Sequence[float], fmt: str = "{:.2f}", unit: str = "") -> str:
    """'mean ± std (min–max, n runs)' of repeated measurements; one value is reported as a single run."""
    if len(values) == 1:
        return f"{fmt.format(values[0])}{unit} (1 run)"
    mean, std = statistics.mean(values), statistics.stdev(values)
    return (f"{fmt.format(mean)}{unit} ± {fmt.format(std)}{unit} ({fmt.format(min(values))}–"
            f"{fmt.format(max(values))}{unit}, {len(values)} runs)")


def mean_diff(a: Sequence[float], b: Sequence[float], fmt: str = "{:+.2f}", unit: str = "") -> str:
    """'mean(b) - mean(a) ± its standard error (n_b and n_a runs)': a description for reports, not a verdict."""
    d = statistics.mean(b) - statistics.mean(a)
    se = (sum(statistics.variance(v) / len(v) for v in (a, b))) ** 0.5 if min(len(a), len(b)) > 1 else float("nan")
    return f"{fmt.format(d)}{unit} ± {fmt.format(se).lstrip('+')}{unit} (standard error; {len(b)} and {len(a)} runs)"


def mean_ratio(a: Sequence[float], b: Sequence[float]) -> str:
    """'mean(b) / mean(a) ± its standard error (delta method)': a description for reports, not a verdict."""
    r = statistics.mean(b) / statistics.mean(a)
    rel = (sum(statistics.variance(v) / len(v) / statistics.mean(v) ** 2 for v in (a, b)) ** 0.5
           if min(len(a), len(b)) > 1 else float("nan"))
    return f"{r:.3f}x ± {r * rel:.3f}x (standard error; {len(b)} and {len(a)} runs)"


def factor(ratio: float, better: str = "faster", worse: str = "slower") -> str:
    """A ratio in the course's one convention, k >= 1: 1.72 -> '1.72x faster', 0.58 -> '1.72x slower'."""
    return "{:.2f}{}".format(*factor_parts(ratio, better, worse))


def factor_parts(ratio: float, better: str = "faster", worse: str = "slower") -> tuple[float, str]:
    """factor() as a number and a unit, for a results row: 0.58 -> (1.72, 'x slower'), k >= 1."""
    return (ratio, f"x {better}") if ratio >= 1 else (1 / ratio, f"x {worse}")


def _pct(fraction: float) -> str:
    """0.05 -> '5 %' (the course writes a space before %)."""
    return f"{100 * fraction:g} %"


def _span(lo: float, hi: float, better: str, worse: str) -> str:
    """An interval of ratios with k >= 1 at both ends: '1.62x–1.80x faster', or 'from 1.10x slower to 1.20x faster'."""
    if lo >= 1:
        return f"{lo:.2f}x–{hi:.2f}x {better}"
    if hi <= 1:
        return f"{1 / hi:.2f}x–{1 / lo:.2f}x {worse}"
    return f"from {1 / lo:.2f}x {worse} to {hi:.2f}x {better}"


def interval(a: Sequence[float], b: Sequence[float], *, higher_is_better: bool = True,
             paired: bool = False) -> significance.Interval:
    """How many times better a is than b, with its exact interval (significance.ratio_interval): a / b for
    figures where higher is better (images/s), b / a for costs (seconds), so > 1 always means a is better."""
    if higher_is_better:
        return significance.ratio_interval(a, b, paired=paired)
    return significance.ratio_interval(b, a, paired=paired)


def medians_ratio(a: Sequence[float], b: Sequence[float], *, higher_is_better: bool = True) -> float:
    """How many times better a's median is than b's (what a table of medians shows); > 1: a is better."""
    r = statistics.median(a) / statistics.median(b)
    return r if higher_is_better else 1 / r


def _decide(iv: significance.Interval, smallest: float, shown: float | None = None) -> int | None:
    """+1 better, -1 worse (called), 0 not called, None too few rounds. A difference is called only where the medians'
    ratio (`shown`, what a table prints) points the same way as the interval: a stricter rule than the interval
    alone, so its false-positive rate stays within the interval's, and no table reads "slower" beside a higher
    median."""
    if math.isnan(iv.lo):
        return None
    agrees = shown is None or (shown - 1) * (iv.mid - 1) > 0
    if (iv.lo > 1 or iv.hi < 1) and max(iv.mid, 1 / iv.mid) >= 1 + smallest and agrees:
        return 1 if iv.mid > 1 else -1
    return 0


def direction(a: Sequence[float], b: Sequence[float], *, higher_is_better: bool = True, paired: bool = False,
              smallest: float = MIN_EFFECT) -> int | None:
    """compare()'s decision as a number: +1 a better, -1 b better, 0 no (practical) difference, None too few."""
    return _decide(interval(a, b, higher_is_better=higher_is_better, paired=paired), smallest,
                   medians_ratio(a, b, higher_is_better=higher_is_better))


def _agreeing(a: Sequence[float], b: Sequence[float], higher_is_better: bool, paired: bool, sign: int) -> tuple:
    """(rounds, or pairs of runs, with a better for sign +1 or b for -1; all of them): 'sure: 6 of 6 rounds'."""
    pairs, up = (list(zip(a, b)) if paired else [(x, y) for x in a for y in b]), 1 if higher_is_better else -1
    return sum((x - y) * up * sign > 0 for x, y in pairs), len(pairs)


def compare(a: Sequence[float], b: Sequence[float], name_a: str, name_b: str, *, higher_is_better: bool = True,
            paired: bool = False, better: str = "faster", worse: str = "slower",
            smallest: float = MIN_EFFECT, sample: str = "run") -> Verdict:
    """'A: 1.72x faster than B (sure: 6 of 6 rounds)', 'A vs B: no difference (median 1.02x slower, 6 rounds)',
    'A vs B: no practical difference (...)' or 'A vs B: too few rounds to judge (...)', with its .detail.

    a, b: repeated measurements of one figure (images/s when higher_is_better, seconds otherwise). paired: the
    i-th values were measured in the same interleaved round (the sign test; 6 rounds or more), else independent
    runs (the rank-sum test; 4 a side or more), each a `sample` ("epoch": '9 epochs each'); smallest: the least gap."""
    iv = interval(a, b, higher_is_better=higher_is_better, paired=paired)
    count = (f"{len(a)} round{'s' * (len(a) > 1)}" if paired else f"{len(a)} and {len(b)} {sample}s"
             if len(a) != len(b) else f"{len(a)} {sample}{'s' * (len(a) > 1)} each")
    near = f"{max(iv.mid, 1 / iv.mid):.2f}" == "1.00"  # no direction for a ratio that rounds to 1.00x
    median = "median " + ("under 1 % apart" if near else factor(iv.mid, better, worse))
    decision = _decide(iv, smallest, shown := medians_ratio(a, b, higher_is_better=higher_is_better))
    test = "sign test over paired rounds" if paired else "rank-sum test over unpaired runs"
    what = "rounds" if paired else f"{sample} pairs"
    if decision is None:
        need = f"{iv.need}" + ("" if paired else " a side")
        return Verdict(f"{name_a} vs {name_b}: {TOO_FEW} {'rounds' if paired else sample + 's'} to judge ({count}, "
                       f"need {need})",
                       f"{test}: {count}; it needs {need} to keep its false-positive rate at most {_pct(ALPHA)}; "
                       f"{name_a} {factor(iv.mid, better, worse)} in the "
                       f"{'median round' if paired else 'median ratio'}",
                       None, f"{TOO_FEW} {'rounds' if paired else 'runs'} to judge")
    way = 1 if iv.mid > 1 else -1
    agree, total = _agreeing(a, b, higher_is_better, paired, way)
    detail = (f"{test}, {count}: {agree} of {total} {what} {better if way > 0 else worse}; "
              f"{100 * iv.level:.0f} % interval {_span(iv.lo, iv.hi, better, worse)} "
              f"(false-positive rate {100 * (1 - iv.level):.1f} %, at most {_pct(ALPHA)})")
    if decision:
        return Verdict(f"{name_a}: {factor(iv.mid, better, worse)} than {name_b} ({SURE}: {agree} of {total} {what})",
                       detail, decision, factor(iv.mid, better, worse))
    opposite = (shown - 1) * (iv.mid - 1)  # < 0: the median round and the table's medians point different ways
    if (opposite < 0 and paired) or (opposite <= 0 and (iv.lo > 1 or iv.hi < 1)):
        return Verdict(f"{name_a} vs {name_b}: {NOISE} ({what} and medians disagree; {count})",
                       f"{detail}; but the medians' ratio is {factor(shown, better, worse)}: the two disagree", 0,
                       NOISE)
    if iv.lo > 1 or iv.hi < 1:
        gap = f"under {_pct(smallest)} {(worse, better)[way > 0]}"  # no factor: 1.0496 would print as past 5 %
        return Verdict(f"{name_a} vs {name_b}: {PRACTICAL} ({SURE}: {gap}; {count})",
                       f"{detail}; median {factor(iv.mid, better, worse)}, under the {_pct(smallest)} worth calling", 0,
                       PRACTICAL)
    return Verdict(f"{name_a} vs {name_b}: {NOISE} ({median}, {count})", detail, 0, NOISE)


def difference(a: Sequence[float], b: Sequence[float], name_a: str, name_b: str, *, unit: str = "",
               fmt: str = "{:.2f}", noise: float | None = None, noise_runs: int | None = None, smallest: float = 0.0,
               higher: str = "higher", lower: str = "lower") -> Verdict:
    """'A: 0.80 pt higher than B (sure: outside ± 0.30 pt, 5 runs each)', or no difference; .detail: Student's t.

    A difference of means is called when it lies outside Student's t band (significance.mean_difference: the
    pooled spread of a and b, or `noise`, the standard deviation of `noise_runs` repeated runs measured elsewhere,
    e.g. repeated seeds, when a side has a single run) and is at least `smallest` (in the figure's unit)."""
    iv = significance.mean_difference(a, b, noise=noise, noise_runs=noise_runs)
    d = iv.mid
    runs = f"{len(a)} and {len(b)} runs" if len(a) != len(b) else f"{len(a)} run{'s' * (len(a) > 1)} each"
    gap = f"{fmt.format(abs(d))}{unit} {higher if d >= 0 else lower} than {name_b}"
    within = f"{d:+.{_decimals(fmt)}f}{unit}" if round(d, _decimals(fmt)) else f"~0{unit}"  # not +0.00
    if math.isnan(iv.lo):
        return Verdict(f"{name_a} vs {name_b}: {TOO_FEW} runs to judge ({runs}, need 2 a side)",
                       f"Student's t needs 2 runs a side, or a run-to-run spread measured elsewhere; {name_a} "
                       f"measured {gap}", None, f"{TOO_FEW} runs to judge")
    band = iv.hi - d
    src = "their own spread" if noise is None else f"run-to-run std {fmt.format(noise)}{unit} over {noise_runs} runs"
    detail = (f"Student's t, {runs}: {within} against a band of ± {fmt.format(band)}{unit} ({src}; false-positive "
              f"rate {_pct(LEVEL)}, at most {_pct(ALPHA)})")
    if abs(d) > band and abs(d) >= smallest:
        return Verdict(f"{name_a}: {gap} ({SURE}: outside ± {fmt.format(band)}{unit}, {runs})", detail,
                       1 if d > 0 else -1, gap[:gap.rindex(" than ")])
    if abs(d) > band:
        return Verdict(f"{name_a} vs {name_b}: {PRACTICAL} ({within}, under {fmt.format(smallest)}{unit}; {runs})",
                       f"{detail}; under the {fmt.format(smallest)}{unit} worth calling", 0, PRACTICAL)
    return Verdict(f"{name_a} vs {name_b}: {NOISE} ({within}, within ± {fmt.format(band)}{unit}; {runs})", detail, 0,
                   NOISE)


def _decimals(fmt: str) -> int:
    """The decimals a '{:.Nf}' format asks for (2 otherwise)."""
    return int(fmt.split(".")[1][0]) if "." in fmt and fmt.split(".")[1][:1].isdigit() else 2


def reaches(value: float, goal: float, *, higher_is_better: bool = True) -> bool:
    """Whether one figure meets its target: >= goal, or <= goal for lower-is-better targets."""
    return value >= goal if higher_is_better else value <= goal


@dataclass(frozen=True)
class TargetCheck:
    """A measured figure against a target: the deciding value, and how firmly the rounds agree with it."""
    value: float  # the figure that decides: the rounds' median unless the caller gives its own (a ratio of medians)
    goal: float
    low: float  # the smallest and largest round
    high: float
    past: int  # rounds at or past the goal
    rounds: int
    met: bool

    @property
    def straddles(self) -> bool:
        """Some but not all rounds past the goal: the rounds straddle it (a noisy machine: a re-run may differ)."""
        return 0 < self.past < self.rounds


def against(rounds: Sequence[float], goal: float, *, value: float | None = None,
            higher_is_better: bool = True) -> TargetCheck:
    """The one rule for a target: `value` (the median of `rounds` unless given) decides met or missed; the count of
    rounds past the goal shows how firmly. exercises.Grading.grade and the GPU scripts' target lines use it."""
    if not rounds:
        raise ValueError("A target verdict needs at least one measurement.")
    value = statistics.median(rounds) if value is None else value
    return TargetCheck(value=value, goal=goal, low=min(rounds), high=max(rounds), rounds=len(rounds),
                       past=sum(reaches(v, goal, higher_is_better=higher_is_better) for v in rounds),
                       met=reaches(value, goal, higher_is_better=higher_is_better))


def target_line(label: str, got: float, goal: float) -> str:
    """A speed-up against its target in a report: 'label = 2.31x (target 2.0x): met', or 'MISSED'."""
    return f"{label} = {got:.2f}x (target {goal}x): {'met' if against([got], goal).met else 'MISSED'}"


def paired_accuracy(correct_a: Sequence[bool], correct_b: Sequence[bool], name_a: str, name_b: str) -> Verdict:
    """Accuracy of two models on the same test images, 'A: 1.20 pt lower than B (sure: 70 of 110 differing
    images)' only when the exact McNemar test calls it: among the images where exactly one model is right, a
    fair coin would split them this unevenly less than 5 % of the time (significance.mcnemar_band); else no
    difference. .detail gives the accuracies, the band and the counts.

    The test set's sampling noise for these two trained models: a retrained model moves further (repeated seeds
    measure that), so the detail says one training run each."""
    if len(correct_a) != len(correct_b) or not correct_a:
        raise ValueError("A paired accuracy verdict needs per-image results on the same, non-empty test set.")
    n = len(correct_a)
    acc_a, acc_b = 100 * sum(map(bool, correct_a)) / n, 100 * sum(map(bool, correct_b)) / n
    discordant = sum(bool(x) != bool(y) for x, y in zip(correct_a, correct_b))
    band, rate = significance.mcnemar_band(discordant, n)
    d = acc_a - acc_b
    wins_a = sum(bool(x) and not bool(y) for x, y in zip(correct_a, correct_b))
    calls = (f"a gap of ± {band:.2f} pt or more is called (false-positive rate {100 * rate:.1f} %, at most "
             f"{_pct(ALPHA)})" if math.isfinite(band) else "too few images differ to call any gap")
    detail = (f"exact McNemar test, {n:,} test images: {name_a} {acc_a:.2f} %, {name_b} {acc_b:.2f} %; of the "
              f"{discordant:,} differing images (only one model right), {wins_a:,} go to {name_a}; {calls}; one "
              f"training run each")
    if abs(d) >= band - 1e-9:  # band: the smallest gap the test calls (2k - discordant images, in points)
        agree = wins_a if d > 0 else discordant - wins_a
        return Verdict(f"{name_a}: {abs(d):.2f} pt {'higher' if d > 0 else 'lower'} than {name_b} ({SURE}: {agree:,} "
                       f"of {discordant:,} differing images)", detail, 1 if d > 0 else -1,
                       f"{abs(d):.2f} pt {'higher' if d > 0 else 'lower'}")
    return Verdict(f"{name_a} vs {name_b}: {NOISE} ({acc_a:.2f} % vs {acc_b:.2f} %, {n:,} test images)", detail, 0,
                   NOISE)
