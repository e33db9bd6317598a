"""Latent attentions verified as one-token steps (treespec.verify.per_node)
where a value the attention receives per position changes inside the tree:
mistral4's query scale steps at every multiple of
original_max_position_embeddings (8 in the tiny config), so from a 14-token
history the tree's nodes at depth 2 and 3 take another scale than its root.
Each node's row must be the whole model's one-token step after its root path
(classic decoding): bit for bit where the backend is exact, elsewhere within
the backend's measured envelope with the negative controls separating
(treespec.evidence.node_rows.verdict, suites/verify's rule), else inconclusive with the
figures."""

import copy

import mlx.core as mx
import numpy as np
import pytest
from mlx_lm.models.cache import make_prompt_cache

from suites.families import helpers as H
from suites.families import helpers_models as M
from suites.helpers_numerics import exact_backend
from suites.verdict import expect
from treespec.evidence import node_rows, numerics
from treespec.tree import DraftTree
from treespec.verify import adapter_for

pytestmark = pytest.mark.exactness


def test_a_per_position_scale_reaches_each_node_as_its_step_sees_it():
    model = M.build("mistral4")
    rng = np.random.RandomState(2)
    prompt = [int(t) for t in rng.randint(0, 256, 14)]
    tree = DraftTree([int(t) for t in rng.randint(0, 256, len(H.PARENTS))], H.PARENTS)
    cache = make_prompt_cache(model)
    M.forward(model, cache, prompt, stepped=False)
    before = copy.deepcopy(cache)
    verify = adapter_for(model).verify
    rows = verify(tree, cache)
    mx.eval(rows)
    refs = mx.stack([M.forward(model, copy.deepcopy(before),
                               [tree.tokens[j] for j in tree.path_to(i)], whole=True)[-1]
                     for i in range(len(tree))])
    if exact_backend():
        diffs = [M.maxdiff(refs[i], rows[i]) for i in range(len(tree))]
        assert diffs == [0.0] * len(tree), diffs
    env = lambda: numerics.envelope(model, len(prompt), numerics.widths_of(tree, 2))
    controls = lambda: numerics.controls(model, before, tree, refs)
    expect(node_rows.verdict(model, before, tree, rows, refs, env, "node rows vs classic decoding",
                             verify=verify, controls=controls),
           H.CONTRACT, "mistral4")
