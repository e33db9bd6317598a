"""The exactness gate's decision as a test checks it on every backend
(docs/numerics.md#writing-a-numeric-test): where the regime is exact
(``suites.helpers_numerics.exact_backend``) the gate must let speculation
run; elsewhere it may decline instead, and then it is its probe's own
measurement and says why. Either way the decision becomes a verdict for the
table (bit-exact, or declined by gate with the reason), never a silent
pass.

    verdict = gate_verdict(result.stats.gate, result.stats.mode, "chain")
"""

from typing import Optional

from suites.helpers_numerics import exact_backend
from treespec.evidence import numerics

DECLINED = "declined to classic decode"  # how treespec.evidence.gate.decide's reason starts


def gate_verdict(gate: dict, reported: Optional[str] = None,
                 requested: Optional[str] = None) -> numerics.Verdict:
    """Check a decision of the gate (a run's ``stats.gate``, i.e.
    ``treespec.evidence.gate.Decision.summary()``, made without ``allow_inexact``) and
    return its verdict. ``reported``/``requested``: the run's mode and the
    mode asked for; a declined run reports ``classic (declined MODE)``."""
    if exact_backend():
        assert gate["run"], gate["reason"]
    # Speculation runs exactly where the probe found every shape identical.
    assert gate["run"] == gate["exact"], gate
    if requested is not None:
        assert reported == (requested if gate["run"] else f"classic (declined {requested})"), gate
    if gate["run"]:
        assert gate["max_abs_diff"] == 0, gate
        return numerics.Verdict(numerics.BIT_EXACT, detail=f"probe bit-identical, "
                                                           f"{requested or 'speculation'} ran")
    assert gate["reason"].startswith(DECLINED), gate
    return numerics.declined(gate["reason"], gate["max_abs_diff"])
