"""The bench's gate: ``treespec.evidence.gate.decide`` with each shape's
measurement shared across the bench's configurations."""

import functools

from ..evidence.gate import (
    ADAPTER,
    DRAWS,
    Decision,
    compare_shape,
    configuration,
    unsound_decision,
    worst_diff,
)


class SharedProbe:
    """``treespec.evidence.gate.decide``, with the per-shape measurements shared across
    configurations. The gate's probe memoizes whole shape lists, and the bench's
    lists overlap heavily (chain b probes the chains 1..b, so blocks 2..8 would
    measure 35 chains where 8 are distinct). Each shape is measured by the gate's
    own ``compare_shape`` (its seed depends on the shape only), and a
    configuration passes only when every shape of its drafter's ``probe_shapes()``
    is bit-identical, as ``decide`` requires."""

    def __init__(self):
        self.results = {}
        self._config = {}

    def __call__(self, model, shapes, allow_inexact: bool = False, adapter=None,
                 adapter_name: str = ADAPTER):
        # adapter_name: decide's memo name, taken as decide takes it; the
        # measurements here are keyed by the adapter object itself.
        unsound = unsound_decision(model, shapes)
        if unsound is not None:
            return unsound
        key = id(model)
        if key not in self._config:
            self._config[key] = configuration(model)
        cfg = self._config[key]
        got = []
        for shape in (tuple(int(p) for p in s) for s in shapes):
            # per adapter: the row-invariant verifies are measured on their own
            at = (key, shape, None if adapter is None else id(adapter))
            if at not in self.results:
                self.results[at] = compare_shape(model, shape, DRAWS, adapter=adapter)
            got.append(self.results[at])
        bad = [r for r in got if not r.identical]
        where = f"{cfg['blas']}, {cfg['device']}"
        if not bad:
            return Decision(True, True, f"probe passed: {len(got)} shapes bit-identical to "
                            f"single-token steps ({where})")
        worst = functools.reduce(worst_diff, (r.max_abs_diff for r in bad))
        flips = sum(r.argmax_flips for r in bad)
        what = (f"{len(bad)} of {len(got)} shapes differ from single-token steps (max |diff| "
                f"{worst:.3g}, {flips} argmax flips; first at M={bad[0].m}) on {where}, "
                f"{cfg['dtypes']}")
        if allow_inexact:
            return Decision(True, False, f"INEXACT, running anyway (--allow-inexact): {what}")
        return Decision(False, False, f"declined: {what}")
