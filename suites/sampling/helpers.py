"""Distribution-level harness: the production rule on many trees at once.

A synthetic order-2 "language model" over a small vocabulary: the target's
next-token distribution after any text is ``P[ctx]`` and the draft's
``Q[ctx]``, ctx = (second-to-last, last) token with ``V`` standing for
"before the text". The tables are made of seeded raw logits passed through
``SamplingParams.probs`` (mlx-lm's top-p / min-p / top-k functions and
temperature), so the filters' supports are exercised exactly as in the model.

``simulate`` runs speculative sampling on N independent texts in lockstep:
each round drafts a fixed-topology tree per text (children drawn without
replacement with treespec.sampling.sample_without_replacement, or i.i.d. for
a planted wrong drafter), walks it with treespec.sampling.walk_batch (the
production walk) and a node rule (the production ``verify_children`` or a
planted wrong one), and appends the emitted tokens, until every text has
``length`` tokens. ``exact_law`` is the target's law of ``length`` tokens
(what plain sampling draws from), by enumeration.
"""

from dataclasses import dataclass

import mlx.core as mx
import numpy as np
from mlx_lm.sample_utils import make_sampler

from treespec.sampling import SamplingParams, sample_rows, sample_without_replacement, \
    verify_children, walk_batch

V = 8  # vocabulary
LENGTH = 3  # tokens per sample
BOS = V


@dataclass(frozen=True)
class Sampling:
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 0.0
    min_p: float = 0.0

    def params(self):
        return SamplingParams(self.temperature, self.top_k, self.top_p, self.min_p)


def raw_tables(seed=0, target_scale=1.6, draft_noise=1.2):
    """Raw logits [(V+1)^2, V] for target and draft (draft = target + noise)."""
    rng = np.random.default_rng(seed)
    zp = rng.normal(0.0, target_scale, ((V + 1) ** 2, V))
    zq = zp + rng.normal(0.0, draft_noise, zp.shape)
    return zp.astype(np.float32), zq.astype(np.float32)


def tables(sampling: Sampling, seed=0):
    zp, zq = raw_tables(seed)
    params = sampling.params()
    return params.probs(mx.array(zp)), params.probs(mx.array(zq))


def ctx(a, b):
    return a * (V + 1) + b


def shape_parents(branching):
    parents, level = [-1], [0]
    for k in branching:
        nxt = []
        for par in level:
            for _ in range(k):
                parents.append(par)
                nxt.append(len(parents) - 1)
        level = nxt
    return parents


def draw_iid(q, k, rng):
    """k i.i.d. draws per row (with replacement)."""
    return np.stack([sample_rows(q, rng.random(len(q))) for _ in range(k)], axis=1)


def simulate(P, Q, branching, n, seed, rule=verify_children, drafting="wor",
             replacement=False, length=LENGTH, Q_report=None, stats=None):
    """``n`` texts of ``length`` tokens by tree speculative sampling.

    ``drafting``: "wor" (production) or "iid" (with replacement);
    ``Q_report``: the draft table the verifier is told (default: ``Q``, the
    one the children are drawn from); ``stats``: a dict that receives the
    mean number of tokens a round emits (first rounds only)."""
    Q_report = Q if Q_report is None else Q_report
    rng = np.random.default_rng(seed)
    parents = shape_parents(branching)
    kids = [[i for i, p in enumerate(parents) if p == c] for c in range(len(parents))]
    m = len(parents)
    out = np.full((n, length), -1, dtype=np.int64)
    have = np.zeros(n, dtype=np.int64)
    prev2 = np.full(n, BOS)  # the text's last two tokens
    prev1 = np.full(n, BOS)
    while True:
        rows = np.nonzero(have < length)[0]
        if rows.size == 0:
            return out
        r = rows.size
        tok = np.full((r, m), -1, dtype=np.int64)
        a = np.zeros((r, m), dtype=np.int64)  # each node's context
        b = np.zeros((r, m), dtype=np.int64)
        a[:, 0], b[:, 0] = prev2[rows], prev1[rows]
        tok[:, 0] = prev1[rows]
        # Node-major storage (contiguous per node), seen as [rows, nodes, V].
        p = np.empty((m, r, V)).transpose(1, 0, 2)
        q = np.empty((m, r, V)).transpose(1, 0, 2)
        for c in range(m):
            present = tok[:, c] >= 0
            cc = np.where(present, ctx(a[:, c], b[:, c]), 0)
            p[:, c], q[:, c] = P[cc], Q_report[cc]
            if not kids[c]:
                continue
            k = len(kids[c])
            if drafting == "wor":
                draws = sample_without_replacement(Q[cc], k, rng)
            else:
                draws = draw_iid(Q[cc], k, rng)
            draws[~present] = -1
            for j, child in enumerate(kids[c]):
                tok[:, child] = draws[:, j]
                a[:, child] = b[:, c]
                b[:, child] = np.maximum(draws[:, j], 0)
        last, final = walk_batch(parents, tok, p, q, rng, rule=rule, replacement=replacement)
        if stats is not None and "tokens_per_round" not in stats:
            depth = np.zeros(m, dtype=np.int64)
            for x in range(1, m):
                depth[x] = depth[parents[x]] + 1
            stats["tokens_per_round"] = float(np.mean(depth[last] + 1))
        # Emitted: the path's tokens below the root, then the final token.
        for node in np.unique(last):
            sel = np.nonzero(last == node)[0]
            path = []
            x = int(node)
            while x > 0:
                path.append(x)
                x = parents[x]
            seq = np.concatenate([tok[sel][:, path[::-1]], final[sel, None]], axis=1)
            for j in range(seq.shape[1]):
                rr = rows[sel]
                room = have[rr] < length
                rr, col = rr[room], seq[room, j]
                out[rr, have[rr]] = col
                have[rr] += 1
                prev2[rr], prev1[rr] = prev1[rr], col


# Texts per call of mlx-lm's sampler: on the H200 (MLX 0.32.4 CUDA) its
# top-k/top-p filters over 100,000 rows at once fail to launch
# ("cudaGraphAddKernelNode ... invalid argument"); CUDA caps a launch's
# second and third grid dimensions at 65,535.
ROWS_PER_CALL = 50_000


def plain_mlx(sampling: Sampling, n, seed, length=LENGTH, table_seed=0):
    """Plain sampling with mlx-lm itself: ``make_sampler`` on the raw target
    logits, normalised as ``generate_step`` does, ``n`` texts at once."""
    zp, _ = raw_tables(table_seed)
    sampler = make_sampler(sampling.temperature, top_p=sampling.top_p, min_p=sampling.min_p,
                           top_k=sampling.top_k)
    mx.random.seed(seed)
    out = np.zeros((n, length), dtype=np.int64)
    a, b = np.full(n, BOS), np.full(n, BOS)
    for j in range(length):
        logits = mx.array(zp[ctx(a, b)])
        logprobs = logits - mx.logsumexp(logits, axis=-1, keepdims=True)
        t = np.concatenate([np.array(sampler(logprobs[i:i + ROWS_PER_CALL]))
                            for i in range(0, n, ROWS_PER_CALL)]).astype(np.int64)
        out[:, j] = t
        a, b = b, t
    return out


def plain(P, n, seed, length=LENGTH):
    """Plain ancestral sampling from the target (the baseline)."""
    rng = np.random.default_rng(seed)
    out = np.zeros((n, length), dtype=np.int64)
    a, b = np.full(n, BOS), np.full(n, BOS)
    for j in range(length):
        t = sample_rows(P[ctx(a, b)], rng.random(n))
        out[:, j] = t
        a, b = b, t
    return out


def exact_law(P, length=LENGTH):
    """The target's probability of every text of ``length`` tokens, [V]*length."""
    probs = {(): 1.0}
    for _ in range(length):
        nxt = {}
        for text, pr in probs.items():
            a = text[-2] if len(text) >= 2 else BOS
            b = text[-1] if len(text) >= 1 else BOS
            row = P[ctx(a, b)]
            for t in range(V):
                if row[t] > 0:
                    nxt[text + (t,)] = pr * row[t]
        probs = nxt
    law = np.zeros([V] * length)
    for text, pr in probs.items():
        law[text] = pr
    return law


def counts(samples, length=LENGTH):
    flat = np.ravel_multi_index(samples.T, [V] * length)
    return np.bincount(flat, minlength=V ** length).reshape([V] * length)


def marginal(table, position):
    axes = tuple(i for i in range(table.ndim) if i != position)
    return table.sum(axis=axes)


# ---------------------------------------------------------------------------
# Planted wrong rules: the production rule with one thing changed.
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Variant:
    """``verify_children`` with switches. The default is the production
    rule (pinned bit for bit by a test); each planted rule flips one or two.

    accept_q / residual_q: the draft probability used in the acceptance
    ratio / in the residual: "real" (the q the child was drawn from) or
    "one" (EAGLE-style: the draft treated as a point mass on the child).
    residual: "norm" (production), "none" (keep p after a rejection), "raw"
    (max(p - q, 0) not renormalised). remove_rejected: the without-
    replacement update of q (False: verify as if the drafts were i.i.d.).
    skip_undrawable: a child of draft probability 0 under q_i (past the
    support, or a repeat of an earlier child) is skipped (production) rather
    than tried like a fresh draw."""

    accept_q: str = "real"
    residual_q: str = "real"
    residual: str = "norm"
    remove_rejected: bool = True
    skip_undrawable: bool = True  # a child with q_i(x) = 0 is padding (skipped)

    def __call__(self, p, q, children, u, v, replacement=False):
        p = np.array(p, dtype=np.float64)
        q = np.array(q, dtype=np.float64)
        children = np.asarray(children, dtype=np.int64).reshape(len(p), -1)
        n = len(p)
        rows = np.arange(n)
        accepted = np.full(n, -1, dtype=np.int64)
        active = np.ones(n, dtype=bool)
        for i in range(children.shape[1]):
            x = children[:, i]
            xs = np.maximum(x, 0)
            one = np.zeros_like(p)
            one[rows, xs] = 1.0
            px, qx = p[rows, xs], q[rows, xs]
            drawn = active & (x >= 0) & ((qx > 0) | (not self.skip_undrawable))
            qa = np.ones_like(qx) if self.accept_q == "one" else qx
            ok = drawn & (u[:, i] * qa < px)
            accepted[ok] = i
            active &= ~ok
            rej = np.nonzero(drawn & ~ok)[0]
            if rej.size == 0:
                continue
            if self.residual != "none":
                qr = one[rej] if self.residual_q == "one" else q[rej]
                r = np.maximum(p[rej] - qr, 0.0)
                mass = r.sum(axis=-1, keepdims=True)
                if self.residual == "norm":
                    p[rej] = np.where(mass > 0, r / np.where(mass > 0, mass, 1.0), p[rej])
                else:
                    p[rej] = np.where(mass > 0, r, p[rej])
            if self.remove_rejected and not replacement:
                qr = q[rej]
                qr[np.arange(rej.size), x[rej]] = 0.0
                qm = qr.sum(axis=-1, keepdims=True)
                q[rej] = qr / np.where(qm > 0, qm, 1.0)
        token = sample_rows(p, v)
        hit = accepted >= 0
        token[hit] = children[rows[hit], accepted[hit]]
        return accepted, token


# The suite's significance level and sample size, and its sampling settings.
ALPHA = 1e-4
N = 100_000
T1 = Sampling()
FILTERED = Sampling(0.7, top_k=5, top_p=0.9)
NUCLEUS = Sampling(1.3, top_p=0.8, min_p=0.05)
TIGHT = Sampling(0.5, top_k=3)
