"""The ranks' agreement on a round, as pure logic (numpy).

Every rank of a sharded target computes the same logits (the all-reduces give
each rank the same sums), so every rank must walk the same path and emit the
same tokens. A round is packed into one fixed-width row of int32, so that the
ranks can exchange it in one all-gather of a known shape; ``disagreement``
reads the gathered rows back. The row has a fixed width because a collective
pairs calls by order, not by meaning: ranks that sent rows of different
widths would not fail cleanly, they would exchange garbage.
"""

from typing import Optional, Sequence

import numpy as np

from ..options import MAX_DRAFT_NODES

# A path and an emission each hold at most the root and every draft node.
MOST = MAX_DRAFT_NODES + 1
WIDTH = 3 + 2 * MOST  # round index, path length, emitted length, then both, padded
PAD = -1


def row(index: int, path: Sequence[int], emitted: Sequence[int]) -> np.ndarray:
    """Round ``index``'s accepted ``path`` (node indices) and ``emitted``
    tokens as one int32 row of :data:`WIDTH`."""
    path, emitted = list(path), list(emitted)
    if len(path) > MOST or len(emitted) > MOST:
        raise ValueError(f"a round holds at most {MOST} path nodes and emitted tokens, "
                         f"got {len(path)} and {len(emitted)}")
    out = np.full(WIDTH, PAD, dtype=np.int32)
    out[:3] = (index, len(path), len(emitted))
    out[3:3 + len(path)] = path
    out[3 + MOST:3 + MOST + len(emitted)] = emitted
    return out


def unpack(r: np.ndarray) -> dict:
    """A row back as ``{"round", "path", "emitted"}``."""
    r = np.asarray(r)
    n_path, n_emit = int(r[1]), int(r[2])
    return {"round": int(r[0]), "path": r[3:3 + n_path].tolist(),
            "emitted": r[3 + MOST:3 + MOST + n_emit].tolist()}


def disagreement(rows: np.ndarray, what: str = "round") -> Optional[str]:
    """None where every rank's row (``rows[r]``: rank r's) equals rank 0's,
    else one line naming the first rank that differs and both rows."""
    rows = np.asarray(rows)
    for rank in range(1, rows.shape[0]):
        if not np.array_equal(rows[rank], rows[0]):
            a, b = unpack(rows[0]), unpack(rows[rank])
            return (f"ranks out of step at {what} {a['round']}: rank 0 took path {a['path']} "
                    f"emitting {a['emitted']}, rank {rank} took path {b['path']} emitting "
                    f"{b['emitted']} (round {b['round']})")
    return None


def tokens_disagreement(counts: Sequence[int], tokens: np.ndarray) -> Optional[str]:
    """The whole emission compared: ``counts[r]`` tokens rank r emitted,
    ``tokens[r]`` its tokens (padded to the longest). None where all agree."""
    for rank in range(1, len(counts)):
        if counts[rank] != counts[0] or not np.array_equal(tokens[rank], tokens[0]):
            n = min(counts[0], counts[rank])
            first = next((i for i in range(n) if tokens[rank][i] != tokens[0][i]), n)
            return (f"ranks emitted different text: rank 0 {counts[0]} tokens, rank {rank} "
                    f"{counts[rank]}, first difference at token {first}")
    return None
