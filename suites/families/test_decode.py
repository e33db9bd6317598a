"""Contract 9 beyond the zoo: tree decoding emits classic decoding's tokens, at
temperature 0, on a family of each mechanism the sweep made verify (every
recurrent mixer kind, the position stand-ins, cache lists, caches a layer
never writes, latent attentions verified as one-token steps), with a drafter
of the same family that disagrees with it (another seed), so rounds accept
partial paths and roll the rest back."""

import mlx.core as mx
import pytest
from mlx_lm.models.cache import make_prompt_cache

from suites.families import helpers_models as M
from treespec.decoding import decode
from treespec.tree import DraftTree
from treespec.verify import TreeRefused, adapter_for

pytestmark = pytest.mark.exactness

FAMILIES = [
    "mamba", "mamba2", "falcon_h1", "rwkv7", "lfm2", "recurrent_gemma", "jamba",
    "nemotron_h", "longcat_flash_ngram", "bailing_moe_linear", "gpt2", "ministral3",
    "nemotron-nas", "hunyuan", "qwen", "deepseek_v3",
]
PROMPT = [5, 17, 3, 9]  # + 10 tokens: inside every window (16), past ministral3's scale step (8)


@pytest.mark.slow
@pytest.mark.parametrize("name", FAMILIES)
def test_tree_decoding_emits_the_classic_tokens(name):
    target, drafter = M.build(name), M.build(name, seed=1)
    classic = decode(target, PROMPT, max_tokens=10).tokens
    tree = decode(target, PROMPT, mode="tree", draft_model=drafter, branching=(2, 2, 1),
                  max_tokens=10, gate=False)
    assert tree.tokens == classic
    assert tree.stats.rounds > 1 and tree.stats.accepted < tree.stats.proposed, (
        "the drafter agreed everywhere: nothing was rolled back")


# Refused a tree verify for a reason of trees alone (RoPE applied by hand,
# masks built from flattened indices): a chain has contiguous positions and
# the causal mask, mlx-lm's own chain verify, so chain decoding runs.
TREE_ONLY_REFUSALS = {"nanochat": "applies rotary embeddings with mx.fast.rope itself",
                      "talkie": "applies rotary embeddings with mx.fast.rope itself",
                      "phi3small": "computes with arange in the forward"}


@pytest.mark.parametrize("name", sorted(TREE_ONLY_REFUSALS))
def test_a_chain_is_never_refused_for_a_reason_of_trees_alone(name):
    target, drafter = M.build(name), M.build(name, seed=1)
    classic = decode(target, PROMPT, max_tokens=10).tokens
    chain = decode(target, PROMPT, mode="chain", draft_model=drafter, block=3, max_tokens=10)
    assert chain.tokens == classic
    # The gate measured the chain (it may decline where the backend is inexact, or where
    # the tiny model's multi-token forward is not finite: phi3small's block-sparse mask).
    assert chain.stats.mode in ("chain", "classic (declined chain)"), chain.stats.mode
    if chain.stats.mode == "chain":
        assert chain.stats.rounds > 1 and chain.stats.accepted < chain.stats.proposed
    with pytest.raises(TreeRefused, match=TREE_ONLY_REFUSALS[name]):
        decode(target, PROMPT, mode="tree", draft_model=drafter, branching=(2, 1), max_tokens=10)
    # A branching tree handed to the chain adapter is refused before anything is written.
    adapter = adapter_for(target, chains=True)
    cache = make_prompt_cache(target)
    target(mx.array([PROMPT]), cache=cache)
    before = [c.offset for c in cache]
    with pytest.raises(TreeRefused, match="only chains verify here"):
        adapter.verify(DraftTree([1, 2, 3], [-1, 0, 0]), cache)
    assert [c.offset for c in cache] == before
