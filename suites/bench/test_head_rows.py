"""`treespec bench --draft-head`: a hidden-state head's rows beside the draft
model's, gated like every row (contract 10).

What must hold: every head row stands only next to the checks it passed in
the same run (the probe over its HeadDrafter's shapes, its text diffed with
classic's), its text is classic decoding's (checked here against mlx-lm's
own greedy generate_step, independently of the bench), and the row really
drafted from its head: its rounds are those of decode(draft_head=head) and
not those of the draft model on the same prompt. Bad flag combinations are
refused in one line naming --draft-head, before anything is measured.
"""

import json

import mlx.core as mx
import pytest
from mlx_lm.generate import generate_step

from suites.helpers_numerics import exact_backend
from suites.helpers_subprocess import without_startup_notes
from treespec import zoo
from treespec.bench import head_rows as H
from treespec.bench import measure as B
from treespec.checkpoints import default_pair, load_default_pair
from treespec.cli import main as cli
from treespec.decoding import decode
from treespec.draft.head import HeadDrafter
from treespec.heads.load import load_head

PAIR = default_pair()[0].parent
HEADS = [str(PAIR / "head-mtp"), str(PAIR / "head-eagle3")]
MAX_TOKENS = 12


def mlx_lm_greedy(target, prompt, n, eos):
    """The reference text: mlx-lm's own generate_step, greedy, to EOS or n."""
    out = []
    for tok, _ in generate_step(mx.array(prompt), target, max_tokens=n,
                                sampler=lambda lp: mx.argmax(lp, axis=-1)):
        out.append(int(tok))
        if out[-1] in eos:
            break
    return out


@pytest.fixture(scope="module")
def head_bench():
    target, draft, tok = load_default_pair()
    configs = H.with_heads(B.build_configs([3], [(2, 1)], mlx_lm=True, confidence=False),
                           HEADS, [3], [(2, 1)], width=2)
    heads = {s: load_head(s, target, PAIR / "target") for s in HEADS}
    for c in configs:
        if isinstance(c, H.HeadConfig):
            c.head_model = heads[c.head]
    prompt = tok.encode(B.PROMPTS[0])
    eos = list(tok.eos_token_ids)
    report = B.bench(target, draft, [prompt], configs,
                     B.BenchOptions(max_tokens=MAX_TOKENS, repeats=1, eos=eos, warmup_tokens=2))
    return target, draft, prompt, eos, configs, report


def test_every_head_gets_a_chain_fixed_and_dynamic_row_beside_the_draft_model(head_bench):
    *_, configs, report = head_bench
    names = [r["name"] for r in report["rows"]]
    rows = [f"{k} [head {n}]" for n in ("head-mtp", "head-eagle3")
            for k in ("chain b=3", "fixed [2,1]", "dynamic n=2 w=2")]
    # after the draft model's rows, before mlx-lm's: one interleaved run
    assert names == ["classic", "chain b=3", "fixed [2,1]", *rows, "mlx-lm b=3"]


def test_every_head_row_is_gated_and_its_text_is_classic(head_bench):
    target, _, prompt, eos, configs, report = head_bench
    reference = mlx_lm_greedy(target, prompt, MAX_TOKENS, set(eos))
    rows = {r["name"]: r for r in report["rows"]}
    for c in configs:
        if not isinstance(c, H.HeadConfig):
            continue
        r = rows[c.name]
        if not r["exact"]:
            # gated: only where the backend is inexact, and saying which check failed
            assert not exact_backend(), (c.name, r["reason"])
            assert r["reason"].startswith(("probe:", "text:")), (c.name, r)
            continue
        assert r["checks"] == "probe+text" and r["tokens"] == len(reference), (c.name, r)
        # the probe measured the shapes a HeadDrafter of this row drafts, all of them
        kw = c.decode_kwargs()
        shapes = HeadDrafter(c.head_model, kw.pop("mode"), **kw).probe_shapes()
        assert r["probe"]["exact"] and r["probe"]["reason"].startswith(
            f"probe passed: {len(shapes)} shapes"), (c.name, r["probe"])
        # the row's decode, run again, gives mlx-lm's greedy text
        run = B.run_config(c, target, None, prompt, MAX_TOKENS, eos)
        assert run.tokens == reference, c.name


@pytest.mark.parametrize("kind", ["head-chain", "head-fixed", "head-dynamic"])
def test_a_head_row_drafts_from_its_head_not_the_draft_model(head_bench, kind):
    """Both drafters give classic's text, so only the rounds tell them apart:
    the row's rounds are decode(draft_head=...)'s, and on this prompt the
    draft model's differ (checked, else the test could not tell)."""
    target, draft, prompt, eos, configs, report = head_bench
    rows = {r["name"]: r for r in report["rows"]}
    for c in (c for c in configs if c.kind == kind):
        kw = c.decode_kwargs()
        own = decode(target, prompt, max_tokens=MAX_TOKENS, eos_token_ids=eos, gate=False,
                     draft_head=c.head_model, **kw).stats
        other = decode(target, prompt, max_tokens=MAX_TOKENS, eos_token_ids=eos, gate=False,
                       draft_model=draft, **kw).stats
        got = B.run_config(c, target, draft, prompt, MAX_TOKENS, eos).stats
        assert (own.rounds, own.accepted) != (other.rounds, other.accepted), c.name
        assert (got["rounds"], got["accepted"]) == (own.rounds, own.accepted), c.name
        if rows[c.name]["exact"]:
            assert rows[c.name]["rounds"] == own.rounds, c.name


def test_flag_values_are_read_as_a_list_of_heads():
    assert H.parse_specs(["mtp", "a/h1,b/h2"]) == ["mtp", "a/h1", "b/h2"]
    for bad, why in (([""], "empty head spec"), (["x/h,y/h"], "[head h]")):
        with pytest.raises(ValueError, match=why.replace("[", r"\[").replace("]", r"\]")):
            H.parse_specs(bad)


@pytest.mark.parametrize("flags, message", [
    (["--scaled", "64x2"], "--draft-head with --scaled"),
    (["--sharded"], "--draft-head with --sharded"),
    (["--draft-head", ""], "--draft-head: an empty head spec"),
    # the pair's checkpoint holds no mtp.* tensors: no head to read
    ([], "--draft-head mtp: the target checkpoint"),
], ids=["scaled", "sharded", "empty", "no-mtp"])
def test_draft_head_refusals_name_the_flag(capsys, flags, message):
    assert cli.main(["bench", "--draft-head", "mtp", *flags, "--no-auto"]) == 2
    err = without_startup_notes(capsys.readouterr().err).strip()
    assert err.startswith("treespec bench: error: ") and message in err, err
    assert "\n" not in err and "Traceback" not in err, err


def test_a_head_that_does_not_fit_the_target_is_refused_naming_it(capsys):
    # the zoo's EAGLE-3 head reads a 64-wide llama; the pair's target is 256 wide
    head = zoo.eagle3_checkpoint("llama")
    assert cli.main(["bench", "--draft-head", str(head), "--no-auto"]) == 2
    err = without_startup_notes(capsys.readouterr().err).strip()
    assert err.startswith(f"treespec bench: error: --draft-head {head}: ") and "64" in err, err
    assert "\n" not in err, err


def test_with_model_mtp_reads_the_checkpoints_own_module(capsys):
    """``--draft-head mtp`` with --model reads the checkpoint's mtp.* tensors
    (the zoo's qwen3_5 carries a seeded module: random, so its acceptance is
    no concern here, only that its rows run and stand gated)."""
    ckpt = str(zoo.mtp_checkpoint("qwen3_5"))
    assert cli.main(["bench", "--model", ckpt, "--draft-model", ckpt, "--draft-head", "mtp",
                     "--prompts", "1", "--max-tokens", "4", "--repeats", "1", "--blocks", "2",
                     "--trees", "", "--no-auto", "--no-mlx-lm", "--no-confidence",
                     "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    heads = [r for r in report["rows"] if r["name"].endswith("[head mtp]")]
    assert [r["name"] for r in heads] == ["chain b=2 [head mtp]", "dynamic n=1 w=4 [head mtp]"]
    for r in heads:
        assert r["checks"] == "probe+text" or (
            not exact_backend() and r["reason"].startswith(("probe:", "text:"))), r
