import time, statistics
import mlx.core as mx
from mlx_lm import load
from treespec import scaled
from treespec.verify import adapter_for
from treespec.verify.attention import rope_owners
from treespec.verify.module_tree import ModuleTree
def med(f, n=2000):
    ts=[]
    for _ in range(n):
        t0=time.perf_counter(); f(); ts.append(time.perf_counter()-t0)
    return statistics.median(ts)*1e6
for name, model in (("trained pair target (4 layers)", load("treespec/pair/target")[0]),
                    ("scaled 128x32 (32 layers)", scaled.build_pair(128, 32, 2, 0.02, "bfloat16")[0])):
    a = adapter_for(model); t = ModuleTree(model); t.changed()
    w = med(lambda: rope_owners(model, a.family.rope_attr, a._skip)); c = med(t.changed)
    print(f"{name}: walk for the rope owners {w:.0f} us, snapshot check {c:.0f} us, {len(t.edges)} edges")
