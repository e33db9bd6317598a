"""Helpers the e2e suites share."""


def deepest_path(tree, last_child: bool):
    """A root path to a leaf: always the first (or last) child (the first:
    the path of first choices)."""
    path = [0]
    while True:
        kids = [i for i, p in enumerate(tree.parents) if p == path[-1]]
        if not kids:
            return path
        path.append(kids[-1] if last_child else kids[0])
