"""mcore's Triton kernels compile for Hopper (sm_90) in every configuration the engine launches, on a
machine without a GPU: Triton's compiler and the ptxas its wheel ships. The interpreter tests check
what the kernels compute; this checks that the GPU-only paths (programmatic dependent launch, the
rotary prologue with its in-block cache writes) build at all."""

from __future__ import annotations

import json
import subprocess
import sys

from .conftest import repo_env

_COMPILE = r"""
import itertools, json
import triton
from triton.compiler import ASTSource
from triton.backends.compiler import GPUTarget
from mcore.ops import flash_decode as fd
from mcore.ops.gemv_kernel import gemv_kernel

target = GPUTarget("cuda", 90, 32)
out = {"gemv": [], "split": {}, "merge": 0}
gemv_sig = {"X": "*bf16", "W": "*bf16", "Y": "*bf16", "NW": "*bf16", "R": "*bf16", "N": "i32", "eps": "fp32",
            **{c: "constexpr" for c in ("K", "BLOCK_N", "BLOCK_K", "PDL", "GLU", "NORM", "RESIDUAL")}}
for pdl, glu, norm, res in itertools.product([False, True], repeat=4):
    const = {"K": 4096, "BLOCK_N": 2, "BLOCK_K": 1024, "PDL": pdl, "GLU": glu, "NORM": norm, "RESIDUAL": res}
    k = triton.compile(ASTSource(fn=gemv_kernel, signature=gemv_sig, constexprs=const), target=target,
                       options={"num_warps": 8, "num_stages": 3})
    out["gemv"].append(len(k.asm["cubin"]))
split_sig = {"Q": "*bf16", "K": "*bf16", "V": "*bf16", "LEN": "*i32", "PACC": "*fp32", "PML": "*fp32", "OUT": "*bf16",
             "QNW": "*bf16", "KNW": "*bf16", "COS": "*fp32", "SIN": "*fp32", "eps": "fp32",
             "scale": "fp32", "C": "i32",
             **{c: "constexpr" for c in ("S", "ROWS", "D", "BLOCK_M", "BLOCK_N", "NSPLIT", "NSPLIT_P2", "WIDE",
                                         "UPCAST", "INTERP", "PDL", "ROPE", "QKNORM", "KVH", "S_P2")}}
# as the launcher specializes them for the engine's tensors: pointers 16-byte aligned, the capacity a
# multiple of 16 (without it the loads are not pipelined and the shared memory is another kernel's)
names = list(split_sig)
aligned = {(names.index(n),): [["tt.divisibility", 16]]
           for n in ("Q", "K", "V", "LEN", "PACC", "PML", "OUT", "QNW", "KNW", "COS", "SIN", "C")}
# the plain split in both launches, and the rotary prologue (mcore::rope_decode_attention) with and without
# the q/k norms, with PDL (the default on Hopper) and without
for pdl, rope, qknorm in [(False, 0, 0), (True, 0, 0), (True, 1, 1), (True, 1, 0), (False, 1, 1)]:
    const = {"S": 1, "ROWS": 4, "D": 128, "BLOCK_M": 16, "BLOCK_N": 64, "NSPLIT": 33, "NSPLIT_P2": 64,
             "WIDE": False, "UPCAST": False, "INTERP": False, "PDL": pdl, "ROPE": bool(rope),
             "QKNORM": bool(qknorm), "KVH": 8, "S_P2": 1}
    stages = fd.ROPE_STAGES if rope else fd.NUM_STAGES  # as mcore/ops/flash_decode.py launches them
    k = triton.compile(ASTSource(fn=fd._split_kernel, signature=split_sig, constexprs=const, attrs=aligned),
                       target=target,
                       options={"num_warps": fd.NUM_WARPS, "num_stages": stages})
    ptx = k.asm["ptx"]
    out["split"][f"pdl={pdl} rope={rope} qknorm={qknorm}"] = {
        "cubin": len(k.asm["cubin"]),
        "atoms": sum(" atom." in l for l in ptx.splitlines()),
        "barriers": sum(l.strip().startswith("bar.sync") for l in ptx.splitlines()),
        "griddepcontrol": sum("griddepcontrol" in l for l in ptx.splitlines()),
        "shared": k.metadata.shared,
    }
merge_sig = {"PACC": "*fp32", "PML": "*fp32", "OUT": "*bf16",
             **{c: "constexpr" for c in ("ROWS", "D", "NSPLIT", "NSPLIT_P2", "PDL")}}
for pdl in (False, True):
    const = {"ROWS": 4, "D": 128, "NSPLIT": 33, "NSPLIT_P2": 64, "PDL": pdl}
    k = triton.compile(ASTSource(fn=fd._merge_kernel, signature=merge_sig, constexprs=const), target=target,
                       options={"num_warps": 4})
    out["merge"] += bool(k.asm["cubin"])
# the prologue alone (mcore::rope_decode_inputs, before a bound slot), with and without the q/k norms and PDL
inputs_sig = {"QKV": "*bf16", "Q": "*bf16", "K": "*bf16", "V": "*bf16", "LEN": "*i32", "LOUT": "*i32", "QNW": "*bf16", "KNW": "*bf16",
              "COS": "*fp32", "SIN": "*fp32", "eps": "fp32", "scale": "fp32", "C": "i32",
              **{c: "constexpr" for c in ("S", "ROWS", "D", "BLOCK_M", "KVH", "S_P2", "QKNORM", "PDL")}}
out["inputs"] = {}
for pdl, qknorm in [(True, True), (True, False), (False, True)]:
    const = {"S": 1, "ROWS": 4, "D": 128, "BLOCK_M": 16, "KVH": 8, "S_P2": 1, "QKNORM": qknorm, "PDL": pdl}
    k = triton.compile(ASTSource(fn=fd._inputs_kernel, signature=inputs_sig, constexprs=const), target=target,
                       options={"num_warps": fd.NUM_WARPS})
    out["inputs"][f"pdl={pdl} qknorm={qknorm}"] = sum("griddepcontrol" in l for l in k.asm["ptx"].splitlines())
print(json.dumps(out))
"""


def test_kernels_compile_for_sm90_in_every_launch_the_engine_makes(tmp_path):
    r = subprocess.run(
        [sys.executable, "-c", _COMPILE],
        capture_output=True,
        text=True,
        timeout=600,
        env=repo_env(TRITON_CACHE_DIR=str(tmp_path / "triton"), TRITON_DEFAULT_FP_FUSION="1"),
    )
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert len(out["gemv"]) == 16 and all(out["gemv"]) and out["merge"] == 2 and len(out["split"]) == 5
    assert out["inputs"] == {"pdl=True qknorm=True": 2, "pdl=True qknorm=False": 2, "pdl=False qknorm=True": 0}
    for name, k in out["split"].items():
        assert k["cubin"] and k["atoms"] == 0, (name, k)  # no cross-program traffic: the merge is its own kernel
        # PDL: the wait for the previous kernel and the early launch of the next (mcore/ops/pdl.py)
        assert k["griddepcontrol"] == (2 if "pdl=True" in name else 0), (name, k)
    # the rotary prologue's cache writes reach the whole block (a barrier more) before it reads its share
    plain = out["split"]["pdl=True rope=0 qknorm=0"]["barriers"]
    assert all(k["barriers"] > plain for name, k in out["split"].items() if "rope=1" in name), out["split"]
    # the rotary prologue's blocks are placed while the q/k/v product still runs (PDL): its shared
    # memory keeps them at two an SM (an sm_90 SM has 228 KB; each block reserves 1 KB more), so the
    # 8B step's two blocks an SM land evenly (mcore/ops/flash_decode.py, ROPE_STAGES)
    sm, reserved = 228 * 1024, 1024
    for name, k in out["split"].items():
        if "rope=1" in name:
            assert 2 * (k["shared"] + reserved) <= sm < 3 * (k["shared"] + reserved), (name, k["shared"])
