"""``--verify rows`` and ``--verify chunks``: how many nodes a round may
verify on this backend, and in how many rows a call the linears run.

The row-invariant verify is exact only as far as the backend keeps a row's
bits whatever shares its call (treespec.backend.census.row_width). Rather
than let the gate decline every round past that width, ``generate`` caps the
rounds there and says so; a backend that keeps rows for one node only is
refused, naming the row that limits it.

``chunks`` lifts the products' part of that limit: every linear layer runs
in calls of at most the width the census measures its products keep
(treespec.backend.row_chunks), so only the rest of the layer (attention's
batch rows, norms, rope) caps a round."""

from typing import Callable, NamedTuple, Optional, Tuple

from ..backend.census import Row, census, row_width
from ..backend.row_chunks import PRODUCTS, RowChunks, chunk_width, rest_width
from ..errors import TreeRefused, UsageError
from ..verify import MEMO_NAMES, adapter_for, chunks_name


def rows_cap(target, draft_nodes: Optional[int], allow_inexact: bool,
             measure: Callable = census) -> Optional[Tuple[int, str]]:
    """(the most nodes a round may verify, the census row that sets it), or
    None where the drafter's rounds already fit (or ``--allow-inexact`` asks to
    run them anyway). The census measures the target's own shapes in its own
    dtype, at widths up to the drafter's largest round (``measure(target,
    widths=...)``: treespec.backend.census.census)."""
    if allow_inexact or not draft_nodes:
        return None
    nodes = draft_nodes + 1
    width, limiting = row_width(measure(target, widths=range(1, nodes + 1)))
    if width is None or width >= nodes:
        return None
    why = _why(limiting[0])
    if width < 2:
        chunks = ("--verify chunks (its linears in calls this backend keeps), "
                  if all(r.op in PRODUCTS for r in limiting) else "")
        raise UsageError(f"--verify rows: this backend keeps a row's bits for one node only "
                         f"({why}), so no round would be exact; give {chunks}--verify flat, or "
                         "--allow-inexact to run it anyway")
    return width, why


def _why(row: Row) -> str:
    return f"census: {row.op} {row.how} {row.dtype} {row.shape}: {row.error or row.verdict}"


class Chunks(NamedTuple):
    width: int  # the most rows one product call takes
    why: str  # the census row that sets it ('' where every measured width kept its rows)
    cap: Optional[Tuple[int, str]]  # (most nodes a round verifies, why), None: no cap

    def line(self) -> str:
        """What the commands say of it: "--verify chunks: linear layers ..."."""
        rows = "one row a call" if self.width == 1 else f"calls of at most {self.width} rows"
        return (f"--verify chunks: linear layers in {rows}"
                f"{f' ({self.why})' if self.why else ''}")


def chunks_plan(target, draft_nodes: int, allow_inexact: bool,
                measure: Callable = census) -> Chunks:
    """``--verify chunks`` for the drafter's largest round (``draft_nodes``
    + 1 nodes): the width its linears keep (the narrowest of the census's
    product rows the row-invariant verify rests on, in the target's own
    shapes and dtype), and the cap the other rows set (as :func:`rows_cap`;
    None with ``allow_inexact``). A product that keeps no row beyond the
    first still chunks, one row a call (a one-token step's own call)."""
    nodes = draft_nodes + 1
    rows = measure(target, widths=range(1, nodes + 1))
    width, limiting = chunk_width(rows)
    if width == 0:
        raise UsageError(f"--verify chunks: a product of this model could not run on this "
                         f"backend ({_why(limiting[0])})")
    chunk = (Chunks(nodes, "", None) if width is None
             else Chunks(max(1, min(width, nodes)), _why(limiting[0]) if limiting else "", None))
    if allow_inexact:
        return chunk
    cap, limiting = rest_width(rows)
    if cap is None or cap >= nodes:
        return chunk
    if cap < 2:
        raise UsageError(f"--verify chunks: this backend keeps a row's bits for one node only "
                         f"outside the products ({_why(limiting[0])}), so no round would be "
                         "exact; give --verify flat, or --allow-inexact to run it anyway")
    return chunk._replace(cap=(cap, _why(limiting[0])))


def verify_adapter(target, mode: str, plan: Optional[Chunks] = None):
    """(the adapter of ``--verify MODE`` for ``target``, the gate's memo name
    of its verdicts): rows, kernels, or chunks of ``plan.width`` (named with
    its width: one verdict per width). A refusal is a UsageError naming the
    flag."""
    chunks = mode == "chunks"
    try:
        adapter = adapter_for(target, rows=True, kernels=(RowChunks(plan.width) if chunks
                                                          else mode == "kernels"))
    except TreeRefused as e:
        raise UsageError(f"--verify {mode}: {e}")
    return adapter, chunks_name(plan.width) if chunks else MEMO_NAMES[mode]
