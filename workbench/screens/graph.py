"""Graph screen: the module tree beside the node table, `--match` filtering, node details
(input/output tensors with dtypes, shapes, producer and consumers), following tensor edges
with a history stack, recipe instances and hand-marked region nodes shown in the table."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from rich.text import Text
from textual import on
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.widget import Widget
from textual.widgets import DataTable, Input, OptionList, Static, Tree
from textual.widgets.option_list import Option

from mcore import Node, Snapshot, module_tree, recipe_rows

from ..layout import TREE_STEP, tail, tree_width
from ..messages import ActionStarted
from ..search import is_glob, node_hit, path_hit
from ..state import Listing
from .base import WorkbenchScreen, on_action

MARK = "●"
OP_WIDTH = 20
MODULE_WIDTH = 32


def op_cell(op: str) -> str:
    return op if len(op) <= OP_WIDTH else op[: OP_WIDTH - 1] + "…"


def recipe_membership(snapshot: Snapshot) -> dict[str, str]:
    """node id -> the recipe instance it belongs to (first one listed)."""
    out: dict[str, str] = {}
    for r in recipe_rows(snapshot):
        for nid in r.node_ids:
            out.setdefault(nid, r.instance)
    return out


def in_scope(node: Node, scope: str) -> bool:
    if not scope:
        return True
    mp = node.module_path
    return mp == scope or mp.startswith(scope + ".")


def node_detail_text(ix: Snapshot, nid: str, recipes: dict[str, str], marked: bool) -> Text:
    n = ix.node(nid)
    t = Text(no_wrap=False)
    t.append(f"{nid} ", style="bold")
    t.append(n.op, style="bold cyan")
    if n.category:
        t.append(f"  {n.category}", style="dim")
    t.append(f"\n{n.name}", style="dim")
    if n.module_path:
        t.append(f"  [{n.module_path}]", style="dim")
    if nid in recipes:
        t.append(f"\nrecipe instance: {recipes[nid]}", style="magenta")
    if marked:
        t.append(f"\n{MARK} marked for the region", style="yellow")
    return t


def edge_options(ix: Snapshot, nid: str) -> list[Option]:
    """One option per edge: inputs (to their producer) and outputs (to each consumer)."""
    n = ix.node(nid)
    opts: list[Option] = []
    for tid in n.inputs:
        t = ix.tensor(tid)
        prod = t.producer
        where = f"{prod} {ix.node(prod).op}" if prod else "graph input"
        label = Text(no_wrap=True, overflow="ellipsis")
        label.append("in  ", style="green")
        label.append(f"{tid} {t.dtype} {list(t.shape)} ")
        label.append(f"← {where}", style="bold")
        opts.append(Option(label, id=f"go:{prod}:{tid}" if prod else f"none:{tid}:in"))
    for tid in n.outputs:
        t = ix.tensor(tid)
        cons = t.consumers
        head = f"{tid} {t.dtype} {list(t.shape)}" + (" host" if t.location != "device" else "")
        if ix.is_output(tid):
            label = Text(no_wrap=True, overflow="ellipsis")
            label.append("out ", style="yellow")
            label.append(f"{head} ")
            label.append("→ network output", style="bold")
            opts.append(Option(label, id=f"none:{tid}:out"))
        for c in cons:
            label = Text(no_wrap=True, overflow="ellipsis")
            label.append("out ", style="yellow")
            label.append(f"{head} ")
            label.append(f"→ {c} {ix.node(c).op}", style="bold")
            opts.append(Option(label, id=f"go:{c}:{tid}"))
        if not cons and not ix.is_output(tid):
            opts.append(Option(Text(f"out {head} (unused)", style="dim"), id=f"none:{tid}:unused"))
    return opts


class ModuleTree(Tree):
    """The module tree with the keys of file browsers: right expands (then goes to the first
    child), left collapses (then goes to the parent); enter shows the module without folding it."""

    BINDINGS = [
        Binding("right", "expand_or_child", "expand", show=False),
        Binding("left", "collapse_or_parent", "collapse", show=False),
    ]

    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.auto_expand = False  # enter selects; it never folds the whole tree away
        self.guide_depth = 2  # two cells a level: deep modules keep room for their names

    def render_label(self, node, base_style, style) -> Text:
        """The module's name and node count; where the indentation leaves too little room, the count
        goes first, then the name keeps its tail."""
        text = super().render_label(node, base_style, style)
        depth, parent = 0, node.parent
        while parent is not None:
            depth, parent = depth + 1, parent.parent
        room = self.scrollable_content_region.width - depth * self.guide_depth
        if room <= 0 or text.cell_len <= room:
            return text
        plain = text.plain
        icon = len(plain) - len(node.label.plain)
        name = node.label.plain.rsplit(" (", 1)[0] if room - icon < len(node.label.plain) else node.label.plain
        out = text[:icon]  # the expand/collapse icon, styled as drawn
        out.append(tail(name, room - icon), style=style)
        return out

    def action_expand_or_child(self) -> None:
        node = self.cursor_node
        if node is None:
            return
        if node.allow_expand and not node.is_expanded:
            node.expand()
        elif node.children:
            self.move_cursor(node.children[0])

    def action_collapse_or_parent(self) -> None:
        node = self.cursor_node
        if node is None:
            return
        if node.is_expanded and node.children and node is not self.root:
            node.collapse()
        elif node.parent is not None:
            self.move_cursor(node.parent)


class GraphScreen(WorkbenchScreen):
    SCREEN_NAME = "graph"
    BINDINGS = [
        Binding("slash", "filter", "search"),
        Binding("n", "next_match(1)", "next match"),
        Binding("N", "next_match(-1)", "previous", show=False),
        Binding("space", "toggle_mark", "mark node"),
        Binding("backspace", "back", "back"),
        Binding("t", "toggle_focus", "tree/table"),
        Binding("e", "edges", "edges", show=False),
        Binding("p", "app.show('profile')", "profile: where the time goes", show=False),
        Binding("less_than_sign", "tree_width(-1)", "narrower tree", show=False),
        Binding("greater_than_sign", "tree_width(1)", "wider tree", show=False),
    ]

    def __init__(self) -> None:
        super().__init__()
        self._fp: str | None = None
        self.ix: Snapshot | None = None
        self.recipes: dict[str, str] = {}
        self.scope = ""
        self.pattern = ""
        self.history: list[str] = []
        self.current: str | None = None
        self._rows: list[str] = []
        self.only: list[str] | None = None  # the IDs a list_nodes step listed (--last N)
        self._listing_seen: Listing | None = None
        self._filling = False
        self.searching = False  # a search the user typed (/): n and N step through its matches
        self._tree_nodes: dict[str, Any] = {}  # module path -> tree node
        self.tree_delta = 0  # the user's `<` / `>` on top of the share the terminal's width gives

    def compose_body(self) -> Iterable[Widget]:
        yield Static("", id="graph-empty", classes="empty")
        with Horizontal(id="graph-split"):
            yield ModuleTree("graph", id="module-tree")
            with Vertical(id="graph-right"):
                yield Input(
                    placeholder="/ search: words (layers.1 attention) or a glob", id="graph-filter", compact=True
                )
                yield Static("", id="graph-listing")
                yield DataTable(id="nodes", cursor_type="row", zebra_stripes=False)
                with Vertical(id="node-details"):
                    yield Static("", id="node-head")
                    yield OptionList(id="edges", compact=True)

    def on_mount(self) -> None:
        super().on_mount()
        t = self.query_one("#nodes", DataTable)
        t.add_column(" ", key="mark", width=1)
        t.add_column("id", key="id", width=9)
        # the op capped (the details below show it whole), then the recipe instance in full: it is
        # what tells layer 0 from layer 1; a search gives the table the tree's width too
        t.add_column("op", key="op", width=OP_WIDTH)
        t.add_column("recipe", key="recipe")
        t.add_column("module", key="module")
        self.query_one("#module-tree", Tree).show_root = True
        self.refresh_view()

    def focus_default(self) -> None:
        if self.state.snapshot is not None and not isinstance(self.focused, Input):
            self.query_one("#nodes", DataTable).focus()

    def refresh_chrome(self) -> None:
        super().refresh_chrome()
        if self.is_mounted:
            self.call_after_refresh(self.fit_tree)  # once the body has its new width

    def fit_tree(self) -> None:
        """The tree's width: the terminal's share (layout.tree_width) plus the user's `<` / `>`."""
        split = self.query_one("#graph-split")
        if split.size.width:
            self.query_one("#module-tree").styles.width = tree_width(split.size.width, self.tree_delta * TREE_STEP)

    def action_tree_width(self, step: int) -> None:
        """`<` narrows the module tree, `>` widens it (the node table takes the rest)."""
        self.tree_delta += step
        self.fit_tree()
        width = self.query_one("#module-tree").styles.width
        self.wb.say(f"module tree {width.value:.0f} columns · < narrower, > wider" if width else "", "dim")

    # ------------------------------------------------------------------ state -> widgets
    def refresh_view(self) -> None:
        super().refresh_view()
        if not self.is_mounted:
            return
        snap = self.state.snapshot
        has = snap is not None
        self.query_one("#graph-split").display = has
        empty = self.query_one("#graph-empty", Static)
        empty.display = not has
        if snap is None:
            self._fp, self._listing_seen = None, None  # a fresh state (an opened session) starts over
            if self.wb.busy == "capture_graph":
                empty.update(
                    Text(
                        "Capturing the graph… it appears here when the capture is done "
                        "(progress in the status line below; x cancels).",
                        style="yellow",
                    )
                )
            else:
                empty.update(Text("No graph yet. Capture one on the Model screen (F1, then c).", style="dim"))
            return
        if snap.fingerprint != self._fp:
            self._fp = snap.fingerprint
            self.ix = snap
            self.recipes = recipe_membership(snap)
            self.history.clear()
            self.scope = ""
            self.build_tree()
            self.fill_table()
        else:
            self.update_marks()
        lst = self.state.listing
        if lst is not self._listing_seen:
            self._listing_seen = lst
            self.apply_listing(lst)

    @on_action
    def on_action_started(self, message: ActionStarted) -> None:
        if message.action == "capture_graph":
            self.refresh_view()

    def apply_listing(self, lst: Listing | None) -> None:
        """Show what a list_nodes step listed: its --match as the filter, or just its IDs (--last)."""
        self.searching = False  # a step's listing, not a search: n stays the next step
        self.scope = ""
        self._filling = True
        match = (lst.match if lst else None) or ""
        self.query_one("#graph-filter", Input).value = match
        self._filling = False
        self.pattern = match
        self.only = list(lst.ids) if lst and lst.last else None
        self.fill_table(keep=lst.ids[0] if lst and lst.ids else None)

    def build_tree(self) -> None:
        snap = self.snap
        tree = self.query_one("#module-tree", Tree)
        tree.clear()
        counts = module_tree(snap)
        tree.root.set_label(f"{snap.engine_role} ({counts.get('', 0)})")
        tree.root.data = ""
        nodes = {"": tree.root}
        branches = {p.rpartition(".")[0] for p in counts if p}  # modules with submodules
        for path, count in counts.items():
            if not path:
                continue
            parent_path, _, leaf = path.rpartition(".")
            parent = nodes.get(parent_path, tree.root)
            label = f"{leaf} ({count})"
            if path in branches:
                nodes[path] = parent.add(label, data=path, expand=path.count(".") < 1)
            else:  # a leaf: no expand icon, two more cells for its name
                nodes[path] = parent.add_leaf(label, data=path)
        tree.root.expand()
        self._tree_nodes = nodes

    def visible_nodes(self) -> list[Node]:
        snap = self.snap
        only = set(self.only) if self.only is not None else None
        return [
            n
            for n in snap.nodes
            if in_scope(n, self.scope)
            and node_hit(n, self.pattern, self.recipes.get(n.id))
            and (only is None or n.id in only)
        ]

    def fill_table(self, keep: str | None = None) -> None:
        t = self.query_one("#nodes", DataTable)
        keep = keep or self.current
        t.clear()
        note = self.query_one("#graph-listing", Static)
        marked = set(self.state.marked)
        self._rows = []
        for n in self.visible_nodes():
            nid = n.id
            t.add_row(
                MARK if nid in marked else "",
                nid,
                op_cell(n.op),
                self.recipes.get(nid, ""),
                tail(n.module_path, MODULE_WIDTH),  # the details below show it whole
                key=nid,
            )
            self._rows.append(nid)
        parts = []
        if self.pattern:
            how = "glob" if is_glob(self.pattern) else "words"
            parts.append(f"{len(self._rows)} match(es) for {self.pattern!r} ({how}) in the whole graph")
        if self.scope:
            parts.append(f"under {self.scope}")
        if self.only is not None:
            parts.append(f"the {len(self.only)} node(s) the step listed (last {len(self.only)})")
        note.display = bool(parts)
        # a search covers the whole graph: the tree's column goes to the results (back on esc)
        self.query_one("#module-tree").display = not (self.searching and self.pattern)
        hint = (
            " · n/N next/previous · esc ends the search"
            if self.searching and self.pattern
            else " · / searches the whole graph"
        )
        note.update(Text("showing " + ", ".join(parts) + hint, style="dim"))
        if keep in self._rows:
            t.move_cursor(row=self._rows.index(keep))
            self.show_node(keep)
        elif self._rows:
            t.move_cursor(row=0)
            self.show_node(self._rows[0])
        else:
            self.current = None  # nothing shown is stale: the details say there is no match
            what = f"no node matches {self.pattern!r}" if self.pattern else "no node here"
            self.query_one("#node-head", Static).update(Text(what + " · esc clears the search", style="dim"))
            self.query_one("#edges", OptionList).clear_options()

    def update_marks(self) -> None:
        t = self.query_one("#nodes", DataTable)
        marked = set(self.state.marked)
        for nid in self._rows:
            want = MARK if nid in marked else ""
            if t.get_cell(nid, "mark") != want:
                t.update_cell(nid, "mark", want)
        if self.current:
            self.show_node(self.current)

    def show_node(self, nid: str) -> None:
        if self.ix is None or nid not in self.ix.node_by_id:
            return
        self.current = nid
        self.query_one("#node-head", Static).update(
            node_detail_text(self.ix, nid, self.recipes, nid in set(self.state.marked))
        )
        ol = self.query_one("#edges", OptionList)
        ol.clear_options()
        ol.add_options(edge_options(self.ix, nid))
        if ol.option_count:
            ol.highlighted = 0

    # ------------------------------------------------------------------ events
    @on(DataTable.RowHighlighted, "#nodes")
    def row_highlighted(self, event: DataTable.RowHighlighted) -> None:
        if event.row_key is not None and event.row_key.value:
            self.show_node(event.row_key.value)

    @on(DataTable.RowSelected, "#nodes")
    def row_selected(self, event: DataTable.RowSelected) -> None:
        self.query_one("#edges", OptionList).focus()

    @on(Tree.NodeSelected, "#module-tree")
    def tree_selected(self, event: Tree.NodeSelected) -> None:
        event.node.expand()
        if self.pattern:  # a branch view replaces the search (never both at once, silently)
            self.searching, self.pattern = False, ""
            self._filling = True
            self.query_one("#graph-filter", Input).value = ""
            self._filling = False
            self.wb.refresh_footer()
        self.only = None
        self.scope = event.node.data or ""
        self.fill_table()

    @on(Input.Changed, "#graph-filter")
    def filter_changed(self, event: Input.Changed) -> None:
        # Changed arrives after the value was set: a value the screen set itself is already the pattern
        if self._filling or event.value.strip() == self.pattern:
            return
        # a search covers the whole graph, never silently only the selected tree branch
        self.pattern = event.value.strip()
        self.searching = bool(self.pattern)
        self.scope = ""
        self.only = None
        self.fill_table()
        self.wb.refresh_footer()

    @on(Input.Submitted, "#graph-filter")
    def filter_submitted(self) -> None:
        self.query_one("#nodes", DataTable).focus()

    def escape_mode(self) -> bool:
        """Esc on the table or tree ends a search (or a branch/listing view): the whole graph again."""
        if not (self.pattern or self.scope or self.only is not None):
            return False
        self.clear_search()
        return True

    def clear_search(self) -> None:
        keep = self.current
        self.searching = False
        self.pattern, self.scope, self.only = "", "", None
        self._filling = True
        self.query_one("#graph-filter", Input).value = ""
        self._filling = False
        self.fill_table(keep=keep)
        self.wb.refresh_footer()

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        if action == "next_match":
            # only while a typed search is active and the field is left: otherwise n is the next step
            return self.searching and bool(self.pattern) and not isinstance(self.focused, Input)
        return True

    def action_next_match(self, direction: int) -> None:
        tree = self.query_one("#module-tree", Tree)
        if self.focused is tree:
            self.next_tree_match(tree, direction)
            return
        if not self._rows:
            self.wb.say(f"no match for {self.pattern!r}", "yellow")
            return
        t = self.query_one("#nodes", DataTable)
        t.focus()
        row = (t.cursor_row + direction) % len(self._rows)
        t.move_cursor(row=row)
        self.show_node(self._rows[row])
        self.wb.say(f"match {row + 1} of {len(self._rows)}: {self._rows[row]}")

    def next_tree_match(self, tree: Tree, direction: int) -> None:
        """Jump the tree cursor to the next module whose path matches the search (opening its parents)."""
        hits = {p for p in self._tree_nodes if path_hit(p, self.pattern)}
        # the outermost matching module only: its submodules match too, but say nothing new
        paths = [p for p in self._tree_nodes if p in hits and p.rpartition(".")[0] not in hits]
        if not paths:
            self.wb.say(f"no module path matches {self.pattern!r}", "yellow")
            return
        cur = tree.cursor_node.data if tree.cursor_node is not None else ""
        order = list(self._tree_nodes)
        pos = order.index(cur) if cur in order else -1
        ahead = [p for p in paths if (order.index(p) - pos) * direction > 0]
        target = (ahead[0] if direction > 0 else ahead[-1]) if ahead else (paths[0] if direction > 0 else paths[-1])
        node = self._tree_nodes[target]
        parent = node.parent
        while parent is not None:
            parent.expand()
            parent = parent.parent
        self.call_after_refresh(tree.move_cursor, node)
        self.wb.say(f"module {paths.index(target) + 1} of {len(paths)}: {target}")

    @on(OptionList.OptionSelected, "#edges")
    def edge_selected(self, event: OptionList.OptionSelected) -> None:
        oid = event.option.id or ""
        if not oid.startswith("go:"):
            self.wb.say("this edge leads out of the graph (a graph input or output)", "dim")
            return
        parts = oid[len("go:") :].split(":")  # node:N:tensor:M
        self.follow(f"{parts[0]}:{parts[1]}")

    # ------------------------------------------------------------------ navigation
    def goto(self, nid: str) -> None:
        if nid not in self._rows:
            # the target is filtered out: show the whole graph
            self.scope, self.pattern, self.only = "", "", None
            self.searching = False
            self._filling = True
            self.query_one("#graph-filter", Input).value = ""
            self._filling = False
            self.fill_table(keep=nid)
        t = self.query_one("#nodes", DataTable)
        t.move_cursor(row=self._rows.index(nid))
        self.show_node(nid)

    def follow(self, nid: str) -> None:
        if self.current:
            self.history.append(self.current)
        self.goto(nid)
        self.query_one("#edges", OptionList).focus()

    def action_back(self) -> None:
        if isinstance(self.focused, Input):
            return
        if not self.history:
            self.wb.say("no earlier node: follow an edge first (enter on an edge)", "dim")
            return
        self.goto(self.history.pop())

    def action_filter(self) -> None:
        if self.state.snapshot is not None:
            self.query_one("#graph-filter", Input).focus()
            self.searching = bool(self.pattern)

    def action_edges(self) -> None:
        self.query_one("#edges", OptionList).focus()

    def action_toggle_focus(self) -> None:
        tree = self.query_one("#module-tree", Tree)
        if self.focused is tree:
            self.query_one("#nodes", DataTable).focus()
        else:
            tree.focus()

    def action_toggle_mark(self) -> None:
        if self.state.snapshot is None or not self.current:
            return
        toggle_mark(self.state, self.current)
        self.update_marks()
        n = len(self.state.marked)
        self.wb.say(f"{n} node(s) marked; F3 validates the region")


def toggle_mark(state, nid: str) -> None:
    if nid in state.marked:
        state.marked.remove(nid)
    else:
        state.marked.append(nid)
        order = state.snapshot.order
        state.marked.sort(key=lambda x: order.get(x, 0))
