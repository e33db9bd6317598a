"""Flag values of the command line, parsed: comma lists, block ranges, tree
shapes, HIDDENxLAYERS. Light on purpose (the package's tree module and the
standard library only): ``treespec --help`` and every argument check run
before MLX's model code or mlx-lm is imported."""

import argparse
from typing import List, Tuple

from ..errors import TreeError
from ..tree import DraftTree


def ints(text: str) -> List[int]:
    """'3,2,1' -> [3, 2, 1] (spaces ignored)."""
    try:
        return [int(x) for x in text.replace(" ", "").split(",") if x != ""]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}")


def check_shape(shape) -> None:
    """A fixed tree spec: branching factors (each >= 1) or a parent list
    (starting with the root's -1, each parent an earlier node). Raises
    ValueError naming what is wrong."""
    shape = [int(x) for x in shape]
    if not shape:
        raise ValueError("an empty shape")
    if shape[0] == -1:
        DraftTree([0] * len(shape), shape)  # TreeError names the bad node
    elif any(b < 1 for b in shape):
        raise ValueError(f"branching factors must be >= 1, got {shape}")


def parse_blocks(text: str) -> List[int]:
    """'2..8' -> [2..8]; '2,4,6' -> [2, 4, 6]; every block >= 2."""
    text = text.replace(" ", "")
    try:
        if ".." in text:
            lo, hi = (int(x) for x in text.split(".."))
            blocks = list(range(lo, hi + 1))
        else:
            blocks = [int(x) for x in text.split(",") if x]
    except ValueError:
        raise argparse.ArgumentTypeError(f"--blocks wants LO..HI or a comma list, got {text!r}")
    if not blocks or min(blocks) < 2:
        raise argparse.ArgumentTypeError(f"--blocks needs blocks >= 2 (one draft at least), "
                                         f"got {text!r}")
    return sorted(set(blocks))


def parse_trees(text: str) -> List[tuple]:
    """'2,1,1 2,2,1' (or ';'-separated) -> [(2,1,1), (2,2,1)]; '' -> []. A part
    that starts with -1 is a parent list ('-1,0,0,1,1': the chain plus the
    second-best token at each depth); on the command line write it
    ``--trees="-1,0,0,1,1"``, or argparse takes it for an option."""
    out = []
    for part in text.replace(";", " ").split():
        try:
            t = tuple(int(x) for x in part.split(",") if x)
        except ValueError:
            raise argparse.ArgumentTypeError(
                f"--trees wants branching lists like 2,2,1 or parent lists like -1,0,0,1, "
                f"got {part!r}")
        try:
            check_shape(t)
        except (ValueError, TreeError) as e:
            raise argparse.ArgumentTypeError(f"--trees: {part!r}: {e}")
        out.append(t)
    return out


def parse_dims(text: str) -> Tuple[int, int]:
    """'512x8' -> (hidden=512, layers=8)."""
    try:
        hidden, layers = (int(x) for x in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--dims wants HIDDENxLAYERS (e.g. 512x8), got {text!r}")
    return hidden, layers


VERIFY_MODES = ("flat", "rows", "kernels", "chunks")


def parse_verify(text: str) -> Tuple[str, ...]:
    """``flat``, ``rows``, ``kernels``, ``chunks`` or a comma list: the verify modes
    (treespec.verify.row_invariant), each once, in the order given."""
    modes = tuple(dict.fromkeys(m.strip() for m in text.split(",") if m.strip()))
    bad = [m for m in modes if m not in VERIFY_MODES]
    if not modes or bad:
        raise argparse.ArgumentTypeError(
            f"expected {', '.join(VERIFY_MODES)} (or a comma list), got {text!r}")
    return modes
