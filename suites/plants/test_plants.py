"""The suite still catches regressions (issue 21, items 7 and 8): every plant
of suites/planted.py, installed where mlx-lm calls the kernel, turns the
suite checks named here red (a FAIL verdict or a failed assertion) or makes
the gate decline where only a multi-token forward's last bits moved; the
same checks unplanted are green. In whichever CPU regime the run is in
(README's test command runs both).

Size-conditional plants (32+ matmul rows, head_dim 128, 1024+ keys) are also
shown to leave the checks at the zoo's own sizes green: only the size
matrix's shapes (and ``treespec audit``'s long-context probe) reach them.

A gate check whose model the gate already declines unplanted in this regime
(float32 under OpenBLAS) has nothing to show and is skipped with the reason;
the bfloat16 twin shows it there (docs/numerics.md#planted-regressions).
"""

from dataclasses import dataclass
from typing import Callable, FrozenSet

import pytest

from suites.plants import helpers as P
from suites.planted import DECLINED, PLANTS
from suites.verdict import exact_backend, unrecorded
from suites.verify import helpers as verify_helpers
from treespec.evidence import numerics
from treespec.backend.blas import regime

pytestmark = pytest.mark.exactness

NEVER_FAIL = frozenset({numerics.WITHIN, numerics.BIT_EXACT})  # a plant the gate answers
RED = frozenset({numerics.FAIL})
GATE_DECLINES = frozenset({P.DECLINED})


@dataclass(frozen=True)
class Check:
    name: str
    run: Callable[[], str]
    caught: FrozenSet[str] = RED  # what the check must say under the plant
    gate: bool = False  # a gate decision: skipped where the gate declines unplanted
    slow: bool = False


def _gate(family, dtype, trees=(), nodes=""):
    label = f"gate: decision = its probe ({family} {dtype}{', ' + nodes if nodes else ''})"
    return Check(label, lambda: P.gate(verify_helpers.model(family, dtype), trees),
                 GATE_DECLINES, gate=True)


BIG_TREE = P.tree(40, 40).parents  # an EAGLE-sized tree: 32+ matmul rows
ZOO_TREES = [verify_helpers.branching_trees("llama")["bushy"].parents]  # 12 nodes

VERIFY_LLAMA = Check("verify: tree nodes = root-path forwards (zoo llama, bushy tree)", P.zoo_verify)
KERNELS_LLAMA = Check("tree path kernels = plain forward (zoo llama)", P.kernels)

CAUGHT = {
    "attention-drops-array-mask": [
        VERIFY_LLAMA,
        Check("verify, 8-bit quantized KV cache (zoo qwen3)", lambda: P.zoo_verify("qwen3", kv=8)),
        KERNELS_LLAMA,
    ],
    "rope-row-offsets-plus-one": [
        VERIFY_LLAMA,
        Check("verify (zoo gemma4_text, scalar-array offsets)", lambda: P.zoo_verify("gemma4_text")),
        KERNELS_LLAMA,
    ],
    "commit-gathers-a-stale-row": [
        Check(f"rollback: kept rows = verify's rows (zoo {f}, {s})", lambda f=f, s=s: P.rollback(f, s))
        for f, s in [("llama", "native"), ("qwen3", "quantized-8bit-g32"), ("gemma3_text", "native")]
    ],
    "gated-delta-rows-share-first-state": [
        Check(f"rollback round through the tree-aware recurrence (zoo {f}): verify rows, "
              "kept states, decoding on", lambda f=f: P.rollback(f))
        for f in ("qwen3_5", "qwen3_next")
    ],
    "conv-multi-token-few-ulp": [_gate("qwen3_5", d) for d in ("float32", "bfloat16")],
    "matmul-multi-token-few-ulp": [
        *[_gate("llama", d) for d in ("float32", "bfloat16")],
        # Every multi-row product moved alike: the node rows are still the same-width
        # root-path forwards (bit-exact, suites/verify/test_same_width.py), or within the
        # envelope; the recorded envelopes catch it (suites/e2e/test_envelopes.py).
        Check("verify: never FAIL (zoo llama)", P.zoo_verify, NEVER_FAIL),
    ],
    "matmul-32-rows-few-ulp": [
        *[_gate("llama", d, [BIG_TREE], "a 40-node tree") for d in ("float32", "bfloat16")],
        Check("treespec audit: long-context[probe] (zoo llama, 32- and 64-node trees)",
              lambda: P.audit_row("long-context[probe]"), GATE_DECLINES | {numerics.DECLINED},
              gate=True, slow=True),
    ],
    "attention-drops-mask-head-dim-128": [
        Check("verify, size matrix: head_dim 128, 40-node tree", lambda: P.sized_verify(128)),
    ],
    "attention-drops-mask-1024-keys": [
        Check("verify (zoo llama, context 1100)", lambda: P.zoo_verify("llama", 1100)),
        Check("verify, size matrix: head_dim 64, context 1100, 40-node tree",
              lambda: P.sized_verify(64, 1100)),
        Check("treespec audit: long-context[tree-verify] (zoo llama, context 1100)",
              lambda: P.audit_row("long-context[tree-verify]"), slow=True),
    ],
}

# What a size-conditional plant leaves green: the checks at the zoo's sizes.
MISSED = {
    "matmul-32-rows-few-ulp": [_gate("llama", d, ZOO_TREES, "block 4 and a 12-node tree")
                               for d in ("float32", "bfloat16")],
    "attention-drops-mask-head-dim-128": [
        VERIFY_LLAMA, Check("verify, size matrix: head_dim 64", lambda: P.sized_verify(64))],
    "attention-drops-mask-1024-keys": [VERIFY_LLAMA, KERNELS_LLAMA],
}


def _cases(table):
    return [pytest.param(name, c, id=f"{name}-{i}", marks=[pytest.mark.slow] if c.slow else [])
            for name, checks in table.items() for i, c in enumerate(checks)]


def test_every_plant_is_named_by_the_tables():
    assert set(CAUGHT) == set(PLANTS)
    for name, checks in CAUGHT.items():
        gate_only = all(c.gate or c.caught == NEVER_FAIL for c in checks)
        assert gate_only == (PLANTS[name].expect == DECLINED), name
    assert set(MISSED) == {n for n, p in PLANTS.items() if p.at_size}


def _unplanted(check: Check) -> str:
    with unrecorded():
        before = check.run()
    if check.gate and before in (P.DECLINED, numerics.DECLINED):
        pytest.skip(f"{check.name}: the gate declines here unplanted already; nothing to show")
    if before == numerics.INCONCLUSIVE and not exact_backend():
        # The unplanted check cannot tell a defect from this backend (its
        # controls do not separate): no plant can be shown caught or missed.
        pytest.skip(f"{check.name}: inconclusive unplanted on {regime()}; nothing to show")
    assert before in P.OK + (P.RUNS,), f"{check.name} is not green unplanted: {before}"
    return before


@pytest.mark.parametrize("name, check", _cases(CAUGHT))
def test_each_planted_regression_turns_its_check_red(name, check, plant):
    _unplanted(check)
    with unrecorded(), plant(name):
        after = check.run()
    assert after in check.caught, f"{name}: {check.name} said {after!r} under the plant"


@pytest.mark.parametrize("name, check", _cases(MISSED))
def test_a_size_conditional_plant_is_missed_at_the_zoo_sizes(name, check, plant):
    before = _unplanted(check)
    with unrecorded(), plant(name):
        after = check.run()
    assert after == before, f"{name} fired at the zoo's sizes: {check.name} said {after!r}"
