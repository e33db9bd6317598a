"""Audit property of whole decodes (contract 9): at temperature 0, chain and
tree speculative decoding emit the bytes of ``mlx_lm.generate``. The gate
runs, with the adapter under audit: where it declines (the backend is not
exact for these shapes) the text is classic decoding's, still compared, and
a run forced past the gate says where its text first diverges, as
information. ``--allow-inexact``: forced runs only, a divergence "inexact"."""

import time
from typing import Dict, List

import mlx_lm

from ..evidence import numerics
from ..decoding import decode, detokenize
from ..errors import TreeRefused
from .records import FAIL, INEXACT, PASS, SKIP, Check
from .subject import Subject, draft_adapter, the_adapter, the_walk, window

PROMPTS = ("The quick brown fox jumps over", "def main(): return print(")


def e2e_modes(block: int, head: bool = False) -> Dict[str, dict]:
    """The decode modes of the e2e rows; with a hidden-state head the budget
    and width ask for EAGLE-2's dynamic tree instead of the confidence tree."""
    budget = max(2, 2 * (block - 1))
    return {
        f"chain-b{block}": dict(mode="chain", block=block),
        "tree-2x2x1": dict(mode="tree", branching=[2, 2, 1]),
        f"tree-{'dynamic' if head else 'confidence'}-b{budget}": dict(mode="tree", budget=budget,
                                                                      width=3),
    }


def e2e_tokens(s: Subject) -> int:
    if s.options.max_tokens:
        return s.options.max_tokens
    w = window(s.model)
    return max(32, w + 16) if w and w <= 48 else 32


def drafter_note(s: Subject) -> str:
    if s.draft_head is not None:
        return f"the hidden-state head {s.draft_name} (--draft-head)"
    if s.draft_model is not None:
        return str(s.draft_name or "the given draft model")
    return ("the target itself (no --draft-model): it drafts its own greedy tokens, so "
            "rounds rarely reject; rollback[...] covers rejections")


def check_e2e(s: Subject) -> List[Check]:
    """Temperature 0: chain and tree speculative decoding emit the bytes of
    ``mlx_lm.generate`` (contract 9), one row per decode mode."""
    if s.tokenizer is None:
        return [Check("e2e", SKIP, "no tokenizer (an in-memory model): nothing to detokenize")]
    adapter, walk = the_adapter(s), the_walk(s)[0]
    n = e2e_tokens(s)
    draft = s.draft_model if s.draft_model is not None else s.model
    eos = list(s.tokenizer.eos_token_ids)
    prompts = [s.tokenizer.encode(p) for p in PROMPTS]
    expected = s._memo.setdefault("generate", {})
    for p, ids in zip(PROMPTS, prompts):
        if p not in expected:
            expected[p] = mlx_lm.generate(s.model, s.tokenizer, prompt=ids, max_tokens=n)
    out = []
    # a head drafts from the target's hidden states, in place of a draft model
    drafting = (dict(draft_head=s.draft_head) if s.draft_head is not None
                else dict(draft_model=draft, draft_adapter=draft_adapter(s, draft)))
    for name, kw in e2e_modes(s.options.block, s.draft_head is not None).items():
        t0 = time.perf_counter()
        first, accepted, proposed, refused, declined, forced = None, 0, 0, None, None, []
        run = lambda ids, **more: decode(s.model, ids, max_tokens=n, eos_token_ids=eos,
                                         adapter=adapter, adapter_name=s.adapter_source,
                                         walk=walk, **drafting, **more, **kw)
        for k, (p, ids) in enumerate(zip(PROMPTS, prompts)):
            try:
                result = run(ids, gate=False) if s.options.allow_inexact else run(ids)
                if result.stats.mode.startswith("classic (declined"):
                    declined = declined or result.stats.gate["reason"]
                    forced.append(_divergence(detokenize(s.tokenizer, run(ids, gate=False).tokens),
                                              expected[p]))
            except TreeRefused as e:
                refused = e.reason
                break
            text = detokenize(s.tokenizer, result.tokens)
            accepted, proposed = accepted + result.stats.accepted, proposed + result.stats.proposed
            if text != expected[p] and first is None:
                at = _first_difference(text, expected[p])
                first = {"prompt": k, "position": at, "expected": expected[p][max(0, at - 8):at + 16],
                         "got": text[max(0, at - 8):at + 16],
                         "message": f"prompt {k}: text differs from char {at}: expected "
                                    f"{expected[p][max(0, at - 8):at + 16]!r}, got "
                                    f"{text[max(0, at - 8):at + 16]!r}"}
        rate = f"{accepted}/{proposed} drafts accepted" if proposed else "no drafts"
        if refused:
            c = Check(f"e2e[{name}]", SKIP, f"the adapter refuses this mode's trees: {refused}")
        elif first is not None:
            status = INEXACT if s.options.allow_inexact else FAIL
            c = Check(f"e2e[{name}]", status, f"{first['message']} ({rate})", first)
        elif declined:
            c = Check(f"e2e[{name}]", PASS, f"{len(PROMPTS)} prompts x {n} tokens byte-identical to "
                      f"mlx_lm.generate; {declined}; forced past the gate: {'; '.join(forced)}",
                      verdict=numerics.DECLINED)
        else:
            c = Check(f"e2e[{name}]", PASS, f"{len(PROMPTS)} prompts x {n} tokens byte-identical "
                      f"to mlx_lm.generate ({rate})")
        c.seconds = time.perf_counter() - t0
        out.append(c)
    return out


def _first_difference(text: str, expected: str) -> int:
    return next((i for i, (a, b) in enumerate(zip(text, expected)) if a != b),
                min(len(text), len(expected)))


def _divergence(text: str, expected: str) -> str:
    if text == expected:
        return "identical text"
    at = _first_difference(text, expected)
    return f"text first diverges at char {at}"
