"""Condense a --verdict-json file into one markdown row per exactness contract.

    python -m benchmarks.verdict_summary results/verdicts/6514d03/reference.json

The file is what ``pytest -m exactness --verdict-json PATH`` writes
(suites/verdict.py: one row per contract x family x dtype). Per contract:
how many family x dtype rows got each verdict, the largest difference and
envelope seen, the weakest control, the tests. A reading tool, not a
measurement: it writes no record (benchmarks/device/exactness_timed.sh keeps
its output beside the JSON).
"""

import argparse
import json
from collections import defaultdict

WORDS = ("FAIL", "inconclusive", "within envelope", "declined by gate", "bit-exact")


def summary(path: str) -> str:
    with open(path) as f:
        data = json.load(f)
    by = defaultdict(list)
    for r in data["rows"]:
        by[r["contract"]].append(r)
    out = [data["header"], "",
           "| contract | family x dtype rows | max abs diff | largest envelope | weakest control "
           "| tests |",
           "|---|---|---|---|---|---|"]

    def fmt(x):
        return "-" if x is None else f"{x:.3g}"

    for contract, rows in sorted(by.items()):
        counts = defaultdict(int)
        for r in rows:
            counts[r["verdict"]] += 1
        words = ", ".join(f"{counts[w]} {w}" for w in WORDS if counts[w])

        def pick(key, f):
            return f([r[key] for r in rows if r[key] is not None], default=None)

        out.append(f"| {contract} | {words} | {fmt(pick('max_diff', max))} | "
                   f"{fmt(pick('envelope', max))} | {fmt(pick('weakest_control', min))} | "
                   f"{sum(r['tests'] for r in rows)} |")
    return "\n".join(out)


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m benchmarks.verdict_summary", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("path", help="a --verdict-json file")
    args = ap.parse_args(argv)
    print(summary(args.path))


if __name__ == "__main__":
    main()
