"""The speculative sampling rule over a draft tree, and the distribution it samples.

Pure numpy on probabilities: the exactness suite (suites/sampling) runs this
production rule on hundreds of thousands of trees; the round loop runs it on
a batch of one (treespec.sampling).

The rule (multi-draft speculative sampling with recursive rejection)
--------------------------------------------------------------------
At a node whose target distribution is ``p`` and whose children
``x_1..x_k`` were drawn from the draft distribution ``q`` *without
replacement* (``x_1 ~ q``, ``x_2 ~ q`` with ``x_1`` removed and
renormalised, ...), with ``p_1 = p`` and ``q_1 = q``, for i = 1..k:

    accept x_i with probability min(1, p_i(x_i) / q_i(x_i));  stop.
    otherwise  p_{i+1} = norm(max(p_i - q_i, 0))       (the residual)
               q_{i+1} = norm(q_i with x_i set to 0)    (without replacement)

and when every child is rejected, emit a sample of ``p_{k+1}``. An accepted
child's own children are then verified the same way against the target's
distribution after it; at a leaf the target samples its bonus token. With
one child per node this is exactly the speculative sampling of Leviathan et
al. (2023, "Fast Inference from Transformers via Speculative Decoding") and
Chen et al. (2023, "Accelerating LLM Decoding with Speculative Sampling").
With several children it is the recursive rejection sampling of SpecInfer's
"multi-step speculative sampling" (Miao et al., 2023; children i.i.d., ``q``
unchanged: ``replacement=True`` here) in its without-replacement form, the
"recursive rejection sampling" of Recursive Speculative Decoding (Jeon et
al., 2024) and the candidate-removal correction of Multi-Candidate
Speculative Decoding (Yang et al., 2024).

Why it is exact:
1. One child (the lemma): P(out = y) = q(y) min(1, p(y)/q(y)) + P(reject)
   r(y) = min(p, q)(y) + (1 - sum min(p, q)) r(y), and with
   r = max(p - q, 0) / (1 - sum min(p, q)) the sum is p(y).
2. k children, by induction on k, claiming "for EVERY pair (p, q), children
   drawn from q without replacement, the node emits a sample of p": given a
   rejected x_1, the rest are k - 1 draws without replacement from q_2 and
   the procedure continues with (p_2, q_2); by induction it emits p_2, which
   does not depend on x_1. So the node is "x_1 ~ q, accept w.p. min(1, p/q),
   else a sample of r = p_2": the lemma, output ~ p. (k = 0: sample p.)
3. A rejected x_i has p_i(x_i) < q_i(x_i), so every later residual is 0 at
   x_i: a residual sample never equals a rejected child, and never needs
   its subtree. An accepted child's subtree was drawn from the draft after
   it, independently of the coins above, so (2) applies again one level
   down; the rounds chain the conditionals into the law of any length.
4. A child with q_i(x_i) = 0 cannot have been drawn from q_i (it pads a
   node whose draft support ran out); it is skipped, changing neither p nor
   q: the node is exactly the tree without it.
In floating point the rule runs in float64 on probabilities computed from
the models' logits; "exact" is exact in law, verified by chi-square tests.
"""

from dataclasses import dataclass, fields
from typing import Callable, Dict, Sequence

import mlx.core as mx
import numpy as np
from mlx_lm.sample_utils import apply_min_p, apply_top_k, apply_top_p

from .errors import SamplingRefused
from .options import check_sampling
from .tree import DraftTree
from .walk import Walk


# ---------------------------------------------------------------------------
# The distribution: mlx-lm's sampler, as probabilities.
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class SamplingParams:
    """What ``mlx_lm.sample_utils.make_sampler(temp, top_p, min_p,
    min_tokens_to_keep, top_k)`` samples from, in its conventions: top_p in
    (0, 1) is on (0 and 1 are off), top_k > 0 is on, min_p > 0 is on. The
    filters act on the untempered log-probs, as make_sampler's do."""

    temperature: float
    top_k: int = 0
    top_p: float = 0.0
    min_p: float = 0.0
    min_tokens_to_keep: int = 1

    def __post_init__(self):
        t = self.temperature
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not t > 0:
            raise SamplingRefused(
                f"temperature must be > 0 for sampled decoding, got {t!r}; temperature 0 "
                "is greedy decoding: use treespec.decoding.decode")
        check_sampling(self.top_k, self.top_p, self.min_p, error=SamplingRefused)

    def logprobs(self, logits: mx.array) -> mx.array:
        """Normalised, filtered, tempered log-probs, rows over the last
        axis: generate_step's ``logits - logsumexp`` then make_sampler's
        chain (same functions, same order, same dtype)."""
        x = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        if 0 < self.top_p < 1.0:
            x = apply_top_p(x, self.top_p)
        if self.min_p != 0.0:
            x = apply_min_p(x, self.min_p, self.min_tokens_to_keep)
        if self.top_k > 0:
            x = apply_top_k(x, int(self.top_k))
        # categorical_sampling's own scaling: softmax(x * (1 / temp)).
        return x * (1.0 / self.temperature)

    def probs(self, logits: mx.array) -> np.ndarray:
        """The sampling distribution as float64 probabilities (rows sum to 1,
        exact zeros outside the filters' support)."""
        x = self.logprobs(logits)
        x = np.array(x.astype(mx.float32), dtype=np.float64)
        x = x - x.max(axis=-1, keepdims=True)
        p = np.exp(x)  # exp(-inf) = 0 exactly
        return p / p.sum(axis=-1, keepdims=True)

    def describe(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}


def refuse_logits_processors(logits_processors) -> None:
    """Logits processors (mlx-lm's repetition/presence/frequency penalties,
    logit bias) depend on each node's own token history; sampled tree
    verification does not apply them, so it refuses rather than sample a
    different distribution than the one asked for."""
    if logits_processors:
        names = ", ".join(getattr(p, "__name__", type(p).__name__) for p in logits_processors)
        raise SamplingRefused(
            f"logits_processors are not supported by sampled tree speculative decoding "
            f"(got: {names}); repetition/presence/frequency penalties and logit bias "
            "would have to be applied per tree node with that node's own history. "
            "Use mlx_lm.generate for them.")


# ---------------------------------------------------------------------------
# Draws.
# ---------------------------------------------------------------------------


def sample_without_replacement(q: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    """``k`` draws without replacement from each row of ``q`` ([..., V]), in
    draw order, by Gumbel-top-k: the order of ``log q + Gumbel`` has the law
    of sequential draws (x_1 ~ q, x_2 ~ q without x_1 renormalised, ...)
    (Vieira 2014; Kool et al. 2019, "Stochastic Beams"). Slots past a row's
    support (fewer than k tokens with q > 0) are -1."""
    q = np.asarray(q, dtype=np.float64)
    g = rng.gumbel(size=q.shape)
    with np.errstate(divide="ignore"):
        keys = np.log(q) + g
    k = min(int(k), q.shape[-1])
    if k < q.shape[-1]:  # the k largest keys, then their order (a big vocabulary)
        top = np.argpartition(-keys, k - 1, axis=-1)[..., :k]
        order = np.take_along_axis(
            top, np.argsort(-np.take_along_axis(keys, top, axis=-1), axis=-1, kind="stable"),
            axis=-1)
    else:
        order = np.argsort(-keys, axis=-1, kind="stable")
    valid = np.take_along_axis(q, order, axis=-1) > 0
    return np.where(valid, order, -1)


def sample_rows(p: np.ndarray, v: np.ndarray) -> np.ndarray:
    """One token per row of ``p`` [N, V] by inverse CDF with uniforms ``v``
    [N] in [0, 1). Only tokens with p > 0 can come out."""
    c = np.cumsum(p, axis=-1)
    thr = v * c[:, -1]
    idx = (c <= thr[:, None]).sum(axis=-1)  # first index with c > thr
    return np.minimum(idx, p.shape[-1] - 1)


# ---------------------------------------------------------------------------
# The rule.
# ---------------------------------------------------------------------------


def verify_children(p: np.ndarray, q: np.ndarray, children: np.ndarray, u: np.ndarray,
                    v: np.ndarray, replacement: bool = False):
    """Multi-draft speculative sampling at one node, for a batch of N nodes.

    ``p`` [N, V]: the target's distribution at the node; ``q`` [N, V]: the
    draft distribution its children were drawn from; ``children`` [N, k]:
    their tokens in draw order (-1: no child in that slot); ``u`` [N, k] and
    ``v`` [N]: uniforms in [0, 1) for the coins and the residual draw.
    ``replacement``: children were drawn i.i.d. from ``q`` (SpecInfer), so
    ``q`` stays as it is after a rejection.

    Returns ``(accepted, token)``: the slot of the accepted child (-1 if
    none) and the token the node emits (that child's, or a sample of the
    final residual). See the module docstring for why the law of ``token``
    is exactly ``p``."""
    p = np.array(p, dtype=np.float64)  # copies: rows are rewritten below
    q = np.array(q, dtype=np.float64)
    children = np.asarray(children, dtype=np.int64).reshape(len(p), -1)
    n = len(p)
    rows = np.arange(n)
    accepted = np.full(n, -1, dtype=np.int64)
    active = np.ones(n, dtype=bool)
    for i in range(children.shape[1]):
        x = children[:, i]
        xs = np.maximum(x, 0)
        px, qx = p[rows, xs], q[rows, xs]
        drawn = active & (x >= 0) & (qx > 0)  # qx == 0: padding, skip (point 4)
        # u < p/q has probability min(1, p/q); written without the division.
        ok = drawn & (u[:, i] * qx < px)
        accepted[ok] = i
        active &= ~ok
        rej = np.nonzero(drawn & ~ok)[0]
        if rej.size == 0:
            continue
        r = np.maximum(p[rej] - q[rej], 0.0)
        mass = r.sum(axis=-1, keepdims=True)
        # mass == 0 only when p == q on this row (a rejection then has
        # probability 0); p is its own residual there.
        p[rej] = np.where(mass > 0, r / np.where(mass > 0, mass, 1.0), p[rej])
        if not replacement:
            qr = q[rej]
            qr[np.arange(rej.size), x[rej]] = 0.0
            qm = qr.sum(axis=-1, keepdims=True)
            q[rej] = qr / np.where(qm > 0, qm, 1.0)  # all zero: later slots are padding
    token = sample_rows(p, v)
    hit = accepted >= 0
    token[hit] = children[rows[hit], accepted[hit]]
    return accepted, token


Rule = Callable[..., tuple]


def _children_of(parents: Sequence[int]):
    kids = [[] for _ in parents]
    for i, par in enumerate(parents):
        if i:
            kids[par].append(i)
    return kids


def walk_batch(parents: Sequence[int], tokens: np.ndarray, p: np.ndarray, q: np.ndarray,
               rng: np.random.Generator, rule: Rule = verify_children,
               replacement: bool = False):
    """The sampled walk over N trees of one topology.

    ``parents``: the topology (node 0 the root, parents[i] < i); ``tokens``
    [N, n]: node tokens (-1: absent node, e.g. a slot past the draft's
    support); ``p`` [N, n, V]: the target's distribution after each node;
    ``q`` [N, n, V]: the draft distribution each node's children were drawn
    from (read only at nodes with children). From the root down, each node
    applies ``rule`` to its children; an accepted child continues the walk,
    otherwise the node's emitted token ends it (at a leaf: a plain sample
    of p, the bonus token).

    Returns ``(last, token)`` [N]: the deepest accepted node and the token
    emitted after it. The round emits the tokens on the root path to
    ``last`` (root excluded) followed by ``token``. Uniforms are drawn per
    node, in node order, for the rows standing on it."""
    tokens = np.asarray(tokens, dtype=np.int64)
    n_rows, n = tokens.shape
    kids = _children_of(parents)
    last = np.zeros(n_rows, dtype=np.int64)
    token = np.full(n_rows, -1, dtype=np.int64)
    done = np.zeros(n_rows, dtype=bool)
    for c in range(n):  # a child's index exceeds its parent's: one pass
        rows = np.nonzero((last == c) & ~done)[0]
        if rows.size == 0:
            continue
        ks = kids[c]
        ch = tokens[rows][:, ks] if ks else np.zeros((rows.size, 0), dtype=np.int64)
        u = rng.random((rows.size, len(ks)))
        v = rng.random(rows.size)
        acc, tok = rule(p[rows, c], q[rows, c], ch, u, v, replacement=replacement)
        moved = acc >= 0
        if ks:
            last[rows[moved]] = np.asarray(ks)[acc[moved]]
        stop = rows[~moved]
        done[stop] = True
        token[stop] = tok[~moved]
    return last, token


def sampled_walk(tree: DraftTree, p: np.ndarray, q: Dict[int, np.ndarray],
                 rng: np.random.Generator, rule: Rule = verify_children) -> Walk:
    """One tree: ``p`` [n, V] target distributions per node, ``q`` {node:
    [V]} the draft distribution of each expanded node. A :class:`Walk`
    like tree_walk's (path from the root, emitted tokens)."""
    n, vocab = p.shape
    qq = np.zeros((1, n, vocab))
    for node, dist in q.items():
        qq[0, node] = dist
    last, token = walk_batch(tree.parents, np.array(tree.tokens)[None], p[None], qq, rng,
                             rule=rule)
    path = tree.path_to(int(last[0]))
    emitted = [tree.tokens[i] for i in path[1:]] + [int(token[0])]
    return Walk(path=tuple(path), emitted=tuple(emitted))
