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


def mean_ci95(values: list[float]) -> tuple[Optional[float], Optional[float]]:
    """95% interval of the mean of ``values``; (None, None) below two values."""
    if len(values) < 2:
        return None, None
    mean, sd = statistics.fmean(values), statistics.stdev(values)
    half = t95(len(values)) * sd / len(values) ** 0.5
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


def ratio_ci95(new: list[float], base: list[float], pooled_df: bool = False) -> tuple[float, float, float]:
    """(change, low, high): the ratio of two sets of window rates' means less one, and its 95% interval from the
    log ratio's standard error (each mean's CV over the root of its count, Student's t at the smaller count, or
    with ``pooled_df`` at both sets' degrees of freedom together: for few values of one spread, a few runs of
    the same machine): two independent readings, no pairing. Each set needs two values or more."""
    mn, mb = statistics.fmean(new), statistics.fmean(base)
    var = sum((statistics.stdev(x) / statistics.fmean(x)) ** 2 / len(x) for x in (new, base))
    n = len(new) + len(base) - 1 if pooled_df else min(len(new), len(base))
    half = t95(n) * math.sqrt(var)
    log = math.log(mn / mb)
    return mn / mb - 1, math.exp(log - half) - 1, math.exp(log + half) - 1
