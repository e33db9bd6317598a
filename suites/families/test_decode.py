"""Contract 9 beyond the zoo: tree decoding emits classic decoding's tokens, at
temperature 0, on a family of each mechanism the sweep made verify (every
recurrent mixer kind, the position stand-ins, cache lists, caches a layer
never writes, latent attentions verified as one-token steps), with a drafter
of the same family that disagrees with it (another seed), so rounds accept
partial paths and roll the rest back."""

import pytest

from suites.families import helpers_models as M
from treespec.decoding import decode

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
