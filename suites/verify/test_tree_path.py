"""The tree path's own kernels: a chain verified through it (array mask,
per-node RoPE positions, the tree-aware recurrence) is correct by
construction, so its logits against the plain forward of the same tokens
measure only the kernels. Bit for bit where the backend's plain envelope is 0;
elsewhere within that envelope's bound, or the tree path is not admitted
into the envelope and this FAILs (treespec.evidence.numerics.tree_path_verdict)."""

import pytest

from suites.helpers_numerics import model_label
from suites.verdict import KERNELS, expect
from suites.verify import helpers
from suites.verify.helpers import CONFIGS, KV_GROUP, KV_QUANT, config_id
from treespec.evidence import numerics

pytestmark = pytest.mark.exactness


@pytest.mark.parametrize("cfg", CONFIGS + KV_QUANT, ids=config_id)
@pytest.mark.parametrize("context", [3, 12], ids=["context3-4", "context9-16"])
def test_a_chain_through_the_tree_path_is_the_plain_forward(cfg, context):
    model = helpers.model(*cfg[:3])
    kv_bits = cfg[3] if len(cfg) > 3 else None
    env = numerics.envelope(model, context, range(1, 10), kv_bits, KV_GROUP if kv_bits else None)
    verdict = numerics.tree_path_verdict(env)
    assert verdict is not None, f"the tree path refused a chain on {config_id(cfg)}"
    family, dtype = model_label(model)
    expect(verdict, KERNELS, family, dtype + (f" kv{kv_bits}" if kv_bits else ""))
