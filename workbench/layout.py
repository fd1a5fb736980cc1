"""Layout that follows the room: the Graph screen's tree takes a share of the body that grows with
the terminal (30% at 80 columns, half from 160) and the user's `<`/`>` on top; names too long for
their column keep their tail (`…layers.3.mlp.down_proj`), where one module differs from the next."""

from __future__ import annotations

# the tree keeps room for a layer's deepest names (depth 5, `down_proj`); the node table its id and op columns
TREE_MIN, DETAIL_MIN = 24, 40
TREE_STEP = 4  # columns per `<` / `>`


def tree_share(body_width: int) -> float:
    """The tree's share of the body: 0.30 up to 80 columns, rising to 0.50 at 160 and beyond."""
    return 0.30 + 0.20 * min(1.0, max(0.0, (body_width - 80) / 80))


def tree_width(body_width: int, delta: int = 0) -> int:
    """The tree's columns for a body `body_width` wide, with the user's widening or narrowing `delta`."""
    want = round(body_width * tree_share(body_width)) + delta
    return max(TREE_MIN, min(want, max(TREE_MIN, body_width - DETAIL_MIN)))


def tail(text: str, width: int) -> str:
    """`text` in at most `width` cells, cut from the left: a deep name keeps the part that tells it apart."""
    if width <= 0:
        return ""
    if len(text) <= width:
        return text
    return "…" + text[len(text) - width + 1 :] if width > 1 else "…"
