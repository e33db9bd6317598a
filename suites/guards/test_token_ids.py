"""Token ids are checked where they enter the library: every id of a prompt,
of a draft tree and of a walk is an integer in [0, vocab) of the model that
reads it, and a drafter whose logits are not the target's width is refused.
The error names the argument, the position and the reason; nothing reaches
the embedding unchecked (ids past the table are read out of bounds or crash
the process)."""

import copy
import gc
import subprocess
import sys
import textwrap
import weakref

import mlx.core as mx
import mlx.nn as nn
import pytest

from suites.guards import helpers
from suites.guards.helpers import VOCAB
from treespec import rounds
from treespec.audit.states import fingerprint
from treespec.decoding import decode
from treespec.draft import ChainDrafter
from treespec.errors import TreeError
from treespec.models import prefilled, vocab_size
from treespec.options import DecodeOptions
from treespec.tree import DraftTree
from treespec.verify import adapter_for

pytestmark = pytest.mark.exactness

MODES = {"classic": {}, "chain": {"block": 3}, "tree": {"branching": [2, 1]}}


def run(mode, prompt, draft=None, **kw):
    draft = draft if draft is not None else helpers.drafter()
    extra = {} if mode == "classic" else {"draft_model": draft}
    return decode(helpers.model(), prompt, mode=mode, max_tokens=3, **MODES[mode], **extra, **kw)


@pytest.mark.parametrize("mode", MODES)
# (Ids just past either end of the table are read silently; farther ones
# crash the process: those are tried in a child, below.)
@pytest.mark.parametrize("bad", [VOCAB, -1])
def test_decode_refuses_a_prompt_id_outside_the_vocabulary(mode, bad):
    prompt = helpers.prompt(6)
    prompt[2] = bad
    with pytest.raises(ValueError, match=rf"prompt\[2\].*{bad}.*\[0, {VOCAB}\)"):
        run(mode, prompt)


@pytest.mark.parametrize("entry", ["classic", "speculative"])
def test_the_round_loops_refuse_a_prompt_id_outside_the_vocabulary(entry):
    prompt = helpers.prompt(6) + [VOCAB]
    with pytest.raises(ValueError, match=rf"prompt\[6\].*{VOCAB}"):
        if entry == "classic":
            rounds.classic(helpers.model(), prompt, 3)
        else:
            rounds.speculative(helpers.model(), helpers.drafter(), prompt, ChainDrafter(3),
                               DecodeOptions(mode="chain", max_tokens=3))


@pytest.mark.parametrize("vocab", [200, 1000])
@pytest.mark.parametrize("mode", ["chain", "tree"])
@pytest.mark.parametrize("temperature", [0.0, 0.7])
def test_a_drafter_of_another_vocabulary_is_refused(vocab, mode, temperature):
    draft = helpers.llama_of_vocabulary(vocab)
    with pytest.raises(ValueError, match=rf"draft_model.*{vocab}.*{VOCAB}"):
        run(mode, helpers.prompt(6), draft=draft, temperature=temperature)


def test_tree_verify_refuses_a_node_token_outside_the_vocabulary_and_writes_nothing():
    model = helpers.model()
    cache = prefilled(model, helpers.prompt(5))
    before = fingerprint(cache)
    for tree in (DraftTree([1, 2, VOCAB], [-1, 0, 0]), DraftTree([1, VOCAB], [-1, 0])):
        with pytest.raises(ValueError, match=rf"node {len(tree) - 1}.*{VOCAB}.*\[0, {VOCAB}\)"):
            adapter_for(model).verify(tree, cache)
        assert fingerprint(cache) == before


def test_tree_verify_refuses_device_tokens_that_are_not_integer_ids():
    model = helpers.model()
    cache = prefilled(model, helpers.prompt(5))
    before = fingerprint(cache)
    tree = DraftTree([0, 0, 0], [-1, 0, 0])
    with pytest.raises(TypeError, match=r"tokens.*float32"):
        adapter_for(model).verify(tree, cache, tokens=mx.array([1.0, 2.0, 3.0]))
    assert fingerprint(cache) == before


def test_a_draft_tree_refuses_token_ids_that_do_not_fit_int32():
    with pytest.raises(TreeError, match=r"node 1.*2147483648"):
        DraftTree([1, 2**31], [-1, 0])
    with pytest.raises(TreeError, match=r"node 2"):
        DraftTree.linear([1, 2]).push_child(1, 2**40)


# Ids far past the table crash the process (a segfault, measured at 2b3cd63;
# 2**31 and up raise std::bad_cast in some modes),
# so they are tried in a child whose exit status the test reads.
CHILD = textwrap.dedent("""
    import mlx.core as mx
    from suites.guards import helpers
    from treespec.decoding import decode
    from treespec.models import prefilled
    from treespec.tree import DraftTree
    from treespec.verify import adapter_for

    target, draft = helpers.model(), helpers.drafter()
    def tried(name, call, want):
        try:
            call()
            print(name, "RAN")
        except ValueError as e:
            print(name, "refused" if want in str(e) else f"MISNAMED {e}")
    for bad in (1000, 10**5, 10**6, 2**31 - 1, 2**31, 2**40):
        p = helpers.prompt(6) + [bad]
        for mode, kw in (("classic", {}), ("chain", {"block": 3}), ("tree", {"branching": [2]})):
            extra = {} if mode == "classic" else {"draft_model": draft}
            tried(f"{mode}-{bad}", lambda: decode(target, p, mode=mode, max_tokens=2, **kw,
                                                   **extra), "prompt[6]")
        cache = prefilled(target, helpers.prompt(5))
        tried(f"verify-{bad}", lambda: adapter_for(target).verify(DraftTree([1, bad], [-1, 0]),
                                                                  cache), "node 1")
    wide = helpers.llama_of_vocabulary(200000)
    tried("draft-200000", lambda: decode(target, helpers.prompt(6), mode="chain",
                                          draft_model=wide, max_tokens=4), "draft_model")
""")


@pytest.mark.slow
def test_no_id_past_the_table_reaches_the_model_even_where_it_would_crash():
    proc = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True,
                          timeout=600)
    lines = proc.stdout.split("\n")
    assert proc.returncode == 0, (proc.returncode, proc.stdout, proc.stderr[-2000:])
    results = dict(line.split(" ", 1) for line in lines if line)
    assert len(results) == 25 and set(results.values()) == {"refused"}, results


def test_the_vocabulary_is_read_once_per_model_and_again_once_a_module_is_swapped(monkeypatch):
    """``vocab_size`` builds a forward's graph (host work of a whole forward on
    a deep model, asked several times a decode), so it keeps the width on the
    model object with a snapshot of its module tree: a second call builds no
    forward; a head swapped in is read again, and the ids it no longer has
    are refused from then on; a copy of the model (another object, with the
    snapshot of the original's modules) is read for itself."""
    m = helpers.own_llama()  # changed below: not the process's shared model
    calls = [0]
    real = nn.Embedding.__call__

    def counting(self, x):
        calls[0] += 1
        return real(self, x)

    monkeypatch.setattr(nn.Embedding, "__call__", counting)
    assert vocab_size(m) == VOCAB and calls[0] == 1
    assert vocab_size(m) == VOCAB and calls[0] == 1
    decode(m, [VOCAB - 1, 1], max_tokens=1)  # the last id of the table is one of its ids
    m.lm_head = nn.Linear(m.args.hidden_size, VOCAB // 2, bias=False)
    assert vocab_size(m) == VOCAB // 2 and calls[0] >= 3  # (the decode's own forwards counted too)
    with pytest.raises(ValueError, match="prompt"):
        decode(m, [VOCAB - 1, 1], max_tokens=1)
    twin = copy.copy(m)  # shares m's modules, and the snapshot of them kept on m
    twin.lm_head = nn.Linear(m.args.hidden_size, VOCAB, bias=False)
    assert vocab_size(twin) == VOCAB and vocab_size(m) == VOCAB // 2


def test_a_model_whose_vocabulary_was_read_is_freed_with_its_last_reference():
    """What ``vocab_size`` keeps on the model holds the model itself only
    weakly: no reference cycle, so dropping the last reference frees the
    model (and its arrays) at once, not at the next cycle collection."""
    m = helpers.own_llama()  # its own: the process's shared one is never freed
    assert vocab_size(m) == VOCAB
    gone = weakref.ref(m)
    gc.disable()
    try:
        del m
        assert gone() is None
    finally:
        gc.enable()
