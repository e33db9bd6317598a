"""Does interleaving configurations slow them down? The scaled pair, four
configurations (classic, chain b=5, fixed [2,1,1,1], mlx-lm b=5), 64
tokens: once round-robin over two prompts, once back-to-back on one, after
one untimed pass of each. Prints the median ms per token of each.

    python scripts/interleave_probe.py [--dims 2048x16] [--alpha 0.02]

Written for the H200, where ``treespec bench`` timed speculative rows 2-10x
slower than these loops do (README, "On the H200").
"""

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from treespec import scaled  # noqa: E402
from treespec.bench import _mlx_lm_run  # noqa: E402
from treespec.costcurve import parse_dims  # noqa: E402
from treespec.decode import decode  # noqa: E402

CONFIGS = [("classic", dict(mode="classic")), ("chain b=5", dict(mode="chain", block=5)),
           ("fixed [2,1,1,1]", dict(mode="tree", branching=[2, 1, 1, 1])), ("mlx-lm b=5", None)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dims", type=parse_dims, default=(2048, 16))
    ap.add_argument("--alpha", type=float, default=0.02)
    ap.add_argument("--max-tokens", type=int, default=64)
    ap.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    target, draft = scaled.build_pair(*args.dims, 2, args.alpha)
    prompts, mt = scaled.default_prompts(2), args.max_tokens

    def ms_per_token(kw, prompt):
        t0 = time.perf_counter()
        if kw is None:
            _mlx_lm_run(target, draft, prompt, mt, None, 5)
        else:
            decode(target, prompt, draft_model=None if kw["mode"] == "classic" else draft,
                   max_tokens=mt, gate=False, **kw)
        return 1e3 * (time.perf_counter() - t0) / mt

    for _, kw in CONFIGS:
        for p in prompts:
            ms_per_token(kw, p)
    got = {name: [] for name, _ in CONFIGS}
    for _ in range(args.repeats):
        for name, kw in CONFIGS:
            got[name] += [ms_per_token(kw, p) for p in prompts]
    print("interleaved, ms/token:", {n: round(statistics.median(v), 2) for n, v in got.items()})
    got = {name: [ms_per_token(kw, prompts[0]) for _ in range(args.repeats)]
           for name, kw in CONFIGS}
    print("back-to-back, ms/token:", {n: round(statistics.median(v), 2) for n, v in got.items()})


if __name__ == "__main__":
    main()
