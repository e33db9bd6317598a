"""``treespec census``'s flags, checked before anything heavy loads (the
standard library only; the command itself is treespec.backend.census_command).

    --dtype float32,bfloat16   a comma list of DTYPES
    --widths 1..16             M values: N, LO..HI, or a comma list of them
"""

from typing import List, Tuple

from ..errors import UsageError

# treespec.backend.census.DTYPES, spelled here so that checking the flag needs no MLX.
DTYPES = ("float32", "bfloat16", "float16")
DEFAULT_WIDTHS = "1..16"


def parse_dtypes(text: str) -> Tuple[str, ...]:
    names = [d.strip() for d in text.split(",") if d.strip()]
    bad = [d for d in names if d not in DTYPES]
    if bad or not names:
        raise UsageError(f"--dtype: expected a comma list of {', '.join(DTYPES)}, got {text!r}")
    return tuple(dict.fromkeys(names))


def parse_widths(text: str) -> Tuple[int, ...]:
    """'1..16' -> (1, ..., 16); '1,2,4,8' and '1..4,8,16' too; every M >= 1."""
    out: List[int] = []
    try:
        for part in (p.strip() for p in text.split(",")):
            if ".." in part:
                lo, hi = (int(x) for x in part.split(".."))
                if hi < lo:
                    raise ValueError
                out += range(lo, hi + 1)
            elif part:
                out.append(int(part))
    except ValueError:
        raise UsageError(f"--widths: expected M, LO..HI or a comma list of them, got {text!r}")
    if not out or min(out) < 1:
        raise UsageError(f"--widths: every M must be at least 1 (M rows in one call), got {text!r}")
    return tuple(sorted(set(out)))


def check(args) -> None:
    """Every census flag, into ``args.dtypes`` (None: the default) and ``args.widths``."""
    args.dtypes = parse_dtypes(args.dtype) if args.dtype is not None else None
    args.widths = parse_widths(args.widths)
