"""Drafting cost per depth against the verify's cost per extra position, on
the built-in pair (results/heads/README.md).

    python results/heads/head_cost.py [--repeats 21] [--context 64] [--blas openblas]

For each trained head (treespec/pair/head-mtp, head-eagle3): the wall time of
one head forward of one token at R = 1, 2, 4, 8 batch rows (``own=True``, a
depth of a chain at R = 1, a wide level of a tree at R > 1), each row over a
``context``-position head cache; and the copy of the head's cache into R rows
(``caches.fork``) a wide level pays before its forward. Beside them: the
separate draft model's one-token step and the target's forward of T = 1..16
positions over the same context (the verify; what `treespec bench
--verify-curve` measures). Medians of ``repeats`` after 3 warm-ups; each
call's cache is trimmed back so every repeat sees the same context.
"""

import argparse
import statistics
import time

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache

from treespec import caches
from treespec.bench.report import machine_info
from treespec.cli.process import prepare
from treespec.checkpoints import default_pair, load_default_pair
from treespec.heads.load import load_head


def timed(fn, repeats):
    for _ in range(3):
        fn()
    out = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        out.append(1e3 * (time.perf_counter() - t0))
    return statistics.median(out)


def trim(cache, n):
    for c in cache:
        c.trim(n)


def model_cost(model, context, widths, repeats):
    """ms of one forward of T tokens over ``context`` positions, per T."""
    cache = make_prompt_cache(model)
    model(mx.random.randint(0, 300, (1, context)), cache=cache)
    mx.eval([c.state for c in cache])
    out = {}
    for t in widths:
        x = mx.random.randint(0, 300, (1, t))

        def step():
            mx.eval(model(x, cache=cache))
            trim(cache, t)
        out[t] = timed(step, repeats)
    return out


def head_cost(head, context, rows, repeats):
    """(forward ms, fork ms) of one own-state head step per batch-row count."""
    feats = mx.random.normal((1, context, len(head.taps) * head.target_hidden_size))
    cache = head.make_cache()
    mx.eval(head(mx.random.randint(0, 300, (1, context)), feats, cache))
    mx.eval([c.state for c in cache])
    out = {}
    for r in rows:
        rows_cache = caches.fork(cache, [0] * r) if r > 1 else cache
        mx.eval([c.state for c in rows_cache])
        tok = mx.random.randint(0, 300, (r, 1))
        own = mx.random.normal((r, 1, head.hidden_size))

        def step():
            mx.eval(head(tok, own, rows_cache, own=True))
            trim(rows_cache, 1)

        def fork():
            mx.eval([c.state for c in caches.fork(cache, [0] * r)])
        out[r] = (timed(step, repeats), timed(fork, repeats) if r > 1 else 0.0)
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=21)
    ap.add_argument("--context", type=int, default=64)
    ap.add_argument("--blas", choices=("auto", "reference", "openblas"), default="auto")
    a = ap.parse_args()
    prepare(a.blas)  # --blas openblas re-executes this script with OpenBLAS preloaded
    print(machine_info()["blas"])
    target, draft, _ = load_default_pair()
    pair = default_pair()[0].parent
    verify = model_cost(target, a.context, range(1, 17), a.repeats)
    step = model_cost(draft, a.context, [1], a.repeats)[1]
    print(f"target forward ms at T (context {a.context}): "
          + ", ".join(f"T={t} {ms:.2f}" for t, ms in verify.items()))
    extra = statistics.median(verify[t + 1] - verify[t] for t in range(1, 16))
    print(f"  verify: ms per extra position (median of T->T+1, T=1..15): {extra:.3f}; "
          f"T=1->4: {(verify[4] - verify[1]) / 3:.3f}/pos, T=4->16: "
          f"{(verify[16] - verify[4]) / 12:.3f}/pos")
    print(f"draft model one-token step: {step:.2f} ms")
    for name in ("head-mtp", "head-eagle3"):
        head = load_head(str(pair / name), target, pair / "target")
        cost = head_cost(head, a.context, (1, 2, 4, 8), a.repeats)
        print(f"{name}: " + "; ".join(f"R={r} forward {f:.2f} ms + fork {k:.2f} ms"
                                      for r, (f, k) in cost.items()))


if __name__ == "__main__":
    main()
