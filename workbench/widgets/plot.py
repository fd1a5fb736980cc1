"""Text plots for the Verify screen, drawn cell by cell (no plotting library, no global state):
the per-pair measurements of native vs external with each arm's median and spread, every pair's
ratio with the perf gate's interval against its threshold, and the per-element absolute error of
an embedding against the gate's threshold.

Every axis is labelled with its unit and plain numbers. Colours are ANSI names, so the plots
read the same in a 16-colour terminal.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence

from rich.text import Text
from textual.widgets import Static

ARMS = ("native", "external")
ARM_STYLE = {"native": "bright_blue", "external": "bright_green"}
ARM_MARK = {"native": "●", "external": "◆"}


def plain(v: float) -> str:
    """A number as people write it on an axis: no exponent, digits by magnitude."""
    a = abs(v)
    if a >= 100:
        return f"{v:,.0f}"
    if a >= 10:
        return f"{v:.1f}"
    if a >= 0.1 or a == 0:
        return f"{v:.2f}"
    return f"{v:.4f}".rstrip("0")


class Canvas:
    """A grid of (char, style) cells; row 0 is the top."""

    def __init__(self, width: int, height: int):
        self.w, self.h = width, height
        self.cells = [[(" ", "")] * width for _ in range(height)]

    def put(self, x: int, y: int, ch: str, style: str = "") -> None:
        if 0 <= x < self.w and 0 <= y < self.h:
            self.cells[y][x] = (ch, style)

    def text(self, x: int, y: int, s: str, style: str = "") -> None:
        for i, ch in enumerate(s):
            self.put(x + i, y, ch, style)

    def render(self) -> Text:
        t = Text(no_wrap=True)
        for r, row in enumerate(self.cells):
            for ch, style in row:
                t.append(ch, style=style)
            if r < self.h - 1:
                t.append("\n")
        return t


def _scale(lo: float, hi: float, rows: int):
    span = (hi - lo) or 1.0

    def y_of(v: float) -> int:
        return int(round((hi - v) / span * (rows - 1)))

    return y_of


def _y_axis(c: Canvas, lo: float, hi: float, rows: int, top: int, gutter: int) -> None:
    """Tick labels at the top, middle and bottom rows, and the axis line."""
    for frac in (0.0, 0.5, 1.0):
        y = top + int(round(frac * (rows - 1)))
        c.text(0, y, plain(hi - frac * (hi - lo)).rjust(gutter - 1)[: gutter - 1], "dim")
    for y in range(top, top + rows):
        c.put(gutter - 1, y, "│", "dim")


def throughput_plot(series: Mapping[str, Sequence[float]], width: int, height: int, unit: str) -> Text:
    """Points per measured pair (native ● / external ◆), each arm's median as a dashed line and
    its spread (min..max) as a bar at the right; y in `unit`, x the pair number."""
    n = max((len(series.get(a) or []) for a in ARMS), default=0)
    values = [v for a in ARMS for v in (series.get(a) or [])]
    if not n or not values or width < 30 or height < 5:
        return Text("")
    lo, hi = min(values), max(values)
    pad = (hi - lo) * 0.1 or max(abs(hi) * 0.05, 1e-9)
    lo, hi = max(0.0, lo - pad), hi + pad
    gutter = max(len(plain(hi)), len(plain(lo))) + 1
    rows = height - 3  # unit title, x axis, x labels
    c = Canvas(width, height)
    c.text(0, 0, f"{unit} per pair, ╌ median"[:width], "bold")
    top = 1
    y_of = _scale(lo, hi, rows)
    _y_axis(c, lo, hi, rows, top, gutter)
    spread_w = 6  # the two spread bars at the right
    plot_w = width - gutter - spread_w
    xs = [gutter + 1 + int((i + 0.5) * (plot_w - 2) / n) for i in range(n)]
    for arm in ARMS:  # medians first, so points draw over them
        ys = series.get(arm) or []
        if ys:
            y = top + y_of(statistics.median(ys))
            for x in range(gutter, gutter + plot_w):
                if c.cells[y][x][0] == " ":
                    c.put(x, y, "╌", ARM_STYLE[arm])
    for k, arm in enumerate(ARMS):
        ys = series.get(arm) or []
        for i, v in enumerate(ys):
            c.put(
                xs[i] + (k * 2 - 1 if plot_w // n >= 4 else 0), top + y_of(v), ARM_MARK[arm], "bold " + ARM_STYLE[arm]
            )
        if ys:  # spread: min..max of the arm, a tick at its median
            x = gutter + plot_w + 1 + k * 3
            y0, y1, ym = top + y_of(max(ys)), top + y_of(min(ys)), top + y_of(statistics.median(ys))
            for y in range(y0, y1 + 1):
                c.put(x, y, "│", ARM_STYLE[arm])
            c.put(x, y0, "┬" if y1 > y0 else "─", ARM_STYLE[arm])
            c.put(x, y1, "┴" if y1 > y0 else "─", ARM_STYLE[arm])
            c.put(x, ym, "┼" if y1 > y0 else "─", "bold " + ARM_STYLE[arm])
    axis_y = top + rows
    c.put(gutter - 1, axis_y, "└", "dim")
    for x in range(gutter, gutter + plot_w):
        c.put(x, axis_y, "─", "dim")
    c.text(gutter + plot_w + 1, axis_y, "range", "dim")  # the bars at the right: min..max per arm
    label_y = axis_y + 1
    for i, x in enumerate(xs):
        if n <= 12 or i % ((n + 11) // 12) == 0:
            c.text(x - len(str(i + 1)) // 2, label_y, str(i + 1), "dim")
    c.text(0, label_y, "pair", "dim")
    return c.render()


def error_plot(errors: Sequence[float], limit: float, width: int, height: int) -> Text:
    """Per-element |native - external|, largest first (a falling curve), with the max_abs
    threshold as a dashed line: every point must stay under it."""
    if not errors or width < 30 or height < 5:
        return Text("")
    errs = sorted((abs(e) for e in errors), reverse=True)
    hi = max(errs[0], limit) * 1.15 or 1.0
    lo = 0.0
    gutter = max(len(plain(hi)), len(plain(lo))) + 1
    rows = height - 3
    c = Canvas(width, height)
    c.text(0, 0, "|native-external| per element, largest first"[:width], "bold")
    top = 1
    y_of = _scale(lo, hi, rows)
    _y_axis(c, lo, hi, rows, top, gutter)
    plot_w = width - gutter - 1
    yl = top + y_of(limit)
    for x in range(gutter, gutter + plot_w):
        c.put(x, yl, "╌", "red")
    c.text(gutter + max(0, plot_w - 14), yl, f" max_abs {plain(limit)}", "red")
    m = len(errs)
    for col in range(plot_w):
        i = min(m - 1, int(col * m / plot_w))
        v = errs[i]
        c.put(gutter + col, top + y_of(v), "•", "bold red" if v > limit else "bold bright_green")
    axis_y = top + rows
    c.put(gutter - 1, axis_y, "└", "dim")
    for x in range(gutter, gutter + plot_w):
        c.put(x, axis_y, "─", "dim")
    c.text(0, axis_y + 1, "rank", "dim")
    c.text(gutter, axis_y + 1, "1", "dim")
    c.text(gutter + plot_w - len(str(m)), axis_y + 1, str(m), "dim")
    return c.render()


def cosine_gauge(cosine: float | None, min_cosine: float, width: int) -> Text:
    """Two rows: the cosine and its minimum, then the cosine ◆ on a scale from (1 - 10 x margin)
    to 1 with the minimum drawn as ┃ (everything right of it passes)."""
    t = Text(no_wrap=True)
    t.append("cosine ", style="bold")
    if cosine is None:
        t.append("undefined (an embedding is all zeros)", style="red")
        return t
    ok = cosine >= min_cosine
    t.append(f"{cosine:.7f}", style="bold green" if ok else "bold red")
    t.append(f"  min {min_cosine:g} ┃", style="red")
    t.append("\n")
    lo = 1.0 - 10 * (1.0 - min_cosine)
    left = plain(lo) + " "
    bar_w = max(10, width - len(left) - 3)
    pos = int(round((min(max(cosine, lo), 1.0) - lo) / (1.0 - lo) * (bar_w - 1)))
    thr = int(round((min_cosine - lo) / (1.0 - lo) * (bar_w - 1)))
    t.append(left, style="dim")
    for i in range(bar_w):
        if i == pos:
            t.append("◆", style="bold green" if ok else "bold red")
        elif i == thr:
            t.append("┃", style="red")
        else:
            t.append("─", style="dim")
    t.append(" 1", style="dim")
    return t


def legend(series: Mapping[str, Sequence[float]], width: int) -> Text:
    """Each arm's median (what the verdict uses, the dashed line) and spread, one row per arm."""
    out = Text()
    for k, arm in enumerate(ARMS):
        ys = series.get(arm) or []
        t = Text(no_wrap=True)
        t.append(f"{ARM_MARK[arm]} {arm:<8} ", style="bold " + ARM_STYLE[arm])
        if ys:
            t.append(f"median {plain(statistics.median(ys))}")
            t.append(f" ({plain(min(ys))}–{plain(max(ys))})", style="dim")
        else:
            t.append("-", style="dim")
        t.truncate(width)
        out.append_text(t)
        if k == 0:
            out.append("\n")
    return out


def pair_ratios(series: Mapping[str, Sequence[float]]) -> list[float]:
    """external/native of every pair both arms have measured (the gate's per-pair ratios)."""
    return [e / n for n, e in zip(series.get("native") or [], series.get("external") or [], strict=False) if n > 0]


VERDICT_STYLE = {"PROMOTE": "bold green", "REJECT": "bold red", "INCONCLUSIVE": "bold yellow"}


def ratio_gauge(
    ratios: Sequence[float], interval: tuple[float, float, float] | None, min_ratio: float, verdict: str, width: int
) -> Text:
    """Two rows: a key (pair ratio ×, the interval ━ and its confidence, the threshold ┃, the verdict),
    then the ratio axis with every pair's ratio, the interval and the threshold (red)."""
    t = Text(no_wrap=True)
    t.append("× pair ratio", style="bold")
    if interval is not None:
        t.append(f" ━ {interval[2] * 100:.4g}% interval", style="dim")
    t.append(f" ┃ {min_ratio:g}", style="red")
    if verdict and t.cell_len + len(verdict) + 3 <= width:  # the verdict also heads the lines below
        t.append(f" → {verdict}", style=VERDICT_STYLE.get(verdict, "bold"))
    t.truncate(width)
    t.append("\n")
    shown = [min_ratio, *ratios] + ([v for v in interval[:2] if 0 < v and math.isfinite(v)] if interval else [])
    x_lo, x_hi = min(shown), max(shown)
    pad = (x_hi - x_lo) * 0.08 or max(abs(x_hi) * 0.01, 1e-6)
    x_lo, x_hi = x_lo - pad, x_hi + pad
    left, right = plain(x_lo) + " ", " " + plain(x_hi)
    bar_w = max(10, width - len(left) - len(right))
    cells = [("─", "dim")] * bar_w

    def col(v: float) -> int:
        return int(round((min(max(v, x_lo), x_hi) - x_lo) / (x_hi - x_lo) * (bar_w - 1)))

    if interval is not None and interval[0] > 0 and math.isfinite(interval[1]):
        style = VERDICT_STYLE.get(verdict, "bold").replace("bold ", "")
        for i in range(col(interval[0]), col(interval[1]) + 1):
            cells[i] = ("━", style)
    cells[col(min_ratio)] = ("┃", "red")
    for r in ratios:
        cells[col(r)] = ("×", "bold")
    t.append(left, style="dim")
    for ch, style in cells:
        t.append(ch, style=style)
    t.append(right, style="dim")
    return t


class ThroughputPlot(Static):
    """Samples per arm, then every pair's ratio with the gate's interval and threshold; redraws itself
    to its current size (survives resizes)."""

    DEFAULT_CSS = """
    ThroughputPlot { width: 1fr; height: 1fr; min-height: 6; }
    """

    def __init__(self, unit: str = "tokens/s", **kw):
        super().__init__("", **kw)
        self.unit = unit
        self.series: dict[str, list[float]] = {arm: [] for arm in ARMS}
        self.note = ""
        self.min_ratio = 0.98
        self.interval: tuple[float, float, float] | None = None  # (low, high, confidence) once decided
        self.verdict = ""

    def redraw(self) -> None:
        w, h = self.size.width, self.size.height
        if w < 30 or h < 6 or not any(self.series.values()):
            msg = Text(f"each measured pair ({self.unit}) appears here while the performance gate runs", style="dim")
            if self.note:
                msg.append("\n" + self.note, style="dim")
            self.update(msg)
            return
        body = legend(self.series, w)
        ratios = pair_ratios(self.series)
        room = h - 2 - (2 if ratios else 0)  # the ratio axis first: it is what the gate decides on
        if room >= 5:
            body.append("\n")
            body.append_text(throughput_plot(self.series, w, room, self.unit))
        if ratios:
            body.append("\n")
            body.append_text(ratio_gauge(ratios, self.interval, self.min_ratio, self.verdict, w))
        self.update(body)

    def on_resize(self) -> None:
        self.redraw()


class ErrorPlot(Static):
    """The correctness view: embeddings as an error curve with the thresholds; tokens as a strip
    of positions, equal or not, with the first divergence named."""

    DEFAULT_CSS = """
    ErrorPlot { width: 1fr; height: 1fr; min-height: 6; }
    """

    def __init__(self, **kw):
        super().__init__("", **kw)
        self.errors: list[float] | None = None
        self.limits: tuple[float, float] = (0.02, 0.999)
        self.cosine: float | None = None
        self.tokens: tuple[list[int], list[int]] | None = None
        self.placeholder = ""

    def redraw(self) -> None:
        w, h = self.size.width, self.size.height
        if self.errors is not None and w >= 30 and h >= 6:
            body = cosine_gauge(self.cosine, self.limits[1], w)
            body.append("\n")
            body.append_text(error_plot(self.errors, self.limits[0], w, h - 2))
            self.update(body)
        elif self.tokens is not None:
            self.update(token_strip(*self.tokens, width=w))
        else:
            self.update(Text(self.placeholder, style="dim"))

    def on_resize(self) -> None:
        self.redraw()


def first_divergence(native: Sequence[int], external: Sequence[int]) -> int | None:
    """0-based position of the first differing generated token (a length difference counts)."""
    for i, (a, b) in enumerate(zip(native, external, strict=False)):  # the shorter: a length difference
        if a != b:
            return i
    return None if len(native) == len(external) else min(len(native), len(external))


def token_strip(native: Sequence[int], external: Sequence[int], width: int) -> Text:
    t = Text()
    t.append("generated tokens, position by position\n", style="bold")
    n = max(len(native), len(external))
    for i in range(n):
        same = i < len(native) and i < len(external) and native[i] == external[i]
        t.append("▮" if same else "▯", style="green" if same else "bold red")
    d = first_divergence(native, external)
    t.append("\n")
    if d is None:
        t.append(f"all {n} positions equal", style="green")
    else:
        a = native[d] if d < len(native) else "(none)"
        b = external[d] if d < len(external) else "(none)"
        t.append(f"first divergence at position {d + 1}: native {a} vs external {b}", style="bold red")
    t.append("\nper-step logits are not recorded by generate, so tokens are compared exactly", style="dim")
    return t


def share_bars(rows: Sequence[tuple[str, float]], width: int, title: str) -> Text:
    """One row per (label, share of the total): the label cut from the left (the end of a module
    path is what tells rows apart), a bar of the share and the share in percent."""
    t = Text(no_wrap=True, overflow="ellipsis")
    t.append(title, style="bold")
    pct_w, bar_w = 7, max(4, min(20, width // 3))
    label_w = max(6, width - bar_w - pct_w - 1)
    for label, share in rows:
        shown = label if len(label) <= label_w else "…" + label[-(label_w - 1) :]
        filled = int(round(max(0.0, min(1.0, share)) * bar_w))
        t.append("\n" + shown.ljust(label_w) + " ")
        t.append("█" * filled, style="cyan")
        t.append("░" * (bar_w - filled), style="dim")
        t.append(f"{share:7.1%}")
    return t
