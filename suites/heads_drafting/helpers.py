"""What the head-drafting suite shares: a head that accepts often, the
independent references (the target's features from a plain mlx-lm forward,
a fresh head fed the accepted text), and the planted defective drafters."""

from typing import Optional, Sequence

import mlx.core as mx
import mlx.nn as nn
import numpy as np
from mlx_lm.models.base import create_attention_mask
from mlx_lm.models.cache import KVCache

from treespec.audit.head_props import HeadStateRecorder as Recorder
from treespec.audit.head_props import classic_features, fresh_cache_rows, state_difference
from treespec.evidence.verdicts import SAFETY, TRIANGLE
from treespec.draft.head import HeadDrafter
from treespec.heads.base import FINAL


class DraftModelHead(nn.Module):
    """A head (treespec.heads.base's contract) around an mlx-lm llama draft
    model: the draft model's own prediction, nudged by the features through
    two small seeded projections added to its input embedding. So it drafts
    about as well as the draft model does (rounds accept partial paths,
    which a random head's never do), while its cache and drafts still
    depend on every feature it is fed: a wrong feature shows in its cache."""

    def __init__(self, draft, target_hidden: int, taps=(FINAL,), scale: float = 0.05):
        super().__init__()
        h = draft.args.hidden_size
        self.draft = draft
        rng = np.random.RandomState(7)
        width = len(taps) * target_hidden
        self.fc_target = mx.array(rng.normal(0, scale / np.sqrt(width), (width, h)), mx.float32)
        self.fc_own = mx.array(rng.normal(0, scale / np.sqrt(h), (h, h)), mx.float32)
        object.__setattr__(self, "taps", tuple(taps))
        object.__setattr__(self, "target_hidden_size", target_hidden)
        object.__setattr__(self, "hidden_size", h)
        object.__setattr__(self, "vocab_size", draft.args.vocab_size)

    def make_cache(self):
        return [KVCache() for _ in self.draft.layers]

    def __call__(self, tokens, features, cache=None, own=False):
        inner = self.draft.model
        x = inner.embed_tokens(tokens) + features @ (self.fc_own if own else self.fc_target)
        hidden = inner(tokens, cache=cache, input_embeddings=x)
        return inner.embed_tokens.as_linear(hidden), hidden


def text_model(target):
    """The module holding embed_tokens / layers / norm (qwen3_5 wraps it)."""
    outer = getattr(target, "language_model", target)
    return outer.model


def reference_features(target, tokens: Sequence[int], taps) -> mx.array:
    """The target's features at every position of ``tokens`` from one plain
    forward, read without treespec's taps: the final norm's output is what
    mlx-lm's text model returns; a layer's output is the residual stream
    after it, run layer by layer (the plain llama layout only)."""
    inner = text_model(target)
    x = mx.array(list(tokens))[None]
    parts = []
    for tap in taps:
        if tap == FINAL:
            parts.append(inner(x))
            continue
        h = inner.embed_tokens(x)
        mask = create_attention_mask(h, None)
        for layer in inner.layers[:tap % len(inner.layers) + 1]:
            h = layer(h, mask, None)
        parts.append(h)
    return mx.concatenate(parts, axis=-1) if len(parts) > 1 else parts[0]


def widths_bounds(head, target, prompt, text, feats) -> tuple:
    """(cache bound, feature bound): ``TRIANGLE x SAFETY`` x this backend's
    rounding across forward widths, measured here on ``text`` between two
    computations correct by construction at the extreme widths: the
    target's features from classic decoding's one-token steps
    (treespec.audit.head_props.classic_features) against ``feats`` (one
    plain forward), and a fresh head fed the steps' features one pair a
    forward against one fed ``feats`` in one forward. The rounds' states
    come from widths in between. (0, 0) on an exact backend: bit identity.
    The factor is the suite's pass rule's (treespec.evidence.verdicts)."""
    steps = classic_features(target, prompt, text, head.taps)
    n = feats.shape[1] - 1
    one = fresh_cache_rows(head, text, feats, n)
    stepped = fresh_cache_rows(head, text, steps, n, steps=True)
    own = max((float(np.abs(np.asarray(a[i], np.float64) - np.asarray(b[i], np.float64)).max())
               for a, b in zip(one, stepped) if a is not None for i in (0, 1) if a[i].size),
              default=0.0)
    feat = float(np.abs(np.array(steps.astype(mx.float32), np.float64)
                        - np.array(feats.astype(mx.float32), np.float64)).max())
    factor = TRIANGLE * SAFETY
    return factor * own, factor * feat


def check_against_fresh_head(head, target, prompt, recorder: Recorder,
                             atol: Optional[float] = None):
    """Every round's head state against an independent recomputation: the
    accepted text's features from a plain forward of the target
    (``reference_features``, read off mlx-lm's modules), a fresh head cache
    fed them with the text's next tokens in one forward. After round r (e
    tokens emitted before it): the cache holds the pairs (text[t + 1],
    features[t]) for t < L, its offset L; the queue holds the tokens
    text[L + 1 ..] of the committed text and the features of positions L ..
    (one more than tokens: the last pairs with the next root). The
    comparison is the audit's head-state row's (treespec.audit.head_props),
    here with this suite's own reference features, within
    :func:`widths_bounds` (``atol``: one bound for both, given). AssertionError
    naming the round."""
    text = list(prompt) + recorder.emitted
    feats = reference_features(target, text, head.taps)
    bounds = widths_bounds(head, target, prompt, text, feats) if atol is None else (atol, atol)
    first, _, _ = state_difference(head, text, feats, recorder.rounds, *bounds)
    assert first is None, f"{first['message']} (bounds {bounds[0]:.3g}, {bounds[1]:.3g})"


# -- planted defects (passed in as drafters, never patched in) -------------

class NoRollBack(HeadDrafter):
    """Plant: the head's cache keeps the round's drafts."""

    def roll_back(self):
        pass


class RejectedFeatures(HeadDrafter):
    """Plant: the head is fed a rejected node's hidden state in place of the
    accepted path's last node's, where the round has a rejected node."""

    def path_features(self, features, rnd, path):
        rejected = [i for i in range(len(rnd.tree)) if i not in path]
        path = list(path[:-1]) + [rejected[-1] if rejected else path[-1]]
        return super().path_features(features, rnd, path)


class WrongLayer(HeadDrafter):
    """Plant: the taps read the last decoder layer's output (before the
    final norm) where the head asks for the final norm's."""

    def tap_list(self):
        return tuple(-1 if t == FINAL else t for t in self.head.taps)


PLANTS = {"cache not rolled back": NoRollBack, "a rejected node's features": RejectedFeatures,
          "the wrong layer's features": WrongLayer}
