"""The host work treespec's chain adds to mlx-lm's: per round, and per decode call.

    python -m benchmarks.host_cost --dims 64x32 --repeats 300
    python -m benchmarks.host_cost --pair default --sections calls --block 3
    python -m benchmarks.host_cost --pair zoo --sections round,calls --block 2

On the thin pair by default (a random llama of ``--dims`` with a 256-token
vocabulary and a 2-layer drafter: a forward's host work dominates, with as
many layers as the H200's 4096x32 and little arithmetic). ``--sections``
(default round,setup,calls):

- ``round``: treespec's chain verify of ``--block`` nodes (``TreeAdapter.verify``,
  graph building only) and its commit of all but one (``TreeAdapter.commit``),
  against what mlx-lm's round does for the same: a plain forward over the
  tokens and ``trim_prompt_cache``; both evaluated untimed between, the caches
  holding 64 tokens; the two rounds alternating, ``--repeats`` of each;
  medians and their differences: the per-round host work treespec adds on
  the round's critical path where the host builds the graph slower than the
  device runs it.
- ``setup``: what every decode call builds before its rounds, interleaved:
  ``adapter_for`` of the target and of the drafter, ``structure`` of the
  target, and the exactness gate with its probe memoized
  (``treespec.evidence.gate.decide``, as every call after the first pays it).
- ``calls``: Python function calls per round outside the models' own modules
  (cProfile), treespec's chain and mlx-lm's speculative decoding, ``--long``
  tokens at ``--block``.

The instructions a round executes (valgrind's callgrind, load-independent)
were counted by scripts/round_overhead.py, archived beside its records in
results/cpu-bench/probes/: under valgrind, mlx-lm's import asks for more open
files than the child may have once its parent imported mlx-lm, which that
script got round by replacing ``resource.setrlimit`` in the child.
"""

import cProfile
import pstats
import statistics
import time

import mlx.core as mx
from mlx_lm.models.cache import make_prompt_cache, trim_prompt_cache

from benchmarks import harness
from treespec.bench.measure import mlx_lm_run
from treespec.decoding import decode
from treespec.draft import make_drafter
from treespec.evidence.gate import decide
from treespec.tree import DraftTree
from treespec.verify import adapter_for
from treespec.verify.structure import structure

SECTIONS = ("round", "setup", "calls")


def decode_once(which, pair, prompt, n, block) -> int:
    """Decode ``n`` tokens with ``which``; the number of rounds."""
    if which == "treespec":
        return decode(pair.target, prompt, draft_model=pair.draft, max_tokens=n, gate=False,
                      mode="chain", block=block).stats.rounds
    return mlx_lm_run(pair.target, pair.draft, prompt, n, None, block).stats["rounds"]


def round_section(args, target, say):
    adapter = adapter_for(target)
    cache = make_prompt_cache(target)
    mx.eval(target(mx.arange(64)[None], cache=cache), [c.state for c in cache])
    b = args.block
    chain = DraftTree(list(range(b)), list(range(-1, b - 1)))
    tokens = mx.array(list(range(1, b + 1)), dtype=mx.uint32)

    def treespec_round():
        t0 = time.perf_counter()
        out = adapter.verify(chain, cache, tokens=tokens)
        t1 = time.perf_counter()
        mx.eval(out)
        t2 = time.perf_counter()
        adapter.commit(cache, chain, list(range(b - 1)))
        t3 = time.perf_counter()
        trim_prompt_cache(cache, b - 1)  # back to 64
        return t1 - t0, t3 - t2

    def mlx_lm_round():
        t0 = time.perf_counter()
        out = target(tokens[None], cache=cache)
        t1 = time.perf_counter()
        mx.eval(out)
        t2 = time.perf_counter()
        trim_prompt_cache(cache, 1)
        t3 = time.perf_counter()
        trim_prompt_cache(cache, b - 1)
        return t1 - t0, t3 - t2

    rounds = {"treespec": treespec_round, "mlx-lm": mlx_lm_round}
    for f in rounds.values():
        f()
    times = {k: [] for k in rounds}
    for order in harness.rotated(list(rounds), args.repeats):
        for name in order:
            times[name].append(rounds[name]())
    med = {k: [statistics.median(x[i] for x in v) * 1e3 for i in (0, 1)]
           for k, v in times.items()}
    say(f"\nround: a chain of {b}, caches of 64 tokens, {args.repeats} alternating repeats "
        "(medians)")
    for k, (build, commit) in med.items():
        what = "commit" if k == "treespec" else "trim"
        say(f"  {k:9} verify graph building {build:.3f} ms  {what} {commit:.3f} ms")
    say(f"  treespec adds {med['treespec'][0] - med['mlx-lm'][0]:.3f} ms of graph building and "
        f"{med['treespec'][1] - med['mlx-lm'][1]:.3f} ms of commit a round")


def setup_section(args, pair, say):
    target, draft = pair.target, pair.draft
    shapes = make_drafter("chain", block=args.block).probe_shapes(2)
    decide(target, shapes, allow_inexact=True)  # the probe, memoized from here on
    calls = {"adapter_for(target)": lambda: adapter_for(target),
             "structure(target)": lambda: structure(target),
             "adapter_for(drafter)": lambda: adapter_for(draft),
             "gate, probe memoized": lambda: decide(target, shapes, allow_inexact=True)}
    # timed whole: a step that returns a number is read as the seconds it timed itself
    items = {name: (lambda f=f: f() and None) for name, f in calls.items()}
    times = harness.interleaved(items, args.repeats, args.calls)
    say(f"\nsetup: what a decode call builds, medians of {args.repeats} interleaved passes x "
        f"{args.calls} calls")
    for name, v in times.items():
        say(f"  {name:22} {statistics.median(v):7.3f} ms")


def calls_section(args, pair, prompt, say):
    say(f"\ncalls: chain block {args.block}, {args.long} tokens, Python calls outside the "
        "models' modules (cProfile)")
    for which in ("treespec", "mlx-lm"):
        decode_once(which, pair, prompt, args.long, args.block)  # warm
        prof = cProfile.Profile()
        prof.enable()
        rounds = decode_once(which, pair, prompt, args.long, args.block)
        prof.disable()
        total = sum(nc for (f, _, _), (_, nc, _, _, _) in pstats.Stats(prof).stats.items()
                    if "mlx_lm/models" not in f and "mlx/nn" not in f)
        say(f"  {which:9} {rounds} rounds, {total / rounds:.0f} Python calls per round")


def main(argv=None):
    ap = harness.parser("host_cost", __doc__, pair="thin", dims=(64, 32), repeats=300, calls=5)
    ap.add_argument("--sections", default=",".join(SECTIONS),
                    help=f"comma separated, of {', '.join(SECTIONS)} (default all)")
    ap.add_argument("--block", type=int, default=3, help="the chain's block (default 3)")
    ap.add_argument("--long", type=int, default=80, help="calls: tokens decoded (default 80)")
    args = ap.parse_args(argv)
    sections = args.sections.split(",")
    if set(sections) - set(SECTIONS):
        ap.error(f"--sections: {', '.join(sorted(set(sections) - set(SECTIONS)))} unknown")
    pair = harness.load_pair(args)
    prompt = pair.prompts(1, length=12)[0]
    with harness.record(args, pair) as say:
        if "round" in sections:
            round_section(args, pair.target, say)
        if "setup" in sections:
            setup_section(args, pair, say)
        if "calls" in sections:
            calls_section(args, pair, prompt, say)


if __name__ == "__main__":
    main()
