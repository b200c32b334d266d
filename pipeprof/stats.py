"""The interval every figure of pipeprof carries: the 95% confidence interval of a mean (Student's t).

One place for it: the trials' windows (``measure.windows``), the monitor's blocks, the data-wait shares,
the overhead pairs and the analysis's re-drawn windows all read their intervals from here.
"""

from __future__ import annotations

import math
import statistics
from typing import Optional

_T95 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228)  # 1..10 degrees of freedom


def t95(n: int) -> float:
    """Two-sided 95% Student's t for the mean of ``n`` values (n >= 2); the normal 1.96 past 11."""
    return _T95[n - 2] if n <= 11 else 1.96


def _two_sided(theta: float, df: int) -> float:
    """P(|T| <= t) for Student's t with ``df`` (whole) degrees of freedom, at ``theta`` = atan(t / sqrt(df)):
    the closed forms of Abramowitz and Stegun 26.7.3 (odd) and 26.7.4 (even)."""
    c2, total = math.cos(theta) ** 2, 0.0
    if df % 2:  # odd: (2/pi)(theta + sin cos (1 + 2/3 cos^2 + 2*4/(3*5) cos^4 + ...)), df - 3 over 2 terms past 1
        term = math.cos(theta)
        for j in range((df - 1) // 2):
            total += term
            term *= c2 * (2 * j + 2) / (2 * j + 3)
        return 2 / math.pi * (theta + math.sin(theta) * total)
    term = 1.0  # even: sin (1 + 1/2 cos^2 + 1*3/(2*4) cos^4 + ...), df / 2 terms
    for j in range(df // 2):
        total += term
        term *= c2 * (2 * j + 1) / (2 * j + 2)
    return math.sin(theta) * total


def t_quantile(df: int, level: float) -> float:
    """The t with P(|T| <= t) = ``level`` for Student's t with ``df`` degrees of freedom (the half-width, in
    standard errors, of a two-sided ``level`` interval); the normal's past 1,000."""
    if df > 1000:
        return statistics.NormalDist().inv_cdf(0.5 + level / 2)
    lo, hi = 0.0, math.pi / 2  # bisection on the angle: the probability rises with it from 0 to 1
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if _two_sided(mid, df) < level else (lo, mid)
    return math.sqrt(df) * math.tan((lo + hi) / 2)


def simultaneous(comparisons: int, level: float = 0.95) -> float:
    """Each interval's level where the best of ``comparisons`` readings is picked by its interval (Bonferroni): all
    of them hold together with ``level``, so a change that does nothing is named in at most 1 - ``level`` of
    readings however many were read beside it, not in nearly that share for each of them."""
    return 1 - (1 - level) / max(1, comparisons)


def _t(n: int, level: float) -> float:
    return t95(n) if level == 0.95 else t_quantile(n - 1, level)


def mean_ci95(values: list[float], level: float = 0.95) -> tuple[Optional[float], Optional[float]]:
    """95% interval of the mean of ``values`` (or a ``level`` one); (None, None) below two values."""
    if len(values) < 2:
        return None, None
    mean, sd = statistics.fmean(values), statistics.stdev(values)
    half = _t(len(values), level) * sd / len(values) ** 0.5
    return mean - half, mean + half


def pooled_rate_ci95(counts: list[float], spans: list[float]) -> tuple[float, Optional[float], Optional[float]]:
    """(rate, low, high): the count over the time of windows of unequal length pooled, sum(counts) / sum(spans),
    with the ratio estimator's 95% interval (residuals ``count - rate * span``, Student's t); (rate, None, None)
    below 2 windows. What a loop's own clock reads over the same time, where the median of window rates would
    weigh a slow window (a pass's restart) as one window among many."""
    rate = sum(counts) / sum(spans)
    n = len(spans)
    if n < 2:
        return rate, None, None
    resid = [c - rate * s for c, s in zip(counts, spans)]
    se = math.sqrt(n / (n - 1) * sum(e * e for e in resid)) / sum(spans)
    return rate, rate - t95(n) * se, rate + t95(n) * se


def ratio_ci95(
    new: list[float], base: list[float], pooled_df: bool = False, level: float = 0.95
) -> tuple[float, float, float]:
    """(change, low, high): the ratio of two sets of window rates' means less one, and its 95% interval from the
    log ratio's standard error (each mean's CV over the root of its count, Student's t at the smaller count, or
    with ``pooled_df`` at both sets' degrees of freedom together: for few values of one spread, a few runs of
    the same machine): two independent readings, no pairing. Each set needs two values or more. ``level``: of
    the interval, where it is not 95% (:func:`simultaneous`)."""
    mn, mb = statistics.fmean(new), statistics.fmean(base)
    var = sum((statistics.stdev(x) / statistics.fmean(x)) ** 2 / len(x) for x in (new, base))
    n = len(new) + len(base) - 1 if pooled_df else min(len(new), len(base))
    half = _t(n, level) * math.sqrt(var)
    log = math.log(mn / mb)
    return mn / mb - 1, math.exp(log - half) - 1, math.exp(log + half) - 1
