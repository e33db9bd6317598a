"""`treespec audit` as pytest: every audit property against the checkpoint
given with ``--target-model`` (options in the root conftest.py)::

    python -m pytest -m exactness --target-model PATH [--draft-model PATH] [--adapter module:attr]

One test per property (treespec.audit.PROPERTIES), each running the audit's
own function for it; skipped when no --target-model is given."""

from pathlib import Path

import pytest

from suites.verdict import record
from treespec import audit
from treespec.evidence.numerics import INCONCLUSIVE, WORDS, Verdict
from treespec.errors import UsageError

pytestmark = pytest.mark.exactness


@pytest.fixture(scope="module")
def subject(request):
    opt = request.config.getoption
    path = opt("--target-model")
    if not path:
        pytest.skip("no --target-model given: `pytest -m exactness --target-model=PATH` "
                    "audits that checkpoint")
    try:
        return audit.subject(path, opt("--draft-model"), opt("--adapter"))
    except UsageError as e:
        raise pytest.UsageError(str(e))


@pytest.mark.parametrize("prop", audit.PROPERTIES)
def test_user_model(subject, prop):
    checks = audit.check(prop, subject)
    for c in checks:
        # A skipped row compared nothing: it has no verdict and is not recorded (it
        # was recorded as bit-exact once). A row inexact within --tolerance is not
        # bit-exact either: recorded inconclusive, saying so.
        if c.status == audit.SKIP:
            continue
        word = c.verdict if c.verdict in WORDS else INCONCLUSIVE
        detail = c.detail if c.verdict in WORDS else f"{c.verdict}: {c.detail}"
        record(Verdict(word, c.max_diff or 0.0, detail=detail), f"audit: {c.name}",
               Path(subject.name).name)
    failed = [c for c in checks if not c.ok]
    assert not failed, "\n".join(c.line() for c in failed)
    if all(c.status == audit.SKIP for c in checks):
        pytest.skip("; ".join(c.line() for c in checks))
    inconclusive = [c for c in checks if c.status == audit.INCONCLUSIVE]
    if inconclusive:
        pytest.skip("inconclusive: " + "; ".join(c.line() for c in inconclusive))
