"""Verdicts in words from measured figures: a ratio or a difference called only when it exceeds the spread of
repeated runs, a target met or missed, and the spread itself, so a lesson's conclusion is printed from its run."""
from __future__ import annotations

import math
import statistics
from typing import Sequence

NOISE = "no difference beyond the spread"


def number(value: float, digits: int = 3) -> str:
    """A plain number to `digits` significant figures, thousands separated (7,770 not 7.77e+03); only a magnitude
    below 1e-4 (a rounding error, say) keeps e-notation, where plain digits would be a row of zeros."""
    if value == 0 or not math.isfinite(value):
        return f"{value:g}"
    if abs(value) < 1e-4:
        return f"{value:.{digits}g}"
    decimals = max(0, digits - 1 - math.floor(math.log10(abs(value))))
    return f"{round(value, decimals):,.{decimals}f}"


def _runs(n: int) -> str:
    return "1 run" if n == 1 else f"{n} runs"


def spread(values: Sequence[float], fmt: str = "{:.2f}", unit: str = "") -> str:
    """'mean ± std (min–max, n runs)' of repeated measurements; one value is reported as a single run."""
    if len(values) == 1:
        return f"{fmt.format(values[0])}{unit} (1 run)"
    mean, std = statistics.mean(values), statistics.stdev(values)
    return (f"{fmt.format(mean)}{unit} ± {fmt.format(std)}{unit} ({fmt.format(min(values))}–"
            f"{fmt.format(max(values))}{unit}, {len(values)} runs)")


def mean_diff(a: Sequence[float], b: Sequence[float], fmt: str = "{:+.2f}", unit: str = "") -> str:
    """'mean(b) - mean(a) ± its standard error (sqrt(s_a²/n_a + s_b²/n_b)) (n_b and n_a runs)' of two sets of runs."""
    d = statistics.mean(b) - statistics.mean(a)
    se = (sum(statistics.variance(v) / len(v) for v in (a, b))) ** 0.5 if min(len(a), len(b)) > 1 else float("nan")
    return f"{fmt.format(d)}{unit} ± {fmt.format(se).lstrip('+')}{unit} (standard error; {len(b)} and {len(a)} runs)"


def mean_ratio(a: Sequence[float], b: Sequence[float]) -> str:
    """'mean(b) / mean(a) ± its standard error (delta method)' of two sets of runs, e.g. times."""
    r = statistics.mean(b) / statistics.mean(a)
    rel = (sum(statistics.variance(v) / len(v) / statistics.mean(v) ** 2 for v in (a, b)) ** 0.5
           if min(len(a), len(b)) > 1 else float("nan"))
    return f"{r:.3f}x ± {r * rel:.3f}x (standard error; {len(b)} and {len(a)} runs)"


def ratio_range(a: Sequence[float], b: Sequence[float], paired: bool = False) -> tuple[float, float, float]:
    """(median(a) / median(b), lowest, highest ratio the runs allow): per-round ratios when `paired` (interleaved
    rounds, same length), else the extremes min(a)/max(b) and max(a)/min(b)."""
    if not a or not b or min(list(a) + list(b)) <= 0:
        raise ValueError("A ratio needs at least one positive measurement on each side.")
    mid = statistics.median(a) / statistics.median(b)
    if paired:
        if len(a) != len(b):
            raise ValueError(f"Paired rounds need as many runs on each side, got {len(a)} and {len(b)}.")
        rounds = [x / y for x, y in zip(a, b)]
        return mid, min(rounds), max(rounds)
    return mid, min(a) / max(b), max(a) / min(b)


def direction(a: Sequence[float], b: Sequence[float], *, higher_is_better: bool = True,
              paired: bool = False) -> int | None:
    """+1 when a beats b beyond the spread (the rule of compare), -1 when b beats a, 0 within noise, None when a
    side has a single run (no spread to judge by)."""
    if min(len(a), len(b)) < 2:
        return None
    _, lo, hi = ratio_range(a, b, paired)
    sign = 1 if lo > 1 else -1 if hi < 1 else 0
    return sign if higher_is_better else -sign


def compare(a: Sequence[float], b: Sequence[float], name_a: str, name_b: str, *, higher_is_better: bool = True,
            paired: bool = False, better: str = "faster", worse: str = "slower") -> str:
    """'A is 1.7x faster than B (rounds 1.5–1.9x, n=3)', '... slower ...' or 'no difference beyond the spread'.

    a, b: repeated measurements of one figure (images/s when higher_is_better, seconds otherwise). A difference is
    called only when the whole range of ratios (see ratio_range) lies on one side of 1; with a single run on either
    side the verdict says one run cannot show the spread."""
    mid, lo, hi = ratio_range(a, b, paired)
    if not higher_is_better:  # times: A is faster when it takes less, so the factor is B's time over A's
        mid, lo, hi = 1 / mid, 1 / hi, 1 / lo
    n = f"n={len(a)}" if len(a) == len(b) else f"n={len(a)} and {len(b)}"
    if min(len(a), len(b)) < 2:
        word, factor = (better, mid) if mid >= 1 else (worse, 1 / mid)
        return (f"{name_a} measured {factor:.2f}x {word} than {name_b} in a single run: one run cannot show "
                f"the spread, so this is no verdict")
    kind = "rounds" if paired else "range"
    if lo > 1:
        return f"{name_a} is {mid:.2f}x {better} than {name_b} ({kind} {lo:.2f}–{hi:.2f}x, {n})"
    if hi < 1:
        return f"{name_a} is {1 / mid:.2f}x {worse} than {name_b} ({kind} {1 / hi:.2f}–{1 / lo:.2f}x, {n})"
    what = "speed ratio" if better == "faster" else "ratio"  # for times too: the factor is B's time over A's
    return (f"{name_a} vs {name_b}: {NOISE} ({what} {mid:.2f}x, {kind} {lo:.2f}–{hi:.2f}x, "
            f"{_runs(min(len(a), len(b)))})")


def difference(a: Sequence[float], b: Sequence[float], name_a: str, name_b: str, *, unit: str = "",
               fmt: str = "{:.2f}", noise: float | None = None, higher: str = "higher", lower: str = "lower") -> str:
    """'A is 0.80 pt higher than B (± 0.30 noise band, 5 and 5 runs)' or 'no difference beyond the spread'.

    A difference of means is called only when it exceeds twice its standard error (about a 95 % band). The
    standard deviation comes from the samples themselves (two or more runs each) or from `noise`, the spread of
    repeated runs measured elsewhere (e.g. a seed loop) when a side has a single run."""
    d = statistics.mean(a) - statistics.mean(b)
    if noise is None and min(len(a), len(b)) < 2:
        return (f"{name_a} measured {fmt.format(abs(d))}{unit} {higher if d >= 0 else lower} than {name_b} in a "
                f"single run: one run cannot show the spread, so this is no verdict")
    if noise is None:
        se = math.sqrt(sum(statistics.variance(v) / len(v) for v in (a, b)))
    else:
        se = noise * math.sqrt(1 / len(a) + 1 / len(b))
    band, runs = 2 * se, f"{len(a)} and {len(b)} runs" if len(a) != len(b) else _runs(len(a)) + " each"
    src = "" if noise is None else f", run-to-run std {fmt.format(noise)}{unit}"
    if abs(d) > band:
        return (f"{name_a} is {fmt.format(abs(d))}{unit} {higher if d > 0 else lower} than {name_b} "
                f"(noise band ± {fmt.format(band)}{unit}{src}; {runs})")
    return (f"{name_a} vs {name_b}: {NOISE} ({d:+.{_decimals(fmt)}f}{unit} within ± {fmt.format(band)}{unit}"
            f"{src}; {runs})")


def _decimals(fmt: str) -> int:
    """The decimals a '{:.Nf}' format asks for (2 otherwise)."""
    return int(fmt.split(".")[1][0]) if "." in fmt and fmt.split(".")[1][:1].isdigit() else 2


def target(values: Sequence[float], goal: float, name: str, *, higher_is_better: bool = True, unit: str = "x",
           fmt: str = "{:.2f}") -> str:
    """'A meets the target of at least 2.00x: median 2.31x (rounds 2.10–2.52x, 3 of 3 runs at or past it)', or
    'misses'. The median decides; the count of runs past the goal shows how firmly."""
    if not values:
        raise ValueError("A target verdict needs at least one measurement.")
    med = statistics.median(values)
    past = (lambda v: v >= goal) if higher_is_better else (lambda v: v <= goal)
    word = "at least" if higher_is_better else "at most"
    verdict = "meets" if past(med) else "misses"
    rng = (f"median {fmt.format(med)}{unit}" if len(values) == 1 else
           f"median {fmt.format(med)}{unit} (rounds {fmt.format(min(values))}–{fmt.format(max(values))}{unit}, "
           f"{sum(map(past, values))} of {len(values)} runs at or past it)")
    single = "; a single run, so no spread" if len(values) == 1 else ""
    return f"{name} {verdict} the target of {word} {fmt.format(goal)}{unit}: {rng}{single}"


def paired_accuracy(correct_a: Sequence[bool], correct_b: Sequence[bool], name_a: str, name_b: str) -> str:
    """Accuracy of two models on the same test images, 'A is 1.20 pt lower than B' only when the gap exceeds twice
    its paired standard error, sqrt(images where exactly one is right) / N (McNemar); else within noise.

    This is the test set's sampling noise for these two trained models; a retrained model moves further (a seed
    spread measures that), so the line says it is one training run each."""
    if len(correct_a) != len(correct_b) or not correct_a:
        raise ValueError("A paired accuracy verdict needs per-image results on the same, non-empty test set.")
    n = len(correct_a)
    acc_a, acc_b = 100 * sum(map(bool, correct_a)) / n, 100 * sum(map(bool, correct_b)) / n
    discordant = sum(bool(x) != bool(y) for x, y in zip(correct_a, correct_b))
    band, d = 2 * 100 * math.sqrt(discordant) / n, acc_a - acc_b
    where = f"{n:,} test images, {discordant} on which only one is right; one training run each"
    if abs(d) > band:
        return (f"{name_a} is {abs(d):.2f} pt {'higher' if d > 0 else 'lower'} than {name_b} "
                f"({acc_a:.2f} % vs {acc_b:.2f} %, noise band ± {band:.2f} pt; {where})")
    return (f"{name_a} vs {name_b}: {NOISE} ({acc_a:.2f} % vs {acc_b:.2f} %, {d:+.2f} pt within ± {band:.2f} pt; "
            f"{where})")
