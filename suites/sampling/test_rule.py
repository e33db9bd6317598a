"""Speculative tree sampling draws from the target's law, and a wrong rule
would be caught.

Distribution level (suites/sampling/harness.py): an order-2 synthetic model
over V = 8 tokens, target and draft tables made through SamplingParams
(mlx-lm's filters and temperature), the production walk and rule
(treespec.sampling.walk_batch / verify_children) on N = 100,000 texts of 3
tokens per scenario, all at fixed seeds.

The checks (``law_checks``), each a chi-square test at ALPHA = 1e-4:
  joint      goodness of fit of the 512-cell law of 3-token texts to the
             target's exact law (what plain sampling draws from)
  pos1..3    goodness of fit of each position's marginal
  vs-mlx-lm  two-sample homogeneity of the joint counts against N texts
             drawn by mlx-lm's own ``make_sampler`` on the raw logits
Cells expecting fewer than 5 are pooled; a text of target probability 0 is
an outright failure (p = 0).

False alarms: the tests that must pass here are 10 scenarios x 5 checks = 50
and 1 on the without-replacement draws, plus 3 of mlx-lm's sampler against
the exact law (test_params.py) and 2 x 2 model-level checks (test_model.py):
58 chi-square tests at 1e-4 each, a family-wise false-alarm rate <= 58 x
1e-4 = 0.58 % for a fresh choice of seeds (Bonferroni). The seeds are fixed,
so a run is reproducible: it passes or fails the same way every time.

Planted wrong rules (``Variant`` flips one switch of the production rule,
which ``test_variant_default_is_the_production_rule`` pins bit for bit) run
through the very same ``assert_law`` at the same N and must fail it.
Two rules the issue expected to be wrong are exact, and pass:
  - EAGLE-style "draft probability treated as 1" *in both the acceptance
    test and the residual* (accept x with probability p(x), else remove x
    from p): given any child x, the node emits x w.p. p(x) and otherwise a
    draw of p without x, which is p whatever the children were. It never
    reads q, so it is exact for any drafter; it only accepts less.
  - Children drawn *with* replacement and verified with the without-
    replacement update: a repeat of a rejected child has q_i = 0 and is
    skipped, and a non-repeat's law given that is exactly q_i: the same
    tree with fewer children.
Using q = 1 in only one of the two places, or a repeat tried as a fresh
draw, is wrong and caught.
"""

import numpy as np
import pytest

from suites.sampling import helpers as H
from suites.sampling.helpers_stats import gof, homogeneity
from treespec.sampling import sample_without_replacement, verify_children

pytestmark = pytest.mark.exactness

ALPHA, N = H.ALPHA, H.N
T1, FILTERED, NUCLEUS, TIGHT = H.T1, H.FILTERED, H.NUCLEUS, H.TIGHT

SCENARIOS = {
    "chain-b4-T1": ((1, 1, 1), T1),
    "tree-3x2-T1": ((3, 2), T1),
    "tree-2x2x2-T1": ((2, 2, 2), T1),
    "chain-b3-T0.7-k5-p0.9": ((1, 1), FILTERED),
    "tree-3x2-T0.7-k5-p0.9": ((3, 2), FILTERED),
    "wide-6-T1.3-p0.8-minp0.05": ((6,), NUCLEUS),  # support often < 6: padding
    "tree-4x1-T0.5-k3": ((4, 1), TIGHT),  # always one slot past the support
}

# Exact rules other than the production one (they pass the same checks).
ALSO_EXACT = {
    "specinfer-iid-draft-iid-verify": dict(drafting="iid", replacement=True),
    "iid-draft-without-replacement-verify": dict(drafting="iid"),
    "eagle-q1-accept-and-residual": dict(rule=H.Variant(accept_q="one", residual_q="one")),
}

def _verify_as_iid(p, q, children, u, v, replacement=False):
    return verify_children(p, q, children, u, v, replacement=True)


WRONG = {
    # The draft probability treated as 1 in one place only.
    "q1-in-acceptance-only": dict(rule=H.Variant(accept_q="one")),
    "q1-in-residual-only": dict(rule=H.Variant(residual_q="one")),
    # No residual: after a rejection, keep sampling from p.
    "no-residual": dict(rule=H.Variant(residual="none")),
    # Residual max(p - q, 0) not renormalised before the next child's ratio.
    "unnormalised-residual": dict(rule=H.Variant(residual="raw")),
    # Without-replacement drafts verified as if i.i.d. (q not corrected).
    "wor-draft-verified-as-iid": dict(rule=_verify_as_iid),
    # With-replacement drafts whose repeats are tried as fresh draws.
    "iid-draft-repeats-tried": dict(drafting="iid", rule=H.Variant(skip_undrawable=False)),
    # The drafter samples at the asked temperature / filters but reports the
    # raw (temperature 1, unfiltered) draft distribution.
    "reported-q-is-not-the-sampled-q": dict(report=T1),
}
# Which scenarios each wrong rule is run on: a chain has one child per node,
# where a residual's normalisation and q's update do not matter.
WRONG_ON = {
    "q1-in-acceptance-only": ["chain-b4-T1", "tree-3x2-T1"],
    "q1-in-residual-only": ["chain-b4-T1", "tree-3x2-T1"],
    "no-residual": ["chain-b4-T1", "tree-3x2-T1"],
    "unnormalised-residual": ["tree-3x2-T1"],
    "wor-draft-verified-as-iid": ["tree-3x2-T1"],
    "iid-draft-repeats-tried": ["tree-3x2-T1"],
    "reported-q-is-not-the-sampled-q": ["chain-b3-T0.7-k5-p0.9", "tree-3x2-T0.7-k5-p0.9"],
}

_PLAIN = {}


def plain_counts(sampling):
    if sampling not in _PLAIN:
        _PLAIN[sampling] = H.counts(H.plain_mlx(sampling, N, seed=1234))
    return _PLAIN[sampling]


def law_checks(samples, sampling):
    """[(name, chi2, df, p)] of the five checks on ``samples`` [n, 3]."""
    P, _ = H.tables(sampling)
    law = H.exact_law(P)
    c = H.counts(samples)
    out = [("joint", *gof(c, law))]
    for i in range(H.LENGTH):
        out.append((f"pos{i + 1}", *gof(H.marginal(c, i), H.marginal(law, i))))
    out.append(("vs-mlx-lm", *homogeneity(c, plain_counts(sampling))))
    return out


def assert_law(samples, sampling):
    checks = law_checks(samples, sampling)
    bad = [f"{n}: chi2 {x:.1f} on {df} df, p = {p:.3g}" for n, x, df, p in checks if p < ALPHA]
    assert not bad, "not the target's law: " + "; ".join(bad)
    return checks


def run(name, rule=verify_children, drafting="wor", replacement=False, report=None, seed=1,
        stats=None):
    branching, sampling = SCENARIOS[name]
    P, Q = H.tables(sampling)
    Q_report = None if report is None else H.tables(report)[1]
    return H.simulate(P, Q, branching, N, seed=seed, rule=rule, drafting=drafting,
                      replacement=replacement, Q_report=Q_report, stats=stats), sampling


@pytest.mark.parametrize("name", SCENARIOS)
def test_tree_sampling_emits_the_targets_law(name):
    samples, sampling = run(name)
    assert_law(samples, sampling)


@pytest.mark.parametrize("variant", ALSO_EXACT)
def test_other_exact_rules_pass_the_same_checks(variant):
    samples, sampling = run("tree-3x2-T1", **ALSO_EXACT[variant])
    assert_law(samples, sampling)


@pytest.mark.parametrize("wrong,scenario",
                         [(w, s) for w in WRONG for s in WRONG_ON[w]])
def test_a_wrong_rule_fails_the_same_checks(wrong, scenario):
    samples, sampling = run(scenario, **WRONG[wrong])
    with pytest.raises(AssertionError, match="not the target's law"):
        assert_law(samples, sampling)


def test_the_checks_see_the_wrong_rules_only_where_they_differ():
    """On a chain the unnormalised residual and the missing q update change
    nothing (one child per node): the same samples as production, bit for
    bit. That is why those rules are planted on trees."""
    ok, _ = run("chain-b4-T1", seed=5)
    for wrong in ("unnormalised-residual", "wor-draft-verified-as-iid"):
        got, _ = run("chain-b4-T1", seed=5, **WRONG[wrong])
        assert np.array_equal(got, ok), wrong


def test_production_accepts_more_than_the_eagle_q1_rule():
    """The exact rule that never reads q pays for it in acceptance."""
    ours, eagle = {}, {}
    run("tree-3x2-T1", stats=ours)
    run("tree-3x2-T1", stats=eagle, **ALSO_EXACT["eagle-q1-accept-and-residual"])
    assert ours["tokens_per_round"] > eagle["tokens_per_round"] + 0.05


def test_variant_default_is_the_production_rule():
    """The planted rules differ from production by their switch alone."""
    rng = np.random.default_rng(3)
    n, v, k = 4000, 8, 4
    p = rng.dirichlet(np.full(v, 0.5), n)
    q = rng.dirichlet(np.full(v, 0.5), n)
    q[:, 0] = 0.0  # a token outside the draft's support
    q /= q.sum(1, keepdims=True)
    children = np.stack([rng.permutation(v)[:k] for _ in range(n)])  # may hold q = 0 tokens
    children[::7, -1] = -1  # absent slots
    u, w = rng.random((n, k)), rng.random(n)
    for replacement in (False, True):
        a = verify_children(p, q, children, u, w, replacement=replacement)
        b = H.Variant()(p, q, children, u, w, replacement=replacement)
        assert np.array_equal(a[0], b[0]) and np.array_equal(a[1], b[1])


def test_one_child_is_standard_speculative_sampling():
    """With one child the rule is Leviathan et al.'s / Chen et al.'s, draw for
    draw: accept iff u < p(x)/q(x); otherwise the inverse-CDF draw of
    norm(max(p - q, 0)) at v."""
    rng = np.random.default_rng(4)
    n, v = 5000, 8
    p = rng.dirichlet(np.full(v, 0.5), n)
    q = rng.dirichlet(np.full(v, 0.5), n)
    x = np.array([rng.choice(v, p=row) for row in q])
    u, w = rng.random(n), rng.random(n)
    acc, tok = verify_children(p, q, x[:, None], u[:, None], w)
    rows = np.arange(n)
    assert np.array_equal(acc == 0, u < p[rows, x] / q[rows, x])
    r = np.maximum(p - q, 0)
    r /= r.sum(1, keepdims=True)
    want = np.array([np.searchsorted(np.cumsum(ri), wi * np.cumsum(ri)[-1], side="right")
                     for ri, wi in zip(r, w)])
    assert np.array_equal(tok[acc < 0], want[acc < 0])
    assert np.array_equal(tok[acc == 0], x[acc == 0])


def test_gumbel_top_k_draws_without_replacement():
    """sample_without_replacement's ordered pairs have the law of sequential
    draws: P(a, b) = q(a) q(b) / (1 - q(a)). (1 of the suite's chi-square
    tests.)"""
    rng = np.random.default_rng(6)
    q = np.array([0.4, 0.25, 0.2, 0.1, 0.05, 0.0])
    draws = sample_without_replacement(np.tile(q, (N, 1)), 3, rng)
    assert (draws[:, :2] >= 0).all() and (draws[:, 0] != draws[:, 1]).all()
    assert not (draws == 5).any()  # q = 0: never drawn
    law = q[:, None] * q[None, :] / (1 - q[:, None])
    np.fill_diagonal(law, 0.0)
    counts = np.zeros((6, 6))
    np.add.at(counts, (draws[:, 0], draws[:, 1]), 1)
    assert gof(counts, law)[2] >= ALPHA
