"""treespec's benchmarks: one module per lasting question, run from the
repository root as ``python -m benchmarks.NAME ...`` (``--help`` says what
each measures), against the installed package and its public names only.

Every benchmark takes its pair and timing flags from ``benchmarks.harness``
(``--pair default|weak|zoo|scaled``, ``--dims HxL``, ``--alpha``,
``--repeats``, ``--calls``, ``--out``), times its items interleaved
(treespec.bench.timing: medians of passes in a rotated order, ratios taken
within a pass) and writes what it prints to
``results/<topic>/<commit>/<name>.txt``, the exact command on line 1 and the
machine and commit on line 2.

Not timed tests: suites/benchmarks only checks that each one starts
(``--help``) and that one runs end to end on the smallest pair.
"""
