"""The flat, row-invariant and chunked verifies of suites/verify/test_row_chunks.py's
trees against one-token steps, on the running BLAS: '=' where bit for bit,
else the largest difference.

    LD_PRELOAD=/usr/lib/x86_64-linux-gnu/openblas-pthread/libblas.so.3 \
      PYTHONPATH=. python results/exact-at-speed/chunks/chunks_vs_rows.py
"""
import mlx.core as mx
from suites.verify import helpers
from suites.verify.test_row_chunks import TREES, _steps
from treespec.backend.blas import detect
from treespec.backend.row_chunks import RowChunks
from treespec.cli.rows import chunks_plan
from treespec.evidence.controls import clone
from treespec.tree import DraftTree
from treespec.verify import adapter_for
print(detect().name)
for family in ("llama", "qwen3", "qwen3_5"):
    for dtype in ("float32", "bfloat16"):
        model = helpers.model(family, dtype)
        for shape, parents in TREES.items():
            tree = DraftTree(helpers.tokens(len(parents), 3), parents)
            plan = chunks_plan(model, len(tree) - 1, False)
            before = helpers.history(9).replay(model)
            want = _steps(model, before, tree)
            out = []
            for name, kw in (("flat", {}), ("rows", {"rows": True}), ("chunks", {"kernels": RowChunks(plan.width)})):
                got = adapter_for(model, **kw).verify(tree, clone(before))
                out.append(f"{name} {'=' if mx.array_equal(got, want).item() else helpers.max_abs_diff(got, want):.3g}" if not mx.array_equal(got, want).item() else f"{name} =")
            print(f"{family:8s} {dtype:9s} {shape:13s} chunk width {plan.width} cap {plan.cap and plan.cap[0]}: " + ", ".join(out), flush=True)
