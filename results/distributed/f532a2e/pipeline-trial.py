"""Pipeline trial: zoo FAMILY split with mlx-lm's pipeline(group) over the ranks."""
import faulthandler, os, sys, time
RANK = os.environ.get("MLX_RANK", "0")
FAMILY = sys.argv[1]
log = open(f"/tmp/pipe/{FAMILY}-rank{RANK}.log", "w")
faulthandler.dump_traceback_later(30, repeat=True, file=log)
T0 = time.time()
def say(*a):
    print(f"[{time.time()-T0:6.1f}s r{RANK}]", *a, file=log, flush=True)
import mlx.core as mx
from mlx_lm.generate import generate_step
from mlx_lm.models.cache import make_prompt_cache
from treespec import zoo
from treespec.decoding import decode
from treespec.distributed import group as dist
group = mx.distributed.init()
say("group", group.rank(), group.size())
m = zoo.build(FAMILY)
inner = m.language_model.model if hasattr(m, "language_model") else m.model
inner.pipeline(group)
mx.eval(m.parameters())
say("pipelined", inner.start_idx, inner.end_idx, "local layers", len(m.layers))
mx.eval(mx.distributed.all_sum(mx.array(1.0), stream=mx.cpu))
say("barrier ok")
tok = zoo.tokenizer()
prompt = tok.encode("def fibonacci(n):\n    ")
c = make_prompt_cache(m)
out = m(mx.array(prompt)[None], cache=c)
mx.eval(out)
say("one forward ok", out.shape, float(out[0, -1].max()))
toks = []
for (t, _), _ in zip(generate_step(mx.array(prompt), m, max_tokens=8), range(8)):
    toks.append(int(t))
say("mlx-lm generate_step", toks)
r = decode(m, prompt, mode="classic", max_tokens=12)
say("treespec classic", r.tokens)
check = dist.RankCheck(group)
draft = zoo.drafter(FAMILY)
for name, kw in (("chain", {"mode": "chain"}), ("tree", {"mode": "tree", "branching": [2, 2, 1]})):
    say("start", name)
    r2 = decode(m, prompt, draft_model=draft, max_tokens=12, **kw, **dist.decode_kwargs(check))
    check.final(r2.tokens)
    say(name, r2.tokens, "same as classic:", r2.tokens == r.tokens, "gate", r2.stats.summary()["gate"]["reason"][:100])
say("done")
faulthandler.cancel_dump_traceback_later()
