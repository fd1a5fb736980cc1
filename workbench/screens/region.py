"""Region screen: pick a recipe instance or use the nodes marked by hand; every change is
validated live with mcore.select_region (the failed rule and the offending node or
tensor are named); the ordered ABI table and its hash; `s` saves the receipt through the
select_recipe / select_nodes action."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import Any

from rich.text import Text
from textual import on
from textual.binding import Binding
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.widget import Widget
from textual.widgets import DataTable, Input, Label, Static

from mcore import (
    CANDIDATE_BINDING,
    ProfileCandidate,
    Receipt,
    RegionError,
    UserError,
    find_recipe,
    recipe_rows,
    select_recipe,
    select_region,
)

from ..results import Record, Selected
from .base import WorkbenchScreen


def guided_selection(step) -> tuple[str, Any] | None:
    """("recipe", [id, instance]) or ("nodes", node_ids) when a session step selects a region."""
    p = step.params
    if step.action == "select_recipe":
        return "recipe", [p.get("recipe_id"), p.get("instance")]
    if step.action == "build_bundle" and isinstance(p.get("recipe"), list):
        return "recipe", p["recipe"]
    if step.action == "select_nodes" and isinstance(p.get("node_ids"), list):
        return "nodes", p["node_ids"]
    return None


def parse_extra_args(text: str) -> list[Any]:
    text = text.strip()
    if not text:
        return []
    try:
        v = json.loads(text)
    except json.JSONDecodeError as e:
        raise RegionError(
            "extra_args",
            None,
            f'extra args: not JSON ({e.msg}); type a list like [{{"type":"int","value":32}}] or leave it empty',
        ) from None
    if isinstance(v, dict):
        v = [v]
    if not isinstance(v, list):
        raise RegionError("extra_args", None, 'extra args: expected a JSON list like [{"type":"int","value":32}]')
    return v


def parse_int(text: str, what: str, rule: str) -> int | None:
    text = text.strip()
    if not text:
        return None
    try:
        value = int(text)
    except ValueError:
        raise RegionError(rule, None, f"{what} {text!r} is not an integer") from None
    if value < 0:  # typed, never dropped: a silently dropped `-` would change the ABI hash
        raise RegionError(rule, None, f"{what} {value} is negative; type 0 or more")
    return value


class RegionScreen(WorkbenchScreen):
    SCREEN_NAME = "region"
    BINDINGS = [
        Binding("s", "save", "save receipt"),
        Binding("m", "manual", "manual"),
        Binding("space", "unmark", "unmark", show=False),
    ]

    def __init__(self) -> None:
        super().__init__()
        self._fp: str | None = None
        self.recipe: tuple[str, str] | None = None  # (id, instance) when picked from a recipe
        self.preview: Receipt | None = None
        self.error: RegionError | UserError | None = None
        self._filling = False
        self._marked_seen: list[str] = []
        self._receipt_seen: tuple | None = None
        self._guide_seen: tuple | None = None

    def compose_body(self) -> Iterable[Widget]:
        yield Static("", id="region-empty", classes="empty")
        with Vertical(id="region-main"):
            with Horizontal(id="region-top"):
                yield DataTable(id="recipes", cursor_type="row")
                yield DataTable(id="marked", cursor_type="row")
            # the binding ID gets a row of its own: it is long and it is what tells receipts apart
            with Horizontal(classes="form-row"):
                yield Label("binding id", classes="lbl")
                yield Input(id="binding-id", compact=True)
            with Horizontal(classes="form-row"):
                yield Label("workspace", classes="lbl")
                yield Input("0", id="workspace", compact=True)
                yield Label("extra", classes="lbl lbl-short")
                yield Input(placeholder='none; JSON [{"type":"int","value":32}]', id="extra-args", compact=True)
                yield Label("shape like", classes="lbl lbl-mid")
                yield Input(placeholder="fixed", id="out-like", compact=True)
            yield Static("", id="region-check")
            with VerticalScroll(id="abi-scroll"):
                yield Static("", id="abi")

    def on_mount(self) -> None:
        super().on_mount()
        r = self.query_one("#recipes", DataTable)
        # the instance first: two rows of one recipe differ only there, so it is never cut
        r.add_column("instance", key="instance")
        r.add_column("recipe", key="id")
        r.add_column("nodes", key="nodes")
        m = self.query_one("#marked", DataTable)
        m.add_column("marked", key="id", width=9)
        m.add_column("op", key="op")
        self.refresh_view()

    def focus_default(self) -> None:
        if self.state.snapshot is not None and not isinstance(self.focused, Input):
            self.query_one("#recipes", DataTable).focus()

    # ------------------------------------------------------------------ state -> widgets
    def refresh_view(self) -> None:
        super().refresh_view()
        if not self.is_mounted:
            return
        snap = self.state.snapshot
        self.query_one("#region-main").display = snap is not None
        empty = self.query_one("#region-empty", Static)
        empty.display = snap is None
        if snap is None:
            self._fp, self._receipt_seen = None, None  # a fresh state (an opened session) starts over
            empty.update(
                Text(
                    "No graph yet. Capture one on the Model screen (F1, then c); then pick a recipe "
                    "here or mark nodes with space on the Graph screen (F2).",
                    style="dim",
                )
            )
            return
        if snap.fingerprint != self._fp:
            self._fp = snap.fingerprint
            self.fill_recipes()
            self.recipe = None
        rec = self.state.receipt
        ident = (self.state.receipt_path, rec.abi_sha256, rec.node_ids) if rec else None
        if rec is not None and ident != self._receipt_seen and rec.graph_fingerprint == snap.fingerprint:
            # a receipt saved here, by a guided step or by a recipe build: show its selection
            self._receipt_seen = ident
            self.state.marked = list(rec.node_ids)
            self.fill_from_receipt(rec)
        self.follow_guide()
        self._marked_seen = list(self.state.marked)
        self.fill_marked()
        self.validate()

    def follow_guide(self) -> None:
        """Guided mode: show the selection the last step made (else the one the next step makes), once
        per step, so a refused region shows its refusal and the preview is the recipe the tutorial builds."""
        g = self.wb.guide
        if g is None:
            return
        for i in (g.index - 1, g.index):
            if 0 <= i < len(g.session.steps):
                step = g.session.steps[i]
                if guided_selection(step) is not None:
                    break
        else:
            return
        key = (id(g), i)
        if key == self._guide_seen:
            return
        self._guide_seen = key
        chosen = guided_selection(step)
        if chosen is None:
            return
        kind, sel = chosen
        rows = recipe_rows(self.snap)
        if kind == "recipe":
            for n, r in enumerate(rows):
                if (r.id, r.instance) == tuple(sel):
                    self.pick_recipe(n)
                    return
        elif kind == "nodes":
            p = step.params
            self.recipe = None
            self.state.marked = [n for n in p["node_ids"] if isinstance(n, str)]
            self._filling = True
            self.query_one("#binding-id", Input).value = str(p.get("binding_id") or "")
            self.query_one("#workspace", Input).value = str(p.get("workspace_bytes") or 0)
            extra = p.get("extra_args") or []
            self.query_one("#extra-args", Input).value = json.dumps(extra) if extra else ""
            osi = p.get("output_shape_input")
            self.query_one("#out-like", Input).value = "" if osi is None else str(osi)
            self._filling = False

    def fill_recipes(self) -> None:
        t = self.query_one("#recipes", DataTable)
        t.clear()
        for i, r in enumerate(recipe_rows(self.snap)):
            t.add_row(r.instance, r.id, ",".join(r.node_ids), key=f"{i}")

    def fill_marked(self) -> None:
        t = self.query_one("#marked", DataTable)
        t.clear()
        nodes = self.snap.node_by_id
        for nid in self.state.marked:
            t.add_row(nid, nodes[nid].op if nid in nodes else "?", key=nid)

    def fill_from_receipt(self, rec: Receipt) -> None:
        self._filling = True
        self.recipe = (rec.recipe.id, rec.recipe.instance) if rec.recipe else None
        if self.recipe is not None:
            for i, r in enumerate(recipe_rows(self.snap)):
                if (r.id, r.instance) == self.recipe:
                    self.query_one("#recipes", DataTable).move_cursor(row=i)
        self.query_one("#binding-id", Input).value = rec.binding_id
        self.query_one("#workspace", Input).value = str(rec.workspace_bytes)
        self.query_one("#extra-args", Input).value = json.dumps(list(rec.extra_args)) if rec.extra_args else ""
        osi = rec.output_shape_input
        self.query_one("#out-like", Input).value = "" if osi is None else str(osi)
        self._filling = False

    # ------------------------------------------------------------------ validation
    def current_params(self) -> dict[str, Any]:
        q = self.query_one
        binding = q("#binding-id", Input).value.strip()
        workspace = parse_int(q("#workspace", Input).value, "workspace bytes", "workspace")
        return {
            "node_ids": list(self.state.marked),
            "binding_id": binding,
            "workspace_bytes": 0 if workspace is None else workspace,
            "extra_args": parse_extra_args(q("#extra-args", Input).value),
            "output_shape_input": parse_int(q("#out-like", Input).value, "--output-shape-like-input", "output_shape"),
        }

    def recipe_still_applies(self, p: dict[str, Any]) -> bool:
        if self.recipe is None:
            return False
        try:
            r = find_recipe(self.snap, *self.recipe)
        except UserError:
            return False
        return (
            p["binding_id"] in ("", self.recipe[0])
            and list(r.node_ids) == p["node_ids"]
            and r.workspace_bytes == p["workspace_bytes"]
            and list(r.extra_args) == p["extra_args"]
            and r.output_shape_input == p["output_shape_input"]
        )

    def validate(self) -> None:
        snap = self.state.snapshot
        self.preview, self.error = None, None
        if snap is None or (self.recipe is None and not self.state.marked):
            self.show_check()  # nothing chosen yet: say how to choose, not which rule an empty choice breaks
            return
        try:
            p = self.current_params()
            if self.recipe is not None and not self.recipe_still_applies(p):
                self.recipe = None  # edited by hand: now a manual selection
            if self.recipe is not None:
                self.preview = select_recipe(snap, self.recipe[0], self.recipe[1])
            else:
                self.preview = select_region(
                    snap, p["node_ids"], p["binding_id"], p["workspace_bytes"], p["extra_args"], p["output_shape_input"]
                )
        except UserError as e:  # RegionError included: it names the rule and the node or tensor
            self.error = e
        except Exception as e:  # noqa: BLE001 - a validator bug must not take the screen down
            self.error = RegionError("internal", None, f"the validator failed: {type(e).__name__}: {e}")
        self.show_check()

    def show_check(self) -> None:
        t = Text()
        mode = f"recipe {self.recipe[0]} {self.recipe[1]}" if self.recipe else "manual selection"
        if self.error is not None:
            rule = getattr(self.error, "rule", "input")
            subject = getattr(self.error, "subject", None)
            t.append("✗ ", style="bold red")
            t.append(f"rule {rule}", style="bold red")
            if subject:
                t.append(f" · {subject}", style="bold")
            t.append(f": {self.error}", style="red")
        elif self.preview is None:
            t.append("pick a recipe instance (enter) or mark nodes on the Graph screen (F2, space)", style="dim")
        else:
            p = self.preview
            t.append("✓ ", style="bold green")
            t.append(
                f"valid {mode}: {len(p.node_ids)} node(s), {len(p.input_tensor_ids)} input(s), "
                f"1 output · s saves the receipt",
                style="green",
            )
        self.query_one("#region-check", Static).update(t)
        abi = self.query_one("#abi", Static)
        saved = self.state.receipt
        if self.preview is not None:
            p = self.preview
            head = Text()
            is_saved = (
                saved is not None
                and saved.abi_sha256 == p.abi_sha256
                and saved.node_ids == p.node_ids
                and saved.binding_id == p.binding_id
            )
            head.append(
                "ABI (call order)"
                + (
                    "  · saved as " + self.state.show_path(self.state.receipt_path) if is_saved else "  · not saved yet"
                ),
                style="bold",
            )
            # the call contract first (what the kernel implements), then the identity lines
            body = Text(
                "\n".join(
                    [
                        f"abi_sha256={p.abi_sha256}",
                        *p.call_lines(),
                        f"binding_id={p.binding_id}",
                        f"engine_role={p.engine_role}",
                        f"graph_fingerprint={p.graph_fingerprint}",
                    ]
                )
            )
            abi.update(Text.assemble(head, "\n", body))
        else:
            abi.update(Text("The ABI table appears when the selection is valid.", style="dim"))

    # ------------------------------------------------------------------ events
    @on(DataTable.RowSelected, "#recipes")
    def recipe_picked(self, event: DataTable.RowSelected) -> None:
        self.pick_recipe(int(event.row_key.value or 0))
        self.fill_marked()
        self.validate()

    def pick_recipe(self, index: int) -> None:
        r = recipe_rows(self.snap)[index]
        self.query_one("#recipes", DataTable).move_cursor(row=index)
        self.recipe = (r.id, r.instance)
        self.state.marked = list(r.node_ids)
        self._marked_seen = list(self.state.marked)
        self._filling = True
        self.query_one("#binding-id", Input).value = r.id
        self.query_one("#workspace", Input).value = str(r.workspace_bytes)
        self.query_one("#extra-args", Input).value = json.dumps(list(r.extra_args)) if r.extra_args else ""
        osi = r.output_shape_input
        self.query_one("#out-like", Input).value = "" if osi is None else str(osi)
        self._filling = False

    def use_candidate(self, c: ProfileCandidate) -> None:
        """A profile candidate (Profile screen, s): its recipe instance picked, else its nodes marked
        with the output shape it was found valid with; the receipt is still saved here with s."""
        if c.kind == "recipe":
            for n, r in enumerate(recipe_rows(self.snap)):
                if (r.id, r.instance) == (c.recipe, c.instance):
                    self.pick_recipe(n)
                    break
        else:
            self.recipe = None
            self.state.marked = list(c.node_ids)
            self._marked_seen = list(self.state.marked)
            osi = c.output_shape_input
            self._filling = True
            self.query_one("#out-like", Input).value = "" if osi is None else str(osi)
            self.query_one("#binding-id", Input).value = CANDIDATE_BINDING  # the ID it was checked with
            self._filling = False
        self.fill_marked()
        self.validate()

    @on(Input.Changed, "#binding-id, #workspace, #extra-args, #out-like")
    def param_changed(self) -> None:
        if not self._filling:
            self.validate()

    def action_unmark(self) -> None:
        t = self.query_one("#marked", DataTable)
        if self.focused is not t or not self.state.marked:
            return
        row = t.cursor_row
        if 0 <= row < len(self.state.marked):
            self.state.marked.pop(row)
            self._marked_seen = list(self.state.marked)
            self.fill_marked()
            self.validate()

    def action_manual(self) -> None:
        self.recipe = None
        if not self.query_one("#binding-id", Input).value.strip():
            fam = (self.state.snapshot.family or "my") if self.state.snapshot else "my"
            self.query_one("#binding-id", Input).value = f"{fam}.custom@1"
        self.validate()
        self.query_one("#binding-id", Input).focus()

    def action_save(self) -> None:
        if self.state.snapshot is None:
            return
        self.validate()
        if self.error is not None or self.preview is None:
            self.wb.report_error(f"not saved: {self.error or 'no valid selection'}")
            return
        p = self.current_params()
        binding = self.preview.binding_id
        receipt = f"{binding}.selection.json"
        if self.recipe is not None:
            params = {
                "snapshot": self.state.snapshot_path,
                "recipe_id": self.recipe[0],
                "instance": self.recipe[1],
                "receipt": receipt,
            }
            action = "select_recipe"
        else:
            params = {
                "snapshot": self.state.snapshot_path,
                "node_ids": p["node_ids"],
                "binding_id": binding,
                "workspace_bytes": p["workspace_bytes"],
                "extra_args": p["extra_args"],
                "output_shape_input": p["output_shape_input"],
                "receipt": receipt,
            }
            action = "select_nodes"

        def done(result: Record) -> None:
            assert isinstance(result, Selected)
            self.wb.say(f"✓ receipt saved: abi_sha256 {result.abi_sha256[:16]}…", "green")

        self.wb.perform(action, params, on_done=done, label="save the selection receipt")
