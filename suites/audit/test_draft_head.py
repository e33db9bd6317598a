"""``treespec audit --draft-head``: the e2e rows (contract 9: chain and tree
decoding emit mlx_lm.generate's bytes) drafted by a hidden-state head, read
the way a user's checkpoint is (zoo qwen3_5 with its own ``mtp.*`` tensors).
A head only proposes, so the text alone cannot show that the head drafted:
each row's acceptance must be what decoding with that head gives, and not
what the target drafting for itself gives."""

import pytest

from treespec import zoo
from treespec.audit.e2e_props import PROMPTS, check_e2e, e2e_modes, e2e_tokens
from treespec.audit.records import PASS
from treespec.audit.subject import subject
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
