"""treespec.bench.graph_census: the primitive counts the benchmarks and the
op-pinning tests read, against graphs whose ops are known by construction."""

from collections import Counter

import mlx.core as mx

from treespec.bench.graph_census import difference, primitives


def test_a_lazy_graph_counts_each_of_its_ops_and_its_evaluated_inputs_count_nothing():
    a, b = mx.array([1.0, 2.0]), mx.array([3.0, 4.0])
    mx.eval(a, b)
    out = mx.exp(a + b) * b
    assert primitives(out) == Counter({"Add": 1, "Exp": 1, "Multiply": 1})
    mx.eval(out)
    assert primitives(out) == Counter()


def test_an_int_index_builds_a_gather_where_a_slice_or_squeeze_builds_none():
    # Why the verify and the drafting levels take one row by squeeze(0).
    x = mx.array([[1.0, 2.0, 3.0]])
    mx.eval(x)
    assert primitives(x[0])["Gather"] == 1
    assert primitives(x.squeeze(0)) == Counter({"Squeeze": 1})
    assert primitives(x[:1])["Gather"] == 0


def test_a_difference_lists_every_changed_count_largest_change_first_then_by_name():
    counts = {"Add": 3, "Exp": 2, "Gather": 1}
    base = {"Add": 1, "Exp": 2, "Slice": 2}
    assert difference(counts, base) == [("Add", 2), ("Slice", -2), ("Gather", 1)]
    assert difference(base, base) == []
