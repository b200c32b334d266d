"""The interval every figure of pipeprof carries: the 95% confidence interval of a mean (Student's t).

One place for it: the trials' windows (``measure.windows``), the monitor's blocks, the data-wait shares,
the overhead pairs and the analysis's re-drawn windows all read their intervals from here.

One rule for the bounds a user reads (:func:`rate_bounds`, :func:`share_bounds`): a rate or a ratio of rates is
positive, so its interval is multiplicative (the log's, from the same relative standard error), never below 0;
a share (0..1) is clipped to [0, 1], and a low end at 0 is said as a ceiling ("<= 6%", :func:`share_text`).
A symmetric t-interval of a few noisy windows reached "11 (-83.5-105) samples/s" and "data wait -5%-6%".
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


def rate_bounds(mid: Optional[float], half: Optional[float]) -> tuple[Optional[float], Optional[float]]:
    """(low, high) of a positive rate or ratio ``mid`` known to ``half`` (the symmetric interval's half-width, same
    unit): the log-scale interval of the same relative error, ``mid * exp(-+half / mid)``. Always above 0 and
    never narrower in ratio than the symmetric one's upper side; (None, None) where either is unknown. A rate of 0
    keeps (0, half): nothing was counted."""
    if mid is None or half is None or mid != mid or half != half:
        return None, None
    if mid <= 0:
        return 0.0, max(0.0, mid + abs(half))
    rel = min(abs(half) / mid, 700.0)  # exp overflows past ~709
    return mid * math.exp(-rel), mid * math.exp(rel)


def share_bounds(mid: Optional[float], half: Optional[float]) -> tuple[Optional[float], Optional[float]]:
    """(low, high) of a share (0..1) ``mid`` known to ``half``: the symmetric interval clipped to [0, 1] (a share's
    mean cannot lie outside it); a low end of 0 is a ceiling (:func:`share_text`). (None, None) where unknown."""
    if mid is None or half is None or mid != mid or half != half:
        return None, None
    return max(0.0, mid - abs(half)), min(1.0, mid + abs(half))


def rate_ci95(values: list[float], level: float = 0.95) -> tuple[Optional[float], Optional[float]]:
    """:func:`mean_ci95` of positive rates, by :func:`rate_bounds`: never below 0."""
    lo, hi = mean_ci95(values, level)
    return (None, None) if lo is None else rate_bounds(statistics.fmean(values), (hi - lo) / 2)


def share_ci95(values: list[float], level: float = 0.95) -> tuple[Optional[float], Optional[float]]:
    """:func:`mean_ci95` of shares (0..1), by :func:`share_bounds`: within [0, 1]."""
    lo, hi = mean_ci95(values, level)
    return (None, None) if lo is None else share_bounds(statistics.fmean(values), (hi - lo) / 2)


def share_text(low: Optional[float], high: Optional[float], digits: int = 0) -> str:
    """A share's interval as a person reads it: "3%-6%", or "<= 6%" where its low end is 0 (or rounds to it:
    never "-0%" nor "0%-6%"); "" where unknown."""
    if low is None or high is None or low != low or high != high:
        return ""
    low, high = min(max(low, 0.0), 1.0), min(max(high, 0.0), 1.0)
    lo_txt, hi_txt = f"{low:.{digits}%}", f"{high:.{digits}%}"
    if float(lo_txt.rstrip("%")) == 0:
        return f"≤ {hi_txt}"
    return f"{lo_txt}-{hi_txt}"


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
    return (rate, *rate_bounds(rate, t95(n) * se))  # a rate: multiplicative, never below 0


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


def gain_bounds(gain, low, high) -> tuple[Optional[float], Optional[float]]:
    """(low, high) of a paired gain ``gain`` = new / old - 1, stored as the mean of its pairs' gains with their
    symmetric 95% interval (``low``, ``high``), by the rule of ratios (:func:`rate_bounds`): the ratio new / old
    is a ratio of rates, its interval multiplicative and above 0, so the gain's low end stays above -100% (a
    new rate below 0 it cannot have). Each side's half-width as stored. (None, None) where any is unknown."""
    if any(x is None or x != x for x in (gain, low, high)):
        return None, None
    ratio, gain = 1 + float(gain), float(gain)
    return rate_bounds(ratio, gain - float(low))[0] - 1, rate_bounds(ratio, float(high) - gain)[1] - 1


def cost_bounds(frac, low, high) -> tuple[Optional[float], Optional[float]]:
    """(low, high) of a paired cost ``frac`` = 1 - on / off (the negative of a gain, :func:`gain_bounds`), stored
    as the mean of its pairs' costs with their symmetric 95% interval (``low``, ``high``): the cost stays below 100%
    (an on-rate below 0 it cannot have). (None, None) where any is unknown. Shared by the overhead checks and the
    masked pairs."""
    if any(x is None or x != x for x in (frac, low, high)):
        return None, None
    g_lo, g_hi = gain_bounds(-float(frac), -float(high), -float(low))
    return -g_hi, -g_lo


def signed_pct(x: float) -> str:
    """A signed change as a whole percentage ("+12%", "-3%"); one that rounds to zero is "+0%", never "-0%"."""
    text = f"{x:+.0%}"
    return "+0%" if text == "-0%" else text


def workers_text(n) -> str:
    """A worker count with its noun in number: "0 workers", "1 worker", "2 workers" (a float count is read as a
    whole one: tables store counts as floats)."""
    if n is None or n != n:
        return "– workers"
    n = int(n)
    return f"{n} worker" if n == 1 else f"{n} workers"
