import time
import mlx.core as mx
from suites.verify import helpers
from treespec.evidence.controls import clone
from treespec.evidence.same_width import padded_rows, position_reason, _MEASURED
from treespec.backend.census import format_table
from treespec.tree import DraftTree
from treespec.verify import adapter_for
print(mx.default_device())
TREES = {"fan": DraftTree(helpers.tokens(5, 3), [-1, 0, 0, 0, 0]),
         "bushy": DraftTree(helpers.tokens(12, 4), [-1, 0, 0, 1, 1, 2, 3, 3, 4, 6, 7, 8])}
for fam in ["llama", "qwen3_5", "gemma3_text"]:
    for dt in ["bfloat16", "float16"]:
        t = time.time()
        model = helpers.model(fam, dt)
        before = helpers.history(12 if fam != "gemma3_text" else 1).replay(model)
        why = position_reason(model, 12)
        for name, tree in TREES.items():
            logits = adapter_for(model).verify(tree, clone(before))
            same = padded_rows(model, before, tree)
            eq = None if same is None else mx.array_equal(logits, same).item()
            print(fam, dt, name, "verify==padded:", eq, flush=True)
        print(fam, dt, "position_reason:", why, f"({time.time() - t:.1f} s)", flush=True)
for rows in _MEASURED.values():
    print(format_table([r for r in rows if r.first_differs is not None or r.error]))
