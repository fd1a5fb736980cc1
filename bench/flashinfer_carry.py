"""Pack what bench/attention_gpu.py's FlashInfer rows need from a flashinfer-python wheel into one
archive small enough to carry to the offline GPU machine beside the CuTe DSL.

    python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 \\
        --platform manylinux2014_x86_64 -d /tmp/fi flashinfer-python==0.7.4
    python3 bench/flashinfer_carry.py /tmp/fi/flashinfer_python-0.7.4-py3-none-any.whl .whl/flashinfer-carry.tar.xz

The wheel (101 MB; 0.7.4 ships no compiled kernels: it JIT-compiles them with nvcc and ninja from the
CUDA sources inside it) is over one device call's 64 MiB. The archive keeps (about 6 MB):
- every .py of the package folders that `import flashinfer` and the decode modules' generators load
  (found by importing the unpacked wheel in a child process; modules this machine lacks, such as
  `requests`, are stood in for during that probe only: the device has them), and their small .json;
- the headers the decode and prefill JIT modules include: data/include, data/cccl (libcudacxx, cub,
  thrust), data/spdlog; and from data/csrc the single/batch decode and prefill sources, their jinja
  templates and the shared top-level headers (not the hundreds of unrelated kernel families);
- the license files.
On the device `bench/attention_gpu.py --flashinfer ARCHIVE` unpacks it under /tmp and imports it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path

CSRC_FAMILIES = ("single_decode", "batch_decode", "single_prefill", "batch_prefill")
DATA_TREES = ("data/include", "data/cccl", "data/spdlog")

PROBE = r"""
import importlib.abc, importlib.machinery, json, os, sys, types
root, fake = sys.argv[1], set(sys.argv[2:])
sys.path.insert(0, root)
os.environ.setdefault("FLASHINFER_CUDA_ARCH_LIST", "9.0a")


class StandIn(types.ModuleType):  # only so the import completes here; never packed
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return StandIn(f"{self.__name__}.{name}")

    def __call__(self, *a, **k):
        return StandIn("call")

    def __mro_entries__(self, bases):
        return (object,)


class Fake(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        if name.split(".")[0] in fake:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)

    def create_module(self, spec):
        m = StandIn(spec.name)
        m.__path__ = []
        return m

    def exec_module(self, module):
        pass


sys.meta_path.insert(0, Fake())
import torch
import flashinfer, flashinfer.decode, flashinfer.prefill
from flashinfer.jit.attention import modules as jm
bf = torch.bfloat16
jm.gen_single_decode_module(bf, bf, bf, 128, 128, 0, False, False)
jm.gen_batch_decode_module(bf, bf, bf, torch.int32, 128, 128, 0, False, False)
pkg = os.path.join(root, "flashinfer")
files = sorted({m.__file__ for m in list(sys.modules.values()) if (getattr(m, "__file__", None) or "").startswith(pkg)})
print(json.dumps([os.path.relpath(f, root) for f in files]))
"""


def loaded_modules(root: Path) -> list[str]:
    """The flashinfer files (relative to `root`) that importing it and generating the decode modules
    load. A module this machine lacks is stood in for (one more each try) so the import completes."""
    fake: list[str] = []
    for _ in range(20):
        r = subprocess.run([sys.executable, "-c", PROBE, str(root), *fake], capture_output=True, text=True)
        if r.returncode == 0:
            return json.loads(r.stdout.strip().splitlines()[-1])
        missing = re.findall(r"No module named '([^'.]+)", r.stderr)
        if not missing or missing[-1] in fake:
            break
        fake.append(missing[-1])
    sys.exit(f"flashinfer_carry: importing the unpacked wheel failed:\n{r.stderr[-3000:]}")


def members(root: Path, loaded: list[str]) -> list[str]:
    """The archive's files, relative to `root`."""
    pkg = root / "flashinfer"
    folders = {(root / f).parent for f in loaded}
    keep = {str(p.relative_to(root)) for d in folders for p in d.glob("*.py")}
    keep |= {str(p.relative_to(root)) for d in folders for p in d.glob("*.json") if p.stat().st_size < 65536}
    for tree in DATA_TREES:
        keep |= {str(p.relative_to(root)) for p in (pkg / tree).rglob("*") if p.is_file()}
    for p in (pkg / "data" / "csrc").iterdir():
        own = p.name.startswith(CSRC_FAMILIES)
        shared = p.suffix in (".h", ".cuh") and not p.name.startswith("cake_")
        if p.is_file() and (own or shared) and p.stat().st_size < 262144:
            keep.add(str(p.relative_to(root)))
    keep |= {str(p.relative_to(root)) for p in root.glob("*.dist-info/licenses/*")}
    keep |= {str(p.relative_to(root)) for p in root.glob("*.dist-info/LICENSE*")}
    return sorted(keep)


def main() -> int:
    if len(sys.argv) != 3 or not sys.argv[1].endswith(".whl"):
        print("usage: python3 bench/flashinfer_carry.py FLASHINFER_WHEEL.whl OUT.tar.xz", file=sys.stderr)
        return 2
    wheel, out = Path(sys.argv[1]), Path(sys.argv[2])
    if not wheel.is_file():
        print(f"flashinfer_carry: {wheel} not found; download it first (see this file's docstring)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="fi-carry-") as tmp:
        root = Path(tmp)
        zipfile.ZipFile(wheel).extractall(root)
        files = members(root, loaded_modules(root))
        out.parent.mkdir(parents=True, exist_ok=True)
        staged = out.with_name(f".{out.name}.{os.getpid()}.tmp")
        with tarfile.open(staged, "w:xz") as tar:
            for f in files:
                tar.add(root / f, arcname=f)
        staged.replace(out)
    print(
        f"{out}: {len(files)} files, {out.stat().st_size / 2**20:.1f} MiB (from {wheel.name}, {wheel.stat().st_size / 2**20:.0f} MiB)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
