"""Graph search, one rule for the node table and the module tree.

A query with glob characters (* ? [) is `mcore graph list --match` (a glob over the ID, op,
category, name and module path). Anything else is words: every word must appear, in any
case, somewhere in the node's ID, op, category, name, module path or recipe instance, so
`decode_attention` and `layers.1 attn` find what people mean.
"""

from __future__ import annotations

from mcore import Node, node_matches

GLOB_CHARS = "*?["


def is_glob(query: str) -> bool:
    return any(c in query for c in GLOB_CHARS)


def words(query: str) -> list[str]:
    return [w for w in query.lower().split() if w]


def node_hit(node: Node, query: str, recipe: str | None = None) -> bool:
    """Whether a node matches the search query (empty query: every node)."""
    query = query.strip()
    if not query:
        return True
    if is_glob(query):
        return node_matches(node, query)
    hay = " ".join(
        str(x) for x in (node.id, node.op, node.category or "", node.name, node.module_path, recipe or "")
    ).lower()
    return all(w in hay for w in words(query))


def path_hit(path: str, query: str) -> bool:
    """Whether a module path (a tree entry) matches: globs against the path, else every word in it."""
    import fnmatch

    query = query.strip()
    if not query or not path:
        return False
    if is_glob(query):
        return fnmatch.fnmatchcase(path.lower(), query.lower())
    return all(w in path.lower() for w in words(query))
