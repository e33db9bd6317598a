"""Why treespec's chain was slower than mlx-lm's: a ladder of prototypes.

Written when treespec's chain trailed mlx-lm's by ~5% (commit 2c8cb6f). What
the rungs found is now the shipped round (treespec/draft.py DeviceRound,
treespec/decode.py): the accepted tokens the draft missed go in with the root,
the verify is built on the lazy drafts and queued behind them, the greedy
readout is in the verify's graph. The rungs still measure the remaining cost
of each piece against the shipped loop.

    python scripts/bench_chain_overhead.py [--block 4] [--max-tokens 96] [--repeats 7]

Each rung removes one cost from treespec's chain round loop, so the gap to
mlx-lm's ``speculative_generate_step`` is attributed piece by piece:

  treespec      decode(mode="chain") as shipped (gate off; the probe runs once, before)
  lazy-draft    + a chain drafter that never leaves the graph: argmax of the draft
                logits (no logsumexp), mx.async_eval per step, one tolist() per round
                instead of an eval + logsumexp + .item() per node
  +trim-draft   + the drafter commits a chain by trimming its cache (no commit_path)
  +plain-adapt  + inside decode's own loop, the target verifies a chain with a plain forward
                (causal mask, as mlx-lm) instead of adapter.verify's tree mask and per-node
                RoPE, and commits by a trim (no commit_path gather)
  plain-verify  the same without decode's loop: a bare loop (no DraftTree, Stats, walk
                objects, no eval of the cache state after commit)
  one-sync      + drafting and verifying in ONE graph, one eval per round (what mlx-lm does:
                the verify input is mx.concatenate([root, lazy drafts]))
  mlx-lm        mlx_lm.generate.speculative_generate_step, num_draft_tokens = block - 1

Every rung is checked token for token against classic decoding first (a rung that
differs prints no figure). Runs are interleaved (round robin over rungs, per
repeat) and reported as medians: the CPU is shared and noisy. The prototypes live
here only; treespec/draft.py and treespec/decode.py are unchanged.
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import mlx.core as mx  # noqa: E402
from mlx_lm.generate import speculative_generate_step  # noqa: E402
from mlx_lm.models.cache import make_prompt_cache, trim_prompt_cache  # noqa: E402

from treespec.bench import PROMPTS  # noqa: E402
from treespec.cli import load_default_pair  # noqa: E402
from treespec.decode import _clip, _eos_set, classic, decode  # noqa: E402
from treespec.draft import ChainDrafter, DraftRound, cache_offset  # noqa: E402
from treespec.gate import decide  # noqa: E402
from treespec.tree import DraftTree  # noqa: E402


class LazyChainDrafter(ChainDrafter):
    """ChainDrafter with one host sync per round and no per-node logsumexp."""

    def draft(self, root, limit=None):
        n = self.block - 1 if limit is None else min(self.block - 1, limit)
        feed = self.pending + [root]
        self.pending = []
        self._round_offset = cache_offset(self.cache) + len(feed) - 1
        logits = self.model(mx.array(feed)[None], cache=self.cache)[0, -1]
        ys = []
        for i in range(n):
            y = mx.argmax(logits, axis=-1)
            mx.async_eval(y)
            ys.append(y)
            if i + 1 < n:  # the last draft is never fed (mlx-lm does the same)
                logits = self.model(y.reshape(1, 1), cache=self.cache)[0, -1]
        drafts = mx.stack(ys).tolist() if ys else []
        tokens = [root] + drafts
        tree = DraftTree.linear(tokens)
        fed_tree = DraftTree.linear(tokens[:max(1, n)])
        fed = [i if i < len(fed_tree) else -1 for i in range(len(tree))]
        return DraftRound(tree, fed, self._round_offset, fed_tree)


class TrimChainDrafter(LazyChainDrafter):
    """LazyChainDrafter whose commit trims the draft cache (a chain's accepted
    path is a prefix: nothing to gather) instead of ``commit_path``."""

    def commit(self, rnd, path):
        fed = len(rnd.fed_tree)
        keep = min(len(path), fed)
        trim_prompt_cache(self.cache, fed - keep)
        self.pending = [rnd.tree.tokens[n] for n in path[keep:]]


class PlainChainAdapter:
    """Stands in for treespec's adapter in decode: a linear tree is verified
    with a plain forward (its mask is the causal mask, contract 1; its
    positions offset + i are offset + depth) and committed by a trim."""

    def __init__(self, model, inner):
        self.model, self.inner = model, inner

    def verify(self, tree, cache, start=0, tokens=None):
        if tree.is_linear() and start == 0:
            tokens = mx.array(tree.tokens) if tokens is None else tokens
            return self.model(tokens[None], cache=cache)[0]
        return self.inner.verify(tree, cache, start, tokens=tokens)

    def commit(self, cache, tree, path, offset=None):
        if tree.is_linear():
            trim_prompt_cache(cache, len(tree) - len(path))
            return len(path)
        return self.inner.commit(cache, tree, path, offset)


def decode_with_plain_adapter(*args, **kwargs):
    import treespec.decode as D

    real = D.adapter_for
    D.adapter_for = lambda model: PlainChainAdapter(model, real(model))
    try:
        return decode(*args, **kwargs)
    finally:
        D.adapter_for = real


def plain_verify_decode(target, draft_model, prompt, max_tokens, block, eos_token_ids=None,
                        one_sync=False):
    """The chain round loop with plain forwards and trims (no tree machinery)."""
    eos, out = _eos_set(eos_token_ids), []
    tcache, dcache = make_prompt_cache(target), make_prompt_cache(draft_model)
    for model, cache in ((target, tcache), (draft_model, dcache)):
        if len(prompt) > 1:
            model(mx.array(prompt[:-1])[None], cache=cache)
            mx.eval([c.state for c in cache])
    root, pending = prompt[-1], []
    while len(out) < max_tokens:
        n = min(block - 1, max_tokens - len(out) - 1)
        logits = draft_model(mx.array(pending + [root])[None], cache=dcache)[0, -1]
        ys = []
        for i in range(n):
            y = mx.argmax(logits, axis=-1)
            if not one_sync:
                mx.async_eval(y)
            ys.append(y)
            if i + 1 < n:
                logits = draft_model(y.reshape(1, 1), cache=dcache)[0, -1]
        if one_sync:
            drafts_arr = mx.stack(ys).astype(mx.int32) if ys else mx.array([], mx.int32)
            inp = mx.concatenate([mx.array([root], mx.int32), drafts_arr])
            targets = mx.argmax(target(inp[None], cache=tcache)[0], axis=-1)
            mx.eval(targets, drafts_arr)
            drafts = drafts_arr.tolist()
        else:
            drafts = mx.stack(ys).tolist() if ys else []
            targets = mx.argmax(target(mx.array([root] + drafts)[None], cache=tcache)[0], axis=-1)
        targets = targets.tolist()
        k = 0
        while k < n and drafts[k] == targets[k]:
            k += 1
        emitted = drafts[:k] + [targets[k]]
        trim_prompt_cache(tcache, n - k)  # keep root + k accepted drafts
        fed = max(n - 1, 0) + 1  # root + the n-1 fed drafts
        keep = min(k + 1, fed)
        trim_prompt_cache(dcache, fed - keep)
        pending = drafts[fed - 1:k] if k + 1 > fed else []
        emitted_c, stop = _clip(emitted, max_tokens - len(out), eos)
        out += emitted_c
        if stop:
            break
        root = emitted[-1]
    return out


def mlx_lm_decode(target, draft_model, prompt, max_tokens, block, eos_token_ids=None):
    eos, out = _eos_set(eos_token_ids), []
    for tok, _, _ in speculative_generate_step(
            mx.array(prompt), target, draft_model, num_draft_tokens=block - 1,
            max_tokens=max_tokens, sampler=lambda lp: mx.argmax(lp, axis=-1)):
        out.append(int(tok))
        if out[-1] in eos:
            break
    return out


def parts(target, draft, prompt, block, n=200):
    """Per-phase costs of one chain round on fixed cache states, CPU and wall
    medians (microseconds): the draft phase (b-1 drafts, then a commit that
    keeps only the root), and the target's verify + walk + commit."""
    from treespec.verify import adapter_for
    from treespec.walk import tree_walk

    def measure(f):
        for _ in range(10):
            f()
        cpu, wall = [], []
        for _ in range(n):
            c0, t0 = time.process_time(), time.perf_counter()
            f()
            cpu.append(time.process_time() - c0)
            wall.append(time.perf_counter() - t0)
        return 1e6 * statistics.median(cpu), 1e6 * statistics.median(wall)

    out = {}
    root = prompt[-1]
    for name, drafter in (("draft: treespec ChainDrafter", ChainDrafter(block)),
                          ("draft: lazy (prototype)", LazyChainDrafter(block))):
        drafter.start(draft, prompt[:-1])

        def f(d=drafter):
            rnd = d.draft(root)
            d.commit(rnd, [0])
        out[name] = measure(f)

    adapter = adapter_for(target)
    cache = make_prompt_cache(target)
    target(mx.array(prompt[:-1])[None], cache=cache)
    mx.eval([c.state for c in cache])
    tokens = [root] + [5] * (block - 1)
    tree = DraftTree.linear(tokens)

    def tree_round():
        off = cache_offset(cache)
        logits = adapter.verify(tree, cache)
        t = mx.argmax(logits, axis=-1)
        mx.eval(t)
        walk = tree_walk(tree, t.tolist())
        adapter.commit(cache, tree, walk.path[:1], off)
        mx.eval([c.state for c in cache])
        trim_prompt_cache(cache, 1)

    def tree_verify_only():
        logits = adapter.verify(tree, cache)
        t = mx.argmax(logits, axis=-1)
        mx.eval(t)
        t.tolist()
        adapter._last = None
        trim_prompt_cache(cache, block)

    def plain_round():
        t = mx.argmax(target(mx.array(tokens)[None], cache=cache)[0], axis=-1)
        t.tolist()
        trim_prompt_cache(cache, block)

    out["verify+walk+commit: treespec adapter"] = measure(tree_round)
    out["verify only: treespec adapter"] = measure(tree_verify_only)
    out["verify+trim: plain forward (mlx-lm)"] = measure(plain_round)
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--block", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--prompts", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--zoo", metavar="FAMILY",
                    help="a tiny zoo target and its drafter instead of the trained pair: "
                         "forwards so cheap that the round loop's host cost shows")
    ap.add_argument("--parts", action="store_true",
                    help="only the per-phase microbenchmark (CPU and wall medians)")
    args = ap.parse_args(argv)

    if args.zoo:
        from treespec import zoo

        target, draft, eos = zoo.build(args.zoo), zoo.drafter(args.zoo, noise=0.02), []
        prompts = [[(7 * i + j) % 50 + 1 for j in range(12)] for i in range(args.prompts)]
    else:
        target, draft, tok = load_default_pair()
        eos = list(tok.eos_token_ids)
        prompts = [tok.encode(p) for p in PROMPTS[: args.prompts]]
    b, m = args.block, args.max_tokens
    if args.parts:
        res = parts(target, draft, prompts[0], b)
        print(f"one chain round, block {b}, median of 200 (us): CPU, wall")
        for k, (c, w) in res.items():
            print(f"  {k:<40} {c:>9.0f} {w:>9.0f}")
        return
    rungs = {
        "classic": lambda p: classic(target, p, m, eos).tokens,
        "treespec": lambda p: decode(target, p, "chain", draft, m, eos, block=b, gate=False).tokens,
        "lazy-draft": lambda p: decode(target, p, "chain", draft, m, eos, gate=False,
                                       drafter=LazyChainDrafter(b)).tokens,
        "+trim-draft": lambda p: decode(target, p, "chain", draft, m, eos, gate=False,
                                        drafter=TrimChainDrafter(b)).tokens,
        "+plain-adapt": lambda p: decode_with_plain_adapter(
            target, p, "chain", draft, m, eos, gate=False, drafter=TrimChainDrafter(b)).tokens,
        "plain-verify": lambda p: plain_verify_decode(target, draft, p, m, b, eos),
        "one-sync": lambda p: plain_verify_decode(target, draft, p, m, b, eos, one_sync=True),
        "mlx-lm": lambda p: mlx_lm_decode(target, draft, p, m, b, eos),
    }
    print(f"probe: {decide(target, ChainDrafter(b).probe_shapes()).reason}")
    ref = [rungs["classic"](p) for p in prompts]
    ok = {}
    for name, f in rungs.items():
        got = [f(p) for p in prompts]
        ok[name] = got == ref
        if not ok[name]:
            print(f"{name}: tokens differ from classic; no figure")
    times = {name: [] for name in rungs if ok[name]}
    cpu = {name: [] for name in rungs if ok[name]}
    ntok = sum(len(r) for r in ref)
    for r in range(args.repeats):
        names = list(times)
        names = names[r % len(names):] + names[: r % len(names)]
        for name in names:
            t0, c0 = time.perf_counter(), time.process_time()
            for p in prompts:
                rungs[name](p)
            times[name].append(ntok / (time.perf_counter() - t0))
            cpu[name].append(1e3 * (time.process_time() - c0) / ntok)
    base = statistics.median(times["treespec"]) if "treespec" in times else None
    print(f"chain block {b}, {len(prompts)} prompts x {m} tokens, median of {args.repeats} "
          f"interleaved repeats (exact: text vs classic)")
    cbase = statistics.median(cpu["treespec"]) if "treespec" in cpu else None
    print(f"{'rung':<14} {'tok/s':>8} {'min':>7} {'max':>7} {'x treespec':>10} "
          f"{'cpu ms/tok':>10} {'x treespec':>10}")
    for name, ts in times.items():
        med, cm = statistics.median(ts), statistics.median(cpu[name])
        rel = f"{med / base:.2f}" if base else "-"
        crel = f"{cbase / cm:.2f}" if cbase else "-"
        print(f"{name:<14} {med:>8.1f} {min(ts):>7.1f} {max(ts):>7.1f} {rel:>10} "
              f"{cm:>10.2f} {crel:>10}")


if __name__ == "__main__":
    main()
