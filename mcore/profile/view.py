"""The printed views of profiles: `mcore profile`'s summary and `mcore profile diff`'s comparison."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar

from ..common.errors import UserError
from .report import ProfileCandidate, ProfileModule, ProfileRecipe, ProfileReport

_Row = TypeVar("_Row", ProfileRecipe, ProfileModule)


def _ms(s: float) -> str:
    return f"{s * 1e3:.3f} ms"


def head_lines(report: ProfileReport) -> list[str]:
    """Which engine, on what device, the step's time and where it went (kernels, between them)."""
    dev = report.device
    ctx = f", context {report.context}" if report.context else ""
    engine = report.engine
    lines = [
        f"profile {report.role} on {dev.name} ({dev.type}){ctx}, engine {engine.name}: {engine.how}",
        f"limit: copy {dev.copy_bytes_per_s / 1e9:.1f} GB/s"
        + (f" (peak {dev.theoretical_bytes_per_s / 1e9:.0f} GB/s)" if dev.theoretical_bytes_per_s else "")
        + (f"; math: bf16 {dev.peak_bf16_flops_per_s / 1e12:.0f} TFLOP/s peak" if dev.peak_bf16_flops_per_s else ""),
        f"timing: {report.timing}",
    ]
    step, total = report.step_seconds, report.attributed_seconds
    ratio = f" ({total / step:.1%} of the step)" if step > 0 else ""
    between = report.between_kernels
    if between is None:
        lines.append(f"step {_ms(step)}; attributed {_ms(total)}{ratio} over {len(report.nodes)} nodes")
        return lines
    clock = "device time" if dev.type == "cuda" else "wall clock"
    lines.append(
        f"step {_ms(step)} ({clock}); attributed {_ms(total)}{ratio}: kernels "
        f"{_ms(report.kernel_seconds or 0.0)} in {len(report.kernels or ())} calls, between kernels "
        f"{_ms(between.seconds)} ({between.share:.1%}, {between.gaps} gaps)"
        + (f", kernels no graph node claims {_ms(report.unattributed_seconds)}" if report.unattributed_seconds else "")
    )
    if step > 0 and total > 1.05 * step:
        lines.append(overhead_note(report))
    return lines


def overhead_note(report: ProfileReport) -> str:
    """Said where the profiled step outran the step measured apart: the profiler's own cost per
    launch lands between kernels, and on a short step that is a visible share (a 29 us step on the
    H200 showed 5.7 us of it, 2026-12-02); the kernels' own times still compare."""
    step, kernels = report.step_seconds, report.kernel_seconds or 0.0
    return (
        f"note: the profiled step took {report.attributed_seconds / step:.0%} of the step measured apart: "
        f"the profiler's cost shows as time between kernels; the kernels add up to {kernels / step:.0%} "
        "of the step, so compare kernels with each other and with the step, not the gaps"
    )


def top_lines(report: ProfileReport, top: int) -> list[str]:
    """The printed view: the head, the hottest modules and the ranked candidate regions."""
    lines = head_lines(report)
    lines.append(
        "modules (time per step, share, bytes moved, achieved GB/s, achieved GFLOP/s, time at the limit / time):"
    )
    for m in [m for m in report.modules if m.path != "<root>"][:top]:
        r = m.rates
        lines.append(
            f"  {m.path:<48} {r.seconds * 1e3:9.3f} ms {r.share:6.1%} {r.bytes / 1e6:9.2f} MB "
            f"{r.bytes_per_s / 1e9:7.2f} GB/s {r.flops_per_s / 1e9:8.1f} GFLOP/s {r.ratio_to_limit:6.1%}"
        )
    if report.kernels:
        lines.append(f"top {min(top, len(report.kernels))} kernels (time, share, time at the limit / time, nodes):")
        for k in sorted(report.kernels, key=lambda k: -k.rates.seconds)[:top]:
            lines.append(
                f"  {k.kernel[:60]:<60} {k.rates.seconds * 1e3:9.3f} ms {k.rates.share:6.1%} "
                f"{k.rates.ratio_to_limit:6.1%} {len(k.node_ids)}"
            )
    for s in report.slots:
        lines.append(f"slot {s.binding_id}: {_ms(s.rates.seconds)} {s.rates.share:.1%} over {s.calls} call(s)")
    lines.append(
        f"top {top} candidate regions (headroom = time minus time at the limit: the most a kernel could save; "
        "net: less what splitting fused kernels costs):"
    )
    for i, c in enumerate(report.candidates[:top], 1):
        what = f"{c.recipe} {c.instance}" if c.kind == "recipe" else f"region {c.module_path}"
        lines.append(
            f"  {i:2}. {what}: {_ms(c.seconds)} {c.share:.1%}, headroom {_ms(c.headroom_seconds)}"
            + (f", net {_ms(c.net_headroom_seconds)}" if c.split_cost_seconds else "")
        )
        lines.append(f"      {c.command}")
        lines += _split_lines(c)
    fusion = report.fusion
    if fusion:
        ks = fusion.kernels
        fused = [k for k in ks if len(k.nodes) > 1]
        lines.append(
            f"fusion ({fusion.engine}): {len(ks)} kernels for "
            f"{sum(len(k.nodes) for k in ks)} nodes, {len(fused)} of them fusing several nodes"
        )
    return lines


def _split_lines(c: ProfileCandidate) -> list[str]:
    splits = c.splits or ()
    if not splits:
        return []
    parts = [f"{k.kernel} ({k.inside} inside, {k.outside} outside)" for k in splits[:4]]
    more = f" and {len(splits) - 4} more" if len(splits) > 4 else ""
    cost = f"; the nodes outside then run unfused: at least {_ms(c.split_cost_seconds)}" if c.split_cost_seconds else ""
    return [f"      a slot here splits {len(splits)} fused kernel(s): {', '.join(parts)}{more}{cost}"]


def check_comparable(a: ProfileReport, b: ProfileReport, labels: Sequence[str]) -> None:
    """Two profiles compare region by region only when they timed the same engine, role and device kind."""
    get: Callable[[ProfileReport], str]
    for what, get in (
        ("engine", lambda p: p.engine.name),
        ("role", lambda p: p.role),
        ("device", lambda p: p.device.type),
    ):
        if get(a) != get(b):
            raise UserError(
                f"{labels[0]} profiles {what} {get(a)!r} but {labels[1]} {what} {get(b)!r}: profile both with "
                f"the same --{what} to compare them region by region"
            )


def diff_lines(a: ProfileReport, b: ProfileReport, labels: Sequence[str] = ("a", "b")) -> list[str]:
    """Two checked profiles (say native and with a kernel bound), region by region: b minus a."""
    check_comparable(a, b, labels)
    ctx = [p.context for p in (a, b)]
    where = (
        "" if ctx == [None, None] else f", context {ctx[0]}" if ctx[0] == ctx[1] else f", context {ctx[0]} vs {ctx[1]}"
    )
    lines = [
        f"engine {a.engine.name}, role {a.role}{where}",
        _delta(
            "step (device time)" if a.device.type == "cuda" and a.between_kernels else "step",
            a.step_seconds,
            b.step_seconds,
            labels,
        ),
        _delta("attributed", a.attributed_seconds, b.attributed_seconds, labels),
    ]
    if a.between_kernels and b.between_kernels:
        lines.append(_delta("between kernels", a.between_kernels.seconds, b.between_kernels.seconds, labels))
        lines.append(
            _delta(
                f"kernels ({len(a.kernels or ())} -> {len(b.kernels or ())} calls)",
                a.kernel_seconds or 0.0,
                b.kernel_seconds or 0.0,
                labels,
            )
        )
    slots = {s.binding_id for p in (a, b) for s in p.slots}
    for binding in sorted(slots):
        sa = sum(s.rates.seconds for s in a.slots if s.binding_id == binding)
        sb = sum(s.rates.seconds for s in b.slots if s.binding_id == binding)
        lines.append(_delta(f"slot {binding}", sa, sb, labels))
    lines += _changed("recipe", _by(a.recipes, lambda r: r.recipe), _by(b.recipes, lambda r: r.recipe), 10)
    lines += _changed(
        "recipe instance",
        _by(a.recipes, lambda r: f"{r.recipe} {r.instance}"),
        _by(b.recipes, lambda r: f"{r.recipe} {r.instance}"),
        10,
    )
    lines += _changed("module", _by(a.modules, lambda r: r.path), _by(b.modules, lambda r: r.path), 10)
    return lines


def _delta(what: str, sa: float, sb: float, labels: Sequence[str]) -> str:
    ratio = f", x{sb / sa:.3f}" if sa > 0 else ""
    return f"{what}: {labels[0]} {_ms(sa)}, {labels[1]} {_ms(sb)} ({(sb - sa) * 1e3:+.3f} ms{ratio})"


def _by(rows: Iterable[_Row], key: Callable[[_Row], str]) -> dict[str, float]:
    out: dict[str, float] = defaultdict(float)
    for r in rows:
        out[key(r)] += r.rates.seconds
    return out


def _changed(what: str, ra: dict[str, float], rb: dict[str, float], top: int) -> list[str]:
    """The `top` rows that changed most, b minus a, with the count of rows compared."""
    keys = sorted(set(ra) | set(rb), key=lambda k: (-abs(rb.get(k, 0.0) - ra.get(k, 0.0)), k))
    lines = [f"{what}s ({len(keys)}), largest changes first:"] if keys else []
    for k in keys[:top]:
        d = rb.get(k, 0.0) - ra.get(k, 0.0)
        lines.append(f"  {k}: {ra.get(k, 0.0) * 1e3:.3f} -> {rb.get(k, 0.0) * 1e3:.3f} ms ({d * 1e3:+.3f})")
    return lines
