"""The zoo drafters: a seeded perturbation of the target that agrees with it
only partly (more noise, less agreement; none, the target itself), saved and
loaded like any checkpoint."""

import mlx.core as mx
import mlx_lm
import pytest

from suites.zoo.helpers import REQUIRED, prefill_then_step, random_tokens
from treespec import zoo

pytestmark = pytest.mark.exactness


def greedy_agreement(family, draft, seed):
    target = zoo.build(family)
    tokens = random_tokens(seed, (32, 16))
    agree = target(tokens).argmax(-1) == draft(tokens).argmax(-1)
    return agree.astype(mx.float32).mean().item()


@pytest.mark.parametrize("family", REQUIRED)
def test_the_default_drafter_agrees_with_its_target_only_partly(family):
    rate = greedy_agreement(family, zoo.drafter(family), seed=5)
    assert 0.3 <= rate <= 0.8, rate


def test_a_drafter_without_noise_is_its_target():
    tokens = random_tokens(6, (2, 10))
    draft = zoo.drafter("qwen3", noise=0.0)
    assert mx.array_equal(draft(tokens), zoo.build("qwen3")(tokens))


def test_more_drafter_noise_means_less_agreement():
    rates = [
        greedy_agreement("llama", zoo.drafter("llama", noise=n), seed=7)
        for n in (0.02, 0.13, 0.6)
    ]
    assert rates[0] > rates[1] > rates[2]


@pytest.mark.parametrize("family", ["llama", "qwen3_5"])
def test_a_drafter_checkpoint_loads_offline_with_identical_logits(
    family, zoo_root, offline
):
    path = zoo.drafter_checkpoint(family, root=zoo_root)
    loaded, _ = mlx_lm.load(str(path))
    tokens = random_tokens(8, (1, 9))
    built_first, built_step = prefill_then_step(zoo.drafter(family), tokens, 8)
    loaded_first, loaded_step = prefill_then_step(loaded, tokens, 8)
    assert mx.array_equal(built_first, loaded_first)
    assert mx.array_equal(built_step, loaded_step)
    target = zoo.build(family)(tokens[:, :8])
    assert not mx.array_equal(loaded_first, target)
