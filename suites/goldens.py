"""What the suite says of goldens, in one place and importable before MLX is
(the root conftest.py reads it before ``--device`` is applied): the prefix of
the skip a test gives where this backend has no golden yet (counted apart by
suites/verdict.py, a failure under ``--strict-verdicts``), and the one step
that records a backend's goldens, texts and envelopes alike (the tests marked
``goldens``), the same on every backend, in one process as syrupy writes."""

GOLDEN_MISSING = "golden not recorded"
RECORD_GOLDENS = "python -m pytest -m goldens --snapshot-update"
