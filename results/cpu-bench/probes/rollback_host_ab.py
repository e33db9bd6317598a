"""One question, asked once (issue 41's rollback restructuring): what did one
class per cache mode (a CommitPlan planned and applied per cache) and the
verify handle's checks cost a chain round's host work, against the
whole-list trim it replaced?

Run from the repository root with two checkouts of treespec (e.g. `git
worktree add /tmp/old 26bde29`); each measurement is a fresh process, the two
checkouts alternated:

    python results/cpu-bench/probes/rollback_host_ab.py --old /tmp/old --new . --alternations 3

Child measurements (public calls only): a 64x32 random llama (vocabulary
256) with 64 tokens of history; a chain of 4 verified (`adapter.verify`, the
graph built, not evaluated) and its first 3 nodes committed (`adapter.commit`,
a trim); then `rollback.commit_path` alone over 32 plain KVCaches. Medians
of 380 rounds and 5000 commits, in microseconds."""

import argparse
import os
import statistics
import subprocess
import sys
import timeit

CHILD = r'''
import statistics, time, timeit
import mlx.core as mx
from mlx_lm.models import llama
from mlx_lm.models.cache import KVCache, make_prompt_cache
from treespec import DraftTree
from treespec.rollback import commit_path, snapshot
from treespec.verify import adapter_for

args = llama.ModelArgs(model_type="llama", hidden_size=64, num_hidden_layers=32,
                       intermediate_size=128, num_attention_heads=4, num_key_value_heads=2,
                       rms_norm_eps=1e-5, vocab_size=256, tie_word_embeddings=False)
mx.random.seed(0)
model = llama.Model(args)
mx.eval(model.parameters())
cache = make_prompt_cache(model)
model(mx.arange(64)[None], cache=cache)
mx.eval([c.state for c in cache])
adapter = adapter_for(model)
chain = DraftTree.linear([1, 2, 3, 4])
verify, commit = [], []
for i in range(400):
    t0 = time.perf_counter(); logits = adapter.verify(chain, cache); t1 = time.perf_counter()
    mx.eval(logits)
    t2 = time.perf_counter(); adapter.commit(cache, chain, [0, 1, 2]); t3 = time.perf_counter()
    mx.eval([c.state for c in cache])
    for c in cache:
        c.offset -= 3  # back to 64 tokens: rows past offset are never read
    if i >= 20:
        verify.append((t1 - t0) * 1e6); commit.append((t3 - t2) * 1e6)

kv = [KVCache() for _ in range(32)]
for c in kv:
    c.update_and_fetch(mx.zeros((1, 2, 68, 8)), mx.zeros((1, 2, 68, 8)))
    c.offset = 64
snap = snapshot(kv)
def one():
    for c in kv:
        c.offset = 68
    commit_path(kv, 64, [0, 1, 2], chain, snapshot=snap)
n = 5000
alone = timeit.timeit(one, number=n) / n * 1e6
print(f"{statistics.median(verify):.1f} {statistics.median(commit):.1f} {alone:.1f}")
'''


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--old", required=True, help="checkout of the baseline")
    ap.add_argument("--new", required=True, help="checkout measured against it")
    ap.add_argument("--alternations", type=int, default=3)
    args = ap.parse_args()
    print("command: python " + " ".join(sys.argv))
    out = {"old": [], "new": []}
    for _ in range(args.alternations):
        for side in ("old", "new"):
            # Run inside the checkout: `python -c` puts the working directory first on
            # sys.path, ahead of PYTHONPATH, so from any other checkout it would import that one.
            root = os.path.abspath(getattr(args, side))
            env = dict(os.environ, PYTHONPATH=root)
            run = subprocess.run([sys.executable, "-c", CHILD + "\nimport treespec; "
                                  "assert treespec.__file__.startswith(" + repr(root) + ")"],
                                 env=env, cwd=root, capture_output=True, text=True, check=True)
            figures = [float(x) for x in run.stdout.split()]
            out[side].append(figures)
            print(f"{side}: verify build {figures[0]:.1f} us, adapter.commit {figures[1]:.1f} us, "
                  f"commit_path over 32 KVCaches {figures[2]:.1f} us", flush=True)
    for i, what in enumerate(("verify build", "adapter.commit", "commit_path x32")):
        old = statistics.median(f[i] for f in out["old"])
        new = statistics.median(f[i] for f in out["new"])
        print(f"{what}: old {old:.1f} us, new {new:.1f} us, new/old {new / old:.2f}, "
              f"difference {new - old:+.1f} us")


if __name__ == "__main__":
    main()
