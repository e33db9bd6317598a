"""`treespec audit`: run the exactness contracts against one checkpoint and its adapter.

    treespec audit --model PATH [--draft-model PATH] [--adapter module:attr]
                   [--json] [--block N] [--allow-inexact]

Each property is one function (``check_*`` in the ``*_props`` modules): it
takes a :class:`Subject` (the model, the adapter factory and walk under
audit, the options) and returns :class:`Check` records (name, status,
verdict, detail, first failure, max |diff|). :func:`check` runs one property by
name, :func:`run` all of them; suites/audit/test_user_model.py parametrises
pytest over :data:`PROPERTIES` with the same functions.

References are the suites' own: a plain mlx-lm forward over each node's
root path from a copy of the identically prefilled cache (contract 6), a
cache that was only ever fed the accepted path (contract 7), mlx-lm's chain
accept loop (contract 2) and ``mlx_lm.generate`` (contract 9). Numeric
comparisons are judged against the model's envelope measured in the same
run (treespec.evidence.numerics): bit for bit where the backend is exact, within the
envelope elsewhere with the negative controls separating, inconclusive where
they do not; data movement (what a commit keeps) is bit for bit everywhere.
``--allow-inexact`` accepts what is beyond that within ``--tolerance``
(reported as "inexact").

A user adapter (``--adapter module:attr``) is any callable ``attr(model)``
returning an object with ``verify(tree, cache, start=0)``,
``commit(cache, tree, path, offset=None)`` and ``check(tree, cache, start=0)``
(treespec.verify.TreeAdapter's interface); if it also has
``walk(tree, target_tokens)`` that walk is audited and used instead of
treespec.walk.tree_walk. It is handed to the round loop and the gate as
their ``adapter=`` / ``walk=`` arguments.
"""

from .command import cmd_audit
from .records import (FAIL, INCONCLUSIVE, INEXACT, NOT_VERIFIED, PASS, SKIP, VERIFYING, Check,
                      Options, Report)
from .runner import CHECKS, PROPERTIES, audit, check, format_report, header, run
from .subject import Subject, load_adapter, subject

__all__ = ["CHECKS", "FAIL", "INCONCLUSIVE", "INEXACT", "NOT_VERIFIED", "PASS", "PROPERTIES", "SKIP",
           "VERIFYING", "Check", "Options",
           "Report", "Subject", "audit", "check", "cmd_audit", "format_report",
           "header", "load_adapter", "run", "subject"]
