"""Where the row-invariant verify's node rows first depart from classic decoding's one-token steps.

Builds each case (family:dtype:tree; trees chain2 chain5 branch7 branch12 of test_row_invariant.py)
as test_every_node_row_is_classic_decodings_one_token_step does, runs the row verify and the test's
one-token steps, and records in both each decoder layer's output (taps) and every call (array args,
output) of every submodule of every layer and of mlx-lm's sdpa and gated_delta_update (the classes'
__call__ wrapped for the run, watched instances only). Rows map to nodes by where a call ran: token
axis (1, T, ..); batch axis in depth_steps' wide (T, 1, D) and per-depth (n_d, 1, D) calls and the
tree recurrence. Reports the first differing layer and in it the first call (completion order) with
input rows equal to the steps' and output rows differing: where the arithmetic departs; also the
device, versions, each run's gated-delta branch and (last: it compiles on a GPU) the census width.

    PYTHONPATH=. python3 results/exact-at-speed/row_diff_probe.py --out DIR \\
        --cases qwen3_5:bfloat16:chain2,qwen3_5:bfloat16:chain5,qwen3:bfloat16:branch7
(writes DIR/row_diff_probe.json after every case; --no-census skips the census)"""

import argparse, functools, inspect, json, os, sys, time  # noqa: E401
from contextlib import contextmanager
import mlx.core as mx
import mlx_lm
import numpy as np
from mlx_lm.models.cache import ArraysCache
from suites.verify import helpers
from suites.verify.test_row_invariant import TREES
from treespec.backend.census import census, row_width
from treespec.evidence.controls import clone
from treespec.heads.base import FINAL
from treespec.mixers import slots
from treespec.tree import DraftTree
from treespec.verify import adapter_for
from treespec.verify.depth_steps import depth_groups
from treespec.verify.taps import layer_home, tapped

NAMES = {k.replace("chain of ", "chain").replace("branching ", "branch"): k for k in TREES}
FUNCS = ("scaled_dot_product_attention", "gated_delta_update")

def gdn_branch(a: dict) -> str:
    """The branch mlx_lm.models.gated_delta.gated_delta_update takes, by its own conditions."""
    dk, metal, dev, use = a["k"].shape[-1], mx.metal.is_available(), mx.default_device(), a.get("use_kernel", True)
    kernel = use and dev == mx.gpu and metal and dk >= 32 and dk % 32 == 0
    return f"{'kernel' if kernel else 'ops'} (use_kernel={use}, {dev}, metal={metal}, Dk={dk})"

@contextmanager
def recording(model):
    """A recorder: ``calls`` (reset by the caller) of every submodule of every layer and of FUNCS
    (path, array args, output, completion order, ``mix``: the mixer call, a direct child of the
    layer handed a cache, it is or is in); ``plant``: a path whose output is scaled by 1 + 2^-7."""
    rec = argparse.Namespace(calls=[], stack=[], seq=0, plant=None, watch={})
    for i, layer in enumerate(layer_home(model)[1]):
        rec.watch.update({id(m): f"{i}.{p}" for p, _, _, m in slots(layer)})
    mods, put = [m for _, _, _, m in slots(model) if id(m) in rec.watch], []

    def wrap(owner, name, orig, method):
        sig = inspect.signature(orig)

        @functools.wraps(orig)  # inspect.signature(module.__call__) still reads the original
        def call(*a, **k):
            up = rec.calls[rec.stack[-1]] if rec.stack else None
            path = rec.watch.get(id(a[0])) if method else up and f"{up['path']}.{name}()"
            if not path:
                return orig(*a, **k)
            b = sig.bind(*a, **k).arguments
            c = {"path": path, "note": name == FUNCS[1] and gdn_branch(b), "mix": up and up["mix"],
                 "args": {n: v for n, v in b.items() if isinstance(v, mx.array)}}
            if path.count(".") == 1 and any(isinstance(v, ArraysCache) or hasattr(type(v), "update_and_fetch")
                                            for n, v in b.items() if n != "self"):
                c["mix"] = len(rec.calls)
            rec.stack.append(len(rec.calls))
            rec.calls.append(c)
            out = orig(*a, **k)
            rec.stack.pop()
            out = out * (1 + 2 ** -7) if path == rec.plant else out
            c["out"], c["exit"], rec.seq = (out[0] if isinstance(out, tuple) else out), rec.seq, rec.seq + 1
            return out
        put.append((owner, name, orig))
        setattr(owner, name, call)
    for cls in {next(c for c in type(m).__mro__ if "__call__" in vars(c)) for m in mods}:
        wrap(cls, "__call__", vars(cls)["__call__"], True)
    for mod, f in [(m, f) for m in {sys.modules[type(x).__module__] for x in mods} for f in FUNCS if f in vars(m)]:
        wrap(mod, f, vars(mod)[f], False)
    try:
        yield rec
    finally:
        for owner, name, orig in reversed(put):
            setattr(owner, name, orig)

def diff(a: np.ndarray, b: np.ndarray) -> float:
    """0.0 where a equals b (as mx.array_equal: -0 == 0), else max |a - b| (nan: nans differ)."""
    if a.shape != b.shape:
        return float("inf")
    return 0.0 if np.array_equal(a, b, equal_nan=True) else float(np.nanmax(np.abs(a - b)) or "nan")

def node_rows(a: np.ndarray, s: np.ndarray, axis: str, k: int, n: int):
    """(row k of a on ``axis``, "row") against step array s; (a, "whole"); (None, None): unmappable."""
    if a.ndim == s.ndim >= 2 and s.shape[0] == 1:
        if axis == "batch" and a.shape[0] == n and a.shape[1:] == s.shape[1:]:
            return a[k:k + 1], "row"
        if axis == "token" and a.shape[0] == 1 and a.shape[2:] == s.shape[2:] and a.shape[1] == n + s.shape[1] - 1:
            return a[:, k:k + s.shape[1]], "row"  # node k's row; a conv's input: its window
    return (a, "whole") if a.shape == s.shape else (None, None)

def layout(calls, i, groups, T):
    """(axis, nodes, where) of row-verify call i: how its rows map to tree nodes."""
    mix = calls[i]["mix"]
    c = calls[i] if mix is None else calls[mix]
    same = [j for j, d in enumerate(calls) if d["path"] == c["path"]]
    k = same.index(mix) if mix is not None else 0
    if mix is not None and len(same) == len(groups) + 1:  # depth_steps: wide, then one per depth
        late = any(calls[p]["path"].endswith("()") for p in range(mix, i + 1) if calls[p]["mix"] == mix)
        return ("batch", list(groups[k - 1]), f"depth {k - 1}") if k else \
            ("batch", list(range(T)), "wide, discarded" if late else "wide")  # its attention is unused
    if mix is not None and len(same) == len(groups):  # tree recurrence: one call per depth
        return "batch", list(groups[k]), f"recurrence depth {k}"
    shape = tuple(next(iter(c["args"].values())).shape)[:2] if c["args"] else ()
    return {(1, T): ("token", list(range(T)), f"tokens (1, {T}, ..)"),
            (T, 1): ("batch", list(range(T)), f"nodes ({T}, 1, ..)")}.get(shape, (None, [], f"{shape}"))

def compare(rows, steps, groups, T):
    """Per row-verify call: layout, and per node max |diff| (None: unmappable) of its input and output
    rows against the step call of the same path and index in its pass; a step-shaped arg of a
    multi-token call that differs (a recurrent state) is carried in the call, not compared."""
    out, seen = [], {}
    for i, c in enumerate(rows):
        axis, nodes, where = layout(rows, i, groups, T)
        j = seen[c["path"], c["mix"]] = seen.get((c["path"], c["mix"]), -1) + 1
        held, per = where.startswith(("wide", "depth")) and c["path"].count(".") == 1, {}  # o_proj held back
        for k, node in enumerate(nodes):
            sc = [d for d in steps[node] if d["path"] == c["path"]]
            if j >= len(sc):
                continue
            sc, ins, carried = sc[j], [], []
            for name, a in ((n, a) for n, a in c["args"].items() if n in sc["args"]):  # rope offsets aside
                r, kind = node_rows(a, sc["args"][name], axis, k, len(nodes))
                d = None if r is None else diff(r, sc["args"][name])
                carried += [name] if kind == "whole" and axis == "token" and len(nodes) > 1 and d else []
                ins += [] if name in carried else [d]
            r = node_rows(c["out"], sc["out"], axis, k, len(nodes))[0]
            per[int(node)] = {"in": None if None in ins else max(ins, default=0.0), "carried": carried,
                              "out": None if held or r is None else diff(r, sc["out"])}
        out.append({"path": c["path"], "where": where, "axis": axis, "exit": c["exit"], "held": held, "nodes": per,
                    "shapes": {k: list(v.shape) for k, v in c["args"].items()}, "out_shape": list(c["out"].shape)})
    return out

def localize(table, layer):
    """In ``layer``, the first call (completion order) with input rows equal, output rows differing;
    failing that, the first call (wide pass aside) whose input rows differ."""
    mine = [t for t in table if t["path"].split(".")[0] == layer]
    for t in sorted(mine, key=lambda t: t["exit"]):
        bad = {n: v["out"] for n, v in t["nodes"].items() if v["in"] == 0.0 and v["out"] not in (0.0, None)}
        if bad:
            return {"departs": t["path"], "where": t["where"], "axis": t["axis"], "nodes": sorted(bad),
                    "max": max(bad.values()), "shapes": t["shapes"], "out_shape": t["out_shape"],
                    "carried": sorted({x for v in t["nodes"].values() for x in v["carried"]})}
    first = next((t for t in mine if not t["where"].startswith("wide")
                  and any(v["in"] not in (0.0, None) for v in t["nodes"].values())), None)
    return {"departs": None, "first_input_differs": first and f"{first['path']} [{first['where']}]"}

def probe(family, dtype, shape, plant):
    """One case: the test's model, tree and history; layer and call comparisons."""
    model = helpers.model(family, dtype)
    tree = DraftTree(helpers.tokens(len(TREES[shape]), 3), TREES[shape])
    T, layers = len(tree), layer_home(model)[1]
    groups = [n for n, _ in depth_groups(np.asarray(tree.depths()), np.asarray(tree.ancestry()))]
    before = helpers.history(9).replay(model)
    adapter, taps = adapter_for(model, rows=True), tuple(range(len(layers))) + (FINAL,)
    if plant is not None and "." not in plant:  # "L": layer L's first linear (or "L.path")
        plant = next(f"{plant}.{p}" for p, _, _, m in slots(layers[int(plant)]) if "Linear" in type(m).__name__)
    with recording(model) as rec:
        rec.plant = plant
        with tapped(model, taps) as tp:
            got = adapter.verify(tree, clone(before))
        rec.plant, r_calls, r_all, s_all, s_calls = None, rec.calls, [o[-1] for o in tp.outputs], [], []
        for i in range(T):  # the test's _steps, each node's last step kept
            cache = clone(before)
            with tapped(model, taps) as tp:
                for token in [tree.tokens[j] for j in tree.path_to(i)]:
                    rec.calls = []
                    out = model(mx.array([[token]]), cache=cache)
            s_all.append([o[-1] for o in tp.outputs] + [out[:, -1:]])
            s_calls.append(rec.calls)
    r_all, steps = r_all + [got[None]], [d for s in s_calls for d in s]
    mx.eval([*r_all, *[a for x in s_all for a in x],
             *[a for c in r_calls + steps for a in [c["out"], *c["args"].values()]]])
    to_np = lambda a: np.array(a.astype(mx.float32) if mx.issubdtype(a.dtype, mx.floating) else a)  # noqa: E731
    for c in r_calls + steps:
        c["out"], c["args"] = to_np(c["out"]), {k: to_np(v) for k, v in c["args"].items()}
    d = [[diff(to_np(r)[:, i:i + 1], to_np(s_all[i][li])) for i in range(T)] for li, r in enumerate(r_all)]
    per_layer = [{"layer": name, "max": max(x), "nodes": [i for i, v in enumerate(x) if v != 0.0]}
                 for name, x in zip([str(i) for i in range(len(layers))] + ["final norm", "logits"], d)]
    first = next((p["layer"] for p in per_layer if p["nodes"]), None)
    table = compare(r_calls, s_calls, groups, T)
    return {"family": family, "dtype": dtype, "tree": shape, "parents": TREES[shape], "nodes": T,
            "depth_groups": [list(map(int, g)) for g in groups], "plant": plant,
            "logits_equal": not per_layer[-1]["nodes"], "layers": per_layer, "first_layer": first,
            "localized": localize(table, first) if first and first.isdigit() else first and (
                f"after the last layer: the {'final norm' if first[0] == 'f' else 'output head'} (token axis)"),
            "gated_delta": {run: sorted({f"{c['note']} q{list(c['args']['q'].shape)}" for c in cs if c["note"]})
                            for run, cs in (("rows", r_calls), ("steps", steps))},
            "calls": [t for t in table if t["path"].split(".")[0] == first]}

def report(r) -> str:
    st = lambda t, key: "".join("=" if v[key] == 0.0 else "." if v[key] is None else "X"  # noqa: E731
                                for v in t["nodes"].values())
    return "\n".join([
        f"== {r['family']} {r['dtype']} {r['tree']} ({r['nodes']} nodes, depths {r['depth_groups']}), plant "
        f"{r['plant']}; logits equal: {r['logits_equal']}",
        "  layer outputs: " + ", ".join(f"{p['layer']}:" + (f"{p['max']:.3g}@{p['nodes']}" if p["nodes"] else "=")
                                        for p in r["layers"]),
        f"  gated delta: rows {r['gated_delta']['rows']}; steps {r['gated_delta']['steps']}",
        f"  FIRST DIFFERING LAYER: {r['first_layer']}; localized: {json.dumps(r['localized'])}"
        + ("\n    its calls (per node: = equal, X differs, . not compared):" if r["calls"] else "")] + [
        f"    {t['path']:<44} {t['where']:<17} in {st(t, 'in'):<7} out {st(t, 'out'):<7} {t['shapes']} -> "
        f"{t['out_shape']}" for t in r["calls"]])

def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", default="qwen3_5:bfloat16:chain2,qwen3_5:bfloat16:chain5,qwen3:bfloat16:branch7")
    ap.add_argument("--out", default=".")
    ap.add_argument("--no-census", action="store_true")
    ap.add_argument("--plant", default=None, help=argparse.SUPPRESS)
    args, _ = ap.parse_args(), sys.stdout.reconfigure(line_buffering=True)  # a timeout keeps what printed
    os.makedirs(args.out, exist_ok=True)
    t0, path = time.time(), os.path.join(args.out, "row_diff_probe.json")
    doc = {"device": str(mx.default_device()), "mlx": mx.__version__, "mlx_lm": mlx_lm.__version__,
           "metal": mx.metal.is_available(), "cuda": hasattr(mx, "cuda") and mx.cuda.is_available(),
           "env": {k: v for k, v in os.environ.items() if k.startswith("MLX_")}, "cases": []}
    print(json.dumps({k: v for k, v in doc.items() if k != "cases"}))
    save = lambda: open(path, "w").write(  # noqa: E731
        json.dumps({**doc, "seconds": round(time.time() - t0, 2)}, indent=1, default=str))
    for case in args.cases.split(","):
        family, dtype, shape = case.split(":")
        try:
            r = probe(family, dtype, NAMES.get(shape, shape), args.plant)
        except Exception as e:  # one case's failure must not lose the others
            r = {"family": family, "dtype": dtype, "error": f"{type(e).__name__}: {e}"}
        doc["cases"].append(r)
        print(report(r) if "error" not in r else f"== {case}: {r['error']}")
        save()
    width = functools.lru_cache()(lambda family, dtype: row_width(census(helpers.model(family, dtype)))[0])
    for r in [] if args.no_census else doc["cases"]:  # last: on a GPU it compiles every shape
        r["census_width"] = width(r["family"], r["dtype"])
        r["test_would_skip"] = (r["census_width"] or 0) < r.get("nodes", 0)
        print(f"census {r['family']} {r['dtype']}: row width {r['census_width']} (at {time.time() - t0:.1f} s)")
        save()
    print(f"total {time.time() - t0:.1f} s; {path}")

if __name__ == "__main__":
    main()
