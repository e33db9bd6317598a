"""SamplingParams is mlx-lm's sampler, as a distribution; what it refuses."""

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.sample_utils import apply_min_p, apply_top_k, apply_top_p, make_repetition_penalty

from suites.sampling import helpers as H
from suites.sampling.helpers_stats import gof
from suites.sampling.helpers import ALPHA, FILTERED, N, NUCLEUS, T1
from treespec.sampling import SamplingParams, SamplingRefused, refuse_logits_processors

pytestmark = pytest.mark.exactness


@pytest.mark.parametrize("sampling", [T1, FILTERED, NUCLEUS], ids=["T1", "filtered", "nucleus"])
def test_mlx_lm_make_sampler_draws_from_sampling_params_probs(sampling):
    """Plain sampling with mlx-lm's own make_sampler fits the law built from
    SamplingParams.probs: the distribution the rule preserves is mlx-lm's.
    (3 of the suite's chi-square tests.)"""
    P, _ = H.tables(sampling)
    counts = H.counts(H.plain_mlx(sampling, N, seed=99))
    _, _, p = gof(counts, H.exact_law(P))
    assert p >= ALPHA


def test_the_support_is_mlx_lms_filter_chain():
    """Zero probability exactly where make_sampler's filters put -inf."""
    zp, _ = H.raw_tables(0)
    x = mx.array(zp)
    x = x - mx.logsumexp(x, axis=-1, keepdims=True)
    chain = apply_top_k(apply_min_p(apply_top_p(x, 0.8), 0.05), 4)
    finite = np.isfinite(np.array(chain))
    probs = SamplingParams(0.6, top_k=4, top_p=0.8, min_p=0.05).probs(mx.array(zp))
    assert np.array_equal(probs > 0, finite)
    assert np.allclose(probs.sum(-1), 1.0)


def test_temperature_scales_like_categorical_sampling():
    zp, _ = H.raw_tables(0)
    x = zp - np.log(np.exp(zp.astype(np.float64)).sum(-1, keepdims=True))
    want = np.exp(x / 0.5)
    want /= want.sum(-1, keepdims=True)
    assert np.allclose(SamplingParams(0.5).probs(mx.array(zp)), want, atol=1e-6)


@pytest.mark.parametrize("kwargs,match", [
    (dict(temperature=0.0), "temperature 0 is greedy"),
    (dict(temperature=-1.0), "temperature must be > 0"),
    (dict(temperature=1.0, top_k=-1), "top_k"),
    (dict(temperature=1.0, top_p=1.5), "top_p"),
    (dict(temperature=1.0, min_p=2.0), "min_p"),
])
def test_bad_parameters_are_refused(kwargs, match):
    with pytest.raises(SamplingRefused, match=match):
        SamplingParams(**kwargs)


def test_logits_processors_are_refused_by_name():
    with pytest.raises(SamplingRefused, match="repetition_penalty_processor"):
        refuse_logits_processors([make_repetition_penalty(1.2)])
    refuse_logits_processors(None)
    refuse_logits_processors([])
