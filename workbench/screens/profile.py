"""Profile screen (p on the Graph screen): where the time goes in one role of a bundle, from
mcore's profile report of the engine it names (by default the one the pipeline runs: compiled on
CUDA, op by op on the CPU; `e` picks another): time by module subtree and by op kind as bars (a
compiled profile's time between kernels among them), and the candidate regions ranked by net
headroom. `s` (or enter) takes the highlighted candidate to the Region screen with its nodes marked
(its recipe instance picked), where the receipt is saved as usual."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any

from rich.text import Text
from textual import on
from textual.binding import Binding
from textual.containers import Horizontal, Vertical
from textual.widget import Widget
from textual.widgets import DataTable, Static

from mcore import PartialProfile, ProfileCandidate, ProfileReport

from ..messages import ActionDone, ActionProgress
from ..widgets.plot import share_bars
from .base import WorkbenchScreen, bar_text, on_action

ROOMY_HEIGHT = 32  # from this height the bars show 10 rows each, below 5


Shown = ProfileReport | PartialProfile  # a finished report, or a running profile's live view


def module_rows(report: Shown, top: int) -> list[tuple[str, float]]:
    """The hottest module subtrees, leaving out the root and wrappers that hold all the time."""
    rows = [(m.path, m.rates.share) for m in report.modules if m.path != "<root>" and m.rates.share < 0.999]
    return sorted(rows, key=lambda r: -r[1])[:top]


def op_rows(report: Shown, top: int) -> list[tuple[str, float]]:
    """Time by op kind (aten.mm.default -> mm), summed over the role's nodes, and a compiled step's
    time between kernels as a row of its own."""
    shares: dict[str, float] = defaultdict(float)
    for n in report.nodes:
        op = n.op.removeprefix("aten.").removesuffix(".default")
        shares[op] += n.rates.share
    if isinstance(report, ProfileReport) and report.between_kernels:
        shares["between kernels"] += report.between_kernels.share
    return sorted(shares.items(), key=lambda r: -r[1])[:top]


ENGINES = ("auto", "compiled", "torch")


def engine_text(p: Shown) -> str:
    """Which engine the report profiled, and for a compiled one how its step's time splits."""
    if isinstance(p, PartialProfile):  # a live view of an op-by-op profile
        return f"{len(p.nodes)} nodes timed op by op"
    if p.engine.name == "torch":
        return f"engine torch: {len(p.nodes)} nodes timed op by op"
    kernels = len(p.kernels or ())  # a compiled profile has kernels and the time between them
    between = p.between_kernels.share if p.between_kernels else 0.0
    return (
        f"engine compiled: {kernels} kernels, between kernels {between:.1%}, "
        f"attributed {p.attributed_seconds / p.step_seconds:.1%} of the step"
        if p.step_seconds > 0
        else f"engine compiled: {kernels} kernels"
    )


def candidate_name(c: ProfileCandidate) -> str:
    return c.name


class ProfileScreen(WorkbenchScreen):
    SCREEN_NAME = "profile"
    BINDINGS = [
        Binding("r", "run_profile", "profile"),
        Binding("e", "next_engine", "engine"),
        Binding("f", "run_profile(True)", "op by op + fusion"),
        Binding("s", "select_candidate", "select region"),
    ]

    def __init__(self) -> None:
        super().__init__()
        self._shown: Shown | None = None  # the report the widgets show
        self.engine = "auto"  # what r profiles: auto is the engine the pipeline runs on its device

    def compose_body(self) -> Iterable[Widget]:
        yield Static("", id="profile-empty", classes="empty")
        with Vertical(id="profile-main"):
            yield Static("", id="profile-head")
            with Horizontal(id="profile-bars"):
                yield Static("", id="bars-modules")
                yield Static("", id="bars-ops")
            yield DataTable(id="candidates", cursor_type="row")

    def on_mount(self) -> None:
        super().on_mount()
        t = self.query_one("#candidates", DataTable)
        for label, key in (
            ("#", "rank"),
            ("share", "share"),
            ("headroom", "headroom"),
            ("nodes", "nodes"),
            ("kind", "kind"),
            ("candidate", "name"),
        ):
            t.add_column(label, key=key)
        self.refresh_view()

    def focus_default(self) -> None:
        if self.state.profile is not None:
            self.query_one("#candidates", DataTable).focus()

    def on_resize(self, event) -> None:
        super().on_resize(event)
        self._shown = None  # the bars' row count and width follow the size
        self.refresh_view()

    # ------------------------------------------------------------------ state -> widgets
    def refresh_view(self) -> None:
        super().refresh_view()
        if not self.is_mounted:
            return
        p: Shown | None = self.state.profile
        live = self.state.profile_partial if self.wb.busy == "profile" else None
        if live is not None:  # a running profile: its bars fill in step by step
            p = live
        self.query_one("#profile-main").display = p is not None
        empty = self.query_one("#profile-empty", Static)
        empty.display = p is None
        if p is None:
            if self.wb.busy != "profile":
                empty.update(
                    Text(
                        f"No profile yet. Press r to profile the native bundle on engine {self.engine} "
                        "(build it on the Build screen, F5, first; e picks the engine: auto is the one the "
                        "pipeline runs, compiled on CUDA and op by op on the CPU): the time of its kernels "
                        "or nodes attributed to modules, recipe instances and candidate regions.",
                        style="dim",
                    )
                )
            return
        if p is self._shown:
            return
        self._shown = p
        top = 10 if self.app.size.height >= ROOMY_HEIGHT else 5
        half = max(20, (self.query_one("#profile-bars").size.width or self.app.size.width) // 2 - 1)
        from mcore import describe_device

        ctx = f" · context {p.context}" if isinstance(p, ProfileReport) and p.context else ""
        head = Text(no_wrap=True, overflow="ellipsis")
        head.append(f"Profile {p.role}{ctx}", style="bold")
        head.append(f" · {p.bundle.model} · {engine_text(p)} · {describe_device(p.device.to_dict())}")
        if isinstance(p, PartialProfile):
            head.append(f" · live: step {p.step}/{p.steps}, candidates when done (x cancels)", style="yellow")
        elif self.state.profile_path:
            head.append(f" · {self.state.show_path(self.state.profile_path)}", style="dim")
        self.query_one("#profile-head", Static).update(head)
        self.query_one("#bars-modules", Static).update(share_bars(module_rows(p, top), half, "time by module"))
        self.query_one("#bars-ops", Static).update(share_bars(op_rows(p, top), half, "time by op"))
        t = self.query_one("#candidates", DataTable)
        t.clear()
        for i, c in enumerate(p.candidates if isinstance(p, ProfileReport) else ()):  # a live view has none yet
            # net headroom as a share of the step: what a kernel at the copy limit could save at most,
            # less what splitting the compiled engine's fused kernels there costs
            room = c.net_headroom_seconds / (p.attributed_seconds or 1e-12)
            t.add_row(
                str(i + 1),
                f"{c.share:.1%}",
                f"≤{room:.1%}",
                str(len(c.node_ids)),
                c.kind,
                candidate_name(c) + (f"  splits {len(c.splits)} fused" if c.splits else ""),
                key=str(i),
            )

    @on_action
    def on_action_done(self, message: ActionDone) -> None:
        """A finished profile hands the keys to its candidates: Down moves, s takes the highlighted one."""
        if message.outcome.action == "profile" and message.outcome.kind == "ok":
            self.query_one("#candidates", DataTable).focus()

    @on_action
    def on_action_progress(self, message: ActionProgress) -> None:
        if message.action == "profile" and self.state.profile is None:
            empty = self.query_one("#profile-empty", Static)
            bar = bar_text(message.fraction, 30)
            empty.update(Text.assemble((bar, "cyan"), f" {message.step}  ", ("x cancels", "dim")))

    # ------------------------------------------------------------------ keys
    def action_next_engine(self) -> None:
        """e: the engine r profiles, in turn auto, compiled, torch."""
        self.engine = ENGINES[(ENGINES.index(self.engine) + 1) % len(ENGINES)]
        self.wb.say(
            f"r profiles engine {self.engine}" + (" (the one the pipeline runs)" if self.engine == "auto" else "")
        )
        self._shown = None
        self.refresh_view()

    def action_run_profile(self, fusion: bool = False) -> None:
        """r: profile the native bundle on the chosen engine; f: op by op, also compiled once more to
        mark under each candidate how many fused kernels a slot there would split."""
        st = self.state
        b = st.bundles.get("native")
        if b is None:
            self.wb.report_error("no native bundle to profile yet: build one on the Build screen (F5, then b)")
            return
        role = st.engine_role if st.engine_role in b.result.fingerprints else None
        params: dict[str, Any] = {
            "bundle": b.result.bundle,
            "output": f"profile-{role or 'default'}.json",
            "role": role,
            "steps": 3,
        }
        if fusion:
            params.update(fusion=True, engine="torch")
        elif self.engine != "auto":
            params["engine"] = self.engine
        label = "profile the native bundle" + (" op by op, and its fusion" if fusion else f" (engine {self.engine})")
        self.wb.perform("profile", params, label=label)

    @on(DataTable.RowSelected, "#candidates")
    async def candidate_chosen(self, event: DataTable.RowSelected) -> None:
        await self.action_select_candidate()

    async def action_select_candidate(self) -> None:
        p, st = self.state.profile, self.state
        if p is None or not p.candidates:
            self.wb.say("no candidate to select: press r to profile first", "yellow")
            return
        row = self.query_one("#candidates", DataTable).cursor_row
        c = p.candidates[max(0, min(row, len(p.candidates) - 1))]
        if st.snapshot is None or st.snapshot.fingerprint != p.bundle.fingerprint:
            self.wb.report_error(
                f"the captured graph is not the profiled {p.role} graph: capture that role "
                "(Model screen, F1) with the bundle's build arguments, then select again"
            )
            return
        from .region import RegionScreen

        await self.wb.go("region")
        region = self.wb.get_screen("region")
        if isinstance(region, RegionScreen):
            region.use_candidate(c)
        self.wb.say(f"{candidate_name(c)}: {len(c.node_ids)} node(s) marked; s saves the receipt", "green")
