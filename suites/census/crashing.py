"""Rows per op for treespec.backend.census_child's tests, and their child
(``python -m suites.census.crashing SPEC``): the census's own rms_norm rows, but measuring the
float16 ``tokens`` rows (every shape) kill the process with SIGSEGV, as a faulting kernel
would (the H200's census, results/half-power)."""

import os
import signal
import sys

import mlx.core as mx

from treespec.backend.census import MEASURES
from treespec.backend.census_child import main


def _segfault_in_float16(build):
    def planted(spec, dtype, rng, widest, how):
        if dtype == mx.float16 and how == "tokens":
            os.kill(os.getpid(), signal.SIGSEGV)
        return build(spec, dtype, rng, widest, how)
    return planted


ROWS = {"rms_norm": [(op, how, _segfault_in_float16(build))
                     for op, how, build in MEASURES["rms_norm"]]}


if __name__ == "__main__":
    main(sys.argv[1:], ROWS)
