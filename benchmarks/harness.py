"""What every benchmark shares: its flags, its pair, its timing and its record.

- ``parser``: the flags every benchmark takes: ``--pair`` (``default`` and
  ``weak``: the trained pair with that drafter; ``zoo``: a tiny seeded zoo
  family, ``--family``, and its noisy drafter; ``scaled``: the seeded scaled
  llama of ``--dims``/``--alpha`` and its first ``--draft-layers`` layers;
  ``thin``: a seeded random llama of ``--dims`` with a 256-token vocabulary
  and a 2-layer drafter of its own, where a forward's host work dominates),
  ``--dtype`` (zoo, scaled and thin), ``--repeats`` and ``--calls``
  (interleaved timing), ``--blas`` (the CPU BLAS, re-executing the command
  with it: ``prepare``), and where the record goes (``--out``, ``--topic``,
  ``--name``).
- ``load_pair``: that pair, through treespec's public loaders
  (treespec.checkpoints.load_default_pair, treespec.zoo, treespec.bench.scaled),
  with prompts that suit it: bench's Python prompts for a pair with the zoo's
  tokenizer, seeded token prompts for the random ones.
- ``interleaved``, ``ratio``: treespec.bench.timing's (every item once
  untimed, then passes over all in an order rotated every pass; ratios are
  medians of per-pass ratios); ``rotated``: the same order for a benchmark
  that times whole decodes itself.
- ``record``: prints and writes ``<out>/<topic>/<commit>/<name>.txt``, whose
  line 1 is the exact command (the environment variables that change what
  runs first: ``MLX_*``, ``LD_PRELOAD``, ``TREESPEC_*``, BLAS threads) and
  line 2 the machine and commit (platform, Python, MLX and its device,
  mlx-lm, the BLAS as treespec.backend.blas describes it, CPUs and load, the
  short commit, ``+dirty`` when tracked files differ from it).
"""

import argparse
import os
import platform
import shlex
import sys
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator, List, Optional, Sequence

import mlx.core as mx

from treespec import zoo
from treespec.auto.costcurve import build_llama
from treespec.backend import blas
from treespec.bench import scaled
from treespec.bench.prompts import PROMPTS
from treespec.bench.report import machine_info
from treespec.bench.timing import interleaved, ratio
from treespec.checkpoints import load_default_pair
from treespec.cli.flags import parse_dims
from treespec.models import n_params, vocab_size

__all__ = ["PAIRS", "Pair", "command_line", "interleaved", "load_pair", "machine_line", "parser",
           "prepare", "ratio", "record", "rotated"]

ROOT = Path(__file__).resolve().parents[1]
PAIRS = ("default", "weak", "zoo", "scaled", "thin")
# Environment variables that change what a run measures: written into line 1.
ENV_PREFIXES = ("MLX_", "TREESPEC_", "LD_PRELOAD", "OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")


def parser(name: str, doc: str, *, pairs: Sequence[str] = PAIRS, pair: Optional[str] = "scaled",
           dims=scaled.STUDY_DIMS, repeats: Optional[int] = 9,
           calls: Optional[int] = 5) -> argparse.ArgumentParser:
    """The argument parser of ``benchmarks.<name>``, its help the module's
    docstring, with the pair flags (none when ``pairs`` is empty), the
    timing flags (``--repeats``/``--calls`` where given a default) and the
    record's."""
    ap = argparse.ArgumentParser(prog=f"python -m benchmarks.{name}", description=doc,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.set_defaults(benchmark=name)
    if pairs:
        ap.add_argument("--pair", choices=tuple(pairs), default=pair,
                        help="default|weak: the trained pair with that drafter; zoo: a tiny "
                             "seeded zoo family (--family) and its drafter; scaled: the seeded "
                             "scaled llama (--dims, --alpha, --draft-layers); thin: a random "
                             "llama of --dims, vocabulary 256, and a 2-layer drafter "
                             "(default %(default)s)")
        ap.add_argument("--dims", type=parse_dims, default=dims,
                        help="HIDDENxLAYERS of the scaled or thin pair's target "
                             f"(default {dims[0]}x{dims[1]})")
        ap.add_argument("--alpha", type=float, default=scaled.STUDY_ALPHA,
                        help="the scaled pair's damping of the layers past the drafter's "
                             "(sets the agreement; default %(default)s)")
        ap.add_argument("--draft-layers", type=int, default=2,
                        help="the scaled pair's drafter: the target's first N layers")
        ap.add_argument("--family", default="llama", choices=zoo.FAMILIES,
                        help="the zoo pair's family")
        ap.add_argument("--dtype", choices=zoo.DTYPES,
                        help="zoo, scaled and thin pairs (default float32, bfloat16, bfloat16)")
    if repeats is not None:
        ap.add_argument("--repeats", type=int, default=repeats,
                        help="interleaved passes (default %(default)s)")
    if calls is not None:
        ap.add_argument("--calls", type=int, default=calls,
                        help="timed calls per item and pass, their median kept "
                             "(default %(default)s)")
    ap.add_argument("--blas", default="auto", choices=blas.CHOICES,
                    help="the CPU BLAS to run on: re-executes the command with it where it is "
                         "not the one loaded (default: keep the loaded one)")
    ap.add_argument("--out", type=Path, default=ROOT / "results",
                    help="the record goes to OUT/TOPIC/COMMIT/NAME.txt (default results/)")
    ap.add_argument("--topic", help="default cpu-bench, or gpu-bench on an accelerator")
    ap.add_argument("--name", help=f"the record's name (default {name.replace('_', '-')}-PAIR)")
    return ap


# ----------------------------------------------------------------------------- the pair


@dataclass
class Pair:
    """A target and its drafter, what they are (``what``, for the record's
    header) and a short tag for file names."""

    target: object
    draft: object
    what: str
    tag: str
    tokenizer: object = None  # None: the scaled and thin pairs (random weights know no text)
    eos: List[int] = field(default_factory=list)

    def prompts(self, n: int, length: int = 32) -> List[List[int]]:
        """``n`` prompts: bench's Python prompts (cycled past their 8) for a
        pair with a tokenizer, seeded token prompts of ``length`` otherwise."""
        if self.tokenizer is None:
            return scaled.default_prompts(n, length, vocab=vocab_size(self.target))
        return [self.tokenizer.encode(PROMPTS[i % len(PROMPTS)]) for i in range(n)]


def prepare(args) -> None:
    """What every benchmark does before it loads a model: the ``--blas`` it
    asked for (treespec.backend.blas.ensure_blas)."""
    blas.ensure_blas(args.blas)


def load_pair(args) -> Pair:
    """The pair ``parser``'s flags ask for, ``prepare`` done first."""
    prepare(args)
    if args.pair in ("default", "weak"):
        target, draft, tok = load_default_pair(args.pair)
        tag = "trained-pair" if args.pair == "default" else "weak-drafter"
        return Pair(target, draft, f"trained pair, {args.pair} drafter", tag, tok,
                    list(tok.eos_token_ids))
    if args.pair == "zoo":
        dtype = args.dtype or "float32"
        target, draft = zoo.build(args.family, dtype=dtype), zoo.drafter(args.family, dtype=dtype)
        return Pair(target, draft, f"zoo {args.family} {dtype} and its drafter",
                    f"zoo-{args.family}-{dtype}", zoo.tokenizer(), [zoo.token_id(zoo.EOS)])
    hidden, layers = args.dims
    dtype = args.dtype or "bfloat16"
    if args.pair == "thin":
        target = build_llama(hidden, layers, vocab=256, dtype=dtype)
        draft = build_llama(hidden, 2, vocab=256, dtype=dtype, seed=1)
        return Pair(target, draft, f"thin random llama {hidden}x{layers} {dtype}, vocabulary "
                    f"256, drafter a random {hidden}x2", f"thin-{hidden}x{layers}")
    target, draft = scaled.build_pair(hidden, layers, args.draft_layers, args.alpha, dtype)
    what = (f"scaled llama {hidden}x{layers} {dtype} ({n_params(target) / 1e9:.3f}B), drafter "
            f"its first {args.draft_layers} layers, alpha {args.alpha}")
    return Pair(target, draft, what, f"scaled-{hidden}x{layers}")


# ----------------------------------------------------------------------------- timing


def rotated(names: Sequence[str], repeats: int) -> Iterator[List[str]]:
    """The order of each of ``repeats`` passes over ``names``, rotated by one
    every pass (treespec.bench.timing.interleaved's), so that no item always
    runs first."""
    names = list(names)
    for r in range(repeats):
        k = r % len(names)
        yield names[k:] + names[:k]


# ----------------------------------------------------------------------------- the record


def command_line(name: str, argv: Optional[Sequence[str]] = None,
                 environ: Optional[dict] = None) -> str:
    """The command that reruns this benchmark: the environment variables that
    change what it runs, then ``python -m benchmarks.<name>`` and its
    arguments, shell-quoted."""
    environ = os.environ if environ is None else environ
    argv = sys.argv[1:] if argv is None else list(argv)
    env = [f"{k}={shlex.quote(v)}" for k, v in sorted(environ.items())
           if k.startswith(ENV_PREFIXES)]
    return " ".join(env + ["python", "-m", f"benchmarks.{name}"] + [shlex.quote(a) for a in argv])


def machine_line(info: Optional[dict] = None) -> str:
    """The machine and commit, one line (treespec.bench.report.machine_info)."""
    m = machine_info() if info is None else info
    attention = f"; {m['attention']}" if "attention" in m else ""
    load = m.get("loadavg")
    return (f"{platform.platform()}; python {m['python']}; mlx {m['mlx']} ({m['device']}), "
            f"mlx-lm {m.get('mlx_lm')}; {m['blas']}; {m['cpus']} CPUs, load "
            f"{load[0] if load else '?'}; treespec git {m['git']}{attention}")


def _free(path: Path) -> Path:
    """``path``, or ``NAME-2.txt``, ``NAME-3.txt``... when taken (a rerun)."""
    stem, n, free = path.stem, 1, path
    while free.exists():
        n += 1
        free = path.with_name(f"{stem}-{n}{path.suffix}")
    return free


@contextmanager
def record(args, pair: Optional[Pair] = None, what: str = "") -> Iterator[Callable[..., None]]:
    """Yields ``say``, a ``print`` that also writes the record: line 1 the
    command, line 2 the machine and commit, line 3 the pair (or ``what``),
    then every line said. The record's path is printed last."""
    info = machine_info()
    topic = args.topic or ("cpu-bench" if mx.default_device() == mx.cpu else "gpu-bench")
    name = args.name or "-".join(filter(None, (args.benchmark.replace("_", "-"),
                                               pair.tag if pair else None)))
    folder = Path(args.out) / topic / info["git"]
    folder.mkdir(parents=True, exist_ok=True)
    path = _free(folder / f"{name}.txt")
    with open(path, "w") as f:
        def say(*parts, sep=" ", end="\n"):
            text = sep.join(str(p) for p in parts) + end
            sys.stdout.write(text)
            sys.stdout.flush()
            f.write(text)
            f.flush()

        say(command_line(args.benchmark))
        say(machine_line(info))
        say(pair.what if pair else what)
        yield say
    print(f"(record: {path})", flush=True)
