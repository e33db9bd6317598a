"""What a draft shape emits per verify under greedy decoding, read off the
target's own text: one teacher-forced forward of the draft model instead of
one decode per shape.

Under greedy decoding every round commits the target's text (contract 9,
docs/contracts.md#contract-9-greedy-text-equals-mlx_lm-generate), so the draft model only ever sees
a prefix of that text, and the round that starts after ``p`` tokens accepts, at depth j, the child
whose token is the target's token ``p + j``. Every top-k drafter makes a node's children its best
tokens, best first (``treespec.draft.top_children``: float32 logits, ties to the lower id), so
whether that child exists depends only on the **rank** of the target's token among the draft's
logits after that prefix, and on the shape: a node with k children has the ranks 0..k-1. So

- :func:`draft_ranks` (the one device step) runs the draft model once over
  the prompt and the target's text and returns, for each text token, its
  rank under the draft after the tokens before it;
- :func:`rounds` (numpy, pure) replays the round loop on those ranks for
  any parent list in first-choice order (a chain is a linear one): each
  round takes the first ``max_tokens - emitted`` nodes of the shape, as the
  round loop's ``limit`` does, walks down while the node has a child of the
  next rank, and emits what it accepted plus the target's own token.

The replay equals the round loop's own walks wherever the draft model's
incremental forwards equal its forward over the whole text (the exact
regimes; ``suites/e2e/test_emission.py`` pins it round by round against
decodes). It counts rounds up to ``max_tokens`` text tokens and does not
model an end-of-sequence token inside a round. What a round costs is not
here: ``treespec.auto.predict`` prices shapes from measured times.
"""

from typing import List, Sequence

import mlx.core as mx
import numpy as np

__all__ = ["child_ranks", "draft_ranks", "rounds"]


def child_ranks(parents: Sequence[int]) -> dict:
    """(parent, rank) -> child for a parent list: a node's children in node
    order are its ranks 0, 1, ... (first-choice order keeps the best first)."""
    seen, out = {}, {}
    for i, p in enumerate(parents[1:], start=1):
        r = seen.get(p, 0)
        seen[p] = r + 1
        out[(p, r)] = i
    return out


def rounds(parents: Sequence[int], ranks: Sequence[int], max_tokens: int) -> List[int]:
    """Tokens emitted by each round of a greedy decode of ``max_tokens``
    tokens drafting ``parents`` (a shape in first-choice order; node 0 the
    root), where ``ranks[t]`` is the draft's rank of text token t after
    tokens 0..t-1 (:func:`draft_ranks`)."""
    if len(ranks) < max_tokens:
        raise ValueError(f"ranks cover {len(ranks)} tokens, max_tokens is {max_tokens}")
    if not parents or parents[0] != -1:
        raise ValueError(f"a shape's node 0 is its root (parent -1), got {list(parents)[:1]}")
    kids = child_ranks(parents)
    out, done = [], 0
    while done < max_tokens:
        nodes = min(len(parents), max_tokens - done)  # the round loop's limit + 1
        node, j = 0, 0
        while True:
            child = kids.get((node, int(ranks[done + j])))
            if child is None or child >= nodes:
                break
            node, j = child, j + 1
        out.append(j + 1)
        done += j + 1
    return out


def draft_ranks(draft_model, prompt: Sequence[int], text: Sequence[int]) -> np.ndarray:
    """For each token of ``text`` (what the target emitted after ``prompt``),
    its rank among the draft model's float32 logits after ``prompt`` and the
    text before it: how many ids score higher, and how many score the same
    with a lower id. One forward over ``prompt + text[:-1]``."""
    if not prompt or not text:
        raise ValueError("draft_ranks needs a prompt and a text of at least one token each")
    tokens = mx.array(list(prompt) + list(text[:-1]))[None]
    logits = draft_model(tokens)[0, len(prompt) - 1:].astype(mx.float32)
    truth = mx.array(list(text))[:, None]
    score = mx.take_along_axis(logits, truth, axis=-1)
    ids = mx.arange(logits.shape[-1])[None, :]
    above = (logits > score) | ((logits == score) & (ids < truth))
    return np.array(above.sum(axis=-1))
