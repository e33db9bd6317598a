"""Recurrent mixers are measured, not named (docs/verify.md#recurrence-through-a-tree):
no device makes treespec refuse them. Where mlx-lm runs a kernel for the
recurrence (gated_delta_update, rwkv7's wkv7, the Mamba2 SSM step on a Metal
GPU), the tree-aware recurrence's per-depth calls hand it one token per batch
row, and the gate's probe verifies the run's branching shapes through those
same calls against one-token steps: where they are not classic decoding's
arithmetic, speculation declines, saying why, and the text is classic
decoding's. A chain goes through mlx-lm's own multi-token path, so a defect
of the per-depth step never declines it."""

from contextlib import contextmanager

import mlx.core as mx
import mlx.nn as nn
import pytest
from mlx_lm.models.cache import make_prompt_cache

from suites.families.helpers_models import build as family_model
from suites.helpers_gate import gate_verdict
from suites.hybrid import helpers as H
from suites.verdict import GATE, expect
from treespec import zoo
from treespec.decoding import decode
from treespec.tree import DraftTree
from treespec.verify import adapter_for
from treespec.verify.tree_recurrence import TreeRecurrence

pytestmark = pytest.mark.exactness

PROMPT = list(range(30, 44))
MAX_TOKENS = 20
TREES = {"fixed": dict(mode="tree", branching=[2, 2, 1]), "confidence": dict(mode="tree", budget=5)}


def _model(name):
    return H.build(name) if name in H.FAMILIES else family_model(name)


@pytest.mark.parametrize("name", ["qwen3_5", "qwen3_next", "mamba2"])
def test_a_recurrent_model_is_not_refused_by_the_device_it_runs_on(name, monkeypatch):
    """With a Metal GPU as the default device (as far as any name can tell),
    the adapter's checks of a branching tree and of a chain pass: what that
    device computes is for the gate to measure. Fails with the refusal by
    name this replaced (every recurrent mixer, chains included, on a Metal
    GPU unless TREESPEC_RECURRENT_KERNEL=allow), tried."""
    model = _model(name)
    cache = make_prompt_cache(model)
    model(mx.array([PROMPT]), cache=cache)
    mx.eval([c.state for c in cache])
    adapter = adapter_for(model)
    # Only the names change: no forward runs while they say "Metal GPU".
    monkeypatch.setattr(mx, "default_device", lambda: mx.Device(mx.gpu))
    monkeypatch.setattr(mx.metal, "is_available", lambda: True)
    monkeypatch.delenv("TREESPEC_RECURRENT_KERNEL", raising=False)  # the old opt-in, unset
    for tree in (DraftTree([1, 2, 3, 4], [-1, 0, 0, 1]), DraftTree.linear([1, 2, 3, 4])):
        adapter.check(tree, cache)


class DriftingStep(nn.Module):
    """Planted: a mixer whose step over a batch of several nodes rounds its
    output a few ulp away from the same step over one node, as a kernel that
    computes batched rows differently would. One node per call (classic
    decoding, and a chain's per-depth calls) is exact."""

    def __init__(self, mixer, batches):
        super().__init__()
        self.mixer = mixer
        self._batches = batches

    def __call__(self, inputs, mask=None, cache=None):
        out = self.mixer(inputs, mask=mask, cache=cache)
        self._batches.append(inputs.shape[0])
        if inputs.shape[0] > 1:
            out = out * (1 + 2 * mx.finfo(out.dtype).eps)
        return out


class FailingStep(DriftingStep):
    """Planted: a mixer whose step over a batch of several nodes fails as MLX
    reports a kernel it cannot launch (a RuntimeError)."""

    def __call__(self, inputs, mask=None, cache=None):
        self._batches.append(inputs.shape[0])
        if inputs.shape[0] > 1:
            raise RuntimeError("planted: [metal::Device] Unable to launch the batched kernel")
        return self.mixer(inputs, mask=mask, cache=cache)


class PlantedRecurrence(TreeRecurrence):
    """The tree-aware recurrence with every per-depth call going through
    ``step(mixer, batches)`` (:class:`DriftingStep`, :class:`FailingStep`);
    ``batches``: the batch of every such call."""

    def __init__(self, step):
        super().__init__()
        self.step, self.batches = step, []

    @contextmanager
    def inject(self, model, caches, tree):
        with super().inject(model, caches, tree) as wrappers:
            real = [(w, w.mixer) for w in wrappers or ()]
            for w, mixer in real:
                w.mixer = self.step(mixer, self.batches)
            try:
                yield wrappers
            finally:  # the stand-ins put these back into the model
                for w, mixer in real:
                    w.mixer = mixer


@pytest.mark.parametrize("mode", TREES.values(), ids=TREES.keys())
@pytest.mark.parametrize("family", H.FAMILIES)
def test_a_per_depth_step_wrong_only_for_several_nodes_is_declined_by_the_gate(family, mode):
    """The probe runs the run's branching shapes through the per-depth calls
    the rounds would make, several nodes per call, so a step wrong only there
    is declined with the probe's figures, and the text is classic decoding's.
    Fails with a probe that verifies chains only (the gate passes and the
    run goes on with the drifting step), tried."""
    target, draft = zoo.build(family), zoo.drafter(family)
    recurrence = PlantedRecurrence(DriftingStep)
    result = decode(target, PROMPT, draft_model=draft, max_tokens=MAX_TOKENS,
                    adapter=adapter_for(target, recurrent=recurrence),
                    adapter_name="planted: drifting per-depth step", **mode)
    gate = result.stats.summary()["gate"]
    assert result.stats.mode == f"classic (declined {mode['mode']})", gate
    # Declined: no round ran, so these calls were the probe's.
    assert max(recurrence.batches) > 1, "the probe never ran a per-depth call of several nodes"
    assert "shapes differ from single-token steps" in gate["reason"]
    assert result.tokens == decode(target, PROMPT, max_tokens=MAX_TOKENS).tokens


@pytest.mark.parametrize("family", H.FAMILIES)
def test_a_chain_never_meets_a_defect_of_the_per_depth_step(family):
    """A chain is verified through mlx-lm's own multi-token path, not per
    depth: the same planted step leaves a chain run as the gate finds it
    without the plant (on an exact backend: run, and mlx-lm's text)."""
    target, draft = zoo.build(family), zoo.drafter(family)
    recurrence = PlantedRecurrence(DriftingStep)
    result = decode(target, PROMPT, draft_model=draft, max_tokens=MAX_TOKENS, mode="chain",
                    block=4, adapter=adapter_for(target, recurrent=recurrence),
                    adapter_name="planted: drifting per-depth step")
    assert recurrence.batches == []
    expect(gate_verdict(result.stats.summary()["gate"], result.stats.mode, "chain"), GATE,
           family, "float32")
    assert result.tokens == decode(target, PROMPT, max_tokens=MAX_TOKENS).tokens


def test_a_per_depth_step_the_backend_cannot_run_is_a_decline_quoting_it():
    """A backend that cannot run the per-depth calls (MLX's RuntimeError) is
    met by the probe first: the run declines in one line quoting MLX, every
    cache put back, and decodes classically; no exception leaves decode."""
    target, draft = zoo.build("qwen3_5"), zoo.drafter("qwen3_5")
    result = decode(target, PROMPT, draft_model=draft, max_tokens=MAX_TOKENS,
                    adapter=adapter_for(target, recurrent=PlantedRecurrence(FailingStep)),
                    adapter_name="planted: failing per-depth step", **TREES["fixed"])
    gate = result.stats.summary()["gate"]
    assert result.stats.mode == "classic (declined tree)", gate
    assert "cannot run the probe's multi-token forwards" in gate["reason"]
    assert "Unable to launch the batched kernel" in gate["reason"]
    assert "\n" not in gate["reason"]
    assert result.tokens == decode(target, PROMPT, max_tokens=MAX_TOKENS).tokens
