"""``treespec audit --draft-head``: the e2e rows (contract 9: chain and tree
decoding emit mlx_lm.generate's bytes) drafted by a hidden-state head, read
the way a user's checkpoint is (zoo qwen3_5 with its own ``mtp.*`` tensors),
and the head-state rows (the head's cache after every round).
A head only proposes, so the text alone cannot show that the head drafted:
each row's acceptance must be what decoding with that head gives, and not
what the target drafting for itself gives."""

import pytest

from suites.heads_drafting.helpers import PLANTS
from treespec import zoo
from treespec.audit.e2e_props import PROMPTS, check_e2e, e2e_modes, e2e_tokens
from treespec.audit.head_props import check_head_state
from treespec.audit.records import FAIL, PASS, Options
from treespec.audit.runner import check, properties_for
from treespec.audit.subject import subject
from treespec.checkpoints import default_pair
from treespec.cli import main as cli
from treespec.decoding import decode


def _acceptance(s, **drafting) -> list:
    n, eos = e2e_tokens(s), list(s.tokenizer.eos_token_ids)
    out = []
    for kw in e2e_modes(s.options.block, head=True).values():
        runs = [decode(s.model, s.tokenizer.encode(p), max_tokens=n, eos_token_ids=eos, **drafting,
                       **kw).stats for p in PROMPTS]
        out.append(f"({sum(r.accepted for r in runs)}/{sum(r.proposed for r in runs)} "
                   "drafts accepted)")
    return out


def test_the_e2e_rows_are_drafted_by_the_head_and_are_mlx_lms_text():
    s = subject(zoo.mtp_checkpoint("qwen3_5"), head="mtp")
    checks = check_e2e(s)
    assert [c.status for c in checks] == [PASS] * 3, [c.line() for c in checks]
    assert [c.name for c in checks][-1] == "e2e[tree-dynamic-b6]"
    headed = _acceptance(s, draft_head=s.draft_head)
    assert all(a in c.detail for a, c in zip(headed, checks)), (headed, [c.detail for c in checks])
    # the target drafting for itself accepts otherwise: the rows are the head's
    assert headed != _acceptance(s, draft_model=s.model)


@pytest.mark.parametrize("extra,says", [
    (["--draft-model", "x"], "--draft-head with --draft-model"),
    ([], "--draft-head mtp: the target checkpoint"),  # zoo llama holds no mtp.* tensors
])
def test_a_head_the_audit_cannot_use_is_refused_in_one_line(capsys, extra, says):
    target = zoo.checkpoint("llama")
    assert cli.main(["audit", "--model", str(target), "--draft-head", "mtp", *extra]) == 2
    assert says in capsys.readouterr().err


# -- the head-state rows ------------------------------------------------------------
# With --draft-head the audit adds one head-state row per drafting mode: after
# every round the head's cache and queue against a fresh head fed the accepted
# text (treespec.audit.head_props; suites/heads_drafting checks the same with its
# own reference features). The zoo llama's speculators EAGLE-3 head is the
# cheapest head to load; 16 tokens a prompt keep the rows short.


def _subject(which):
    if which == "pair-mtp":  # the trained head: rounds accept multi-node paths
        target = default_pair()[0]
        return subject(target, head=str(target.parent / "head-mtp"),
                       options=Options(max_tokens=16))
    return subject(zoo.checkpoint("llama"), head=str(zoo.eagle3_checkpoint("llama")),
                   options=Options(max_tokens=16))


@pytest.fixture(scope="module")
def eagle3_subject():
    return _subject("llama-eagle3")


ROWS = ["head-state[chain-b4]", "head-state[tree-2x2x1]", "head-state[tree-dynamic-b6]"]


@pytest.mark.parametrize("which", ["llama-eagle3", "pair-mtp"])
def test_a_head_audit_has_head_state_rows_that_pass(which):
    s = _subject(which)
    assert "head-state" in properties_for(s)
    checks = check("head-state", s)
    assert [c.name for c in checks] == ROWS
    assert [c.status for c in checks] == [PASS] * 3, [c.line() for c in checks]
    # the pair's trained head gets drafts accepted: multi-node paths committed
    assert which != "pair-mtp" or all(" 0/" not in c.detail for c in checks), checks


# The dynamic tree drafts in copies of the head's cache: nothing to roll back there.
CAUGHT = {"cache not rolled back": ROWS[:2], "a rejected node's features": ROWS}


@pytest.mark.parametrize("plant", sorted(CAUGHT))
def test_a_planted_head_defect_fails_its_head_state_rows(eagle3_subject, plant):
    """The drafter handed in as an argument (never patched in); the e2e
    text would still be classic decoding's."""
    checks = check_head_state(eagle3_subject, drafter=PLANTS[plant])
    failed = [c.name for c in checks if c.status == FAIL]
    assert failed == CAUGHT[plant], [c.line() for c in checks]


def test_only_head_state_needs_a_head(capsys):
    assert cli.main(["audit", "--model", str(zoo.checkpoint("llama")), "--only",
                     "head-state"]) == 2
    assert "--only head-state: the head's state needs --draft-head" in capsys.readouterr().err
