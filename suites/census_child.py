"""The suite's census child (``python -m suites.census_child SPEC``):
treespec.backend.census_child's main under the plant the calling process
runs under (``TREESPEC_PLANT``, set by suites/planted.py), so that the
census in a child measures the backend the tests see, planted or not, as
it did when it ran in the tests' own process."""

import os
import sys
from contextlib import nullcontext

from suites.planted import PLANT_ENV, planted
from treespec.backend.census_child import main

if __name__ == "__main__":
    name = os.environ.get(PLANT_ENV)
    with planted(name) if name else nullcontext():
        main(sys.argv[1:])
