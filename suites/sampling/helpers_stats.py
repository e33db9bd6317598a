"""Chi-square tests with our own p-values (no scipy in the environment).

``chi2_sf(x, df)`` is the regularised upper incomplete gamma function
Q(df/2, x/2), by its series below a + 1 and Lentz's continued fraction
above (Numerical Recipes' gammq), checked in test_stats.py against
tabulated quantiles.

Cells whose expected count is below ``MIN_EXPECTED`` are pooled (smallest
first) into one cell until the pool reaches it, the usual rule for the
chi-square approximation. A count in a cell of probability 0 is an
impossible outcome: p-value 0.
"""

import math

import numpy as np

MIN_EXPECTED = 5.0


def _gamma_series(a, x):
    term = total = 1.0 / a
    ap = a
    for _ in range(100000):
        ap += 1.0
        term *= x / ap
        total += term
        if abs(term) < abs(total) * 1e-16:
            break
    return total * math.exp(-x + a * math.log(x) - math.lgamma(a))  # lower P


def _gamma_cf(a, x):
    tiny = 1e-300
    b = x + 1.0 - a
    c = 1.0 / tiny
    d = 1.0 / b
    h = d
    for i in range(1, 100000):
        an = -i * (i - a)
        b += 2.0
        d = an * d + b
        d = tiny if abs(d) < tiny else d
        c = b + an / c
        c = tiny if abs(c) < tiny else c
        d = 1.0 / d
        delta = d * c
        h *= delta
        if abs(delta - 1.0) < 1e-16:
            break
    return math.exp(-x + a * math.log(x) - math.lgamma(a)) * h  # upper Q


def chi2_sf(x: float, df: int) -> float:
    """P(X >= x) for X ~ chi-square(df)."""
    if df <= 0:
        raise ValueError(f"df must be positive, got {df}")
    if x <= 0:
        return 1.0
    a, y = df / 2.0, x / 2.0
    if y < a + 1.0:
        return max(0.0, 1.0 - _gamma_series(a, y))
    return _gamma_cf(a, y)


def _pooled(expected, *arrays):
    """Sum the smallest-expectation cells (ascending) into one pooled cell
    until every cell, the pool included, expects >= MIN_EXPECTED; apply the
    same grouping to each of ``arrays``."""
    order = np.argsort(expected, kind="stable")
    e = expected[order]
    cut, acc = 0, 0.0
    while cut < len(e) and (e[cut] < MIN_EXPECTED or 0 < acc < MIN_EXPECTED):
        acc += e[cut]
        cut += 1
    out = []
    for a in (expected,) + arrays:
        a = np.asarray(a, dtype=float)[order]
        out.append(np.append(a[cut:], a[:cut].sum()) if cut else a)
    return out


def gof(counts, probs):
    """Goodness of fit of ``counts`` to the law ``probs``: (chi2, df, p)."""
    counts = np.asarray(counts, dtype=float).ravel()
    probs = np.asarray(probs, dtype=float).ravel()
    n = counts.sum()
    if np.any(counts[probs <= 0] > 0):
        return math.inf, 0, 0.0
    keep = probs > 0
    e, o = _pooled(n * probs[keep] / probs[keep].sum(), counts[keep])
    if len(e) < 2:
        return 0.0, 0, 1.0
    chi2 = float(((o - e) ** 2 / e).sum())
    df = len(e) - 1
    return chi2, df, chi2_sf(chi2, df)


def homogeneity(counts_a, counts_b):
    """Two-sample chi-square test that two count vectors share one law:
    (chi2, df, p). Cells are pooled on the combined expectation."""
    a = np.asarray(counts_a, dtype=float).ravel()
    b = np.asarray(counts_b, dtype=float).ravel()
    na, nb = a.sum(), b.sum()
    tot = a + b
    keep = tot > 0
    a, b, tot = a[keep], b[keep], tot[keep]
    # Pooled on the smaller sample's expectation.
    _, a, b, tot = _pooled(tot * min(na, nb) / (na + nb), a, b, tot)
    if len(tot) < 2:
        return 0.0, 0, 1.0
    ea, eb = tot * na / (na + nb), tot * nb / (na + nb)
    chi2 = float(((a - ea) ** 2 / ea).sum() + ((b - eb) ** 2 / eb).sum())
    df = len(tot) - 1
    return chi2, df, chi2_sf(chi2, df)
