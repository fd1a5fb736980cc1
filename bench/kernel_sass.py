"""What ptxas made of an exported CuTe DSL kernel, read on any machine (no GPU needed).

An exporter run with CUTE_DSL_KEEP=cubin leaves the cubin it linked; `cuobjdump -sass` (shipped in
Triton's wheel, triton/backends/nvidia/bin) turns it into SASS. For each kernel this prints:

- its registers a thread (`cuobjdump -res-usage`);
- how many instructions lie between `griddepcontrol.wait` (ACQBULK) and the first global load: work
  on the path of every call once the kernel before has finished (the twenty-fourth session found the
  walk's block placement there, 85 instructions, which the PTX had before the wait);
- the order of the first loop's 128-bit loads and tensor-core products (L = LDG.E.128, M = HMMA):
  loads after the first product were issued only once that product's operands arrived.

    python3 bench/kernel_sass.py --selection work/attn.selection.json [-- KNOB=VALUE ...]

`summarize` and `sass_of` are what tests/test_cutedsl_decode_attention.py checks the kernel with.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXPORTER = ROOT / "kernels" / "cutedsl_decode_attention.py"


def tool(name: str) -> Path:
    """cuobjdump or nvdisasm from Triton's wheel (the test extra installs it)."""
    import triton

    path = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / name
    if not path.is_file():
        raise FileNotFoundError(f"{path}: not in this triton wheel; install triton with its NVIDIA backend")
    return path


def sass_of(cubin: Path) -> dict[str, list[str]]:
    """{kernel name: its SASS instructions, in order (opcode and operands, no addresses or encodings)}."""
    text = subprocess.run(
        [str(tool("cuobjdump")), "-sass", str(cubin)], capture_output=True, text=True, check=True
    ).stdout
    kernels: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in text.splitlines():
        m = re.search(r"Function : (\S+)", line)
        if m:
            current = kernels.setdefault(m.group(1), [])
            continue
        m = re.match(r"\s*/\*[0-9a-f]{4,}\*/\s+(.+?)\s*;", line)
        if m and current is not None:
            current.append(m.group(1))
    return kernels


def registers(cubin: Path) -> dict[str, int]:
    text = subprocess.run(
        [str(tool("cuobjdump")), "-res-usage", str(cubin)], capture_output=True, text=True, check=True
    ).stdout
    return {name: int(regs) for name, regs in re.findall(r"Function (\S+?):\s*\n\s*REG:(\d+)", text)}


def opcode(ins: str) -> str:
    """The opcode of an instruction, without its predicate (`@!P0 BRA ...` -> `BRA`)."""
    words = ins.split()
    return words[1] if words[0].startswith("@") and len(words) > 1 else words[0]


def summarize(instructions: list[str]) -> dict:
    """{"wait_to_first_load": instructions between ACQBULK and the first LDG (None without a wait),
    "loop_order": the first 128-bit-load block's loads and products as a string of L and M}."""
    ops = [opcode(i) for i in instructions]
    wait = ops.index("ACQBULK") if "ACQBULK" in ops else None
    loads = [n for n, op in enumerate(ops) if op.startswith("LDG")]
    to_load = None
    if wait is not None:
        after = [n for n in loads if n > wait]
        to_load = after[0] - wait - 1 if after else None
    wide = [n for n, op in enumerate(ops) if op == "LDG.E.128"]
    order = ""
    if wide:
        for op in ops[wide[0] :]:
            if op == "LDG.E.128":
                order += "L"
            elif op.startswith("HMMA"):
                order += "M"
            if order.count("M") == 8:  # the first k-block of the scores is enough to see the loads' place
                break
    return {"wait_to_first_load": to_load, "loop_order": order}


def export_cubin(selection: Path, env: dict[str, str], work: Path) -> Path:
    """The exporter's cubin for `selection` with the knobs in `env` (written under `work`)."""
    dump = work / "dump"
    dump.mkdir(parents=True, exist_ok=True)
    r = subprocess.run(
        [sys.executable, str(EXPORTER), "--selection", str(selection), "--output", str(work / "k.so")],
        capture_output=True,
        text=True,
        env={**os.environ, "CUTE_DSL_KEEP": "cubin", "CUTE_DSL_DUMP_DIR": str(dump), **env},
    )
    if r.returncode != 0:
        raise RuntimeError(r.stderr.strip().splitlines()[-1] if r.stderr.strip() else "export failed")
    (cubin,) = dump.rglob("*.cubin")
    return cubin


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--selection", required=True, type=Path, help="a receipt of the attention recipe")
    ap.add_argument("knobs", nargs="*", help="KNOB=VALUE exporter settings (CUTEDSL_ATTENTION_...)")
    a = ap.parse_args(argv)
    if not a.selection.is_file():
        ap.error(f"{a.selection}: no such receipt")
    if not all("=" in k for k in a.knobs):
        ap.error("knobs are KNOB=VALUE")
    with tempfile.TemporaryDirectory() as tmp:
        cubin = export_cubin(a.selection, dict(k.split("=", 1) for k in a.knobs), Path(tmp))
        regs = registers(cubin)
        for name, instructions in sass_of(cubin).items():
            s = summarize(instructions)
            short = name if len(name) <= 40 else name[:37] + "..."
            print(
                f"{short}: {regs.get(name, '?')} registers, {len(instructions)} instructions, "
                f"{s['wait_to_first_load']} between the wait and the first load, first loop {s['loop_order'] or '-'}"
            )
    return 0


if __name__ == "__main__":
    sys.exit(main())
