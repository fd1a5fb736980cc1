"""Live per-iteration throughput plot (native vs external), drawn with plotext into a Static.

plotext's figure is process-global, so rendering happens only on the UI thread (the
perf gate's samples arrive through call_from_thread). Colours are palette indices 0-15,
so the plot reads the same in a 16-colour terminal.
"""

from __future__ import annotations

import threading

from rich.text import Text
from textual.widgets import Static

ARMS = ("native", "external")
_RICH_COLOURS = {"native": "bright_blue", "external": "bright_green"}
_PLOT_LOCK = threading.Lock()


def render_plot(series: dict[str, list[float]], width: int, height: int, unit: str) -> str:
    """The plotext figure as an ANSI string (palette colours only)."""
    import plotext as plt

    with _PLOT_LOCK:
        fig = plt.figure
        fig.clear()
        fig.plot_size(max(20, width), max(3, height))
        fig.theme("simple")
        fig.legend(False)
        n = max((len(series.get(arm) or []) for arm in ARMS), default=0)
        if n:
            step = max(1, (n + 5) // 6)
            fig.ruler("x").ticks(list(range(1, n + 1, step)))
        for arm in ARMS:
            ys = series.get(arm) or []
            if not ys:
                continue
            sig = fig.signal(list(range(1, len(ys) + 1)), list(ys), marker="braille")
            sig.lines()
            fig.draw(sig)
        return fig.build().string()


class ThroughputPlot(Static):
    """Samples per arm; redraws itself to its current size (survives resizes)."""

    DEFAULT_CSS = """
    ThroughputPlot { width: 1fr; height: 1fr; min-height: 6; }
    """

    def __init__(self, unit: str = "tokens/s", **kw):
        super().__init__("", **kw)
        self.unit = unit
        self.series: dict[str, list[float]] = {arm: [] for arm in ARMS}

    def clear(self, unit: str | None = None) -> None:
        if unit:
            self.unit = unit
        for ys in self.series.values():
            ys.clear()
        self.redraw()

    def add_sample(self, arm: str, index: int, value: float) -> None:
        ys = self.series.setdefault(arm, [])
        while len(ys) < index:
            ys.append(float(value))  # a missed sample: repeat the value so the x axis stays aligned
        if index < len(ys):
            ys[index] = float(value)
        else:
            ys.append(float(value))
        self.redraw()

    def legend(self) -> Text:
        t = Text()
        for arm in ARMS:
            ys = self.series.get(arm) or []
            last = f" {ys[-1]:.1f}" if ys else ""
            t.append("■ ", style=_RICH_COLOURS[arm])
            t.append(f"{arm}{last} {self.unit}   ")
        return t

    def redraw(self) -> None:
        w, h = self.size.width, self.size.height
        if w < 20 or h < 6 or not any(self.series.values()):
            msg = Text(f"per-run throughput ({self.unit}) appears here while the performance gate runs\n",
                       style="dim")
            msg.append_text(self.legend())
            self.update(msg)
            return
        body = self.legend()
        body.append("\n")
        body.append_text(Text.from_ansi(render_plot(self.series, w, h - 1, self.unit).rstrip("\n")))
        self.update(body)

    def on_resize(self) -> None:
        self.redraw()
