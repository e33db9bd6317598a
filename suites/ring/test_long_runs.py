"""Long greedy runs on sliding-window models in half precision: 1500 tokens,
through many wraps of every ring, chain and tree decoding emit exactly
mlx-lm's greedy tokens (``generate_step``, which ``mlx_lm.generate``
runs). Before the verify laid rings out as one-token steps see them, these
runs left classic decoding after a few hundred tokens while the gate passed
(a rare rounding of the reordered sums; README, "Verify")."""

import mlx.core as mx
import pytest
from mlx_lm.generate import generate_step

from treespec import zoo
from treespec.decode import decode

pytestmark = [pytest.mark.exactness, pytest.mark.slow]

TOKENS = 1500
CASES = [(f, d) for f in ("gemma3_text", "gemma4_text") for d in ("bfloat16", "float16")]
PROMPTS = {
    "prose": "The ring keeps only the last keys it saw",
    "code": "def rotate(ring, key):\n    ",
}
MODES = {"chain-b4": dict(mode="chain", block=4), "tree-2x2x1": dict(mode="tree", branching=[2, 2, 1])}


def mlx_lm_greedy(model, prompt, n):
    steps = generate_step(mx.array(prompt), model, max_tokens=n,
                          sampler=lambda lp: mx.argmax(lp, axis=-1))
    return [int(t) for t, _ in steps]


@pytest.mark.parametrize("family, dtype", CASES, ids=[f"{f}-{d}" for f, d in CASES])
@pytest.mark.parametrize("prompt", list(PROMPTS))
def test_long_half_precision_runs_stay_on_mlx_lm_greedy_text(family, dtype, prompt):
    target, draft = zoo.build(family, dtype), zoo.drafter(family, dtype)
    ids = zoo.tokenizer().encode(PROMPTS[prompt])
    want = mlx_lm_greedy(target, ids, TOKENS)
    for name, mode in MODES.items():
        result = decode(target, ids, draft_model=draft, max_tokens=TOKENS, **mode)
        assert result.stats.gate["run"], result.stats.gate["reason"]
        got = result.tokens
        at = next((i for i, (a, b) in enumerate(zip(got, want)) if a != b), None)
        assert at is None and len(got) == len(want), (
            f"{name}: leaves mlx-lm's greedy tokens at {at} of {TOKENS}")
