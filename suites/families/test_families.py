"""Every model family of the installed mlx-lm verifies a branching tree and rolls
back exactly, or is refused with its specific reason; none is silently wrong.

One test per module (helpers.modules(): 126 in mlx-lm 0.32.2, plus variants),
each a tiny seeded model of mlx-lm's own classes (helpers_configs) verified
through ``adapter_for`` against mlx-lm's own forwards over root paths, from a
history inside and one past every window, then committed and decoded on
(suites/families/helpers says what is compared and the one documented
difference). Its line, printed at the end of the run, is the README's table
("Families"). The expected refusals and the audit record
(treespec.verify.audited) are pinned here: a family that starts or stops
verifying fails until both are updated.
"""

import json

import mlx.core as mx
import pytest
from mlx.utils import tree_flatten
from mlx_lm.utils import load_model

from suites.families import helpers as H
from suites.helpers_numerics import EXACT_REGIMES
from suites.verdict import expect
from treespec import numerics
from treespec.blas import regime
from suites.families.helpers_configs import config
from suites.hybrid.helpers import Flattened
from treespec.verify import TreeAdapter, adapter_for, tree_injected
from treespec.verify.audited import AUDITED

pytestmark = pytest.mark.exactness

# Refused, and the words the refusal must say (README, "Families": why).
REFUSED = {
    "baichuan_m1": "an attention that keeps a recurrent state of its own",
    "deepseek_v41": "LayerCache is not a cache mode treespec knows",
    "llama4": "chunked attention (llama4) builds its chunk mask from flattened row indices",
    "minimax_m3_vl": "minimax_m3_vl.Attention._block_mask",
    "nanochat": "nanochat.apply_rotary_emb (nanochat.py:32) applies rotary embeddings with "
                "mx.fast.rope itself",
    "phi3small": "phi3small.Attention._block_sparse_mask",
    "talkie": "talkie.Attention._rope (talkie.py:85) applies rotary embeddings with "
              "mx.fast.rope itself",
    "internlm2@dynamic": "DynamicNTKScalingRoPE computes its base from the scalar offset",
}
# Latent attentions treespec keeps on the multi-token path (helpers: MULTI_TOKEN),
# and why; every other latent attention verifies as one-token steps.
MULTI_TOKEN = {
    "deepseek_v32": "selects its keys (indexer top-k)",
    "glm_moe_dsa": "selects its keys (indexer top-k)",
}
# mlx-lm itself cannot run these here: not counted either way.
CANNOT_RUN = {
    "olmo": "SystemExit",  # its module exits at import without ai2-olmo
    "muse_spark": "No Metal back-end",  # a Metal-only kernel in its forward
}


def check(name: str, outcome: H.Outcome) -> None:
    """The sweep's verdict on one family: never WRONG, and the pinned one.

    What a family is (refused and why, unable to run, audited) is structure
    and holds on every backend. Which exact verdict it gets is numerics: the
    sweep compares bit for bit and measures no envelope of its own (its 126
    families would each need one), so on a regime that is not exact any
    verdict other than the pinned one is reported inconclusive, with its
    figures, never a pass (a root row's one-token difference there is the
    backend's dependence on the number of tokens as much as a defect); the
    contracts it stands for are judged against the envelope by the zoo
    suites there (suites/verify, suites/rollback, suites/hybrid)."""
    if "@" not in name and name not in CANNOT_RUN:
        audited = f"mlx_lm.models.{name}" in AUDITED
        assert audited == (name not in REFUSED), (
            f"treespec.verify.audited says {'audited' if audited else 'not audited'}: {outcome.line()}")
    if name in CANNOT_RUN:
        assert outcome.verdict == H.CANNOT_RUN and CANNOT_RUN[name] in outcome.detail, outcome.line()
        return
    if name in REFUSED:
        assert outcome.verdict == H.REFUSED and REFUSED[name] in outcome.detail, outcome.line()
        return
    if name in MULTI_TOKEN:
        pinned = outcome.verdict == H.MULTI_TOKEN
    else:  # a root row documented only by a wrapped window's ring order
        pinned = outcome.verdict == H.EXACT or (
            outcome.verdict == H.ROOT_ROW and "one-token path" not in outcome.detail)
    if not pinned and outcome.verdict not in (H.REFUSED, H.CANNOT_RUN) \
            and regime() not in EXACT_REGIMES:
        expect(numerics.Verdict(numerics.INCONCLUSIVE, detail=(
            f"the family sweep compares bit for bit, and {regime()} is not an exact regime: "
            f"{outcome.line()}")), H.CONTRACT, name)
    assert outcome.verdict != H.WRONG, f"silently wrong: {outcome.line()}"
    assert pinned, outcome.line()


@pytest.mark.slow
@pytest.mark.parametrize("name", H.modules())
def test_every_family_verifies_a_branching_tree_and_rolls_back_or_is_refused_by_reason(
        name, record_property):
    outcome = H.run(name)
    record_property("family", outcome.line())
    check(name, outcome)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gemma3", "gemma4", "qwen3_vl", "mistral3"])
def test_a_multimodal_checkpoint_verifies_its_language_model(name, tmp_path):
    """Saved as a checkpoint of the wrapper's model_type and loaded back by
    mlx-lm: the adapter reaches the language model inside the wrapper."""
    built = H.build(name)
    mx.save_safetensors(str(tmp_path / "model.safetensors"), dict(tree_flatten(built.parameters())))
    (tmp_path / "config.json").write_text(json.dumps(config(name)))
    loaded, _ = load_model(tmp_path)
    assert type(loaded) is type(built) and loaded.model_type == name
    check(name, H.run(name, model=loaded))


def test_nine_in_ten_families_mlx_lm_can_run_have_an_audit_record():
    names = [n for n in H.modules() if "@" not in n]
    runnable = [n for n in names if n not in CANNOT_RUN]
    assert {f"mlx_lm.models.{n}" for n in runnable} >= AUDITED
    assert len(AUDITED) >= 0.9 * len(runnable), (len(AUDITED), len(runnable))


class FlattenedScale(TreeAdapter):
    """Planted: ministral3 admitted with its query scale left at the
    flattened index (no re-indexing by depth)."""

    def injection(self, cache, tree, owners, start, plans=None, ropes=True):
        return tree_injected(self.model, cache, tree, self.family.rope_attr, owners, start,
                             positions=[], plans=plans, ropes=ropes)


class MultiTokenLatent(TreeAdapter):
    """Planted: a latent attention left on the multi-token path (no
    treespec.verify.per_node stand-ins), as every one was before."""

    def __init__(self, model):
        super().__init__(model, adapter_for(model).family)
        self._one_token = []


def test_a_latent_attention_left_on_the_multi_token_path_fails_its_pin():
    """deepseek_v3 verified through its multi-token branch: every node is
    mlx-lm's multi-token forward, not classic decoding's one-token step. The
    sweep says so (MULTI_TOKEN, with the figure) and the family's pin fails."""
    outcome = H.run("deepseek_v3", MultiTokenLatent)
    if outcome.verdict == H.WRONG:  # off an exact regime: inconclusive, with its figures
        check("deepseek_v3", outcome)
    assert outcome.verdict == H.MULTI_TOKEN, outcome.line()
    with pytest.raises(AssertionError):
        check("deepseek_v3", outcome)


@pytest.mark.parametrize("name, factory", [
    ("ministral3", lambda m: FlattenedScale(m, adapter_for(m).family)),
    ("mamba2", lambda m: adapter_for(m, recurrent=Flattened())),
], ids=["flattened-query-scale", "flattened-recurrence"])
def test_a_family_that_is_silently_wrong_fails_the_sweep(name, factory):
    """What the sweep would say of a family that verifies wrongly without
    refusing: WRONG, and its check fails. ministral3's scale is wrong only
    where the tree straddles a multiple of original_max_position_embeddings
    (8 in the tiny config: nodes past depth 3 from a 12-token history)."""
    outcome = H.run(name, factory)
    assert outcome.verdict == H.WRONG, outcome.line()
    with pytest.raises(AssertionError, match="silently wrong"):
        check(name, outcome)
