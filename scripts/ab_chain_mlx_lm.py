"""treespec's chain against mlx-lm's speculative decoding, the two alone.

    python scripts/ab_chain_mlx_lm.py --block 4 [--repeats 15] [--max-tokens 96]

The trained pair, two Python prompts; each repeat times treespec's chain
(decode mode "chain", gate off: the probe is not the round loop) and
mlx-lm's speculative_generate_step back to back (the order alternates per
repeat), and the medians of wall and process CPU time are printed. Both texts
are checked against classic first.
"""

import argparse
import statistics
import sys
import time


from treespec.bench import PROMPTS, mlx_lm_run
from treespec.checkpoints import load_default_pair
from treespec.decode import decode


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--block", type=int, default=4)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--max-tokens", type=int, default=96)
    args = ap.parse_args()
    target, draft, tok = load_default_pair()
    prompts = [tok.encode(p) for p in PROMPTS[:2]]
    n, b = args.max_tokens, args.block

    def ours():
        return [decode(target, p, mode="chain", draft_model=draft, max_tokens=n, block=b,
                       gate=False).tokens for p in prompts]

    def theirs():
        return [mlx_lm_run(target, draft, p, n, None, b).tokens for p in prompts]

    ref = [decode(target, p, max_tokens=n).tokens for p in prompts]
    for name, f in (("treespec", ours), ("mlx-lm", theirs)):
        if f() != ref:
            sys.exit(f"{name}'s text differs from classic: no figure")
    times = {"treespec": [], "mlx-lm": []}
    for r in range(args.repeats):
        pair = (("treespec", ours), ("mlx-lm", theirs))
        for name, f in pair[::-1] if r % 2 else pair:  # neither always runs second
            c0, t0 = time.process_time(), time.perf_counter()
            f()
            times[name].append((time.perf_counter() - t0, time.process_time() - c0))
    med = {k: [statistics.median(x[i] for x in v) for i in (0, 1)] for k, v in times.items()}
    for k, (wall, cpu) in med.items():
        print(f"{k:9} wall {wall * 1e3:7.1f} ms  cpu {cpu * 1e3:7.1f} ms")
    print(f"block {b}: treespec speed / mlx-lm speed = {med['mlx-lm'][0] / med['treespec'][0]:.3f} "
          f"(wall), {med['mlx-lm'][1] / med['treespec'][1]:.3f} (cpu)")


if __name__ == "__main__":
    main()
