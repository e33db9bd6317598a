"""What each speculative round evaluates inside the decode loop, per configuration.

    python -m benchmarks.round_census --dims 4096x32 --max-tokens 48
    python -m benchmarks.round_census --pair default --configs "chain:5 parents:-1,0,0,1,1"
    python -m benchmarks.round_census --dims 4096x32 --start-commits

The primitives of each round's one evaluation (the verify forward, with
whatever the previous round's commits left pending in the caches), by name,
beside the loop's own phase times and tokens per round. On an accelerator
every primitive is about one kernel launch made from the host thread, so a
launch-bound round costs about its count: this says where a tree round's
evaluation holds more than a chain round's of as many verified tokens, which
verify_cost (each piece alone, no loop) cannot show. The drafting levels are
started on their own (``mx.async_eval``) and are not in the count. Counting
walks each round's graph (``mx.export_to_dot``), so the times are from a
second, uncounted decode of the same prompt; every configuration is decoded
once untimed first (one decode each: the times are one run's, a census, not
a timing). The loop sees the target's adapter through a wrapper passed as
``decode(adapter=...)``.

``--configs`` (space separated): ``chain:B``, ``branching:2,1,1,1``,
``rows:2,1,1,1`` (the same with its wide levels drafted as batch rows:
``FixedTreeDrafter(batch_levels=True)``), ``parents:-1,0,0,1,1``.
``--start-commits`` adds, per configuration, a row whose target commits are
started on their own right after each commit (``mx.async_eval`` of the
caches' state), so that no round's verify graph holds the previous round's
row moves: whether a round's evaluation costs more when its graph differs
from round to round than its primitive count says (on CUDA, MLX replays
cached CUDA graphs of a few ops each).
"""

from collections import Counter

import mlx.core as mx

from benchmarks import harness
from treespec.bench.graph_census import difference, primitives
from treespec.decoding import decode
from treespec.draft import FixedTreeDrafter
from treespec.verify import adapter_for

DEFAULT = ("chain:5 chain:9 parents:-1,0,0,1,1,3,3,5,5 "
           "parents:-1,0,0,1,1,3,3,5,5,7,7,9,9,11,11 branching:2,1,1,1")


def config(spec: str) -> dict:
    """One ``--configs`` item as ``decode`` keywords."""
    kind, _, value = spec.partition(":")
    if kind == "chain":
        return {"mode": "chain", "block": int(value)}
    if kind in ("branching", "parents"):
        return {"mode": "tree", kind: [int(x) for x in value.split(",")]}
    if kind == "rows":
        return {"mode": "tree", "drafter": FixedTreeDrafter(
            branching=[int(x) for x in value.split(",")], batch_levels=True)}
    raise SystemExit(f"--configs: {spec!r} is not chain:B, branching:..., rows:... or "
                     "parents:...")


class Loop:
    """The target's adapter as the loop sees it: with ``count``, the
    primitives of every verify's output graph are counted before the loop
    evaluates it; with ``start``, every commit's writes are started on their
    own. Everything else is the adapter's own."""

    def __init__(self, inner, count: bool, start: bool):
        self.inner, self.count, self.start, self.rounds = inner, count, start, []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def verify(self, *args, **kwargs):
        out = self.inner.verify(*args, **kwargs)
        if self.count:
            self.rounds.append(primitives(out))
        return out

    def commit(self, cache, *args, **kwargs):
        out = self.inner.commit(cache, *args, **kwargs)
        if self.start:
            mx.async_eval([c.state for c in cache])
        return out


def main(argv=None):
    ap = harness.parser("round_census", __doc__, repeats=None, calls=None)
    ap.add_argument("--max-tokens", type=int, default=48)
    ap.add_argument("--configs", default=DEFAULT)
    ap.add_argument("--start-commits", action="store_true",
                    help="also each configuration with its commits started on their own")
    args = ap.parse_args(argv)
    specs = [(spec, config(spec)) for spec in args.configs.split()]
    pair = harness.load_pair(args)
    with harness.record(args, pair) as say:
        target, draft = pair.target, pair.draft
        prompt = pair.prompts(1)[0]
        rows = {}
        for spec, kw in specs:
            run = dict(draft_model=draft, max_tokens=args.max_tokens, gate=False, **kw)
            for start in (False, True) if args.start_commits else (False,):
                adapter = adapter_for(target)
                loop = dict(run, adapter=Loop(adapter, count=False, start=start))
                decode(target, prompt, **loop)  # kernels, plans and pools made untimed
                timed = decode(target, prompt, **loop).stats
                counted = Loop(adapter, count=True, start=start)
                decode(target, prompt, **dict(run, adapter=counted))
                per_round = sum(counted.rounds, Counter())
                n = len(counted.rounds)
                name = spec + (" (commits started)" if start else "")
                rows[name] = (timed, {k: v / n for k, v in per_round.items()})
        say(f"\none prompt x {args.max_tokens} tokens; ms per round from the uncounted decode; "
            "primitives per round evaluation (mean)")
        say(f"{'configuration':<62} {'rounds':>6} {'emit/r':>6} {'draft':>6} {'verify':>6} "
            f"{'commit':>6} {'prims':>7}")
        for spec, (st, census) in rows.items():
            ms = {k: st.time_ms[k] / max(st.rounds, 1) for k in ("draft", "verify", "commit")}
            say(f"{spec:<62} {st.rounds:>6} {st.emitted / max(st.rounds, 1):>6.2f} "
                f"{ms['draft']:>6.2f} {ms['verify']:>6.2f} {ms['commit']:>6.2f} "
                f"{sum(census.values()):>7.1f}")
        first, (_, base) = next(iter(rows.items()))
        for spec, (_, census) in list(rows.items())[1:]:
            top = [(k, v) for k, v in difference(census, base) if abs(v) >= 0.5]
            say(f"{spec} - {first}: " + ", ".join(f"{k} {v:+.1f}" for k, v in top[:14]))


if __name__ == "__main__":
    main()
