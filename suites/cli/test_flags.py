"""`treespec generate`'s flags: mlx-lm's names and defaults, nothing accepted
and ignored, every refusal a one-line error naming the flag and the mode,
given before anything heavy is imported or loaded; the library refuses the
same options, spelled as keyword arguments (treespec.options)."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

from suites.helpers_subprocess import without_startup_notes
from treespec import zoo
from treespec.checkpoints import default_pair
from treespec.cli.main import COMMANDS, build_parser, command, main
from treespec.decoding import decode
from treespec.draft import FixedTreeDrafter
from treespec.errors import OptionError
from treespec.options import MAX_DRAFT_NODES

ROOT = Path(__file__).resolve().parents[2]


def error_of(capsys, *args) -> str:
    assert main(["generate", *args]) == 2
    err = without_startup_notes(capsys.readouterr().err)
    assert err.count("\n") == 1 and err.startswith("treespec generate: error: "), err
    return err


# (command-line flags, decode keyword arguments, what the CLI error says, what the library's says)
REFUSED = {
    "negative temperature": (["--temp", "-1"], dict(temperature=-1.0),
                             "--temp -1.0: must be a number >= 0", "temperature=-1.0"),
    "top-p out of range": (["--temp", "0.7", "--top-p", "2", "--mode", "chain"],
                           dict(temperature=0.7, top_p=2.0, mode="chain"),
                           "--top-p must be in [0, 1]", "top_p must be in [0, 1]"),
    "top-p at temperature 0": (["--top-p", "0.9"], dict(top_p=0.9),
                               "--top-p 0.9 acts only when sampling", "top_p=0.9 acts only"),
    "top-k at temperature 0": (["--top-k", "5"], dict(top_k=5), "--top-k 5 acts only",
                               "top_k=5 acts only"),
    "min-p at temperature 0": (["--min-p", "0.1"], dict(min_p=0.1), "--min-p 0.1 acts only",
                               "min_p=0.1 acts only"),
    "seed at temperature 0": (["--seed", "3"], dict(seed=3), "--seed 3 acts only when sampling",
                              "seed=3 acts only when sampling"),
    "branching without --mode tree": (["--tree-branching", "2,2"],
                                      dict(mode="chain", branching=[2, 2]),
                                      "--tree-branching 2,2 shapes a tree; it acts only in "
                                      "--mode tree, not --mode chain",
                                      "branching=[2, 2] shapes a tree; it acts only in "
                                      "mode='tree', not mode='chain'"),
    "budget without --mode tree": (["--budget", "3"], dict(mode="chain", budget=3),
                                   "--budget 3 shapes a tree", "budget=3 shapes a tree"),
    "width without --mode tree": (["--width", "3"], dict(mode="chain", width=3),
                                  "--width 3 shapes a tree", "width=3 shapes a tree"),
    "sampled tree without a shape": (["--mode", "tree", "--temp", "0.7"],
                                     dict(mode="tree", temperature=0.7),
                                     "--mode tree at --temp 0.7 needs a fixed shape "
                                     "(--tree-branching or --tree-parents)",
                                     "mode='tree' at temperature=0.7 needs a fixed shape"),
    "huge budget": (["--mode", "tree", "--budget=10000", "--max-tokens", "16"],
                    dict(mode="tree", budget=10000, max_tokens=16),
                    f"--budget 10000: 10000 draft nodes per round; at most {MAX_DRAFT_NODES}",
                    f"budget=10000: 10000 draft nodes per round; at most {MAX_DRAFT_NODES}"),
    "huge fixed tree": (["--mode", "tree", "--tree-branching", "8,8"],
                        dict(mode="tree", branching=[8, 8]),
                        f"--tree-branching 8,8: 72 draft nodes per round; at most "
                        f"{MAX_DRAFT_NODES}", "branching=[8, 8]: 72 draft nodes"),
    "huge chain": (["--num-draft-tokens", "65"], dict(mode="chain", block=66),
                   "--num-draft-tokens 65: 65 draft nodes", "block=66: 65 draft nodes"),
    "budget beside a fixed shape": (["--mode", "tree", "--tree-branching", "2,1", "--budget",
                                     "3"], dict(mode="tree", branching=[2, 1], budget=3),
                                    "--budget 3 sizes the confidence tree",
                                    "budget=3 sizes the confidence tree"),
    "a parent list that is no tree": (["--mode", "tree", "--tree-parents=-1,0,3"],
                                      dict(mode="tree", parents=[-1, 0, 3]),
                                      "--tree-parents -1,0,3: a parent list starts with the "
                                      "root's -1", "(node 2 does not)"),
    "two fixed shapes": (["--mode", "tree", "--tree-branching", "2", "--tree-parents=-1,0"],
                         dict(mode="tree", branching=[2], parents=[-1, 0]),
                         "give one fixed shape", "give one fixed shape"),
    "drafts in classic mode": (["--mode", "classic", "--num-draft-tokens", "5"],
                               dict(mode="classic", block=6),
                               "--num-draft-tokens 5 acts only in chain or tree decoding; "
                               "--mode classic drafts nothing",
                               "block=6 acts only in chain or tree decoding"),
    "allow-inexact in classic mode": (["--mode", "classic", "--allow-inexact"],
                                      dict(mode="classic", allow_inexact=True),
                                      "--allow-inexact acts only in chain or tree",
                                      "allow_inexact acts only in chain or tree"),
    "kv group size without kv bits": (["--kv-group-size", "32"], dict(kv_group_size=32),
                                      "--kv-group-size 32 acts only with --kv-bits",
                                      "kv_group_size=32 acts only with kv_bits"),
    "kv bits mx.quantize lacks": (["--kv-bits", "7"], dict(kv_bits=7),
                                  "--kv-bits 7: bits must be one of", "kv_bits=7: bits must be"),
    "max tokens below 1": (["-m", "0"], dict(max_tokens=0), "--max-tokens 0: must be",
                           "max_tokens=0: must be"),
    "batch levels on a chain": (["--batch-levels"], dict(batch_levels=True),
                                "--batch-levels acts only on a fixed tree's drafting (--mode "
                                "tree with --tree-branching or --tree-parents); --mode chain",
                                "batch_levels acts only on a fixed tree's drafting "
                                "(mode='tree' with branching or parents); mode='chain'"),
    "batch levels in classic mode": (["--mode", "classic", "--batch-levels"],
                                     dict(mode="classic", batch_levels=True),
                                     "--batch-levels acts only on a fixed tree's drafting",
                                     "batch_levels acts only on a fixed tree's drafting"),
    "batch levels on the confidence tree": (["--mode", "tree", "--batch-levels"],
                                            dict(mode="tree", batch_levels=True),
                                            "the confidence tree feeds its levels through the "
                                            "tree injection", "the confidence tree feeds"),
    "batch levels on a spine": (["--mode", "tree", "--tree-parents=-1,0,0,1,1", "--batch-levels"],
                                dict(mode="tree", parents=[-1, 0, 0, 1, 1], batch_levels=True),
                                "--batch-levels with --tree-parents -1,0,0,1,1: no level of "
                                "this tree feeds two or more nodes",
                                "batch_levels with parents=[-1, 0, 0, 1, 1]: no level"),
    "batch levels on a tree widening only at its leaves": (
        ["--mode", "tree", "--tree-branching", "1,1,3", "--batch-levels"],
        dict(mode="tree", branching=[1, 1, 3], batch_levels=True),
        "--batch-levels with --tree-branching 1,1,3: no level", "branching=[1, 1, 3]: no level"),
    "batch levels when sampling": (["--mode", "tree", "--tree-branching", "2,1", "--temp", "0.7",
                                    "--batch-levels"],
                                   dict(mode="tree", branching=[2, 1], temperature=0.7,
                                        batch_levels=True),
                                   "--batch-levels at --temp 0.7: the sampled tree draws its "
                                   "children on the host", "batch_levels at temperature=0.7"),
}


@pytest.mark.parametrize("flags,kwargs,cli_says,lib_says", REFUSED.values(), ids=REFUSED.keys())
def test_a_flag_that_cannot_act_is_an_error_naming_it_and_the_library_agrees(
        capsys, flags, kwargs, cli_says, lib_says, llama_pair):
    assert cli_says in error_of(capsys, *flags)
    target, draft = llama_pair
    mode = kwargs.get("mode", "chain")
    with pytest.raises(OptionError) as e:
        decode(target, [1, 2, 3], draft_model=draft if mode != "classic" else None,
               **{"mode": mode, **kwargs})
    assert lib_says in str(e.value)


def test_a_drafter_object_carries_its_own_shape_and_batch_levels(llama_pair):
    """``decode(drafter=...)``: the drafter is built already, so a shape
    option or ``batch_levels`` beside it would act on nothing: refused,
    naming the option and the drafter."""
    target, draft = llama_pair
    for kwargs, says in ((dict(branching=[2]), "branching=[2] with drafter: the drafter "
                          "carries its own shape"),
                         (dict(batch_levels=True), "batch_levels with drafter: the drafter "
                          "carries its own")):
        with pytest.raises(OptionError, match=re.escape(says)):
            decode(target, [1, 2, 3], draft_model=draft, mode="tree",
                   drafter=FixedTreeDrafter(branching=[2, 1]), **kwargs)


@pytest.fixture(scope="module")
def llama_pair():
    return zoo.build("llama"), zoo.drafter("llama")


AUTO_REFUSED = {
    "a shape": (["--budget", "3"], "--budget sets a shape, and --mode auto chooses the shape"),
    "sampling": (["--temp", "0.5"], "--mode auto calibrates greedy decoding; at --temp 0.5"),
    "kv options": (["--kv-bits", "4"], "--kv-bits: --mode auto calibrates with mlx-lm's "
                   "default caches"),
    "batch levels": (["--batch-levels"], "--batch-levels sets how a fixed tree drafts, and "
                     "--mode auto chooses the shape itself"),
}


@pytest.mark.parametrize("flags,says", AUTO_REFUSED.values(), ids=AUTO_REFUSED.keys())
def test_auto_refuses_what_it_would_override(capsys, flags, says):
    assert says in error_of(capsys, "--mode", "auto", *flags)


def test_model_alone_decodes_classically_and_its_draft_flags_say_why(capsys):
    target, _ = default_pair()
    err = error_of(capsys, "--model", str(target), "--num-draft-tokens", "5")
    assert "--mode classic (--model alone: no --draft-model given)" in err
    err = error_of(capsys, "--model", str(target), "--mode", "chain")
    assert "--mode chain needs a draft model (--draft-model)" in err


def test_a_draft_model_without_a_model_is_refused(capsys):
    _, draft = default_pair()
    assert "--draft-model given without --model" in error_of(capsys, "--draft-model", str(draft))


@pytest.mark.parametrize("flags", [["--num-draft-tokens", "3", "--block", "4"],
                                   ["--json", "--quiet"]], ids=["block and drafts", "json quiet"])
def test_flags_that_would_disagree_cannot_be_given_together(capsys, flags):
    with pytest.raises(SystemExit) as e:
        main(["generate", *flags])
    assert e.value.code == 2 and "not allowed with argument" in capsys.readouterr().err


def test_mlx_lm_names_and_defaults():
    # mlx_lm.generate: -m is --max-tokens (100), -p --prompt, --top-p 1.0 is off,
    # --num-draft-tokens 3, --kv-group-size 64 and --quantized-kv-start 5000 by default.
    args = build_parser().parse_args(["generate", "-m", "7", "-p", "x"])
    assert (args.max_tokens, args.prompt) == (7, "x")
    args = build_parser().parse_args(["generate"])
    assert args.max_tokens == 100 and args.top_p == 1.0 and args.temp == 0.0
    resolved = args.check(args)
    assert resolved.options.mode == "chain" and resolved.options.resolved_block == 4
    assert resolved.options.kv.group_size == 64 and resolved.options.kv.start == 5000
    # --block is the verify width: --num-draft-tokens + 1, the same option.
    a = build_parser().parse_args(["generate", "--block", "6"])
    b = build_parser().parse_args(["generate", "--num-draft-tokens", "5"])
    assert a.check(a).options == b.check(b).options


def test_help_names_the_default_pair(capsys):
    with pytest.raises(SystemExit):
        main(["generate", "--help"])
    help_text = capsys.readouterr().out
    assert "built-in trained pair" in help_text and "zoo" not in help_text


def test_the_dispatch_table_names_each_commands_function():
    assert set(COMMANDS) == {"generate", "bench", "audit", "census"}
    for name in COMMANDS:
        assert callable(command(name))


LIGHT = """
import sys
from treespec.cli.main import main
for argv in ({argvs}):
    try:
        main(argv)
    except SystemExit:
        pass
heavy = sorted(m for m in ("mlx_lm", "transformers", "treespec.cli.generate", "treespec.decoding")
               if m in sys.modules)
print("HEAVY", heavy)
"""


def test_help_and_flag_errors_import_neither_mlx_lm_nor_the_decoder():
    argvs = ", ".join(repr(a) for a in (["--help"], ["generate", "--help"], ["bench", "--help"],
                                        ["generate", "--temp", "-1"],
                                        ["generate", "--mode", "tree", "--budget=10000"]))
    run = subprocess.run([sys.executable, "-c", LIGHT.format(argvs=argvs)], cwd=ROOT,
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert "HEAVY []" in run.stdout, run.stdout[-500:]
    assert run.stderr.count("error: --budget 10000") == 1


@pytest.mark.parametrize("flags,says", [
    (["--mode", "classic"], "--verify rows with --mode classic: classic decoding verifies no draft"),
    (["--mode", "auto"], "--verify rows with --mode auto: --mode auto calibrates the flat verify"),
], ids=["classic", "auto"])
def test_the_row_invariant_verify_is_refused_where_it_would_not_act(capsys, flags, says):
    assert says in error_of(capsys, "--verify", "rows", *flags)
