"""Audit property of a hidden-state head's state (with ``--draft-head``):
after every round's commit (the head's cache rolled back to the root's pair,
the accepted path queued with the verifier's features for it: the
"draft-extend" of treespec.draft.head), the head holds exactly what a fresh
head fed the accepted text holds.

The reference is independent of the drafter: the target's features of the
committed text as classic decoding computes them (mlx-lm's prefill of the
prompt, then one-token steps, the taps recorded), and a fresh head cache fed
the pairs (text[t + 1], features[t]) for every position before the round's
root in one head forward. After a round whose queue starts at position L the
head's cache holds those L pairs (the offset L, its keys and values the fresh
head's) and its queue the tokens text[L + 1 ..] with the features of L ..
(docs/heads.md#drafting-from-a-head). A cache not rolled back holds the
round's drafts past L; a rejected node's features, or another layer's, give
other keys: each shows here, while the text stays classic decoding's.

Values are bit for bit where the backend is exact. Elsewhere a forward's
rows depend on its width, so each comparison is judged against the same
computation at two widths measured in the same run: the target's features
from one forward of the whole text against the one-token steps', the fresh
head's cache from one forward against one-pair steps'. Lengths and queued
tokens are compared exactly everywhere. suites/heads_drafting compares with
its own reference (the features read off mlx-lm's modules layer by layer)
through :func:`state_difference`."""

import time
from typing import List, Optional, Sequence, Tuple, Type

import mlx.core as mx
import numpy as np
from mlx_lm.models.cache import make_prompt_cache

from ..decoding import decode
from ..draft.head import HeadDrafter
from ..evidence import numerics
from ..verify.taps import tapped
from .e2e_props import PROMPTS, e2e_modes, e2e_tokens
from .records import FAIL, INEXACT, PASS, SKIP, Check
from .subject import Subject, the_adapter, the_walk

__all__ = ["HeadStateRecorder", "cache_rows", "check_head_state", "classic_features",
           "fresh_cache_rows", "state_difference", "whole_features"]


def cache_rows(cache) -> list:
    """The keys and values a head's cache holds, copied to numpy (None for
    a cache nothing was written to)."""
    return [(np.array(c.keys[..., :c.offset, :]), np.array(c.values[..., :c.offset, :]))
            if c.keys is not None else None for c in cache]


class HeadStateRecorder:
    """``on_round``: after every commit, what the head drafter holds (its
    cache rows, its queued tokens and features), copied, and the tokens
    emitted before the round."""

    def __init__(self, drafter: HeadDrafter):
        self.drafter, self.rounds, self.emitted = drafter, [], []

    def __call__(self, rnd, walk):
        d = self.drafter
        features = None if d._pending_features is None else np.array(d._pending_features)
        self.rounds.append((cache_rows(d.cache), list(d.pending), features, len(self.emitted)))
        self.emitted += list(walk.emitted)


def classic_features(model, prompt: Sequence[int], text: Sequence[int], taps) -> mx.array:
    """The target's features ``(1, len(text), F)`` at every position of
    ``text``, as classic decoding computes them: mlx-lm's prompt cache, the
    prompt but its last token in one forward, then one token a step."""
    cache = make_prompt_cache(model)
    head = len(prompt) - 1
    with tapped(model, taps) as t:
        if head:
            mx.eval(model(mx.array(list(text[:head]))[None], cache=cache))
        for token in text[head:]:
            mx.eval(model(mx.array([[token]]), cache=cache))
    return t.features()


def whole_features(model, text: Sequence[int], taps) -> mx.array:
    """The same features from one forward of the whole text."""
    with tapped(model, taps) as t:
        mx.eval(model(mx.array(list(text))[None]))
    return t.features()


def fresh_cache_rows(head, text: Sequence[int], feats: mx.array, length: int,
                     steps: bool = False) -> list:
    """A fresh head cache fed the first ``length`` pairs (text[t + 1],
    features[t]): in one forward, or one pair a forward (``steps``)."""
    fresh = head.make_cache()
    if length and not steps:
        head(mx.array(list(text[1:length + 1]))[None], feats[:, :length], fresh)
    for t in range(length if steps else 0):
        head(mx.array([[text[t + 1]]]), feats[:, t:t + 1], fresh)
    return cache_rows(fresh)


def _max_diff(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.max(np.abs(a.astype(np.float64) - b.astype(np.float64)), initial=0.0))


def state_difference(head, text: Sequence[int], feats: mx.array, rounds: list,
                     atol: float = 0.0, feature_atol: Optional[float] = None
                     ) -> Tuple[Optional[dict], float, int]:
    """Every recorded round's head state (HeadStateRecorder.rounds) against
    a fresh head fed ``feats`` (the reference features of ``text``, the
    committed text). Returns the first difference (a dict with its
    ``message`` and ``round``) or None, the largest |diff| of the values
    compared, and how many rounds were compared. ``atol`` bounds the cache's
    values, ``feature_atol`` (default ``atol``) the queued features."""
    feature_atol = atol if feature_atol is None else feature_atol
    worst = 0.0
    for r, (rows, pending, pfeats, _) in enumerate(rounds):
        length = 0 if rows[0] is None else rows[0][0].shape[2]
        if length + 1 > feats.shape[1]:
            return ({"round": r, "message": f"round {r}: the head's cache holds {length} pairs, "
                     f"the committed text has {feats.shape[1] - 1}"}, worst, r + 1)
        for layer, (got, want) in enumerate(zip(rows, fresh_cache_rows(head, text, feats,
                                                                        length))):
            if got is None or want is None:
                if got is None and want is None:
                    continue
                return {"round": r, "message": f"round {r}: layer {layer}: one cache is empty"}, \
                    worst, r + 1
            for what, g, w in (("keys", got[0], want[0]), ("values", got[1], want[1])):
                if g.shape != w.shape:
                    return ({"round": r, "message": f"round {r}: layer {layer} {what}: head "
                             f"cache {g.shape}, fresh head {w.shape} (its drafts not rolled "
                             "back, or pairs missing)"}, worst, r + 1)
                d = _max_diff(g, w)
                worst = max(worst, d)
                if d > atol:
                    return ({"round": r, "max_abs_diff": d, "message": f"round {r}: layer "
                             f"{layer} {what} differ from the fresh head's"}, worst, r + 1)
        n = 0 if pfeats is None else pfeats.shape[1]
        if pending != list(text[length + 1:length + n]):
            return ({"round": r, "message": f"round {r}: queued tokens {pending}, the text's "
                     f"{list(text[length + 1:length + n])}"}, worst, r + 1)
        if n:
            want = np.array(feats[:, length:length + n])
            d = _max_diff(pfeats, want) if pfeats.shape == want.shape else float("inf")
            worst = max(worst, d)
            if d > feature_atol:
                return ({"round": r, "max_abs_diff": d,
                         "message": f"round {r}: queued features differ from the target's"},
                        worst, r + 1)
    return None, worst, len(rounds)


def _widths_rounding(s: Subject, head, text, feats) -> Tuple[float, float]:
    """The backend's own rounding across forward widths, measured here: the
    target's features from one forward of the text against ``feats`` (its
    steps'), the fresh head's cache from one forward against one-pair
    steps'. Both 0 on an exact backend."""
    target = _max_diff(np.array(whole_features(s.model, text, head.taps)), np.array(feats))
    n = feats.shape[1] - 1
    one = fresh_cache_rows(head, text, feats, n)
    steps = fresh_cache_rows(head, text, feats, n, steps=True)
    own = max((_max_diff(a[i], b[i]) for a, b in zip(one, steps) if a is not None
               for i in (0, 1)), default=0.0)
    return own, target


def check_head_state(s: Subject, drafter: Type[HeadDrafter] = HeadDrafter) -> List[Check]:
    """One row per head drafting mode (the e2e rows' chain, fixed tree and
    dynamic tree): after every round of decoding each e2e prompt, the head's
    cache and queue against a fresh head fed the accepted text. ``drafter``:
    the drafter class audited (the suites pass planted defective ones)."""
    if s.draft_head is None:
        return [Check("head-state", SKIP, "n/a: no --draft-head (a hidden-state head's cache)")]
    if s.tokenizer is None:
        return [Check("head-state", SKIP, "no tokenizer (an in-memory model): no prompts")]
    adapter, walk, head = the_adapter(s), the_walk(s)[0], s.draft_head
    n, eos = e2e_tokens(s), list(s.tokenizer.eos_token_ids)
    out = []
    for name, kw in e2e_modes(s.options.block, head=True).items():
        t0 = time.perf_counter()
        first, worst, rounds, declined, envelope = None, 0.0, 0, None, (0.0, 0.0)
        accepted = proposed = 0
        for k, p in enumerate(PROMPTS):
            prompt = s.tokenizer.encode(p)
            drafting = drafter(head, **kw)
            recorder = HeadStateRecorder(drafting)
            result = decode(s.model, prompt, max_tokens=n, eos_token_ids=eos, adapter=adapter,
                            adapter_name=s.adapter_source, walk=walk, draft_head=head,
                            mode=kw["mode"], drafter=drafting, on_round=recorder,
                            gate=not s.options.allow_inexact)
            if not recorder.rounds:  # declined by the gate: classic decoding, no head ran
                declined = result.stats.gate and result.stats.gate.get("reason")
                continue
            accepted += result.stats.accepted
            proposed += result.stats.proposed
            text = list(prompt) + recorder.emitted
            feats = classic_features(s.model, prompt, text, head.taps)
            own, target = _widths_rounding(s, head, text, feats)
            envelope = (max(envelope[0], own), max(envelope[1], target))
            atol, fatol = ((s.options.tolerance,) * 2 if s.options.allow_inexact
                           else (own, target))
            bad, d, compared = state_difference(head, text, feats, recorder.rounds, atol, fatol)
            worst, rounds = max(worst, d), rounds + compared
            if bad is not None and first is None:
                first = {**bad, "prompt": k, "message": f"prompt {k}: {bad['message']}"}
        out.append(_row(f"head-state[{name}]", first, worst, f"{rounds} rounds ({accepted}/"
                        f"{proposed} drafts accepted)" if rounds else "", declined, envelope,
                        s.options.allow_inexact))
        out[-1].seconds = time.perf_counter() - t0
    return out


def _row(name, first, worst, rounds: str, declined, envelope, inexact) -> Check:
    """``rounds``: how many rounds were compared and their acceptance ("" for none)."""
    what = "the head's cache and queue against a fresh head fed the accepted text"
    if first is not None:
        d = first.get("max_abs_diff")
        return Check(name, FAIL, first["message"] + (f" (max |diff| {d:.3g})" if d else ""),
                     first, worst)
    if not rounds:
        return Check(name, SKIP, f"no round drafted: {declined or 'nothing to compare'}",
                     verdict=numerics.DECLINED if declined else "")
    if worst == 0:
        return Check(name, PASS, f"{rounds}: {what}, bit-identical", None, 0.0)
    if inexact:
        return Check(name, INEXACT, f"{rounds}: {what}, within --tolerance (max |diff| "
                     f"{worst:.3g})", None, worst)
    return Check(name, PASS, f"{rounds}: {what}, max |diff| {worst:.3g} within the "
                 f"backend's rounding across widths measured here (head {envelope[0]:.3g}, "
                 f"target features {envelope[1]:.3g})", None, worst, verdict=numerics.WITHIN)
