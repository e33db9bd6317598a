"""``--verify rows``: how many nodes a round may verify on this backend.

The row-invariant verify is exact only as far as the backend keeps a row's
bits whatever shares its call (treespec.backend.census.row_width). Rather
than let the gate decline every round past that width, ``generate`` caps the
rounds there and says so; a backend that keeps rows for one node only is
refused, naming the row that limits it."""

from typing import Callable, Optional, Tuple

from ..backend.census import census, row_width
from ..errors import UsageError


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
    row = limiting[0]
    why = f"census: {row.op} {row.how} {row.dtype} {row.shape}: {row.error or row.verdict}"
    if width < 2:
        raise UsageError(f"--verify rows: this backend keeps a row's bits for one node only "
                         f"({why}), so no round would be exact; give --verify flat, or "
                         "--allow-inexact to run it anyway")
    return width, why
