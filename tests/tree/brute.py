"""An independent, obviously-correct trie in plain Python, for checking the tensor implementations."""

from __future__ import annotations


def brute_tree(cands: list[list[int]], width: int):
    """Returns the kept nodes of one request as dicts, listed in the required order."""
    nodes: dict[tuple[int, ...], dict] = {}
    for ci, cand in enumerate(cands):
        for d in range(1, len(cand) + 1):
            prefix = tuple(cand[:d])
            if prefix not in nodes:
                nodes[prefix] = {"prefix": prefix, "first": ci, "votes": 0}
            nodes[prefix]["votes"] += 1
    ranked = sorted(nodes.values(), key=lambda x: (-x["votes"], len(x["prefix"]), x["first"]))
    kept = ranked[: width - 1]
    kept.sort(key=lambda x: (len(x["prefix"]), x["first"]))
    index = {x["prefix"]: i + 1 for i, x in enumerate(kept)}
    for x in kept:
        x["parent"] = index.get(x["prefix"][:-1], 0)  # prefix-closed: the parent is kept (or is the root)
        assert len(x["prefix"]) == 1 or x["prefix"][:-1] in index
    return kept


def python_walk(tokens, parents, valid, target):
    """Greedy walk: from the root, take the first valid child (by index) whose token is the target's choice."""
    path, cur = [0], 0
    while True:
        nxt = None
        for i in range(1, len(tokens) + 1):
            if valid[i - 1] and parents[i - 1] == cur and tokens[i - 1] == target[cur]:
                nxt = i
                break
        if nxt is None:
            return path, target[cur]
        path.append(nxt)
        cur = nxt
