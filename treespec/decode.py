"""Decoding at temperature 0: classic, chain and tree, with one API.

``decode(target, prompt, mode=...)`` returns the generated token ids and the
round diagnostics. ``classic`` is mlx-lm's own ``generate_step`` with a
greedy sampler; ``chain`` and ``tree`` run the speculative round loop:

    draft a tree -> one target forward over it -> walk -> commit both caches

Tree drafting is opt-in: ``mode="tree"`` must be asked for by name.
"""

import sys
import time
from dataclasses import asdict, dataclass, field
from typing import List, Optional, Sequence

import mlx.core as mx
from mlx_lm.generate import generate_step
from mlx_lm.models.cache import make_prompt_cache

from .cuda_env import warn_if_cudnn_attention
from .draft import PREFILL_STEP, Drafter, cache_offset, make_drafter, prefill
from .verify import adapter_for
from .walk import tree_walk

MODES = ("classic", "chain", "tree")


@dataclass
class Stats:
    """What a tuning engineer reads after a run."""

    mode: str
    requested: dict = field(default_factory=dict)  # the drafter as configured
    rounds: int = 0
    proposed: int = 0  # draft nodes verified
    accepted: int = 0  # draft nodes accepted
    emitted: int = 0  # tokens committed by verify forwards
    zero_accept_rounds: int = 0
    partial_accept_rounds: int = 0
    full_accept_rounds: int = 0  # accepted down to the tree's deepest level
    depth_reached: List[int] = field(default_factory=list)  # rounds whose tree reached depth d+1
    depth_accepted: List[int] = field(default_factory=list)  # rounds accepting depth d+1
    nodes_per_round: List[int] = field(default_factory=list)
    time_ms: dict = field(default_factory=lambda: {
        "prefill": 0.0, "draft": 0.0, "verify": 0.0, "walk": 0.0, "commit": 0.0})
    notes: List[str] = field(default_factory=list)
    gate: Optional[dict] = None  # the exactness gate's decision, when it ran

    def record(self, tree, walk):
        self.rounds += 1
        drafts = len(tree) - 1
        self.proposed += drafts
        self.accepted += walk.accepted
        self.nodes_per_round.append(len(tree))
        depth = tree.depth()
        if walk.accepted == 0:
            self.zero_accept_rounds += 1
        elif walk.accepted == depth:
            self.full_accept_rounds += 1
        else:
            self.partial_accept_rounds += 1
        while len(self.depth_reached) < depth:
            self.depth_reached.append(0)
            self.depth_accepted.append(0)
        for d in range(depth):
            self.depth_reached[d] += 1
            self.depth_accepted[d] += walk.accepted > d

    def summary(self) -> dict:
        s = asdict(self)
        s["acceptance"] = self.accepted / self.proposed if self.proposed else None
        s["emitted_per_verify"] = self.emitted / self.rounds if self.rounds else None
        s["per_depth_acceptance"] = [
            a / r if r else None for a, r in zip(self.depth_accepted, self.depth_reached)]
        n = self.nodes_per_round
        s["effective"] = {
            "mean_nodes": sum(n) / len(n) if n else None,
            "max_nodes": max(n) if n else None,
            "mean_budget": (sum(n) / len(n) - 1) if n else None,
        }
        s.pop("nodes_per_round")
        return s


@dataclass
class Result:
    tokens: List[int]
    stats: Stats


def _eos_set(eos_token_ids) -> set:
    if eos_token_ids is None:
        return set()
    if isinstance(eos_token_ids, int):
        return {eos_token_ids}
    return set(eos_token_ids)


def _clip(tokens: List[int], max_tokens: int, eos: set) -> (List[int], bool):
    """Cut at max_tokens and just after the first EOS; say whether to stop."""
    out = []
    for t in tokens:
        out.append(t)
        if t in eos or len(out) >= max_tokens:
            return out, True
    return out, False


def classic(target, prompt: Sequence[int], max_tokens: int, eos_token_ids=None,
            sampler=None, requested: Optional[dict] = None) -> Result:
    """mlx-lm's ``generate_step``: greedy, or with the given ``sampler``."""
    stats = Stats("classic", requested=requested or {})
    eos, out = _eos_set(eos_token_ids), []
    t0 = time.perf_counter()
    sampler = sampler or (lambda lp: mx.argmax(lp, axis=-1))
    for tok, _ in generate_step(mx.array(list(prompt)), target, max_tokens=max_tokens,
                                sampler=sampler):
        out.append(int(tok))
        if out[-1] in eos:
            break
    stats.time_ms["verify"] = (time.perf_counter() - t0) * 1e3
    stats.rounds = stats.emitted = len(out)
    return Result(out, stats)


_WARNED = set()


def _warn_once(decision):
    """Loud, on stderr, once per probed configuration and verdict."""
    key = (decision.probe.key, decision.run)
    if key not in _WARNED:
        _WARNED.add(key)
        print(f"treespec: exactness gate: {decision.reason}", file=sys.stderr)


def greedy_readout(logits):
    """Temperature 0: each node's target token is what classic decoding picks,
    mlx-lm generate_step's argmax of ``logits - logsumexp(logits)`` in the
    logits' dtype. Not the argmax of the logits: in bfloat16 the subtraction
    rounds near-equal logits to one value and the tie goes to the lower id
    (on the H200 a 0.9B bf16 model's speculative text left classic's at token
    5 this way). Computed in the verify's graph: a separate evaluation would
    cost a host sync, ~50 us on the CPU."""
    return mx.argmax(logits - mx.logsumexp(logits, axis=-1, keepdims=True), axis=-1)


def greedy_walk(rnd, targets):
    return tree_walk(rnd.tree, targets.tolist())


def speculative(target, draft_model, prompt: Sequence[int], max_tokens: int,
                drafter: Drafter, eos_token_ids=None, mode: str = "tree",
                gate: bool = True, allow_inexact: bool = False, walker=greedy_walk,
                readout=greedy_readout, fallback=None,
                requested: Optional[dict] = None) -> Result:
    """The round loop. The target's cache, like the drafter's, holds the
    committed text except the root between rounds.

    ``walker(round, readout(logits)) -> Walk`` decides what the target
    accepts (greedy here, the sampled rule in treespec.sampling); ``fallback()``
    is the classic decode the gate declines to."""
    prompt = [int(t) for t in prompt]
    if not prompt:
        raise ValueError("the prompt needs at least one token (the first root)")
    adapter = adapter_for(target)
    stats = Stats(mode, requested=requested or drafter.describe())
    if gate:
        from .gate import decide

        decision = decide(target, drafter.probe_shapes(), allow_inexact=allow_inexact)
        stats.gate = decision.summary()
        if not decision.exact:
            _warn_once(decision)
            stats.notes.append(decision.reason)
        if not decision.run:
            result = (fallback or (lambda: classic(target, prompt, max_tokens, eos_token_ids)))()
            result.stats.requested, result.stats.gate = stats.requested, stats.gate
            result.stats.notes = stats.notes
            result.stats.mode = f"classic (declined {mode})"
            return result
    eos, out = _eos_set(eos_token_ids), []
    clock = time.perf_counter
    t0 = clock()
    cache = make_prompt_cache(target)
    prefill(target, cache, prompt[:-1])
    drafter.start(draft_model, prompt[:-1], PREFILL_STEP)
    stats.time_ms["prefill"] = (clock() - t0) * 1e3
    root = prompt[-1]
    while len(out) < max_tokens:
        t0 = clock()
        # Never draft past max_tokens: a round emits at most drafts + 1.
        rnd = drafter.draft(root, limit=max_tokens - len(out) - 1)
        offset = cache_offset(cache)
        # Built on the lazy drafts of a device round (see draft.DeviceRound):
        # drafting and verifying are one graph and one evaluation, as in
        # mlx-lm's round. So for such rounds 'draft' is building the graphs
        # and 'verify' evaluating both. (Dropping a separate wait for the
        # drafts moved chain/mlx-lm on the H200 from 0.93, 0.96, 0.97 to
        # 0.91, 0.98, 1.04 at blocks 2, 3, 6; pairs scatter by ~0.03.)
        read = readout(adapter.verify(rnd.topology, cache, tokens=rnd.device_tokens))
        t1 = clock()
        mx.eval(read)
        t2 = clock()
        walk = walker(rnd, read)
        t3 = clock()
        # Both commits evaluate what they write (commit_path ends in mx.eval).
        adapter.commit(cache, rnd.tree, walk.path, offset)
        drafter.commit(rnd, walk.path)
        t4 = clock()
        for k, dt in zip(("draft", "verify", "walk", "commit"), (t1 - t0, t2 - t1, t3 - t2, t4 - t3)):
            stats.time_ms[k] += dt * 1e3
        stats.record(rnd.tree, walk)
        emitted, stop = _clip(list(walk.emitted), max_tokens - len(out), eos)
        stats.emitted += len(walk.emitted)
        out += emitted
        if stop:
            break
        root = walk.emitted[-1]
    return Result(out, stats)


def decode(target, prompt: Sequence[int], mode: str = "classic", draft_model=None,
           max_tokens: int = 64, eos_token_ids=None, block: int = 4,
           branching=None, parents=None, budget: Optional[int] = None,
           width: int = 4, drafter: Optional[Drafter] = None, gate: bool = True,
           allow_inexact: bool = False, temperature: float = 0.0, top_k: int = 0,
           top_p: float = 0.0, min_p: float = 0.0, seed: int = 0) -> Result:
    """One entry point for every mode. ``tree`` is never chosen implicitly.
    ``temperature > 0`` samples, exactly in law (treespec.sampling)."""
    if mode != "classic":
        warn_if_cudnn_attention()
    if temperature > 0:
        if budget is not None:
            raise ValueError("the confidence-driven tree (budget=) drafts greedily; at "
                             "temperature > 0 give a fixed shape (branching= or parents=)")
        from .sampling import decode_sampled  # it builds on this module

        return decode_sampled(target, prompt, draft_model, temperature=temperature,
                              top_k=top_k, top_p=top_p, min_p=min_p, seed=seed, mode=mode,
                              block=block, branching=branching, parents=parents,
                              max_tokens=max_tokens, eos_token_ids=eos_token_ids,
                              drafter=drafter, gate=gate, allow_inexact=allow_inexact)
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if max_tokens < 1:
        raise ValueError(f"max_tokens must be >= 1, got {max_tokens}")
    if mode == "classic":
        return classic(target, prompt, max_tokens, eos_token_ids)
    if draft_model is None:
        raise ValueError(f"mode {mode!r} needs a draft model")
    if drafter is None:
        drafter = make_drafter(mode, block=block, branching=branching, parents=parents,
                               budget=budget, width=width)
    elif mode == "chain" and drafter.kind != "chain":
        raise ValueError(f"mode 'chain' got a {drafter.kind!r} drafter; ask for mode 'tree'")
    return speculative(target, draft_model, prompt, max_tokens, drafter, eos_token_ids, mode,
                       gate=gate, allow_inexact=allow_inexact)


def detokenize(tokenizer, tokens: Sequence[int]) -> str:
    """The text mlx-lm's ``generate`` would print for these tokens: its own
    streaming detokenizer, stopping before an EOS."""
    detok = tokenizer.detokenizer
    eos = set(tokenizer.eos_token_ids)
    for t in tokens:
        if t in eos:
            break
        detok.add_token(t)
    detok.finalize()
    return detok.text
