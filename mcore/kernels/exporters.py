"""Running a kernel exporter: a Python script that compiles a kernel for a selection receipt and
writes one TVM-FFI DSO (the generated CuTe DSL stubs, the shipped decode-attention exporter).

One implementation for `mcore kernel export`, the workbench's `export_kernel` step and its
replay. An exporter is run in a fresh interpreter (it may import the CuTe DSL, which this process
need not have), in its own process group with a time limit (MCORE_EXPORT_TIMEOUT seconds, default
1800) and bounded output (mcore/common/subproc.py), its output streamed line by line, cancellable; its
last lines say what it wrote (`binding_id=`, `abi_sha256=`, `arch=`, `dso=`). An exporter that
refuses its input exits 2 with one line, which becomes this module's error.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ..common.errors import UserError
from ..common.fileio import check_overwrite, install_file
from ..common.progress import NO_PROGRESS, Progress
from ..common.subproc import run_bounded, timeout_from_env
from .shipped import kernels_dir

PathArg = str | os.PathLike

# Exporters that ship with mcore (kernels/), by name: they run without a trust prompt.
SHIPPED_EXPORTERS = {
    "cutedsl-decode-attention": "cutedsl_decode_attention.py",
}
# what each one is, as `mcore kernel list` and the workbench's kernel list show it
EXPORTER_DESCRIPTIONS = {
    "cutedsl-decode-attention": (
        "CuTe DSL split-KV decode attention for the receipts of qwen.decode_attention_region@2 "
        "(any layer; head dim 64 or 128, BF16/FP16; sm_90 GPU, needs nvidia-cutlass-dsl)"
    ),
}


@dataclass(frozen=True)
class CatalogEntry:
    """One kernel mcore ships: built from sources (`kernel build NAME`) or exported for a receipt
    (`kernel export NAME --selection R`)."""

    name: str
    kind: str  # "build" | "export"
    description: str
    detail: str  # the ABI (build) or what it needs (export)
    command: str


def kernel_catalog() -> list[CatalogEntry]:
    """Every shipped kernel and exporter, in one list (the CLI's `kernel list` and the workbench's)."""
    from .shipped import KERNELS

    rows = [
        CatalogEntry(k.name, "build", k.description, k.abi, f"mcore kernel build {k.name} -o KERNEL.so")
        for k in (KERNELS[n] for n in sorted(KERNELS))
    ]
    for name in sorted(SHIPPED_EXPORTERS):
        rows.append(
            CatalogEntry(
                name,
                "export",
                EXPORTER_DESCRIPTIONS.get(name, f"exporter kernels/{SHIPPED_EXPORTERS[name]}"),
                f"compiled for the receipt it is given: kernels/{SHIPPED_EXPORTERS[name]}",
                f"mcore kernel export {name} --selection RECEIPT -o KERNEL.so",
            )
        )
    return rows


@dataclass
class ExportResult:
    library: Path
    binding_id: str | None
    abi_sha256: str | None
    arch: str | None
    lines: list[str] = field(default_factory=list)
    library_sha256: str | None = None  # of the DSO written, as mcore read it (not as the exporter said)


def shipped_exporter(name: str) -> Path | None:
    """The script of a shipped exporter named `name`, or None when `name` is not one."""
    f = SHIPPED_EXPORTERS.get(name)
    return kernels_dir() / f if f else None


def exporter_script(exporter: PathArg) -> Path:
    """A shipped exporter's name or the path of an exporter script (.py) -> the script."""
    shipped = shipped_exporter(str(exporter))
    if shipped is not None:
        return shipped
    p = Path(exporter).expanduser()
    if p.suffix != ".py":
        names = ", ".join(SHIPPED_EXPORTERS)
        raise UserError(
            f"exporter {exporter}: name a shipped exporter ({names}) or an exporter script (.py), "
            "such as one `mcore kernel stub` wrote"
        )
    if not p.is_file():
        raise UserError(f"exporter {p}: no such file; generate one with `mcore kernel stub`")
    return p


def check_snapshot_given(exporter: PathArg, snapshot: PathArg | None) -> None:
    """A stub (`mcore kernel stub` wrote it: its FixedContract checks the graph) needs the snapshot:
    refused here in one line, not by the exporter's argparse usage after it started."""
    if snapshot is not None or shipped_exporter(str(exporter)) is not None:
        return
    script = exporter_script(exporter)
    try:
        text = script.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return  # unreadable: running it says why
    # the kit's exporters require --snapshot unless they say otherwise; any other script decides alone
    stub = "kit.FixedContract(" in text and "snapshot_required=False" not in text
    if stub:
        raise UserError(
            f"exporter {script.name} is a stub: it checks the graph snapshot too; "
            "pass --snapshot SNAPSHOT (the snapshot the receipt was made from)"
        )


def run_exporter(
    exporter: PathArg,
    selection: PathArg,
    output: PathArg,
    snapshot: PathArg | None = None,
    progress: Progress = NO_PROGRESS,
    log: Callable[[str], None] | None = None,
    cwd: PathArg | None = None,
    overwrite: bool = False,
) -> ExportResult:
    """Run `exporter` for the receipt `selection`, writing the DSO `output` (the one overwrite rule:
    over an existing file only with `overwrite`). The exporter writes a temp file beside `output`,
    which replaces it only once the exporter succeeded: nothing is half-written."""
    script = exporter_script(exporter)
    sel, out = Path(selection), Path(output)
    if not sel.is_file():
        raise UserError(
            f"{sel}: selection receipt not found; make one with `mcore graph select` or `mcore build --recipe`"
        )
    check_snapshot_given(script, snapshot)
    check_overwrite(out, overwrite)
    tmp = out.with_name(f".{out.name}.{os.getpid()}.export{out.suffix}")

    def relay(line: str) -> None:
        # the exporter names the temp file it wrote; the user gets `out`: say that path (as it was written)
        if line.startswith("dso=") and Path(line[4:]).name == tmp.name:
            line = f"dso={Path(line[4:]).with_name(out.name)}"
        if log is not None:
            log(line)

    try:
        res = _export(script, sel, tmp, snapshot, progress, relay, cwd)
        if res.library.resolve() == tmp.resolve():
            install_file(out, tmp, overwrite)
            res.library = out
    finally:
        tmp.unlink(missing_ok=True)
    progress.report(f"exported {res.library.name}", 1.0)
    return res


def _export(
    script: Path,
    sel: Path,
    out: Path,
    snapshot: PathArg | None,
    progress: Progress,
    log: Callable[[str], None] | None,
    cwd: PathArg | None,
) -> ExportResult:
    """Run the exporter script, writing `out`; what it says it wrote."""
    cmd = [sys.executable, str(script), "--selection", str(sel), "--output", str(out)]
    if snapshot is not None:
        cmd += ["--snapshot", str(snapshot)]
    progress.report(f"running {script.name}", 0.0)
    text: list[str] = []

    def line(ln: str) -> None:
        text.append(ln)
        del text[:-1000]  # the last lines say what it wrote; the log has seen the rest
        if log is not None:
            log(ln)

    timeout = timeout_from_env("MCORE_EXPORT_TIMEOUT", 1800.0)
    hint = "; set MCORE_EXPORT_TIMEOUT=SECONDS to allow longer"
    rc = run_bounded(
        cmd, f"exporter {script.name}", timeout, progress, line, merge_stderr=True, cwd=cwd, limit_hint=hint
    ).returncode
    if rc != 0:
        last = next((ln for ln in reversed(text) if ln.strip()), f"exit code {rc}")
        hint = "" if rc == 2 else " (the CuTe DSL exporters need `pip install nvidia-cutlass-dsl`, gcc and libcudart)"
        raise UserError(f"exporter {script.name} failed (exit {rc}): {last.strip()[:300]}{hint}")
    fields = dict(ln.split("=", 1) for ln in text if "=" in ln and ln.split("=", 1)[0].isidentifier())
    dso = Path(fields["dso"]) if "dso" in fields else out
    if not dso.is_absolute():
        dso = Path(cwd or ".") / dso
    if not dso.is_file():
        raise UserError(f"exporter {script.name} exited 0 but wrote no DSO at {dso}")
    from .dso import library_sha256

    # the bytes the exporter wrote, hashed before they are installed (install copies them unchanged)
    return ExportResult(
        dso, fields.get("binding_id"), fields.get("abi_sha256"), fields.get("arch"), text, library_sha256(dso)
    )
