"""Condense a --verdict-json file (per contract x family x dtype) into one
markdown row per contract: how many family x dtype rows got each verdict,
the largest difference and envelope seen, the weakest control.

    python scripts/verdict_summary.py results/verdicts/reference.json
"""

import json
import sys
from collections import defaultdict

WORDS = ("FAIL", "inconclusive", "within envelope", "declined by gate", "bit-exact")


def summary(path: str) -> str:
    data = json.loads(open(path).read())
    by = defaultdict(list)
    for r in data["rows"]:
        by[r["contract"]].append(r)
    out = [data["header"], "",
           "| contract | family x dtype rows | max abs diff | largest envelope | weakest control | tests |",
           "|---|---|---|---|---|---|"]
    fmt = lambda x: "-" if x is None else f"{x:.3g}"
    for contract, rows in sorted(by.items()):
        counts = defaultdict(int)
        for r in rows:
            counts[r["verdict"]] += 1
        words = ", ".join(f"{counts[w]} {w}" for w in WORDS if counts[w])
        pick = lambda k, f: f([r[k] for r in rows if r[k] is not None], default=None)
        out.append(f"| {contract} | {words} | {fmt(pick('max_diff', max))} | "
                   f"{fmt(pick('envelope', max))} | {fmt(pick('weakest_control', min))} | "
                   f"{sum(r['tests'] for r in rows)} |")
    return "\n".join(out)


if __name__ == "__main__":
    print(summary(sys.argv[1]))
