"""A linear tree verifies exactly as mlx-lm's own chain verify: the plain
``model(tokens[None], cache=cache)`` forward ``speculative_generate_step``
runs. Same logits bit for bit, and the caches end in the same state (every
array byte, every offset), on attention-only and hybrid recurrent models."""

import mlx.core as mx
import pytest

from suites.verify import support
from suites.verify.support import CONFIGS, KV_QUANT, clone, config_id, max_abs_diff, plain_rows, snapshot
from treespec.verify import adapter_for

pytestmark = pytest.mark.exactness


def _cases():
    for cfg in CONFIGS + KV_QUANT:
        hists = support.histories(cfg[0], cfg[3] if len(cfg) > 3 else None)
        for hist in (hists[1], hists[3], hists[4]):  # short, wrapped by prompt, by steps
            for name, tree in support.linear_trees(cfg[0]).items():
                yield pytest.param(cfg[:3], hist, tree, id=f"{config_id(cfg)}-h{hist.offset}-{name}")


@pytest.mark.parametrize("cfg, hist, tree", list(_cases()))
def test_a_linear_tree_verifies_exactly_as_mlx_lm_chain_verify(cfg, hist, tree):
    model = support.model(*cfg)
    cache = hist.replay(model)
    chain_cache = clone(cache)
    chain = plain_rows(model, chain_cache, tree.tokens)
    logits = adapter_for(model).verify(tree, cache)
    mx.eval(logits)
    assert mx.array_equal(chain, logits), max_abs_diff(chain, logits)
    assert snapshot(cache) == snapshot(chain_cache)
