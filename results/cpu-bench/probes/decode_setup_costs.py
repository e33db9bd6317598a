# Archived one-question probe (issue 41): scripts/decode_setup_costs.py as it stood at 7dc635f,
# beside the record(s) it produced; not run or tested since (its imports may have moved).
# Record(s):
#   results/cpu-bench/a215c45/decode-setup-64x32.txt, decode-setup-64x32-48-tokens.txt
#     (recorded in ed5e197)
#   results/cpu-bench/7340ad4/decode-setup-64x32.txt (134a261 against 7340ad4, recorded in e4fa5ed)
# Its first half (the logits width read every call against once per model) removes a private
# attribute (treespec.models._VOCAB) from the models: a one-question probe, answered there. Its
# second half, what a decode call builds before its rounds, is
# `python -m benchmarks.host_cost --sections setup`.
# The version that produced a record: git show <recording commit>:scripts/decode_setup_costs.py

"""What a decode call costs around its rounds: the logits width read off a
forward's graph on every call, against once per model object.

    python scripts/decode_setup_costs.py [--dims 64x32] [--tokens 2] [--repeats 15]

A seeded random llama (``treespec.auto.costcurve.build_llama``, vocabulary 256)
of HIDDENxLAYERS as the target and its 2-layer twin as the drafter, so that
a forward's host work dominates; ``treespec.decoding`` in chain mode, block 3,
``--tokens`` tokens, gate off. Two variants interleaved per repeat (5 calls
each, median): "fresh", the width kept on the models removed before every
call (what every decode paid before it was kept), and "kept". Prints both
medians and the median of per-repeat differences; then what building the
adapters of a call costs (``adapter_for`` of each model, ``structure`` of the
target) and the call's exactness gate once its probe is memoized
(``treespec.evidence.gate.decide``, as every call after the first pays it), medians
of 60 calls.
"""

import argparse
import statistics
import time

from treespec.auto.costcurve import build_llama
from treespec.decoding import decode
from treespec.draft import make_drafter
from treespec.cli.flags import parse_dims
from treespec.evidence.gate import decide
from treespec.models import _VOCAB
from treespec.verify import adapter_for
from treespec.verify.structure import structure


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--dims", type=parse_dims, default=(64, 32), help="HIDDENxLAYERS of the target")
    ap.add_argument("--tokens", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=15)
    args = ap.parse_args()
    hidden, layers = args.dims
    target = build_llama(hidden, layers, vocab=256, dtype="bfloat16")
    draft = build_llama(hidden, 2, vocab=256, dtype="bfloat16")
    prompt = list(range(20))

    def one(kept):
        if not kept:
            for m in (target, draft):
                m.__dict__.pop(_VOCAB, None)
        t0 = time.perf_counter()
        decode(target, prompt, mode="chain", draft_model=draft, max_tokens=args.tokens,
               block=3, gate=False)
        return 1e3 * (time.perf_counter() - t0)

    for _ in range(5):
        one(True), one(False)
    fresh, kept = [], []
    for r in range(args.repeats):
        for variant in ((False, True) if r % 2 == 0 else (True, False)):
            (kept if variant else fresh).append(statistics.median(one(variant) for _ in range(5)))
    diff = statistics.median(a - b for a, b in zip(fresh, kept))
    print(f"target llama {hidden}x{layers}, drafter {hidden}x2, chain b=3, {args.tokens} tokens, "
          f"{args.repeats} interleaved repeats x 5 calls:\n"
          f"  width read every call {statistics.median(fresh):8.2f} ms\n"
          f"  width kept per model  {statistics.median(kept):8.2f} ms\n"
          f"  difference (median of per-repeat differences) {diff:.2f} ms a decode call")
    # The two adapters every decode call builds (the target's costs most),
    # and its gate with the probe memoized (every call after the first).
    shapes = make_drafter("chain", block=3).probe_shapes(args.tokens)
    for name, step in (("adapter_for(target)", lambda: adapter_for(target)),
                       ("structure(target)", lambda: structure(target)),
                       ("adapter_for(drafter)", lambda: adapter_for(draft)),
                       ("gate, probe memoized", lambda: decide(target, shapes,
                                                               allow_inexact=True))):
        times = []
        for _ in range(60):
            t0 = time.perf_counter()
            step()
            times.append(1e3 * (time.perf_counter() - t0))
        print(f"  {name:22} {statistics.median(times):6.2f} ms (median of 60 calls)")


if __name__ == "__main__":
    main()
