"""The launcher's group, and the ranks kept in step.

A collective pairs the calls of the ranks by their order alone. So any
decision that one rank takes from something local (a file on its disk, a
clock) and that changes which forwards it runs puts the ranks out of step:
their all-reduces then sum unrelated partial results, silently, and the text
is garbage (docs/distributed.md#why-the-ranks-can-drift). Here: joining the
group with a refusal where there is none, checking that every rank runs the
same command on the same checkpoint, and :class:`RankCheck`, the per-round
comparison of the walked path and emitted tokens (``--check-ranks``).
"""

import hashlib
import os
from pathlib import Path
from typing import Optional, Sequence

import mlx.core as mx
import numpy as np
from mlx_lm.generate import generation_stream

from ..errors import OptionError
from .lockstep import disagreement, row, tokens_disagreement

# Set by mlx.launch in every process it starts (mlx/_distributed_utils/launch.py).
LAUNCH_ENV = "MLX_RANK"

# The gate's probe runs forwards of the target, so collectives: every rank must
# measure it or none. Its disk memo is per machine and keyed by the rank's own
# weight shard and by treespec's source (which an edit changes between two ranks'
# reads), so one rank could read a verdict while another measures: the all-reduces
# then pair a probe forward with a decoding forward (reproduced: the probe "finds"
# differences of 17 and both ranks decode garbage). A sharded run names its adapter
# apart, and the gate memoizes on disk only the default name
# (treespec.evidence.gate.probe): every rank measures, in the same order.
SHARDED_ADAPTER = "treespec.verify.adapter_for (sharded: probed on every rank, not memoized)"


class RankDivergence(RuntimeError):
    """The ranks of a sharded target walked different paths or emitted
    different tokens: their collectives no longer pair up."""


def launched() -> bool:
    """Whether mlx.launch started this process."""
    return LAUNCH_ENV in os.environ


def join(flag: str, command: str = "generate"):
    """The distributed group this process was launched into, or OptionError
    naming ``flag`` where there is none to shard over."""
    if not mx.distributed.is_available():
        raise OptionError(f"{flag}: this MLX build has no distributed backend")
    group = mx.distributed.init()
    if group.size() < 2:
        raise OptionError(f"{flag}: no distributed group to shard over (this process is alone, "
                          f"a group of size {group.size()}): start every rank with mlx.launch, "
                          f"e.g. mlx.launch -n 2 --backend ring treespec {command} {flag} ...")
    return group


def stray(flags: str) -> Optional[str]:
    """Why a process mlx.launch started without a sharding flag must not run
    (each rank would decode the whole model alone and print), or None."""
    if not launched():
        return None
    group = mx.distributed.init()
    if group.size() < 2:
        return None
    return (f"this process is rank {group.rank()} of {group.size()} started by mlx.launch, but "
            f"{flags} was not given: every rank would decode the whole model alone; "
            f"add {flags} to shard the target across the ranks")


def gather(group, values: np.ndarray) -> np.ndarray:
    """Every rank's ``values`` (same shape and dtype on each), rank r's at row r.

    A collective pairs the ranks' calls by their order alone, and mlx-lm's
    classic decoding leaves one forward in flight on its generation stream
    (it evaluates the next token ahead): so the gather first waits for
    everything already on that stream, with its all-reduces, and only then
    runs, on the CPU's stream. Run on the generation stream itself it would
    be ordered too, but on MLX 0.32.4's CUDA build an all-gather or
    all-sum of a host-made array over the ring backend on that stream fails
    ("There is no Stream(cpu, N) in current thread"), while on the CPU's
    stream it runs on every build measured (results/distributed/README.md).
    Without the wait, a gather on another stream interleaved with that
    forward's all-reduces under OpenBLAS: the ranks gathered each other's
    activations as token counts (suites/distributed fails then)."""
    mx.synchronize(generation_stream)
    out = mx.distributed.all_gather(mx.array(values[None]), group=group, stream=mx.cpu)
    return np.array(out)


def fingerprint(argv: Sequence[str], paths: Sequence[Optional[str]] = ()) -> np.ndarray:
    """What must be the same on every rank, as 8 int32: the command line and
    each checkpoint's config.json and weight file names and sizes (cheap to
    read on a machine holding a large checkpoint, and where two machines hold
    different checkpoints at one path, they differ)."""
    h = hashlib.sha256("\0".join(argv).encode())
    for p in paths:
        if p is None:
            continue
        root = Path(p)
        config = root / "config.json"
        h.update(config.read_bytes() if config.is_file() else b"-")
        for w in sorted(root.glob("*.safetensors")):
            h.update(f"{w.name}:{w.stat().st_size}".encode())
    return np.frombuffer(h.digest(), dtype=np.int32).copy()


def agree(group, mine: np.ndarray, flag: str) -> None:
    """OptionError naming ``flag`` unless every rank's ``mine`` equals rank 0's."""
    rows = gather(group, mine)
    differ = [r for r in range(1, rows.shape[0]) if not np.array_equal(rows[r], rows[0])]
    if differ:
        raise OptionError(f"{flag}: rank(s) {', '.join(map(str, differ))} run a different "
                          "command line or checkpoint than rank 0 (config.json, weight files): "
                          "every rank must run the same command on the same checkpoint")


def digest(text: str) -> np.ndarray:
    """``text`` as 8 int32 (sha256): what the ranks exchange to compare a result."""
    return np.frombuffer(hashlib.sha256(text.encode()).digest(), dtype=np.int32).copy()


def same_result(group, text: str, what: str) -> None:
    """:class:`RankDivergence` unless every rank's ``text`` (a result's
    tokens or verdicts, written the same way on each) equals rank 0's: one
    all-gather of 8 int32 at the end of a command without rounds to check
    (bench, audit)."""
    rows = gather(group, digest(text))
    differ = [r for r in range(1, rows.shape[0]) if not np.array_equal(rows[r], rows[0])]
    if differ:
        raise RankDivergence(f"rank(s) {', '.join(map(str, differ))} got other {what} than "
                             "rank 0: the ranks ran different forwards")


def decode_kwargs(check: Optional["RankCheck"] = None) -> dict:
    """``treespec.decoding.decode``'s keyword arguments for a sharded target:
    the gate measured on every rank (:data:`SHARDED_ADAPTER`), and the rank
    check's hook where one is given."""
    out = {"adapter_name": SHARDED_ADAPTER}
    if check is not None:
        out["on_round"] = check.on_round
    return out


class RankCheck:
    """The ranks compared every round: ``on_round`` is the round loop's hook
    (``decode(on_round=...)``), one all-gather of :data:`lockstep.WIDTH`
    int32 per round; ``final(tokens)`` compares the whole emission (classic
    decoding has no rounds). Raises :class:`RankDivergence` at the first
    difference, on every rank at once (each sees every row)."""

    def __init__(self, group):
        self.group = group
        self.rounds = 0

    def on_round(self, rnd, walk) -> None:
        rows = gather(self.group, row(self.rounds, walk.path, walk.emitted))
        self.rounds += 1
        why = disagreement(rows)
        if why is not None:
            raise RankDivergence(why)

    def final(self, tokens: Sequence[int]) -> None:
        counts = gather(self.group, np.array([len(tokens)], dtype=np.int32))[:, 0]
        padded = np.full(max(1, int(counts.max())), -1, dtype=np.int32)  # never empty
        padded[:len(tokens)] = tokens
        why = tokens_disagreement(counts.tolist(), gather(self.group, padded))
        if why is not None:
            raise RankDivergence(why)


def start(flag: Optional[str], flags: str, argv: Sequence[str], paths: Sequence[Optional[str]],
          check_ranks: bool = False):
    """A command's distributed set-up: ``flag`` the sharding flag given (None:
    none; ``flags`` names them all for the refusal of a launched process
    without one), ``argv`` (the command, then its arguments) and checkpoint
    ``paths`` every rank must share. Returns (group or None, RankCheck or
    None); OptionError naming the flag."""
    if flag is None:
        why = stray(flags)
        if why is not None:
            raise OptionError(why)
        return None, None
    group = join(flag, argv[0] if argv else "generate")
    agree(group, fingerprint(argv, paths), flag)
    return group, RankCheck(group) if check_ranks else None
