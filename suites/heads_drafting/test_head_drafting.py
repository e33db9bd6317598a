"""Drafting from a hidden-state head (treespec.draft.head): the target's
hidden states captured during forwards it runs anyway (treespec.verify.taps),
the head's cache kept on the accepted text, and the text exactly classic
decoding's.

A head changes what is proposed, never the output: so the text alone cannot
catch a head fed the wrong features. What does is the independent
recomputation: after every round, the head's cache and its queue equal those
of a fresh head fed the accepted text's features from one plain mlx-lm
forward of the target (suites/heads_drafting/helpers.py), bit for bit on an
exact backend. Each planted defect (the head's cache not rolled back, a
rejected node's features fed, the wrong layer tapped) keeps the text classic
and is caught there."""

import json
from functools import lru_cache

import mlx.core as mx
import mlx_lm
import numpy as np
import pytest

from suites.heads_drafting import helpers
from suites.helpers_numerics import exact_backend
from treespec import zoo
from treespec.checkpoints import default_pair
from treespec.cli.main import main
from treespec.decoding import decode
from treespec.draft.head import HeadDrafter
from treespec.errors import OptionError
from treespec.heads.base import FINAL
from treespec.heads.load import load_head
from treespec.models import prefilled
from treespec.tree import DraftTree
from treespec.verify import adapter_for
from treespec.verify.taps import tapped

pytestmark = pytest.mark.exactness

# The fixed shape has a spine (drafted on the head's cache itself) and then
# a level of two fed nodes (batch rows over copies of it); small shapes keep
# the gate's probe of the built-in pair short.
MODES = {
    "chain": dict(mode="chain", block=4),
    "fixed-1x2x1": dict(mode="tree", branching=[1, 2, 1]),
    "dynamic-b5w2": dict(mode="tree", budget=5, width=2),
}
PROMPT = [5, 80, 33, 21, 9, 14]


PAIR_DIR = default_pair()[0].parent


@lru_cache(maxsize=None)
def _loaded(which):
    """A target and its head, each loaded the way users load them
    (``mlx_lm.load`` and ``treespec.heads.load.load_head``): the built-in
    pair's trained heads (``pair-mtp``, ``pair-eagle3``), the zoo llama with
    its seeded speculators EAGLE-3 head directory, the zoo qwen3_5 and
    qwen3_next checkpoints with their own seeded ``mtp.*`` module."""
    family, kind = which.split("-")
    if family == "pair":
        target_dir, spec = default_pair()[0], str(PAIR_DIR / f"head-{kind}")
    elif kind == "eagle3":
        target_dir, spec = zoo.checkpoint(family), str(zoo.eagle3_checkpoint(family))
    else:
        target_dir, spec = zoo.mtp_checkpoint(family), "mtp"
    target, tokenizer = mlx_lm.load(str(target_dir))
    prompt = tokenizer.encode("def fibonacci(n):\n    ") if family == "pair" else PROMPT
    return target, load_head(spec, target, target_dir), prompt


@pytest.fixture(scope="module")
def zoo_llama():
    """The zoo llama with a head around its drafter (rounds accept some)."""
    return zoo.build("llama"), helpers.DraftModelHead(zoo.drafter("llama"), 64), PROMPT


# -- capture ------------------------------------------------------------------

TAPS = (FINAL, 0, -1)


def _root_path_features(model, family, text):
    """The last row of the taps of one plain forward of ``text``: the final
    norm's output read off mlx-lm's text model; the layers' outputs run
    layer by layer on llama and qwen3 (helpers.reference_features), and on
    the other families recorded during that plain forward (hybrids' layers
    take masks of two kinds, sliding windows their own: the llama and qwen3
    cases pin which output a tap is)."""
    if family in ("llama", "qwen3"):
        return helpers.reference_features(model, text, TAPS)[0, -1]
    final = helpers.reference_features(model, text, (FINAL,))[0, -1]
    with tapped(model, TAPS[1:]) as layers:
        model(mx.array(text)[None])
    return mx.concatenate([final, layers.features()[0, -1]])


@pytest.mark.parametrize("family", ["llama", "qwen3", "qwen3_5", "qwen3_next", "gemma3_text"])
def test_a_verify_hands_over_every_nodes_taps_equal_to_its_root_path_forward(family):
    """Each node's captured features (the final norm's output, decoder
    layers 0 and -1) equal the last row of a plain mlx-lm forward of the
    prompt plus that node's root path, on hybrids and sliding windows too;
    afterwards the model's layers and norm are its own again. Fails with
    the taps' layer index off by one, tried."""
    model = zoo.build(family)
    prompt = PROMPT
    tree = DraftTree([7, 11, 12, 13, 14, 15], [-1, 0, 0, 1, 1, 2])
    cache = prefilled(model, prompt[:-1])
    home = helpers.text_model(model)
    layers, norm = list(home.layers), home.norm
    adapter = adapter_for(model)
    adapter.vocab()  # read before: inside the block it would be a forward of its own
    with tapped(model, TAPS) as taps:
        adapter.verify(tree, cache)
    feats = taps.features()
    assert [id(x) for x in home.layers] == [id(x) for x in layers] and home.norm is norm
    for node in range(len(tree)):
        text = prompt[:-1] + [tree.tokens[i] for i in tree.path_to(node)]
        ref = _root_path_features(model, family, text)
        tol = 0 if exact_backend() else 1e-4
        np.testing.assert_allclose(np.array(feats[0, node]), np.array(ref), atol=tol, rtol=0,
                                   err_msg=f"node {node}")


def test_the_taps_come_out_when_the_forward_raises():
    """Restored in a ``finally``: a forward that raises leaves the model as
    it was (its layers and final norm the same objects)."""
    model = zoo.build("qwen3_next")
    home = helpers.text_model(model)
    layers, norm = [id(x) for x in home.layers], home.norm
    with pytest.raises(TypeError):  # MLX's, for a cache that is not one
        with tapped(model, (FINAL, 1)):
            model(mx.array([[1, 2]]), cache=["not a cache"] * len(layers))
    assert [id(x) for x in home.layers] == layers and home.norm is norm


# -- the text ---------------------------------------------------------------------

TARGETS = ["pair-mtp", "pair-eagle3", "llama-eagle3", "qwen3_5-mtp", "qwen3_next-mtp"]


@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("which", TARGETS)
def test_text_is_classic_decodings_with_a_head_drafting(which, mode):
    """Temperature 0: chain, fixed-tree and dynamic-tree rounds drafted by
    a head emit exactly mlx-lm's generate_step tokens (rounds.classic), with
    the gate in front, for every head layout and loading path: the pair's
    trained MTP and EAGLE-3 heads, the zoo's seeded ones."""
    target, head, prompt = _loaded(which)
    classic = decode(target, prompt, max_tokens=24)
    result = decode(target, prompt, max_tokens=24, draft_head=head, **MODES[mode])
    assert result.tokens == classic.tokens
    assert result.stats.gate is not None  # the gate ran in front
    if result.stats.gate["run"]:
        assert result.stats.proposed > 0 and result.stats.mode == MODES[mode]["mode"]


# Temperature > 0 draws every shape's children from the head's q
# (treespec.sampling.SampledHeadDrafter), the dynamic tree's included.
SAMPLED = sorted(MODES)


@pytest.mark.parametrize("mode", SAMPLED)
@pytest.mark.parametrize("which", TARGETS)
def test_sampling_at_top_k_1_with_a_head_is_greedy_decoding(which, mode):
    """top_k = 1 leaves one token in p and in the head's q: the sampled
    rule must emit classic greedy decoding's tokens, for every head layout
    (the EAGLE-3 heads' q is 0 outside their reduced draft vocabulary).
    The law at full temperature: suites/sampling/test_model.py."""
    target, head, prompt = _loaded(which)
    classic = decode(target, prompt, max_tokens=12)
    result = decode(target, prompt, max_tokens=12, draft_head=head, temperature=0.7, top_k=1,
                    seed=0, gate=False, **MODES[mode])
    assert result.tokens == classic.tokens
    assert result.stats.proposed > 0


@pytest.mark.parametrize("which", ["pair-eagle3", "llama-eagle3"])
def test_an_eagle3_heads_q_lies_in_its_draft_vocabulary(which):
    """Every expanded node's q is a distribution over the target's
    vocabulary that is 0 off the target ids the head's d2t reaches
    (``arange + d2t``, read from its checkpoint), and the node's children
    are distinct tokens it draws, q > 0."""
    target, head, prompt = _loaded(which)
    reach = np.zeros(head.vocab_size, dtype=bool)
    reach[np.array(head.target_ids())] = True
    seen = []

    def on_round(rnd, walk):
        for node, q in rnd.q.items():
            kids = [rnd.tree.tokens[c] for c in rnd.tree.children(node)]
            seen.append(node)
            assert q.shape == (head.vocab_size,) and abs(q.sum() - 1) < 1e-9
            assert not q[~reach].any(), f"q > 0 off the draft vocabulary at node {node}"
            assert len(set(kids)) == len(kids) and all(q[k] > 0 for k in kids)

    decode(target, prompt, mode="tree", branching=[2, 2], max_tokens=12, draft_head=head,
           temperature=1.0, seed=0, gate=False, on_round=on_round)
    assert seen


@pytest.mark.parametrize("prompt,shape", [
    ([9], dict(mode="chain", block=3)),
    ([9], dict(mode="tree", budget=4, width=2)),
    (PROMPT, dict(mode="tree", budget=0)),
], ids=["one-token-prompt-chain", "one-token-prompt-dynamic", "budget-0"])
def test_rounds_with_nothing_to_draft_from_keep_the_text_and_the_queue(zoo_llama, prompt, shape):
    """A one-token prompt has no features before its root (the first round
    drafts nothing, and its root joins the queue); a budget of 0 drafts
    nothing in any round. The text is classic decoding's and the head's
    state still matches a fresh head's after every round."""
    target, head, _ = zoo_llama
    drafter = HeadDrafter(head, **shape)
    result, recorder = _run(target, head, prompt, drafter, shape["mode"])
    assert result.tokens == decode(target, prompt, max_tokens=32).tokens
    helpers.check_against_fresh_head(head, target, prompt, recorder)


# -- the head's cache, and the plants -------------------------------------------


def _run(target, head, prompt, drafter, mode):
    recorder = helpers.Recorder(drafter)
    result = decode(target, prompt, mode=mode, max_tokens=32, draft_head=head,
                    drafter=drafter, on_round=recorder, gate=False)
    return result, recorder


@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("which", ["pair-mtp", "llama-eagle3"])
def test_after_every_round_the_heads_cache_is_a_fresh_heads_fed_the_accepted_text(which, mode):
    """The head's cache after each round's commit holds exactly the pairs
    (next token, target features) of the committed text up to the root, and
    its queue the rest, against a fresh head fed the features of one plain
    target forward (bit for bit on an exact backend): the cache was rolled
    back to the accepted path and re-fed the verifier's features for it.
    The pair's trained MTP head accepts often (multi-node paths are
    committed); the zoo's EAGLE-3 head reads two decoder layers' outputs."""
    target, head, prompt = _loaded(which)
    drafter = HeadDrafter(head, **MODES[mode])
    result, recorder = _run(target, head, prompt, drafter, MODES[mode]["mode"])
    assert not which.startswith("pair") or result.stats.accepted > 0
    helpers.check_against_fresh_head(head, target, prompt, recorder)


PLANTED = [(name, mode) for name in helpers.PLANTS for mode in sorted(MODES)
           # the dynamic tree drafts in copies of the head's cache: nothing to roll back
           if not (name == "cache not rolled back" and mode.startswith("dynamic"))]


@pytest.mark.parametrize("plant,mode", PLANTED)
def test_each_planted_head_defect_keeps_the_text_and_is_caught_by_the_fresh_head(
        zoo_llama, plant, mode):
    """The text stays classic decoding's (a head only proposes), and the
    comparison with a fresh head fed the plain forward's features fails."""
    target, head, prompt = zoo_llama
    drafter = helpers.PLANTS[plant](head, **MODES[mode])
    result, recorder = _run(target, head, prompt, drafter, MODES[mode]["mode"])
    assert result.tokens == decode(target, prompt, max_tokens=32).tokens
    with pytest.raises(AssertionError):  # against the same measured bounds as the clean runs
        helpers.check_against_fresh_head(head, target, prompt, recorder)


MISFITS = {
    "vocabulary": (dict(vocab_size=zoo.VOCAB_SIZE + 1), r"its logits are \d+ wide"),
    "hidden size": (dict(target_hidden_size=32),
                    "it reads hidden states 32 wide, the target's are 64"),
    "taps": (dict(taps=(5,)), r"its taps \(5,\): tap 5 is outside the target's 2 decoder layers"),
}


@pytest.mark.parametrize("misfit", sorted(MISFITS))
def test_a_head_that_does_not_fit_the_target_is_refused_naming_draft_head(zoo_llama, misfit):
    """Asked before anything runs (no round, no probe): a head of another
    vocabulary, hidden size or layer count. Fails without the check, tried
    (the vocabulary: the run went on and drafted ids past the target's)."""
    target, _, prompt = zoo_llama
    head = helpers.DraftModelHead(zoo.drafter("llama"), 64)
    change, message = MISFITS[misfit]
    for name, value in change.items():
        object.__setattr__(head, name, value)
    rounds = []
    with pytest.raises(OptionError, match="draft_head: " + message):
        decode(target, prompt, mode="chain", draft_head=head, max_tokens=4,
               on_round=lambda *a: rounds.append(a))
    assert not rounds


# -- the command line ---------------------------------------------------------------


@pytest.mark.parametrize("model,head,shape,kind", [
    (None, "pair-eagle3", ["--mode", "tree", "--budget", "5", "--width", "2"], "dynamic"),
    ("qwen3_5", "mtp", ["--mode", "chain"], "chain"),
    # sampled: top-k 1 leaves the target one token, so the text is still classic's
    (None, "pair-eagle3", ["--mode", "tree", "--tree-branching", "2,1", "--temp", "0.7",
                           "--top-k", "1", "--seed", "3"], "sampled-fixed"),
    (None, "pair-eagle3", ["--mode", "tree", "--budget", "5", "--width", "2", "--temp", "0.7",
                           "--top-k", "1", "--seed", "3"], "sampled-dynamic"),
], ids=["pair-eagle3-dynamic", "qwen3_5-own-mtp-chain", "pair-eagle3-sampled-tree",
        "pair-eagle3-sampled-dynamic"])
def test_generate_with_draft_head_prints_classic_decodings_text(capsys, model, head, shape, kind):
    """``treespec generate --draft-head DIR`` (the pair's shipped EAGLE-3
    head) and ``--draft-head mtp`` (a checkpoint's own MTP module), greedy
    or sampled (``--temp``): the text and tokens are ``--mode classic``'s,
    and the diagnostics name the head."""
    target_dir = default_pair()[0] if model is None else zoo.mtp_checkpoint(model)
    spec = str(PAIR_DIR / "head-eagle3") if head == "pair-eagle3" else head
    common = ["generate", "--model", str(target_dir), "-m", "12", "--json", "-p", "def f(x):"]
    assert main([*common, "--mode", "classic"]) == 0
    classic = json.loads(capsys.readouterr().out)
    assert main([*common, "--draft-head", spec, *shape]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["tokens"] == classic["tokens"] and out["text"] == classic["text"]
    assert out["diagnostics"]["draft_head"] == spec
    assert out["diagnostics"]["requested"]["kind"] == kind


@pytest.mark.parametrize("flags,message", [
    (["--draft-model", "x"], "--draft-model and --draft-head: give one drafter"),
    (["--mode", "classic"], "--draft-head acts only in chain or tree decoding"),
    (["--mode", "tree", "--tree-branching", "2,1", "--batch-levels"],
     "--batch-levels with --draft-head"),
    (["--mode", "auto"], "--draft-head with --mode auto"),
])
def test_draft_head_flags_that_cannot_act_are_refused_naming_the_flags(capsys, flags, message):
    assert main(["generate", "--model", "m", "--draft-head", "mtp", *flags]) == 2
    assert message in capsys.readouterr().err
