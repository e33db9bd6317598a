"""Interleaved timing of named steps, for the benchmarks (benchmarks/): every
step once untimed, then ``repeats`` passes over all of them in an order
rotated every pass, so that a machine's drift and load move every step
alike; ratios are taken within a pass."""

import statistics
import time
from typing import Callable, Dict, List, Optional

Step = Callable[[], Optional[float]]


def interleaved(steps: Dict[str, Step], repeats: int, calls: int) -> Dict[str, List[float]]:
    """name -> one ms figure per pass: the median of ``calls`` calls. A step
    that returns seconds reports the part of its call it timed itself (the
    rest is set-up or clean-up); one that returns None is timed whole."""
    def ms(step):
        t0 = time.perf_counter()
        own = step()
        return 1e3 * (own if own is not None else time.perf_counter() - t0)

    for step in steps.values():  # warm-up: first compiles, first allocations
        step()
    names = list(steps)
    times = {n: [] for n in names}
    for r in range(repeats):
        k = r % len(names)
        for n in names[k:] + names[:k]:
            times[n].append(statistics.median(ms(steps[n]) for _ in range(calls)))
    return times


def ratio(times: Dict[str, List[float]], name: str, ref: str) -> float:
    """The median over passes of ``name``'s figure over ``ref``'s."""
    return statistics.median(a / b for a, b in zip(times[name], times[ref]))
