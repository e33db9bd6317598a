"""Issue 45 repro, chain only: classic vs chain on two prompts in the given order.
RANK1_CACHE: if set, rank 1 keeps its gate memo there (rank 0: TREESPEC_CACHE_DIR)."""
import json, os, sys
if os.environ.get("RANK1_CACHE") and os.environ.get("MLX_RANK") == "1":
    os.environ["TREESPEC_CACHE_DIR"] = os.environ["RANK1_CACHE"]
import mlx.core as mx
from treespec import zoo
from treespec.decoding import decode
g = mx.distributed.init(strict=True)
order = sys.argv[1]
target = zoo.build("llama"); target.shard(g); mx.eval(target.parameters())
draft = zoo.drafter("llama")
tok = zoo.tokenizer()
P = {"a": tok.encode("def fibonacci(n):\n    "), "b": tok.encode("import os\nimport sys\n")}
out = {"rank": g.rank(), "order": order, "diff": [], "src": []}
for name in order:
    p = P[name]
    ref = decode(target, p, mode="classic", max_tokens=40).tokens
    got = decode(target, p, mode="chain", draft_model=draft, max_tokens=40)
    out["src"].append(got.stats.summary()["gate"]["probe_source"])
    if got.tokens != ref:
        out["diff"].append(name)
print(json.dumps(out), flush=True)
