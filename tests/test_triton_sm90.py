"""mcore's Triton kernels compile for Hopper (sm_90) in every configuration the engine launches, on a
machine without a GPU: Triton's compiler and the ptxas its wheel ships. The interpreter tests check
what the kernels compute; this checks that the GPU-only paths (programmatic dependent launch, the
folded merge's atomics) build at all, and that the folded merge counts itself in the way its
correctness needs: one thread's acquire-release atomic after a barrier, its result shared through
shared memory, and the partials read past L1."""

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
             "CNT": "*i32", "QNW": "*bf16", "KNW": "*bf16", "COS": "*fp32", "SIN": "*fp32", "eps": "fp32",
             "scale": "fp32", "C": "i32",
             **{c: "constexpr" for c in ("S", "ROWS", "D", "BLOCK_M", "BLOCK_N", "NSPLIT", "NSPLIT_P2", "WIDE",
                                         "UPCAST", "INTERP", "PDL", "FOLD", "ROPE", "QKNORM", "KVH", "S_P2")}}
# the plain split in every launch, and the rotary prologue (mcore::rope_decode_attention) with and without
# the q/k norms, with PDL (the default on Hopper), folded or not
combos = [(pdl, fold, 0, 0) for pdl in (False, True) for fold in (False, True)]
combos += [(True, False, 1, 1), (True, True, 1, 1), (True, True, 1, 0)]
for pdl, fold, rope, qknorm in combos:
    const = {"S": 1, "ROWS": 4, "D": 128, "BLOCK_M": 16, "BLOCK_N": 64, "NSPLIT": 33, "NSPLIT_P2": 64,
             "WIDE": False, "UPCAST": False, "INTERP": False, "PDL": pdl, "FOLD": fold, "ROPE": bool(rope),
             "QKNORM": bool(qknorm), "KVH": 8, "S_P2": 1}
    k = triton.compile(ASTSource(fn=fd._split_kernel, signature=split_sig, constexprs=const), target=target,
                       options={"num_warps": 4, "num_stages": 3})
    lines = [l.strip() for l in k.asm["ptx"].splitlines()]
    atoms = [i for i, l in enumerate(lines) if " atom." in l or l.startswith("atom.")]
    out["split"][f"pdl={pdl} fold={fold} rope={rope} qknorm={qknorm}"] = {
        "cubin": len(k.asm["cubin"]),
        "atoms": [lines[i] for i in atoms],
        # what comes between the last partial store before the first atomic and that atomic
        "barrier_before": bool(atoms) and any(l.startswith("bar.sync") for l in lines[max(0, atoms[0] - 40):atoms[0]]),
        # every thread's fence, then the barrier, then the count (the fence after the last partial store)
        "fence_before": bool(atoms) and any(l.startswith("fence.acq_rel.gpu") for l in lines[max(0, atoms[0] - 40):atoms[0]]),
        "fences": sum(l.startswith("fence.acq_rel.gpu") for l in lines),
        "shared_after": bool(atoms) and any("st.shared" in l for l in lines[atoms[0]:atoms[0] + 6]),
        "cg_loads": sum("ld.global.cg" in l for l in lines),
    }
merge_sig = {"PACC": "*fp32", "PML": "*fp32", "OUT": "*bf16",
             **{c: "constexpr" for c in ("ROWS", "D", "NSPLIT", "NSPLIT_P2", "PDL")}}
for pdl in (False, True):
    const = {"ROWS": 4, "D": 128, "NSPLIT": 33, "NSPLIT_P2": 64, "PDL": pdl}
    k = triton.compile(ASTSource(fn=fd._merge_kernel, signature=merge_sig, constexprs=const), target=target,
                       options={"num_warps": 4})
    out["merge"] += bool(k.asm["cubin"])
print(json.dumps(out))
"""


def test_kernels_compile_for_sm90_and_the_folded_merge_counts_in_after_a_barrier(tmp_path):
    r = subprocess.run(
        [sys.executable, "-c", _COMPILE],
        capture_output=True,
        text=True,
        timeout=600,
        env=repo_env(TRITON_CACHE_DIR=str(tmp_path / "triton"), TRITON_DEFAULT_FP_FUSION="1"),
    )
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert len(out["gemv"]) == 16 and all(out["gemv"]) and out["merge"] == 2 and len(out["split"]) == 7
    for name, k in out["split"].items():
        assert k["cubin"], name
        if "fold=False" in name:
            assert k["atoms"] == [] and k["fences"] == 0, name
            continue
        add, xchg = k["atoms"]  # count in, then reset: each by one predicated thread, gpu scope, acq_rel
        assert add.startswith("@%p") and "atom.global.gpu.acq_rel.add" in add, (name, add)
        assert xchg.startswith("@%p") and "atom.global.gpu.acq_rel.exch" in xchg, (name, xchg)
        assert k["barrier_before"] and k["shared_after"] and k["cg_loads"] > 0, (name, k)
        assert k["fence_before"] and k["fences"] == 2, (name, k)  # the writers' fence and the last arrival's
