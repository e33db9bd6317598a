"""Long greedy runs on sliding-window models in half precision: 1500 tokens,
through many wraps of every ring, chain and tree decoding emit exactly
mlx-lm's greedy tokens (``generate_step``, which ``mlx_lm.generate``
runs). Before the verify laid rings out as one-token steps see them, these
runs left classic decoding after a few hundred tokens while the gate passed
(a rare rounding of the reordered sums; docs/verify.md#sliding-window-rings).

Where the backend is exact the gate must let both modes speculate. Elsewhere
(CUDA, in both half precisions) it may decline: the tokens, classic
decoding's then, are still mlx-lm's, the decline is recorded as the verdict
with its reason, and a run forced past the gate says where its tokens would
first leave mlx-lm's, as information (as suites/e2e/test_text_diff.py). The
forced run stops at that first difference: what it would emit after leaving
mlx-lm's tokens says nothing more, and decoding on to 1500 tokens made these
the suite's longest tests on CUDA (results/h200-exactness/README.md)."""

import mlx.core as mx
import pytest
from mlx_lm.generate import generate_step

from suites.helpers_gate import gate_verdict
from suites.verdict import E2E, expect
from treespec.evidence import numerics
from treespec import zoo
from treespec.decoding import decode

pytestmark = pytest.mark.exactness

TOKENS = 1500
PROMPTS = {
    "prose": "The ring keeps only the last keys it saw",
    "code": "def rotate(ring, key):\n    ",
}
# Each family in each half precision once, each prompt on both families and
# both dtypes: four runs of 1500 tokens (the slowest tests of the suite; all
# eight pairings cost CI about five minutes more and covered nothing else).
CASES = [("gemma3_text", "bfloat16", "prose"), ("gemma3_text", "float16", "code"),
         ("gemma4_text", "bfloat16", "code"), ("gemma4_text", "float16", "prose")]
MODES = {"chain-b4": dict(mode="chain", block=4), "tree-2x2x1": dict(mode="tree", branching=[2, 2, 1])}


def mlx_lm_greedy(model, prompt, n):
    steps = generate_step(mx.array(prompt), model, max_tokens=n,
                          sampler=lambda lp: mx.argmax(lp, axis=-1))
    return [int(t) for t, _ in steps]


class _Left(Exception):
    """Raised by :func:`stop_at_first_difference` to end a forced run."""


def stop_at_first_difference(want, emitted: list):
    """An ``on_round`` for :func:`treespec.decoding.decode` that collects the
    tokens each round emits into ``emitted`` and ends the run (raising
    ``_Left``) once they leave ``want``."""
    def on_round(_round, walk):
        emitted.extend(walk.emitted)
        if first_difference(emitted[:len(want)], want[:len(emitted)]) is not None:
            raise _Left
    return on_round


def forced_first_difference(target, ids, draft, want, mode):
    """(where a run forced past the gate first leaves ``want``, None if never;
    how many tokens its rounds emitted before it stopped)."""
    emitted = []
    try:
        forced = decode(target, ids, draft_model=draft, max_tokens=len(want), allow_inexact=True,
                        on_round=stop_at_first_difference(want, emitted), **mode)
    except _Left:
        return first_difference(emitted, want), len(emitted)
    return first_difference(forced.tokens, want), len(emitted)


def first_difference(got, want):
    """The first index at which ``got`` leaves ``want`` (a length difference
    counts), or None."""
    at = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), None)
    return at if at is not None or len(got) == len(want) else min(len(got), len(want))


@pytest.mark.slow("minutes")
@pytest.mark.parametrize("family, dtype, prompt", CASES, ids=[f"{p}-{f}-{d}" for f, d, p in CASES])
def test_long_half_precision_runs_stay_on_mlx_lm_greedy_text(family, dtype, prompt):
    target, draft = zoo.build(family, dtype), zoo.drafter(family, dtype)
    ids = zoo.tokenizer().encode(PROMPTS[prompt])
    want = mlx_lm_greedy(target, ids, TOKENS)
    verdicts = []
    for name, mode in MODES.items():
        result = decode(target, ids, draft_model=draft, max_tokens=TOKENS, **mode)
        # exact regimes: the gate runs; elsewhere it may decline, saying why
        verdict = gate_verdict(result.stats.gate, result.stats.mode, mode["mode"])
        at = first_difference(result.tokens, want)
        assert at is None, f"{name}: leaves mlx-lm's greedy tokens at {at} of {TOKENS}"
        if verdict.word == numerics.DECLINED:
            at, _ = forced_first_difference(target, ids, draft, want, mode)
            verdict = numerics.declined(
                f"{name}: {verdict.detail}; forced past the gate: " + (
                    "mlx-lm's greedy tokens" if at is None else
                    f"leaves mlx-lm's greedy tokens at {at} of {TOKENS}"), verdict.max_diff)
        verdicts.append(verdict)
    declined = [v for v in verdicts if v.word == numerics.DECLINED]
    verdict = numerics.worst(verdicts)
    if declined:  # every declining mode's reason, not only the first's
        verdict = numerics.declined("; ".join(v.detail for v in declined), verdict.max_diff)
    expect(verdict, E2E, family, dtype)


@pytest.mark.parametrize("at", [0, 5, 17])
def test_a_forced_run_stops_where_it_first_leaves_the_reference(at):
    """The forced run's report is where it first leaves the reference, and it
    decodes no further than the round that left it: against its own tokens
    with one changed at ``at``, it stops there, within one round's tokens
    (its own unchanged tokens it never leaves: the run is deterministic)."""
    target, draft = zoo.build("gemma3_text", "float32"), zoo.drafter("gemma3_text", "float32")
    ids = zoo.tokenizer().encode(PROMPTS["prose"])
    mode = MODES["chain-b4"]
    own = decode(target, ids, draft_model=draft, max_tokens=24, allow_inexact=True, **mode).tokens
    changed = list(own)
    changed[at] = (changed[at] + 1) % zoo.VOCAB_SIZE
    left, decoded = forced_first_difference(target, ids, draft, changed, mode)
    assert left == at
    assert decoded <= at + mode["block"]
    assert forced_first_difference(target, ids, draft, own, mode) == (None, len(own))
