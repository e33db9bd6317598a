"""The program every rank runs under ``mlx.launch`` for suites/distributed:
``python helpers_worker.py SPEC.json OUT_DIR``. It builds a zoo model, shards it
with mlx-lm's own code (treespec.distributed.shard), and writes what the tests
compare to OUT_DIR/rank<r>.json: the tree verify's logits beside one-token steps
of the same sharded model, the next steps after a commit beside a cache that
only ever saw the accepted path, and the texts of classic, chain and tree
decoding (rank check on). It compares nothing itself: the tests do.

SPEC: family, dtype, how ("tensor" | "pipeline" | "none"), checks (subset of
verify, rollback, text, unsharded, drained), memo ({rank: dir}: each rank's gate memo),
max_tokens, modes (of chain, fixed, confidence), prompts (how many), plain_gate
(decode with the library's default gate name, as a run that did not say it is
sharded: what stores a verdict in the memo), repeats and pause_s (of drained).
The memo dirs are set before treespec is imported.
"""

import json
import os
import sys
import time
from pathlib import Path

SPEC = json.loads(Path(sys.argv[1]).read_text())
RANK = os.environ.get("MLX_RANK", "0")
if SPEC.get("memo"):
    os.environ["TREESPEC_CACHE_DIR"] = SPEC["memo"][RANK]

import mlx.core as mx  # noqa: E402
import numpy as np  # noqa: E402
from mlx_lm.generate import generate_step  # noqa: E402
from mlx_lm.models.cache import QuantizedKVCache, make_prompt_cache  # noqa: E402

from treespec import DraftTree, zoo  # noqa: E402
from treespec.decoding import decode  # noqa: E402
from treespec.distributed import group as dist, shard  # noqa: E402
from treespec.models import prefill  # noqa: E402
from treespec.verify import adapter_for  # noqa: E402

PROMPTS = ("def fibonacci(n):\n    ", "import os\nimport sys\n")
# A branching tree of 7 nodes (three depths, siblings at two of them).
PARENTS = (-1, 0, 0, 1, 1, 2, 3)


def model():
    target = zoo.build(SPEC["family"], SPEC.get("dtype", "float32"))
    if SPEC["how"] != "none":
        shard.shard(target, mx.distributed.init(), SPEC["how"])
    return target


def step(target, cache, tokens):
    """One-token forwards, the last logits as float32 lists."""
    out = None
    for t in tokens:
        out = target(mx.array([[t]]), cache=cache)[0, -1]
    mx.eval(out)
    return np.array(out.astype(mx.float32)).tolist()


def cache_for(target, mode):
    if mode == "quantized":  # mlx-lm's QuantizedKVCache, group 32 (the zoo's head_dim allows it)
        return [QuantizedKVCache(group_size=32, bits=8) for _ in target.layers]
    return make_prompt_cache(target, max_kv_size=8 if mode == "rotating" else None)


def verify_and_steps(target, prompt, tree_tokens):
    """Each node's verify logits, and one-token steps over its root path."""
    tree = DraftTree(list(tree_tokens), list(PARENTS))
    cache = make_prompt_cache(target)
    prefill(target, cache, prompt[:-1])
    got = adapter_for(target).verify_handle(tree, cache).logits.astype(mx.float32)
    mx.eval(got)
    out = []
    for i in range(len(PARENTS)):
        ref = make_prompt_cache(target)
        prefill(target, ref, prompt[:-1])
        path = tree.path_to(i)
        out.append({"verify": np.array(got[i]).tolist(),
                    "steps": step(target, ref, [tree_tokens[j] for j in path])})
    return out


def rollback(target, prompt, tree_tokens, mode):
    """After committing the deepest path, three more one-token steps; beside
    them, the same steps on a cache that only ever saw that path."""
    tree = DraftTree(list(tree_tokens), list(PARENTS))
    path = list(tree.path_to(len(PARENTS) - 1))
    more = [5, 9, 11]
    cache = cache_for(target, mode)
    prefill(target, cache, prompt[:-1])
    adapter = adapter_for(target)
    verified = adapter.verify_handle(tree, cache)
    # As the round loop does (its walk reads them): the verify's logits evaluated
    # before the commit. Under pipeline sharding they hold the verify's last
    # collectives; a commit of an unevaluated verify hangs both ranks
    # (docs/distributed.md#pipeline-a-verify-is-evaluated-before-its-commit).
    mx.eval(verified.logits)
    adapter.commit(cache, tree, path, verified=verified)
    got = [step(target, cache, [t]) for t in more]
    ref_cache = cache_for(target, mode)
    prefill(target, ref_cache, prompt[:-1])
    step(target, ref_cache, [tree_tokens[j] for j in path])
    ref = [step(target, ref_cache, [t]) for t in more]
    return {"got": got, "ref": ref}


def rollbacks(target, prompt, tree_tokens, modes):
    """:func:`rollback` in each cache mode; a mode whose forwards need a kernel
    MLX lacks on this backend reports MLX's error instead, so that the other
    modes and checks still run (the test accepts it only where MLX's
    primitive alone raises it too: suites.backend.gap_reason). Both ranks
    raise it at the same product, before the forward's first collective:
    the first layer's attention over the quantized cache (seen on CUDA:
    ``quantized_matmul`` 8-bit group 32, results/distributed/README.md)."""
    out = {}
    for mode in modes:
        try:
            out[mode] = rollback(target, prompt, tree_tokens, mode)
        except RuntimeError as e:
            if "No implementation" not in str(e):
                raise
            out[mode] = {"error": str(e).splitlines()[0]}
    return out


def texts(target, draft, prompt, check):
    n = SPEC.get("max_tokens", 24)
    kw = dist.decode_kwargs(check) if SPEC["how"] != "none" else {}
    if SPEC.get("plain_gate"):
        kw.pop("adapter_name", None)
    out = {"classic": decode(target, prompt, mode="classic", max_tokens=n).tokens}
    for name, extra in (("chain", {"mode": "chain"}),
                        ("fixed", {"mode": "tree", "branching": [2, 2, 1]}),
                        ("confidence", {"mode": "tree", "budget": 6})):
        if name not in SPEC.get("modes", (name,)):
            continue
        r = decode(target, prompt, draft_model=draft, max_tokens=n, **extra, **kw)
        if check is not None:
            check.final(r.tokens)
        out[name] = {"tokens": r.tokens, "gate": r.stats.summary()["gate"]["reason"],
                     "rounds": r.stats.rounds}
    return out


def drained(target, draft, prompt):
    """What runs first after a forward left running on mlx-lm's generation
    stream, ``repeats`` times in turn: after treespec's classic decoding
    (stopped at max_tokens, then at an EOS) one all-sum of a marker (rank r
    sends r + 1); after mlx-lm's own ``generate_step`` (which returns with its
    look-ahead forward in flight) treespec's chain decoding, then the marker.
    Rank 1 waits ``pause_s`` first, so that a forward left running on rank 0
    would meet rank 1's next collective. Per repeat: what ran before, the
    marker's sums, mlx-lm's tokens and the chain's tokens and gate reason (or
    None)."""
    g = mx.distributed.init()
    first = decode(target, prompt, mode="classic", max_tokens=2).tokens[0]
    out = []
    for i in range(SPEC.get("repeats", 9)):
        before, chain, classic = ("max_tokens", "eos", "mlx-lm")[i % 3], None, None
        if before == "mlx-lm":
            classic = [int(t) for t, _ in generate_step(mx.array(prompt), target, max_tokens=8)]
        else:
            decode(target, prompt, mode="classic", max_tokens=8,
                   eos_token_ids=[first] if before == "eos" else None)
        if g.rank() == 1:
            time.sleep(SPEC.get("pause_s", 0.05))
        if before == "mlx-lm":
            r = decode(target, prompt, mode="chain", draft_model=draft, max_tokens=8,
                       **dist.decode_kwargs(None))
            chain = {"tokens": r.tokens, "gate": r.stats.summary()["gate"]["reason"]}
        marker = mx.full((1, 1, target.args.hidden_size), float(g.rank() + 1))
        out.append({"before": before, "chain": chain, "classic": classic,
                    "sums": np.array(mx.distributed.all_sum(marker, group=g)).ravel().tolist()})
    return out


def main():
    target = model()
    tok = zoo.tokenizer()
    prompts = [tok.encode(p) for p in PROMPTS]
    rng = np.random.RandomState(0)
    tree_tokens = [prompts[0][-1]] + rng.randint(3, 200, size=len(PARENTS) - 1).tolist()
    report = {"rank": int(RANK), "spec": SPEC}
    checks = SPEC["checks"]
    if "verify" in checks:
        report["verify"] = verify_and_steps(target, prompts[0], tree_tokens)
    if "rollback" in checks:
        report["rollback"] = rollbacks(target, prompts[0], tree_tokens,
                                       SPEC.get("cache_modes", ["plain"]))
    if "text" in checks:
        check = dist.RankCheck(mx.distributed.init()) if SPEC["how"] != "none" else None
        draft = zoo.drafter(SPEC["family"], SPEC.get("dtype", "float32"))
        report["text"] = [texts(target, draft, p, check)
                          for p in prompts[:SPEC.get("prompts", len(prompts))]]
    if "drained" in checks:
        report["drained"] = drained(target, zoo.drafter(SPEC["family"], SPEC.get("dtype", "float32")),
                                    prompts[0])
    if "unsharded" in checks:  # the same logits unsharded, for the measured difference
        whole = zoo.build(SPEC["family"], SPEC.get("dtype", "float32"))
        a = make_prompt_cache(target)
        b = make_prompt_cache(whole)
        report["unsharded"] = {"sharded": step(target, a, prompts[0]),
                               "whole": step(whole, b, prompts[0])}
    Path(sys.argv[2], f"rank{RANK}.json").write_text(json.dumps(report))


if __name__ == "__main__":
    main()
