"""Audit properties of the backend's numerics: the envelope itself
(treespec.evidence.numerics: how far multi-token forwards, plain and through the
adapter's tree path, are from single-token steps, and whether the negative
controls separate from it), and the exactness probe (treespec.evidence.gate): each
node of a tree verify against single-token steps over its root path, over
the e2e drafters' shapes, with the adapter under audit. A probe that
differs within the envelope makes the gate decline (correct: "declined by
gate"); beyond it, the tree verify is wrong (FAIL)."""

import hashlib
import json
from typing import List, Optional

from ..evidence import numerics
from ..draft import make_drafter
from ..errors import TreeRefused
from ..evidence.gate import CONTEXT, Probe, compare_shape, configuration
from .e2e_props import e2e_modes
from .records import FAIL, INCONCLUSIVE, INEXACT, PASS, SKIP, Check
from .subject import Subject, the_adapter


def probe_shapes(block: int) -> List[tuple]:
    """The shapes the e2e drafters verify (their ``probe_shapes``), in order."""
    shapes = []
    for kw in e2e_modes(block).values():
        for sh in make_drafter(**kw).probe_shapes():
            if tuple(sh) not in shapes:
                shapes.append(tuple(sh))
    return shapes


def _probe(s: Subject, shapes, context: Optional[int] = None, draws: Optional[int] = None):
    """treespec.evidence.gate's measurement of ``shapes`` with the adapter under audit
    (compare_shape, not the memoized gate.probe: its key does not name the
    adapter). Returns (Probe, refused shapes)."""
    context = CONTEXT if context is None else context
    draws = s.options.draws if draws is None else draws
    config = configuration(s.model)
    blob = json.dumps([config, shapes, s.adapter_source, context, draws, s.options.seed])
    probe = Probe(hashlib.sha256(blob.encode()).hexdigest()[:16], config)
    refused = []
    adapter = the_adapter(s)
    for sh in shapes:
        try:
            probe.shapes.append(compare_shape(s.model, sh, draws=draws,
                                              seed=s.options.seed, context=context,
                                              adapter=adapter))
        except TreeRefused as e:
            refused.append((sh, e.reason))
    return probe, refused


def check_probe(s: Subject) -> List[Check]:
    """treespec.evidence.gate's exactness probe (each node of a tree verify vs
    single-token steps over its root path, the way classic decoding computes
    it) over the e2e drafters' shapes, with the adapter under audit. On a
    sliding window the probe's context wraps the ring: the verify lays the
    ring out as the one-token steps see it (docs/verify.md#sliding-window-rings), so there too
    any difference is the backend's (within its envelope) or a FAIL."""
    the_adapter(s)
    shapes = probe_shapes(s.options.block)
    probe, refused = _probe(s, shapes)
    s._memo["probe"] = probe
    if not probe.shapes:  # every shape refused: nothing was compared
        return [Check("probe", SKIP, f"the adapter refuses every shape ({refused[0][1]})")]
    note = f"; {len(refused)} shapes refused ({refused[0][1]})" if refused else ""
    bad = [r for r in probe.shapes if not r.identical]
    ms = sorted({r.m for r in probe.shapes})
    if not bad:
        return [Check("probe", PASS, f"{len(probe.shapes)} shapes (M {ms[0]}-{ms[-1]}) x "
                      f"{s.options.draws} draws bit-identical to single-token steps, 0 argmax "
                      f"flips{note}", max_diff=0.0)]
    first = {"shape": list(bad[0].shape), "node": bad[0].first_node,
             "max_abs_diff": bad[0].max_abs_diff,
             "message": f"M={bad[0].m} shape {','.join(map(str, bad[0].shape))} node {bad[0].first_node}"}
    detail = (f"{len(bad)}/{len(probe.shapes)} shapes differ from single-token steps, max |diff| "
              f"{probe.max_abs_diff:.3g}, {probe.argmax_flips} argmax flips; first: {first['message']}")
    declined = numerics.DECLINED
    env = _envelope(s, shapes)
    if not env.exact and probe.max_abs_diff <= env.bound:
        return [Check("probe", PASS, (
            f"{detail}: within the backend's envelope (bound {env.bound:.3g}; {env.line()}), "
            f"so treespec.evidence.gate declines speculative decoding here unless --allow-inexact"
            f"{note}"), first, probe.max_abs_diff, verdict=declined)]
    detail += f"; beyond the envelope's bound {env.bound:.3g} ({env.line()})"
    return [Check("probe", INEXACT if s.options.allow_inexact else FAIL, detail + note, first,
                  probe.max_abs_diff)]


def _envelope(s: Subject, shapes, context: int = CONTEXT):
    widths = range(1, max(len(sh) for sh in shapes) + 1)
    return numerics.envelope(s.model, context, widths, adapter=the_adapter(s),
                             adapter_name=s.adapter_source)


def check_envelope(s: Subject) -> List[Check]:
    """The backend's envelope for this model at the probe's context and the
    drafters' widths (treespec.evidence.numerics), with the adapter's tree path: 0 on
    an exact backend; elsewhere admitted only if the tree path agrees with
    the plain forward and the negative controls land far outside it."""
    env = _envelope(s, probe_shapes(s.options.block))
    if env.exact:
        return [Check("envelope", PASS, f"multi-token forwards bit-identical to single-token steps, "
                      f"the tree path too: {env.line()}", max_diff=0.0)]
    v = numerics.tree_path_verdict(env)
    if v is None:
        v = numerics.Verdict(numerics.INCONCLUSIVE, detail=f"the tree path refused a chain: {env.line()}")
    status = {numerics.FAIL: FAIL, numerics.INCONCLUSIVE: INCONCLUSIVE}.get(v.word, PASS)
    first = {"message": v.detail, "max_abs_diff": v.max_diff} if v.word == numerics.FAIL else None
    return [Check("envelope", status, v.detail, first, env.value, verdict=v.word)]
