"""Running a kernel exporter: a Python script that compiles a kernel for a selection receipt and
writes one TVM-FFI DSO (the generated CuTe DSL stubs, the shipped decode-attention exporter).

One implementation for `mcore kernel export`, the workbench's `export_kernel` step and its
replay. An exporter is run in a fresh interpreter (it may import the CuTe DSL, which this process
need not have), in its own process group with a time limit (MCORE_EXPORT_TIMEOUT seconds, default
1800) and bounded output (mcore/subproc.py), its output streamed line by line, cancellable; its
last lines say what it wrote (`binding_id=`, `abi_sha256=`, `arch=`, `dso=`). An exporter that
refuses its input exits 2 with one line, which becomes this module's error.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional, Union

from .errors import UserError
from .kernels import kernels_dir
from .progress import NO_PROGRESS, Progress
from .subproc import run_bounded, timeout_from_env

PathArg = Union[str, os.PathLike]

# Exporters that ship with mcore (kernels/), by name: they run without a trust prompt.
SHIPPED_EXPORTERS = {
    "cutedsl-decode-attention": "cutedsl_decode_attention.py",
}


@dataclass
class ExportResult:
    library: Path
    binding_id: Optional[str]
    abi_sha256: Optional[str]
    arch: Optional[str]
    lines: list[str] = field(default_factory=list)
    library_sha256: Optional[str] = None  # of the DSO written, as mcore read it (not as the exporter said)


def shipped_exporter(name: str) -> Optional[Path]:
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


def run_exporter(
    exporter: PathArg,
    selection: PathArg,
    output: PathArg,
    snapshot: Optional[PathArg] = None,
    progress: Progress = NO_PROGRESS,
    log: Optional[Callable[[str], None]] = None,
    cwd: Optional[PathArg] = None,
) -> ExportResult:
    """Run `exporter` for the receipt `selection`, writing the DSO `output` (never over a file)."""
    script = exporter_script(exporter)
    sel, out = Path(selection), Path(output)
    if not sel.is_file():
        raise UserError(
            f"{sel}: selection receipt not found; make one with `mcore graph select` or `mcore build --recipe`"
        )
    if out.exists() or out.is_symlink():
        raise UserError(f"{out} already exists; exporters never replace a file: choose another --output or remove it")
    if not out.parent.is_dir():
        raise UserError(f"{out.parent}: output folder does not exist")
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

    progress.report(f"exported {dso.name}", 1.0)
    return ExportResult(
        dso, fields.get("binding_id"), fields.get("abi_sha256"), fields.get("arch"), text, library_sha256(dso)
    )
