"""The error rates behind the verdicts: exact tests with their intervals (the sign test for paired rounds, the
rank-sum test for unpaired runs, Student's t for differences of means), so each verdict's false-positive rate is
known, not hoped for. Pure Python; no clock, no torch.

Why these tests. Timings are skewed and now and then hit by a busy machine, so the ratio verdicts use tests whose
error rate holds for any noise distribution: when nothing differs, the two sides of a round (or two runs) are
exchangeable, so each paired round's ratio lands above or below 1 like a fair coin (the sign test), and every
ordering of two sets of runs is equally likely (the Wilcoxon-Mann-Whitney rank-sum test). Both are exact; their
intervals are order statistics of the ratios, so "the interval excludes 1" and "the test rejects" are the same
decision. Accuracies over seeds are closer to normal and often come one run per step with a spread measured
elsewhere, which only a t-interval can use: Student's t (pooled spread, integer degrees of freedom).

Every rule runs at LEVEL = 4 %, under the promised ALPHA = 5 %: for the exact tests the margin covers what
exchangeability leaves out (a machine whose state differs between the positions within a round), for Student's t
the non-normal noise it does not model, and it lets 4,000 simulated A/A trials show the 5 % with room to spare."""
from __future__ import annotations

import functools
import math
import statistics
from fractions import Fraction
from typing import NamedTuple, Sequence

ALPHA = 0.05  # the promise: how often at most a verdict calls a difference when nothing differs (both directions)
LEVEL = 0.04  # every rule's own two-sided false-positive rate (exact tests: at most this), a margin under ALPHA


class Interval(NamedTuple):
    """A ratio or difference with its interval: `level` is the coverage (1 - the exact false-positive rate); lo
    and hi are nan where n is below `need`, the fewest rounds (or runs a side) that can reach LEVEL."""

    mid: float
    lo: float
    hi: float
    level: float
    n: int
    need: int


@functools.lru_cache(maxsize=None)  # pure: simulations ask the same few sizes thousands of times
def sign_cut(n: int, alpha: float = LEVEL) -> int | None:
    """The largest c with 2 P(Binomial(n, 1/2) <= c) <= alpha: the interval drops c ratios at each end; None when
    even c = 0 (all n rounds on one side) happens by chance more often than alpha."""
    c, below = -1, 0  # below: the number of the 2^n sign patterns with at most c rounds above 1
    while c + 1 <= n and 2 * (below + math.comb(n, c + 1)) <= Fraction(alpha) * 2 ** n:
        c, below = c + 1, below + math.comb(n, c + 1)
    return None if c < 0 else c


def sign_level(n: int, c: int) -> float:
    """Coverage of the sign-test interval that drops c of n ratios at each end."""
    return 1 - 2 * sum(math.comb(n, k) for k in range(c + 1)) / 2 ** n


def rank_sum_counts(m: int, n: int) -> list[int]:
    """How many of the C(m + n, m) equally likely orderings of m and n runs give each Mann-Whitney U = 0..m*n:
    the coefficients of the Gaussian binomial prod_i (1 - q^(n+i)) / (1 - q^i), i = 1..m, as power series."""
    top = m * n
    counts = [1] + [0] * top
    for i in range(1, m + 1):
        for u in range(top, n + i - 1, -1):  # times (1 - q^(n+i)), high powers first so each reads the old value
            counts[u] -= counts[u - n - i]
        for u in range(i, top + 1):  # divided by (1 - q^i): a running sum with stride i
            counts[u] += counts[u - i]
    return counts


@functools.lru_cache(maxsize=None)
def rank_cut(m: int, n: int, alpha: float = LEVEL) -> tuple[int | None, float]:
    """(largest c with 2 P(U <= c) <= alpha, or None; the coverage 1 - 2 P(U <= c)) for m and n runs."""
    counts, total = rank_sum_counts(min(m, n), max(m, n)), math.comb(m + n, m)
    c, below = -1, 0
    while c + 1 <= m * n // 2 and 2 * (below + counts[c + 1]) <= Fraction(alpha) * total:
        c, below = c + 1, below + counts[c + 1]
    return (None, math.nan) if c < 0 else (c, 1 - 2 * below / total)


@functools.lru_cache(maxsize=None)
def paired_need(alpha: float = LEVEL) -> int:
    """The fewest paired rounds whose sign test can reach alpha (6 for 4 %: 2 x (1/2)^6 = 3.1 %)."""
    return next(n for n in range(1, 64) if sign_cut(n, alpha) is not None)


@functools.lru_cache(maxsize=None)
def unpaired_need(alpha: float = LEVEL) -> int:
    """The fewest runs a side (equal on both) whose rank-sum test can reach alpha (4 for 4 %: 2 / C(8, 4) = 2.9 %)."""
    return next(n for n in range(1, 64) if rank_cut(n, n, alpha)[0] is not None)


def ratio_interval(a: Sequence[float], b: Sequence[float], *, paired: bool, alpha: float = LEVEL) -> Interval:
    """a / b with its exact interval. Paired (interleaved rounds, same length): the median round ratio, and the
    sign test's order statistics of the round ratios. Unpaired: the median of all a_i / b_j (Hodges-Lehmann), and
    the rank-sum test's order statistics of those."""
    if not a or not b or min(list(a) + list(b)) <= 0:
        raise ValueError("A ratio needs at least one positive measurement on each side.")
    if paired:
        if len(a) != len(b):
            raise ValueError(f"Paired rounds need as many runs on each side, got {len(a)} and {len(b)}.")
        ratios, c = sorted(x / y for x, y in zip(a, b)), sign_cut(len(a), alpha)
        level = math.nan if c is None else sign_level(len(a), c)
        need = paired_need(alpha)
    else:
        ratios = sorted(x / y for x in a for y in b)
        c, level = rank_cut(len(a), len(b), alpha)
        need = unpaired_need(alpha)
    mid, n = statistics.median(ratios), min(len(a), len(b))
    if c is None:
        return Interval(mid, math.nan, math.nan, math.nan, n, need)
    return Interval(mid, ratios[c], ratios[len(ratios) - 1 - c], level, n, need)


def t_within(t: float, df: int) -> float:
    """P(|T| <= t) for Student's t with an integer df (the closed forms of Abramowitz & Stegun 26.7.3-4)."""
    if df < 1 or int(df) != df:
        raise ValueError(f"Student's t here takes a whole number of degrees of freedom, got {df}.")
    theta = math.atan(abs(t) / math.sqrt(df))
    cos2, term, total = math.cos(theta) ** 2, 1.0, 1.0
    if df % 2 == 0:  # sin(theta) (1 + 1/2 cos^2 + 1*3/(2*4) cos^4 + ...), df/2 terms
        for k in range(1, df // 2):
            term *= cos2 * (2 * k - 1) / (2 * k)
            total += term
        return math.sin(theta) * total
    if df == 1:
        return 2 * theta / math.pi
    for k in range(1, (df - 1) // 2):  # 2/pi (theta + sin cos (1 + 2/3 cos^2 + 2*4/(3*5) cos^4 + ...))
        term *= cos2 * (2 * k) / (2 * k + 1)
        total += term
    return 2 / math.pi * (theta + math.sin(theta) * math.cos(theta) * total)


@functools.lru_cache(maxsize=None)
def t_critical(df: int, alpha: float = LEVEL) -> float:
    """The t with P(|T| > t) = alpha for an integer df (bisection on t_within; 1e-9 relative)."""
    lo, hi = 0.0, 1.0
    while 1 - t_within(hi, df) > alpha:
        lo, hi = hi, 2 * hi
    while hi - lo > 1e-9 * hi:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if 1 - t_within(mid, df) > alpha else (lo, mid)
    return hi


def _mean(values: Sequence[float]) -> float:
    """The mean by math.fsum (statistics.mean's exact fractions are 50x slower, and simulations call this 8,000x)."""
    return math.fsum(values) / len(values)


def _squares(values: Sequence[float]) -> float:
    """Sum of squared deviations from the mean: (n - 1) times the sample variance."""
    m = _mean(values)
    return math.fsum((v - m) ** 2 for v in values)


def mean_difference(a: Sequence[float], b: Sequence[float], *, noise: float | None = None,
                    noise_runs: int | None = None, alpha: float = LEVEL) -> Interval:
    """mean(a) - mean(b) with Student's t interval: the pooled spread of a and b (df = n_a + n_b - 2), or `noise`,
    a standard deviation measured over `noise_runs` other runs (df = noise_runs - 1), e.g. a seed loop. lo and hi
    are nan without two runs a side or a noise; need is 2 runs a side."""
    if not a or not b:
        raise ValueError("A difference of means needs at least one measurement on each side.")
    d, n = _mean(a) - _mean(b), min(len(a), len(b))
    if noise is not None:
        if noise_runs is None or noise_runs < 2 or noise < 0:
            raise ValueError(f"noise={noise} needs noise_runs, the number of runs it was measured over (2 or more).")
        sd, df = noise, noise_runs - 1
    elif n >= 2:
        df = len(a) + len(b) - 2
        sd = math.sqrt((_squares(a) + _squares(b)) / df)
    else:
        return Interval(d, math.nan, math.nan, math.nan, n, 2)
    band = t_critical(df, alpha) * sd * math.sqrt(1 / len(a) + 1 / len(b))
    return Interval(d, d - band, d + band, 1 - alpha, n, 2)


@functools.lru_cache(maxsize=None)
def mcnemar_band(discordant: int, total: int, alpha: float = LEVEL) -> tuple[float, float]:
    """(the smallest accuracy gap, in points, that the exact McNemar test calls among `discordant` images where
    exactly one model is right, out of `total`; its exact false-positive rate). inf when none can be called."""
    tail, found = 0, (math.inf, 0.0)
    for k in range(discordant, discordant // 2, -1):  # k of the discordant images favour one model, most first
        tail += math.comb(discordant, k)
        if 2 * tail > Fraction(alpha) * 2 ** discordant:  # exact: 2^discordant overflows a float
            break
        found = (100 * (2 * k - discordant) / total, 2 * tail / 2 ** discordant)
    return found
