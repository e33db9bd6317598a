"""A tiny llama pair over a 12-token vocabulary, for model-level tests.

Built directly from ``mlx_lm.models.llama`` with seeded numpy weights (the
zoo's models have vocabulary 384: far too many cells for a chi-square over
two-token texts). The draft is the target with seeded noise on every
matrix, so drafts are often but not always accepted. ``head`` is a
hidden-state head around that draft (treespec.heads.base's contract, fed
the target's final hidden state), optionally with a reduced vocabulary as
an EAGLE-3 head's ``d2t`` gives it: logits -inf, so q = 0, outside it."""

from functools import lru_cache

import mlx.core as mx
import numpy as np
from mlx.utils import tree_flatten
from mlx_lm.models import llama

from suites.heads_drafting.helpers import DraftModelHead

VOCAB = 12
PROMPT = [1, 7, 3]
# The reduced draft vocabulary: half the tokens, among them ones the
# target often emits, so the rule's residual must supply their mass.
DRAFT_VOCAB = (0, 2, 3, 5, 7, 8)


def _args():
    return llama.ModelArgs(
        model_type="llama", hidden_size=32, num_hidden_layers=2, intermediate_size=64,
        num_attention_heads=2, num_key_value_heads=1, head_dim=16, rms_norm_eps=1e-5,
        vocab_size=VOCAB, rope_theta=10000.0, tie_word_embeddings=False)


def _build(noise: float) -> llama.Model:
    model = llama.Model(_args())
    weights = []
    for i, (path, value) in enumerate(sorted(tree_flatten(model.parameters()))):
        rng = np.random.default_rng([7, i])
        shape = value.shape
        if len(shape) == 1:
            w = 1.0 + rng.uniform(-0.1, 0.1, shape)
        else:
            gain = 1.2 if "lm_head" in path else 1.0  # logits of std ~1.2
            std = 1.0 if "embed" in path else gain / np.sqrt(shape[-1])
            w = rng.uniform(-1, 1, shape) * std * np.sqrt(3)
            if noise:
                extra = np.random.default_rng([8, i]).uniform(-1, 1, shape)
                w = w + extra * noise * std * np.sqrt(3)
        weights.append((path, mx.array(w.astype(np.float32))))
    model.load_weights(weights, strict=True)
    model.eval()
    mx.eval(model.parameters())
    return model


@lru_cache(maxsize=None)
def target():
    return _build(0.0)


@lru_cache(maxsize=None)
def draft():
    return _build(0.35)


class PairHead(DraftModelHead):
    """DraftModelHead read out through the draft's own ``lm_head`` (this
    pair's embeddings are not tied: read through them the logits would be
    so wide that q is all but one-hot, and a wrong q would go unseen)."""

    def __call__(self, tokens, features, cache=None, own=False):
        inner = self.draft.model
        x = inner.embed_tokens(tokens) + features @ (self.fc_own if own else self.fc_target)
        hidden = inner(tokens, cache=cache, input_embeddings=x)
        return self.draft.lm_head(hidden), hidden


class ReducedVocabHead(PairHead):
    """The head with EAGLE-3's reduced draft vocabulary: its logits over the
    target's vocabulary are -inf outside ``DRAFT_VOCAB`` (what
    treespec.heads.eagle3's ``full_logits`` gives a token d2t does not
    reach)."""

    def __call__(self, tokens, features, cache=None, own=False):
        logits, hidden = super().__call__(tokens, features, cache, own)
        outside = np.full(VOCAB, -np.inf, dtype=np.float32)
        outside[list(DRAFT_VOCAB)] = 0.0
        return logits + mx.array(outside), hidden


@lru_cache(maxsize=None)
def head(reduced: bool = False):
    cls = ReducedVocabHead if reduced else PairHead
    return cls(draft(), _args().hidden_size)
