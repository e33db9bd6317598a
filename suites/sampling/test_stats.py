"""The chi-square p-values the sampling suite relies on (no scipy here)."""

import math

import numpy as np
import pytest

from suites.sampling.helpers_stats import chi2_sf, gof, homogeneity

pytestmark = pytest.mark.exactness

# (x, df, upper tail) from standard chi-square tables.
TABLE = [
    (3.841459, 1, 0.05), (10.827566, 1, 1e-3), (15.136705, 1, 1e-4),
    (18.307038, 10, 0.05), (29.588298, 10, 1e-3), (124.342113, 100, 0.05),
    (149.449252, 100, 1e-3), (0.554300, 5, 0.99),
]


@pytest.mark.parametrize("x,df,p", TABLE)
def test_chi2_sf_matches_the_tables(x, df, p):
    assert chi2_sf(x, df) == pytest.approx(p, rel=2e-3)


@pytest.mark.parametrize("x,df", [(1.0, 2), (40.0, 30), (600.0, 512), (700.0, 512)])
def test_chi2_sf_matches_the_closed_form_for_even_df(x, df):
    """Even df: P(X >= x) = exp(-x/2) sum_{i < df/2} (x/2)^i / i!."""
    y = x / 2
    terms = [math.exp(-y + i * math.log(y) - math.lgamma(i + 1)) for i in range(df // 2)]
    assert chi2_sf(x, df) == pytest.approx(math.fsum(terms), rel=1e-9)


def test_chi2_sf_edges():
    assert chi2_sf(0.0, 3) == 1.0
    assert chi2_sf(5000.0, 10) < 1e-300


def test_an_impossible_outcome_fails_outright():
    assert gof([5, 5, 1], [0.5, 0.5, 0.0])[2] == 0.0


def test_false_alarm_rates_are_nominal():
    """Under the null, p < 0.01 about 1 % of the time (pooled sparse cells)."""
    rng = np.random.default_rng(0)
    law = rng.dirichlet(np.full(60, 0.3))
    p_gof = [gof(rng.multinomial(800, law), law)[2] for _ in range(1000)]
    p_two = [homogeneity(rng.multinomial(800, law), rng.multinomial(2000, law))[2]
             for _ in range(1000)]
    for ps in (p_gof, p_two):
        assert 0.003 <= np.mean(np.array(ps) < 0.01) <= 0.02
