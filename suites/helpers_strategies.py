"""Hypothesis strategies shared by every suite: trees, offsets, windows."""

from hypothesis import strategies as st

from treespec.tree import DraftTree

VOCAB = 32  # small, so sibling and target tokens collide often


@st.composite
def parent_lists(draw, min_nodes=1, max_nodes=24):
    """Parent lists in topological order: node 0 the root, parents[i] < i.

    Mixes uniform parents (bushy), parent = i - 1 (chains) and parent = 0
    (fans) so deep chains and wide fans both show up."""
    n = draw(st.integers(min_nodes, max_nodes))
    style = draw(st.sampled_from(["random", "chain", "fan", "mixed"]))
    parents = [-1]
    for i in range(1, n):
        if style == "chain":
            parents.append(i - 1)
        elif style == "fan":
            parents.append(0)
        elif style == "mixed":
            parents.append(draw(st.sampled_from([0, i - 1, draw(st.integers(0, i - 1))])))
        else:
            parents.append(draw(st.integers(0, i - 1)))
    return parents


@st.composite
def trees(draw, min_nodes=1, max_nodes=24, vocab=VOCAB):
    parents = draw(parent_lists(min_nodes, max_nodes))
    tokens = draw(st.lists(st.integers(0, vocab - 1), min_size=len(parents), max_size=len(parents)))
    return DraftTree(tokens, parents)


def branching_trees(min_nodes=3, max_nodes=24, vocab=VOCAB):
    return trees(min_nodes, max_nodes, vocab).filter(lambda t: not t.is_linear())


def linear_trees(max_nodes=24, vocab=VOCAB):
    return st.lists(st.integers(0, vocab - 1), min_size=1, max_size=max_nodes).map(
        DraftTree.linear
    )


offsets = st.integers(0, 96)
windows = st.one_of(st.none(), st.integers(1, 40))


@st.composite
def target_tokens_for(draw, tree, vocab=VOCAB, agree=0.6):
    """Target tokens that often agree with some child, so walks go deep."""
    out = []
    for i in range(len(tree)):
        kids = tree.children(i)
        if kids and draw(st.floats(0, 1)) < agree:
            out.append(tree.tokens[draw(st.sampled_from(kids))])
        else:
            out.append(draw(st.integers(0, vocab - 1)))
    return out
