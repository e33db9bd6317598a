"""``treespec census``: the backend census (treespec.backend.census) printed
for the running backend, of the default shapes or of a checkpoint's own.
Its flags are treespec.cli.main's, checked by treespec.cli.census."""

import json
import os
import time

import mlx.core as mx

from ..checkpoints import load_checkpoint
from ..cli.process import prepare
from . import blas
from .census import format_table, row_width, summary, to_json, widths_text
from .census_child import isolated
from .census_position import position_width
from .row_chunks import chunk_width, rest_width
from .census_shapes import model_dtype

TF32 = "MLX_ENABLE_TF32"


def backend() -> dict:
    """What the census ran on: the BLAS, the device, MLX and its TF32 switch."""
    info = mx.device_info() if hasattr(mx, "device_info") else {}
    return {
        "blas": blas.describe(blas.detect()),
        "device": str(mx.default_device()),
        "device_info": {k: v for k, v in info.items() if isinstance(v, (str, int, float, bool))},
        "mlx": mx.__version__,
        "tf32": os.environ.get(TF32),
    }


def header(b: dict, shapes: str, widths) -> str:
    name = b["device_info"].get("device_name") or b["device_info"].get("architecture", "")
    tf32 = b["tf32"] if b["tf32"] is not None else "unset (MLX's default)"
    return "\n".join([
        "treespec census: a row of an M-row call against that row computed alone",
        f"  BLAS     {b['blas'].removeprefix('BLAS: ')}",
        f"  device   {b['device']} {name}".rstrip(),
        f"  mlx      {b['mlx']}; {TF32}={tf32}",
        f"  shapes   {shapes}; widths {widths_text(widths)}",
    ])


def cmd_census(args) -> int:
    prepare()  # the attention kernels the other commands run with
    model, shapes = None, "the default set (treespec/backend/census_shapes.py)"
    if args.model:
        # lazy: the rows are measured in children that load it again; here only
        # its type and dtype are read, no weights
        model, _ = load_checkpoint(args.model, "model", lazy=True)
        shapes = f"{args.model} ({getattr(model, 'model_type', '?')}, {model_dtype(model)})"
    t0 = time.perf_counter()
    # in child processes: a kernel that crashes one costs its row, not the table;
    # one child for both kinds of row (a checkpoint is loaded once)
    rows = isolated(args.model, dtypes=args.dtypes, widths=args.widths, kind="both")
    seconds = time.perf_counter() - t0
    b = backend()
    if args.json:
        print(json.dumps({"backend": b, "shapes": shapes, "rows": to_json(rows),
                          "summary": summary(rows), "seconds": round(seconds, 3),
                          "row_invariant_width": {d: row_width(rows, d)[0]
                                                  for d in dict.fromkeys(r.dtype for r in rows)},
                          "chunk_width": {d: chunk_width(rows, d)[0]
                                          for d in dict.fromkeys(r.dtype for r in rows)},
                          "chunked_rest_width": {d: rest_width(rows, d)[0]
                                                 for d in dict.fromkeys(r.dtype for r in rows)},
                          "position_width": {d: position_width(rows, d)[0]
                                             for d in dict.fromkeys(r.dtype for r in rows)}}))
    else:
        print(header(b, shapes, args.widths))
        print()
        print(format_table(rows))
        print()
        print(f"{summary(rows)} ({len(rows)} rows in {seconds:.2f} s)")
        print(rows_line(rows))
        print(chunks_line(rows))
        print(position_line(rows))
    return 0


def rows_line(rows) -> str:
    """One line: per dtype, up to how many nodes the row-invariant verify
    (``--verify rows``) keeps every node's row bit-identical to one-token
    steps on this backend, and the first row that limits it."""
    return "row-invariant verify (--verify rows): " + _per_dtype(rows, row_width, " nodes")


def chunks_line(rows) -> str:
    """One line: per dtype, in calls of how many rows ``--verify chunks`` runs
    the linears, and up to how many nodes the rest keeps the verify exact."""
    return ("with chunked linears (--verify chunks): products in calls of "
            + _per_dtype(rows, chunk_width, " rows") + "; the rest "
            + _per_dtype(rows, rest_width, " nodes"))


def position_line(rows) -> str:
    """One line: per dtype, up to which width a row's bits depend on the
    call's width alone, not on its place in the call (the census's position
    rows, treespec.backend.census_position), so that a reference forward at
    the verify's width may prove a tree's rows (treespec.evidence.same_width);
    and the first row that limits it."""
    return ("rows by width alone, not place (same-width reference): "
            + _per_dtype(rows, position_width, ""))


def _per_dtype(rows, width_of, unit: str) -> str:
    """Per dtype, "DTYPE up to N{unit} (the first limiting row)" from
    ``width_of(rows, dtype)``, joined; "no row measured" where none is."""
    parts = []
    for d in dict.fromkeys(r.dtype for r in rows):
        width, limiting = width_of(rows, d)
        if width is None:
            continue
        why = (f" ({limiting[0].op} {limiting[0].how} {limiting[0].shape}: "
               f"{limiting[0].error or limiting[0].verdict})" if limiting else "")
        parts.append(f"{d} up to {width}{unit}{why}")
    return "; ".join(parts) or "no row measured"
