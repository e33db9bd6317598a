"""Contracts 2 and 3: the chain walk is mlx-lm's accept loop, a linear tree
walks as the chain, and a tree walk accepts a root path."""

import mlx.core as mx
import mlx.nn as nn
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from mlx_lm.generate import speculative_generate_step
from mlx_lm.models.cache import KVCache

from suites.helpers_strategies import VOCAB, linear_trees, target_tokens_for, trees
from treespec.tree import DraftTree
from treespec.walk import chain_walk, tree_walk

pytestmark = pytest.mark.exactness


@given(st.data())
def test_a_linear_tree_walks_exactly_as_the_chain_walk(data):
    tree = data.draw(linear_trees(max_nodes=17))
    drafts = list(tree.tokens[1:])
    # Agree on a chosen prefix so every accept length is reached.
    accept = data.draw(st.integers(0, len(drafts)))
    target = drafts[:accept] + data.draw(
        st.lists(st.integers(0, VOCAB - 1), min_size=len(drafts) + 1 - accept,
                 max_size=len(drafts) + 1 - accept)
    )
    chain, walked = chain_walk(drafts, target), tree_walk(tree, target)
    assert walked.accepted == chain.accepted >= accept
    assert walked.emitted == chain.emitted
    assert walked.path == tuple(range(chain.accepted + 1))


class ScriptedLM(nn.Module):
    """A model whose greedy next token is a fixed function of the history.

    It keeps the history in a real KVCache (token ids as 1-dim keys), so
    mlx-lm's own trimming rewinds it exactly as it rewinds a transformer."""

    def __init__(self, next_token, vocab):
        super().__init__()
        self.layers = [None]
        self._next, self._vocab = next_token, vocab

    def __call__(self, tokens, cache):
        ids = tokens.astype(mx.float32).reshape(1, 1, -1, 1)
        seen, _ = cache[0].update_and_fetch(ids, ids)
        history = [int(t) for t in seen.reshape(-1).tolist()]
        start = len(history) - tokens.shape[1]
        rows = [self._next(tuple(history[: start + i + 1])) for i in range(tokens.shape[1])]
        return mx.eye(self._vocab)[mx.array(rows)][None] * 10

    def make_cache(self):
        return [KVCache()]


def scripted(seed, vocab):
    return lambda h: hash((seed,) + h) % vocab


def drafter_of(target, seed, agree, vocab):
    def g(h):
        t = target(h)
        return t if hash((seed, 7919) + h) % 100 < agree else (t + 1) % vocab
    return g


def chain_decode(target, draft, prompt, block, max_tokens):
    """A chain speculative decode written on chain_walk; yields
    (token, from_draft) exactly as speculative_generate_step does."""
    history, out = list(prompt), []
    while len(out) < max_tokens:
        k = min(block, max_tokens - len(out))
        drafts = []
        for _ in range(k):
            drafts.append(draft(tuple(history + drafts)))
        targets = [target(tuple(history + drafts[:i])) for i in range(k + 1)]
        walk = chain_walk(drafts, targets)
        for i, tok in enumerate(walk.emitted):
            if len(out) == max_tokens:
                break
            out.append((tok, i < walk.accepted))
        history += list(walk.emitted)
    return out


@settings(max_examples=60)
@given(
    seed=st.integers(0, 2**16),
    agree=st.integers(0, 100),
    block=st.integers(1, 6),
    max_tokens=st.integers(1, 24),
    prompt=st.lists(st.integers(0, 7), min_size=1, max_size=5),
)
def test_the_chain_walk_matches_mlx_lms_accept_loop(seed, agree, block, max_tokens, prompt):
    vocab = 8
    target = scripted(seed, vocab)
    draft = drafter_of(target, seed, agree, vocab)
    reference = [
        (int(tok), bool(from_draft))
        for tok, _, from_draft in speculative_generate_step(
            mx.array(prompt),
            ScriptedLM(target, vocab),
            ScriptedLM(draft, vocab),
            num_draft_tokens=block,
            max_tokens=max_tokens,
        )
    ]
    assert chain_decode(target, draft, prompt, block, max_tokens) == reference


@given(st.data())
def test_the_accepted_set_is_always_a_root_path(data):
    tree = data.draw(trees())
    target = data.draw(target_tokens_for(tree))
    walk = tree_walk(tree, target)
    path = walk.path
    assert path[0] == 0 and walk.accepted == len(path) - 1
    for parent, child in zip(path, path[1:]):
        assert tree.parents[child] == parent
        assert tree.tokens[child] == target[parent], "accepted a token the target did not pick"
    # Maximal: the last node has no child carrying the target's token.
    last = path[-1]
    assert all(tree.tokens[c] != target[last] for c in tree.children(last))
    assert walk.emitted == tuple(tree.tokens[i] for i in path[1:]) + (target[last],)


@given(st.data())
def test_duplicate_sibling_tokens_first_child_wins(data):
    tok = data.draw(st.integers(0, VOCAB - 1))
    fan = data.draw(st.integers(2, 6))
    tree = DraftTree([0] + [tok] * fan, [-1] + [0] * fan)
    # Give every duplicate a child that the target would accept too.
    for i in range(1, fan + 1):
        tree.push_child(i, 3)
    target = [tok] + [3] * (len(tree) - 1)
    walk = tree_walk(tree, target)
    assert walk.path[:2] == (0, 1), "the first child in node order must win"
    assert walk.path == (0, 1, tree.children(1)[0])
