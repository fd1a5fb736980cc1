#!/usr/bin/env python3
"""CuTe DSL decode attention for the decoder families' attention recipe (tutorial step 5):
qwen.decode_attention_region@2 (Qwen3), llama.decode_attention_region@1, mistral.decode_attention_region@1
and qwen2.decode_attention_region@1, one region per layer with the same boundary.

STATUS: the GPU checks in tests/test_cutedsl_decode_attention.py (marked `gpu`, against
mcore.ops.decode_attention_reference) and bench/attention_gpu.py (speed on the Qwen3-8B-sized
config) are what vouch for it; docs/gpu-results.md has their latest results on the H200.

Written by hand (not by `mcore kernel stub`), in the generated exporters' structure: a contract check
that needs no CuTe DSL, the kernel, then compile (`--enable-tvm-ffi`), export_to_c and link. Unlike a
generated exporter it is not pinned to one graph: it serves every receipt of these recipes whose ABI
fits (any model of those families, any layer), and compiles for that receipt's shapes: the published
Llama 3.x, Mistral 7B and Qwen2.5 models have head_dim 64 or 128 and 1 to 8 query heads a KV head.

The ABI (the receipt's call order; `mcore build --recipe qwen.decode_attention_region@2 ...`, or the
family's own id, e.g. llama.decode_attention_region@1):
    run(query, key_cache, value_cache, kv_lengths, context)
    run(query, key_cache, value_cache, kv_lengths, workspace, context)   (built with --workspace-bytes N)
    query        T     [1, H, -1, D]   already scaled by the model (softmax scale here is 1.0)
    key_cache    T     [1, KV, C, D]   after this step's update
    value_cache  T     [1, KV, C, D]
    kv_lengths   INT32 [1]             on the device: valid positions including the s new tokens
    context      T     [1, H, -1, D]   shaped like input 0 (output_shape_input = 0)
    T is BF16 or FP16, D is 64 or 128, H is a multiple of KV (grouped-query attention).
    workspace: none (the recipe's), or UINT8 [N] declared at build (`--workspace-bytes N`, in the ABI
    hash): the split schedule below; the exporter prints the N for its splits. Extra args: none.

Semantics (mcore.ops.decode_attention): query i of the s new tokens sits at position
length - s + i and attends the keys 0..length - s + i (causal among the new tokens).

Schedule (split-KV, flash-decoding across a thread block cluster, Hopper): one cluster of CLUSTER
blocks per (KV head, new token), each block serving the whole GQA group, so K and V are read once
per group (CUTEDSL_ATTENTION_HEADS_PER_BLOCK=1: a cluster per query head, more blocks). The
attended keys [0, end) are cut into CLUSTER * WARPS equal contiguous shares fixed by the length
alone; each warp walks its share 32 keys at a time with an online softmax per head (running max,
per-lane sums, fp32 accumulator over the lane's D/32 columns) where the group has more than 8
heads (or CUTEDSL_ATTENTION_MMA=0). Groups of at most 8 heads (Qwen3's 4) walk 16 keys at a time
on tensor cores instead (mma.sync m16n8k16: scores Q K^T, then context^T += V^T P^T with the
probabilities kept in registers; see `walk_mma`): on the H200, 1.2-1.7x the scalar walk.
Warps merge in warp order through shared memory, then rank 0 merges the blocks in rank order,
reading their shared memory through the cluster (distributed shared memory): deterministic, no
atomics, and no global scratch, which the recipe's ABI (no workspace) could not provide.
With a workspace in the receipt: SPLITS blocks (no cluster) per (KV head, new token) each write
their partial result (fp32 context row, max, sum per head) to the workspace, and a second kernel
merges each row's records in split order (deterministic, no atomics; the contents of the workspace
on entry do not matter). A cluster caps a row at 8 (16) blocks; splits can fill the GPU.
Measured slower on the H200 and removed (docs/gpu-results.md, tenth session): the split count from
the device length, the merge folded into a row's last block (an atomic counter in the workspace),
and a TMA ring (bulk copies by a producer warp into shared memory); earlier, a cp.async ring.

Numerics (mirroring mcore/flash_decode.py): products and sums in fp32; the softmax in fp32 (exp
through ex2.approx); probabilities rounded to T for the product with V (the sum of probabilities is
not rounded); the context rounded to T once.

No host sync: the length is read from the device tensor inside the kernel, so the launch (grid
H / heads per block * s * CLUSTER, WARPS * 32 threads) is the same on every call and can be captured
in a CUDA graph. The launch uses the TVM-FFI environment stream (the engine's current stream), never
the default stream by itself, with programmatic dependent launch (Hopper; CUTEDSL_ATTENTION_PDL=0
turns it off), as the compiled engine's own kernels on Hopper: the kernel may start while the
kernel before it drains, waits for it (griddepcontrol.wait) before touching global memory, and lets
the next kernel launch once its walk has read the caches.
Precondition (the engine guarantees it): s <= length <= C. Keys past C are never read.

Use (needs nvidia-cutlass-dsl with its CUDA 13 libs, apache-tvm-ffi, gcc and libcudart):
    mcore build BUILD_ARGS --recipe qwen.decode_attention_region@2 decoder.layers.0.decode_attention -o work/attn.bundle
    python kernels/cutedsl_decode_attention.py --selection work/attn.selection.json --output work/attn.so
    add --snapshot SNAPSHOT to also check the graph the receipt was made from; add --check-only to run
    only the contract check (it needs no CuTe DSL). A build of several instances writes one receipt per
    slot (X.selection.INSTANCE.json); they share the ABI, so any one of them serves.
Every mismatch is refused with one line and exit 2; an existing output is never overwritten. With no
GPU visible, CUTE_DSL_ARCH defaults to sm_90a (that DSO runs on sm_90 GPUs such as H100/H200).
It prints binding_id=..., abi_sha256=... and dso=PATH; bind the DSO with function name `run`; one
bindings-manifest entry binds every layer's slot of the bundle.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

# ---------------------------------------------------------------- the contract

# The attention recipe of each decoder family (mcore/families/decoder_family.py): one boundary, so one
# kernel serves them all. A receipt keeps its recipe's id as the binding id; this prints it back.
BINDING_IDS = (
    "qwen.decode_attention_region@2",
    "llama.decode_attention_region@1",
    "mistral.decode_attention_region@1",
    "qwen2.decode_attention_region@1",
)
ABI_FORMAT = "mcore.tvm_ffi.abi/1"
DTYPES = ("BF16", "FP16")
HEAD_DIMS = (64, 128)
# Snapshot metadata recorded but not fingerprinted (mcore.graph.snapshot.UNHASHED_METADATA).
UNHASHED_METADATA = ["tool_versions"]

EXIT_CONTRACT = 2  # a selection/snapshot that does not match, an existing output
EXIT_EXPORT = 1  # compile, export or link failed
PROG = Path(sys.argv[0]).name if sys.argv and sys.argv[0] else "exporter"


class ContractError(Exception):
    """The selection or snapshot does not match this exporter; the message says what and what to do."""


def _canonical_json(data):
    return json.dumps(data, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=False)


def _sha256(data):
    return hashlib.sha256(_canonical_json(data).encode()).hexdigest()


def abi_contract(inputs, outputs, workspace_bytes, extra_args, output_shape_input):
    """Exactly what abi_sha256 covers (the same definition as mcore.selection.abi_contract)."""
    extras = []
    for arg in extra_args:
        arg = dict(arg)
        if arg.get("type") == "float":
            arg["value"] = float(arg["value"])
        extras.append(arg)
    return {
        "format": ABI_FORMAT,
        "inputs": [{"dtype": t["dtype"], "shape": list(t["shape"])} for t in inputs],
        "outputs": [{"dtype": t["dtype"], "shape": list(t["shape"])} for t in outputs],
        "workspace_bytes": workspace_bytes,
        "extra_args": extras,
        "output_shape_input": output_shape_input,
    }


def _load_json(path, what):
    p = Path(path)
    if not p.is_file():
        raise ContractError(f"{path}: {what} not found; check the path")
    try:
        return json.loads(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:
        raise ContractError(f"{path}: cannot read the {what} as JSON ({type(e).__name__}: {e})") from None


def _is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


PATTERN = "query T [1,H,-1,D], key and value caches T [1,KV,C,D], INT32 [1] -> T [1,H,-1,D]"
RESELECT = (
    "select the region with `mcore build --recipe RECIPE INSTANCE` on a BF16 or FP16 build, RECIPE being "
    "the model's attention recipe (qwen.decode_attention_region@2 for Qwen3, <family>.decode_attention_region@1 "
    "for llama, mistral, qwen2)"
)


# every field of a selection receipt (mcore.receipt.RECEIPT_FIELDS); any other is refused
RECEIPT_FIELDS = (
    "schema_version",
    "kind",
    "graph_fingerprint",
    "engine_role",
    "binding_id",
    "abi_sha256",
    "workspace_bytes",
    "extra_args",
    "node_ids",
    "input_tensor_ids",
    "output_tensor_ids",
    "output_shape_input",
    "abi",
    "recipe",
    "graph",
)


def check_selection(receipt, where):  # noqa: C901 - issue 29 rewrites this exporter (schedule + kernel + kit)
    """Refuse a receipt that is not this recipe's ABI; return the shapes to compile for:
    {"dtype", "heads", "kv_heads", "capacity", "head_dim"}."""
    if not isinstance(receipt, dict) or receipt.get("kind") != "mcore.selection_receipt":
        raise ContractError(f"{where}: not a selection receipt; pass the .selection.json from `mcore build --recipe`")
    required = (
        "abi",
        "abi_sha256",
        "graph_fingerprint",
        "binding_id",
        "node_ids",
        "workspace_bytes",
        "extra_args",
        "output_shape_input",
    )
    missing = [k for k in required if k not in receipt]
    if missing:
        raise ContractError(f"{where}: the selection receipt lacks {', '.join(missing)}; {RESELECT}")
    unknown = sorted(str(k) for k in receipt if k not in RECEIPT_FIELDS)
    if unknown:
        raise ContractError(f"{where}: the selection receipt has unknown field(s) {', '.join(unknown)}; {RESELECT}")
    abi = receipt["abi"]
    try:
        ins, outs = abi["inputs"], abi["outputs"]
        own_hash = _sha256(
            abi_contract(ins, outs, receipt["workspace_bytes"], receipt["extra_args"], receipt["output_shape_input"])
        )
    except (KeyError, TypeError, ValueError, AttributeError):
        raise ContractError(f"{where}: the receipt's abi section is incomplete; {RESELECT}") from None
    if own_hash != receipt["abi_sha256"]:
        raise ContractError(
            f"{where}: abi_sha256 does not match the receipt's own ABI (the file was edited); {RESELECT}"
        )
    if abi.get("format") != ABI_FORMAT:
        raise ContractError(f"{where}: ABI format {abi.get('format')!r} is not {ABI_FORMAT!r}; {RESELECT}")
    if receipt["binding_id"] not in BINDING_IDS:
        raise ContractError(
            f"{where}: binding ID {receipt['binding_id']!r} is not one of {', '.join(BINDING_IDS)}; {RESELECT}"
        )
    shapes = [list(t.get("shape", [])) for t in ins + outs]
    dts = [t.get("dtype") for t in ins + outs]
    ok = len(ins) == 4 and len(outs) == 1 and all(len(s) == r for s, r in zip(shapes, (4, 4, 4, 1, 4), strict=True))
    if ok:
        q, k, v, n, o = shapes
        ok = (
            q[0] == 1
            and q[2] == -1
            and k[0] == 1
            and k == v
            and n == [1]
            and o == q
            and q[3] == k[3]
            and all(_is_int(x) and x > 0 for x in (q[1], k[1], k[2], q[3]))
        )
    if not ok:
        got = ", ".join(f"{d} {s}" for d, s in zip(dts, shapes, strict=True))
        raise ContractError(f"{where}: the boundary ({got}) is not decode attention ({PATTERN}); {RESELECT}")
    t = dts[0]
    if t not in DTYPES or dts != [t, t, t, "INT32", t]:
        raise ContractError(
            f"{where}: dtypes {', '.join(map(str, dts))} are not supported; this kernel takes BF16 or "
            "FP16 query, caches and context with INT32 lengths (build with --precision bf16 or fp16)"
        )
    heads, kv_heads, capacity, head_dim = q[1], k[1], k[2], q[3]
    if head_dim not in HEAD_DIMS:
        raise ContractError(
            f"{where}: head_dim {head_dim} is not supported (this kernel takes {' or '.join(map(str, HEAD_DIMS))})"
        )
    if heads % kv_heads:
        raise ContractError(f"{where}: {heads} query heads are not a multiple of {kv_heads} KV heads")
    if kv_heads * capacity * head_dim >= 2**31:
        raise ContractError(
            f"{where}: a cache of {kv_heads}x{capacity}x{head_dim} elements is too large for 32-bit offsets"
        )
    if receipt["extra_args"] != [] or receipt["output_shape_input"] != 0:
        raise ContractError(
            f"{where}: this kernel takes no extra args and its output is shaped like input 0 (the receipt "
            f"has extra args {json.dumps(receipt['extra_args'])}, output like input "
            f"{receipt['output_shape_input']}); {RESELECT}"
        )
    ws, least, splits = receipt["workspace_bytes"], workspace_bytes_for(heads, head_dim, 2), SPLITS or DEFAULT_SPLITS
    if ws and ws < least:
        raise ContractError(
            f"{where}: a workspace of {ws} bytes holds fewer than 2 partial results a head; give none "
            f"(--workspace-bytes 0) or at least {least} ({workspace_bytes_for(heads, head_dim, splits)} for "
            f"{splits} splits)"
        )
    return {
        "dtype": t,
        "heads": heads,
        "kv_heads": kv_heads,
        "capacity": capacity,
        "head_dim": head_dim,
        "workspace_bytes": ws,
    }


def check_snapshot(snapshot, receipt, where):
    """Refuse a snapshot that is damaged or is not the graph the receipt was made from."""
    if (
        not isinstance(snapshot, dict)
        or snapshot.get("kind") != "mcore.graph_snapshot"
        or "fingerprint" not in snapshot
    ):
        raise ContractError(f"{where}: not a graph snapshot; pass the file from `mcore graph inspect --snapshot`")
    try:
        payload = {k: v for k, v in snapshot.items() if k != "fingerprint"}
        if isinstance(payload.get("metadata"), dict):  # tool versions are recorded, never hashed
            payload["metadata"] = {k: v for k, v in payload["metadata"].items() if k not in UNHASHED_METADATA}
        own = _sha256(payload)
    except (TypeError, ValueError):
        own = None
    if own != snapshot["fingerprint"]:
        raise ContractError(
            f"{where}: the snapshot's fingerprint does not match its content (edited or damaged); "
            "recapture it with `mcore graph inspect`"
        )
    if snapshot["fingerprint"] != receipt["graph_fingerprint"]:
        raise ContractError(
            f"{where}: this is another graph (fingerprint {snapshot['fingerprint'][:16]}..., the "
            f"selection's is {str(receipt['graph_fingerprint'])[:16]}...); pass the snapshot the "
            "selection was made from"
        )
    tensors = {t.get("id"): t for t in snapshot.get("tensors", []) if isinstance(t, dict)}
    for e in receipt["abi"]["inputs"] + receipt["abi"]["outputs"]:
        t = tensors.get(e.get("tensor_id"), {})
        if t.get("dtype") != e["dtype"] or t.get("shape") != e["shape"]:
            raise ContractError(
                f"{where}: {e.get('tensor_id')} is not {e['dtype']} {e['shape']} in this snapshot; "
                "recapture and select again"
            )


def check_contract(selection_path, snapshot_path=None):
    """Check the receipt (and the snapshot, when given); returns (receipt, shapes). Raises ContractError."""
    receipt = _load_json(selection_path, "selection receipt")
    shapes = check_selection(receipt, str(selection_path))
    if snapshot_path is not None:
        check_snapshot(_load_json(snapshot_path, "graph snapshot"), receipt, str(snapshot_path))
    return receipt, shapes


# ---------------------------------------------------------------- CuTe DSL kernel


def _gpu_visible():
    if os.environ.get("CUDA_VISIBLE_DEVICES") in ("", "-1"):
        return False
    try:
        if any(os.scandir("/proc/driver/nvidia/gpus")):
            return True
    except OSError:
        pass
    try:
        r = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=20)
        return r.returncode == 0 and "GPU" in r.stdout
    except (OSError, subprocess.SubprocessError):
        return False


# Compile and export need no GPU: without one, target sm_90a unless CUTE_DSL_ARCH says otherwise.
# (Set before the CuTe DSL is imported; it reads the variable once.)
if not os.environ.get("CUTE_DSL_ARCH") and not _gpu_visible():
    os.environ["CUTE_DSL_ARCH"] = "sm_90a"

try:
    import cuda.bindings.driver as cuda
    import cutlass
    import cutlass.cute as cute
    from cutlass._mlir.dialects import llvm
    from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream

    CUTE_IMPORT_ERROR = None
except (ImportError, RuntimeError) as e:  # no CuTe DSL, or no CUDA flavour of it: --check-only still works
    cute = None
    CUTE_IMPORT_ERROR = e

WARP = 32
# Warps per block, each attending one contiguous share of the keys: more warps keep more loads in
# flight per SM (a benchmark knob: CUTEDSL_ATTENTION_WARPS 4, 8 or 12; 12 fits the tensor-core walk's
# registers, not the scalar walk's). Unset: 8 in a cluster, 4 split over blocks (small blocks, many
# of them: the shape of the native engine's split-KV kernel; see SPLITS).
_WARPS_ENV = os.environ.get("CUTEDSL_ATTENTION_WARPS", "")
WARPS = int(_WARPS_ENV) if _WARPS_ENV in ("4", "8", "12") else (None if not _WARPS_ENV else 0)  # 0: refused


def warps_for(split):
    """Warps a block: CUTEDSL_ATTENTION_WARPS, else 4 split over blocks and 8 in a cluster."""
    return WARPS if WARPS is not None else (4 if split else 8)


# Blocks per (KV head, new token): a thread block cluster that splits the keys and merges its
# blocks' partial results through distributed shared memory (Hopper), so the whole GPU is busy at
# batch 1 without global scratch (the recipe's ABI declares no workspace). 8 is the portable size.
_CLUSTER_ENV = os.environ.get("CUTEDSL_ATTENTION_CLUSTER", "8")
CLUSTER = int(_CLUSTER_ENV) if _CLUSTER_ENV in ("1", "2", "4", "8", "16") else 0  # 0: refused by make_run
# With a workspace in the receipt (`mcore build ... --workspace-bytes N`, the ABI hash covers it) the
# keys are split over SPLITS blocks per (KV head, new token) with no cluster: each block writes its
# partial result to the workspace and a second kernel merges them in split order (deterministic, no
# atomics). Clusters cap a row at 16 blocks, 64 of the H200's 132 SMs on a Qwen3-8B layer at 8;
# SPLITS blocks of a row can fill the GPU. CUTEDSL_ATTENTION_SPLITS (2-64) is a benchmark knob;
# fewer splits are used where the workspace holds fewer partials (several new tokens). 32 ways of 4
# warps measured fastest of the split shapes at 1k and 8k on the H200 and within 3% of the fastest
# at 32k (16 / 32 / 64 ways of 4, 8, 12 warps; docs/gpu-results.md, ninth session).
DEFAULT_SPLITS = 32
_SPLITS_ENV = os.environ.get("CUTEDSL_ATTENTION_SPLITS", str(DEFAULT_SPLITS))
SPLITS = int(_SPLITS_ENV) if _SPLITS_ENV.isdigit() and 2 <= int(_SPLITS_ENV) <= 64 else 0  # 0: refused
# Query heads per block: 0 (the default) for the whole GQA group, else a divisor of it.
_HEADS_ENV = os.environ.get("CUTEDSL_ATTENTION_HEADS_PER_BLOCK", "0")
HEADS_PER_BLOCK = int(_HEADS_ENV) if _HEADS_ENV.isdigit() else 0
# Scores and context on tensor cores for groups of at most 8 heads; CUTEDSL_ATTENTION_MMA=0: the scalar walk
MMA = os.environ.get("CUTEDSL_ATTENTION_MMA", "1") != "0"
# CUTEDSL_ATTENTION_PREFETCH=1 (tensor-core walk, experimental): a warp issues the loads of its next
# 16 keys before the arithmetic of the current ones, so a key's memory latency overlaps the math
PREFETCH = os.environ.get("CUTEDSL_ATTENTION_PREFETCH", "0") == "1"
# Programmatic dependent launch (Hopper): the kernel may be launched while the one before it drains
# and waits (griddepcontrol.wait) before its first global read or write, and lets the next kernel
# launch once its walk is done; the compiled engine launches its own kernels that way on Hopper
# (mcore/pdl.py), so a bound slot keeps the chain of overlapped launches instead of breaking it twice
# a layer.
# CUTEDSL_ATTENTION_PDL=0: a plain launch; =early: the next kernel may launch as soon as this one's
# wait returned (as the engine's Triton kernels do), and the merge kernel lets its successor launch too
# (an opt-in: 6.7 / 14.0 / 38.7 us against 6.9 / 14.4 / 38.4 at 1k / 8k / 32k on the H200, tenth
# session; within 3%, not enough to change the default without a whole-step measurement).
_PDL_ENV = os.environ.get("CUTEDSL_ATTENTION_PDL", "1")
PDL = _PDL_ENV != "0"
PDL_EARLY = _PDL_ENV == "early"


def schedule(heads, kv_heads):
    """(query heads per block, tensor cores?) for this GQA shape, as make_run builds it."""
    group = heads // kv_heads
    hpb = HEADS_PER_BLOCK if HEADS_PER_BLOCK and group % HEADS_PER_BLOCK == 0 else group
    return hpb, MMA and hpb <= 8


def workspace_bytes_for(heads, head_dim, splits):
    """Workspace bytes for `splits` partial results (fp32 context row, max and sum) of every query
    head at one new token: what `--workspace-bytes` should be for that many splits."""
    return heads * splits * (head_dim + 2) * 4


def partials_held(workspace_bytes, hpb, head_dim):
    """The partial records (hpb heads x (fp32 context row, max, sum)) a workspace holds."""
    return workspace_bytes // (4 * hpb * (head_dim + 2))


NEG = -1.0e30  # an empty share's running max: finite, so merges never compute inf - inf


def make_run(  # noqa: C901 - issue 29 rewrites this exporter (schedule + kernel + kit)
    dtype, heads, kv_heads, capacity, head_dim, workspace_bytes=0
):
    """The jit function run(query, key_cache, value_cache, kv_lengths, [workspace,] context, stream)
    for these shapes (the workspace when workspace_bytes > 0: split over blocks, no cluster).

    Everything but the token count s is a compile-time constant; s comes from query's shape.

    Each lane owns head_dim / 32 contiguous columns. Per 32 keys, the lane loads its slice of each
    key row (the warp reads whole rows, coalesced), the per-key partial dot products are summed
    across the warp by recursive halving (31 shuffles leave lane L with key L's score), then each V
    row is read once and accumulated with the probabilities broadcast by shuffles.
    CLUSTER (1, 2, 4, 8 or 16; 16 is Hopper's non-portable size) comes from CUTEDSL_ATTENTION_CLUSTER,
    the heads each block serves from CUTEDSL_ATTENTION_HEADS_PER_BLOCK (tuning knobs for benchmarks)."""
    if not CLUSTER:
        raise ValueError("CUTEDSL_ATTENTION_CLUSTER must be 1, 2, 4, 8 or 16")
    if WARPS == 0:
        raise ValueError("CUTEDSL_ATTENTION_WARPS must be 4, 8 or 12")
    if workspace_bytes and not SPLITS:
        raise ValueError("CUTEDSL_ATTENTION_SPLITS must be 2 to 64")
    element = {"BF16": cutlass.BFloat16, "FP16": cutlass.Float16}[dtype]
    # Query heads per block: the whole group reads K and V once for all of them (64 blocks on a
    # Qwen3-8B layer, 255 registers a thread); one head per block puts 256 blocks on the GPU, two per
    # SM at 109 registers, but each reads K and V itself: on the H200 that was 2x slower at 8k-32k.
    group = heads // kv_heads
    hpb, use_mma = schedule(heads, kv_heads)
    cols = head_dim // WARP  # P @ V columns per lane: lane * cols ...
    split = workspace_bytes > 0  # partial results through the workspace instead of a cluster
    warps = warps_for(split)
    threads = warps * WARP
    partials = partials_held(workspace_bytes, hpb, head_dim)

    def remote(ptr, rank):
        """The fp32 at shared-memory address `ptr` of block `rank` of this cluster."""
        address = cutlass.Int32(cute.arch.map_dsmem_ptr(ptr, rank).toint())  # a shared::cluster address
        return cutlass.Float32(
            llvm.inline_asm(
                cutlass.Float32.mlir_type,
                [address.ir_value()],
                "ld.shared::cluster.f32 $0, [$1];",
                "=f,r",
                has_side_effects=True,  # stays between the cluster barriers
                is_align_stack=False,
                asm_dialect=llvm.AsmDialect.AD_ATT,
            )
        )

    # Tensor-core variant (the default for a GQA group of at most 8 heads): per 16 keys a warp
    # computes the scores S = Q K^T with mma.sync m16n8k16 (rows: the group's heads, padded to 16;
    # two blocks of 8 keys; head_dim / 16 steps) and the context O^T += V^T P^T (head_dim / 16 blocks
    # of 16 columns; the 16 keys; the 8 rows). The scores' accumulator layout is the layout P^T
    # needs as an operand, so the probabilities never leave the registers. The head dimension of a
    # dot product may be summed in any order, so each lane reads contiguous 16-byte pieces: lane
    # (g = lane / 4, t = lane % 4) takes columns [t * D/4, (t + 1) * D/4) of its key rows for the
    # scores and columns [g * D/8, (g + 1) * D/8) of its value rows, which fixes which output column
    # each accumulator register holds (see `out_col`).
    steps = head_dim // 16  # k-steps of the scores, and 16-column blocks of the context
    qk_words = head_dim // 8  # 32-bit words of a lane's quarter of a row (scores)
    v_words = head_dim // 16  # 32-bit words of a lane's eighth of a row (context)
    pack = "cvt.rn.bf16x2.f32" if dtype == "BF16" else "cvt.rn.f16x2.f32"
    mma_ptx = (
        f"mma.sync.aligned.m16n8k16.row.col.f32.{'bf16.bf16' if dtype == 'BF16' else 'f16.f16'}.f32 "
        "{$0,$1,$2,$3}, {$4,$5,$6,$7}, {$8,$9}, {$10,$11,$12,$13};"
    )

    def asm_i32(text, args, constraints):
        return cutlass.Int32(
            llvm.inline_asm(
                cutlass.Int32.mlir_type,
                [x.ir_value() for x in args],
                text,
                constraints,
                has_side_effects=False,
                is_align_stack=False,
                asm_dialect=llvm.AsmDialect.AD_ATT,
            )
        )

    def mma(acc, i, a, b):
        """acc[i*4 .. i*4+3] += A (4 words) B (2 words): one m16n8k16 tensor-core step."""
        f32 = cutlass.Float32.mlir_type
        res = llvm.inline_asm(
            llvm.StructType.get_literal([f32, f32, f32, f32]),
            [x.ir_value() for x in (*a, *b, acc[i * 4], acc[i * 4 + 1], acc[i * 4 + 2], acc[i * 4 + 3])],
            mma_ptx,
            "=f,=f,=f,=f,r,r,r,r,r,r,f,f,f,f",
            has_side_effects=False,
            is_align_stack=False,
            asm_dialect=llvm.AsmDialect.AD_ATT,
        )
        for j in range(4):
            acc[i * 4 + j] = cutlass.Float32(llvm.extractvalue(f32, res, [j]))

    def row_chunks(cache32, kv_head, row, first, count):
        """The 16-byte pieces (4 words each) of a cache row holding `count` 32-bit words from word
        `first` on (cache32: the cache viewed as Int32, 16-byte aligned)."""
        chunks = cute.logical_divide(cache32[0, kv_head, row, None], cute.make_layout(4))
        return [chunks[None, first // 4 + c] for c in range(count // 4)]

    def words(cache32, kv_head, row, first, count):
        """`count` 32-bit words of a cache row from word `first` on, as 16-byte loads."""
        out = []
        for piece in row_chunks(cache32, kv_head, row, first, count):
            v = piece.load()
            for j in range(4):
                out.append(v[j])
        return out

    def k_rows(base, last, g):
        """The key rows a lane feeds the scores of keys base .. base + 15: row g of each block of 8
        (clamped to `last`: in bounds, masked)."""
        return [cutlass.min(base + kb * 8 + g, last) for kb in range(2)]

    def v_rows(base, last, t):
        """The value rows of keys base + 2t, 2t+1, 2t+8, 2t+9 (clamped rows have probability 0)."""
        return [cutlass.min(base + 2 * t + (r % 2) + 8 * (r // 2), last) for r in range(4)]

    def fetch_k(kc32, kv_head, base, last, g, t):
        """This lane's K words of keys base .. base + 15 (columns [t * D/4, (t + 1) * D/4))."""
        return [words(kc32, kv_head, row, t * qk_words, qk_words) for row in k_rows(base, last, g)]

    def fetch_v(vc32, kv_head, base, last, g, t):
        """This lane's V words of keys base + 2t, 2t+1, 2t+8, 2t+9 (columns [g * D/8, (g + 1) * D/8))."""
        return [words(vc32, kv_head, row, g * v_words, v_words) for row in v_rows(base, last, t)]

    def keep(buf, kw, vk):
        """Words from `fetch_k` and `fetch_v` into the register buffer `buf` (K words, then V words)."""
        flat = [w for row in kw + vk for w in row]
        for i in range(len(flat)):
            buf[i] = flat[i]

    def take(buf):
        """`keep`'s words back from `buf`, as values (so `buf` may be refilled)."""
        vals = [buf[i] for i in range(2 * qk_words + 4 * v_words)]
        kw = [vals[kb * qk_words : (kb + 1) * qk_words] for kb in range(2)]
        vk = [vals[2 * qk_words + r * v_words : 2 * qk_words + (r + 1) * v_words] for r in range(4)]
        return kw, vk

    def out_col(lane, i, half):
        """The context column accumulator register i * 4 + 2 * half (+1) of `lane` holds."""
        return (lane // 4) * (head_dim // 8) + 2 * i + half

    @cute.jit
    def load_q(query, head0, token, g, t):
        """This lane's query words: row g of the group (zeros past it), the head-dim columns its K words
        hold (columns [t * D/4, (t + 1) * D/4)), packed in pairs exactly. Loaded by element: the
        query's alignment is not promised."""
        zero = cutlass.Int32(0)
        qw = cute.make_rmem_tensor((qk_words,), cutlass.Int32)
        for w in cutlass.range_constexpr(qk_words):
            qw[w] = zero
        if g < hpb:
            qrow = cute.logical_divide(query[0, head0 + g, token, None], cute.make_layout(2 * qk_words))
            qv = qrow[None, t].load().to(cutlass.Float32)
            for w in cutlass.range_constexpr(qk_words):
                qw[w] = asm_i32(f"{pack} $0, $1, $2;", [qv[2 * w + 1], qv[2 * w]], "=r,f,f")
        return qw

    @cute.jit
    def mma_step(qw, kw, get_v, acc, sc, m, lsum, base, stop, t):
        """Keys base .. base + 15 folded into this warp's (acc, m, lsum) on tensor cores: scores, an
        online softmax of row g, then context^T += V^T P^T. `get_v()` gives the V words (called after
        the softmax: the walk loads them there). Returns the new (m, lsum)."""
        zero = cutlass.Int32(0)
        # scores: key block kb holds keys base + kb*8 + (0..7); this lane feeds key row g of each
        for kb in cutlass.range_constexpr(2):
            for j in cutlass.range_constexpr(4):
                sc[kb * 4 + j] = cutlass.Float32(0.0)
            for st in cutlass.range_constexpr(steps):
                mma(sc, kb, (qw[2 * st], zero, qw[2 * st + 1], zero), (kw[kb][2 * st], kw[kb][2 * st + 1]))
        # row g, keys base + 2t, 2t+1 (block 0) and 8 + 2t, 8 + 2t + 1 (block 1); rows g + 8 are padding
        s0 = sc[0]
        s1 = sc[1]
        s2 = sc[4]
        s3 = sc[5]
        k0 = base + 2 * t
        if k0 >= stop:
            s0 = cutlass.Float32(-math.inf)
        if k0 + 1 >= stop:
            s1 = cutlass.Float32(-math.inf)
        if k0 + 8 >= stop:
            s2 = cutlass.Float32(-math.inf)
        if k0 + 9 >= stop:
            s3 = cutlass.Float32(-math.inf)
        mt = cute.arch.fmax(cute.arch.fmax(s0, s1), cute.arch.fmax(s2, s3))
        mt = cute.arch.fmax(mt, cute.arch.shuffle_sync_bfly(mt, offset=1))
        mt = cute.arch.fmax(mt, cute.arch.shuffle_sync_bfly(mt, offset=2))
        m_new = cute.arch.fmax(m, mt)
        alpha = cute.math.exp(m - m_new)
        p0 = cute.math.exp(s0 - m_new)
        p1 = cute.math.exp(s1 - m_new)
        p2 = cute.math.exp(s2 - m_new)
        p3 = cute.math.exp(s3 - m_new)
        lsum = lsum * alpha + (p0 + p1 + p2 + p3)
        # P^T as the operand: row g, keys (2t, 2t+1) and (2t+8, 2t+9), rounded to T
        pb0 = asm_i32(f"{pack} $0, $1, $2;", [p1, p0], "=r,f,f")
        pb1 = asm_i32(f"{pack} $0, $1, $2;", [p3, p2], "=r,f,f")
        # the context rows this lane accumulates are 2t and 2t+1: their rescale factors
        alpha_a = cute.arch.shuffle_sync(alpha, 8 * t)
        alpha_b = cute.arch.shuffle_sync(alpha, 8 * t + 4)
        for i in cutlass.range_constexpr(steps):
            acc[i * 4] = acc[i * 4] * alpha_a
            acc[i * 4 + 1] = acc[i * 4 + 1] * alpha_b
            acc[i * 4 + 2] = acc[i * 4 + 2] * alpha_a
            acc[i * 4 + 3] = acc[i * 4 + 3] * alpha_b
        # V rows of keys 2t, 2t+1, 2t+8, 2t+9 over this lane's columns
        vk = get_v()
        for i in cutlass.range_constexpr(steps):
            # word i of a row holds columns out_col(i, 0) (low half) and out_col(i, 1) (high half)
            lo01 = asm_i32("prmt.b32 $0, $1, $2, 0x5410;", [vk[0][i], vk[1][i]], "=r,r,r")
            hi01 = asm_i32("prmt.b32 $0, $1, $2, 0x7632;", [vk[0][i], vk[1][i]], "=r,r,r")
            lo89 = asm_i32("prmt.b32 $0, $1, $2, 0x5410;", [vk[2][i], vk[3][i]], "=r,r,r")
            hi89 = asm_i32("prmt.b32 $0, $1, $2, 0x7632;", [vk[2][i], vk[3][i]], "=r,r,r")
            mma(acc, i, (lo01, hi01, lo89, hi89), (pb0, pb1))
        return m_new, lsum

    @cute.jit
    def store_partial(part, acc, m, lsum, warp, lane):
        """This warp's partial into shared memory: row g's max and sum; context rows 2t, 2t+1 at this
        lane's columns (`out_col`)."""
        part_acc, part_m, part_l = part
        g = lane // 4
        t = lane % 4
        lsum = lsum + cute.arch.shuffle_sync_bfly(lsum, offset=1)
        lsum = lsum + cute.arch.shuffle_sync_bfly(lsum, offset=2)
        if t == 0 and g < hpb:
            part_m[warp, g] = m
            part_l[warp, g] = lsum
        for i in cutlass.range_constexpr(steps):
            for h in cutlass.range_constexpr(2):
                for r in cutlass.range_constexpr(2):
                    if 2 * t + r < hpb:
                        part_acc[warp, 2 * t + r, out_col(lane, i, h)] = acc[i * 4 + 2 * h + r]

    @cute.jit
    def fresh_acc():
        acc = cute.make_rmem_tensor((steps * 4,), cutlass.Float32)  # context^T: steps blocks x 4 registers
        for i in cutlass.range_constexpr(steps * 4):
            acc[i] = cutlass.Float32(0.0)
        return acc

    @cute.jit
    def walk_mma(query, key_cache, value_cache, part, head0, kv_head, token, start, stop):
        """A warp's keys [start, stop), 16 a step, loaded from global memory into registers."""
        tidx, _, _ = cute.arch.thread_idx()
        warp = tidx // WARP
        lane = tidx % WARP
        kc32 = cute.recast_tensor(key_cache, cutlass.Int32)  # 16-byte aligned allocations (fake_arguments)
        vc32 = cute.recast_tensor(value_cache, cutlass.Int32)
        g = lane // 4
        t = lane % 4
        qw = load_q(query, head0, token, g, t)
        acc = fresh_acc()
        m = cutlass.Float32(NEG)  # running max of row g
        lsum = cutlass.Float32(0.0)  # this lane's share of row g's sum
        sc = cute.make_rmem_tensor((8,), cutlass.Float32)  # scores: 2 key blocks x 4 registers
        last = cutlass.max(stop - 1, 0)  # rows past it are clamped to it (in bounds; masked below)
        buf = cute.make_rmem_tensor((2 * qk_words + 4 * v_words,), cutlass.Int32)  # PREFETCH: next keys
        if cutlass.const_expr(PREFETCH):
            keep(buf, fetch_k(kc32, kv_head, start, last, g, t), fetch_v(vc32, kv_head, start, last, g, t))
        for base in cutlass.range(start, stop, 16):
            if cutlass.const_expr(PREFETCH):
                kw, vk = take(buf)
                nxt = base + 16
                keep(buf, fetch_k(kc32, kv_head, nxt, last, g, t), fetch_v(vc32, kv_head, nxt, last, g, t))
                m, lsum = mma_step(qw, kw, lambda vk=vk: vk, acc, sc, m, lsum, base, stop, t)
            else:
                kw = fetch_k(kc32, kv_head, base, last, g, t)
                get_v = lambda base=base: fetch_v(vc32, kv_head, base, last, g, t)  # noqa: E731
                m, lsum = mma_step(qw, kw, get_v, acc, sc, m, lsum, base, stop, t)
        store_partial(part, acc, m, lsum, warp, lane)

    def part_layouts():
        """Each warp's (accumulator, max, sum) in shared memory."""
        return (
            cute.make_layout((warps, hpb, head_dim), stride=(hpb * head_dim, head_dim, 1)),
            cute.make_layout((warps, hpb), stride=(hpb, 1)),
            cute.make_layout((warps, hpb), stride=(hpb, 1)),
        )

    def row_end(length, token, new_tokens):
        """The keys row `token` attends: [0, end) (causal among the new tokens; never past the cache)."""
        return cutlass.min(length - new_tokens + token + 1, capacity)

    @cute.kernel
    def attention_kernel(
        query: cute.Tensor,
        key_cache: cute.Tensor,
        value_cache: cute.Tensor,
        kv_lengths: cute.Tensor,
        context: cute.Tensor,
        new_tokens: cutlass.Int32,
        workspace: cute.Tensor,  # split: (partials, hpb, D + 2) fp32; else unused (context passed)
        splits: cutlass.Int32,  # blocks per row: the split count, or CLUSTER
    ):
        bidx, _, _ = cute.arch.block_idx()
        rank = cute.arch.block_idx_in_cluster()
        row = bidx // CLUSTER
        if cutlass.const_expr(split):  # `splits` consecutive blocks a row
            rank = bidx % splits
            row = bidx // splits
        if cutlass.const_expr(PDL):  # every input is an earlier kernel's output; nothing is touched before this
            cute.arch.griddepcontrol_wait()
            if cutlass.const_expr(PDL_EARLY):
                cute.arch.griddepcontrol_launch_dependents()
        token = row % new_tokens
        end = row_end(kv_lengths[0], token, new_tokens)  # the length is read on the device: no host sync

        smem = cutlass.memory.SmemAllocator()
        blk = (
            smem.allocate_tensor(cutlass.Float32, cute.make_layout((hpb, head_dim), stride=(head_dim, 1)), 16),
            smem.allocate_tensor(cutlass.Float32, cute.make_layout(hpb), 16),
            smem.allocate_tensor(cutlass.Float32, cute.make_layout(hpb), 16),
        )  # the block's (accumulator, max, sum)
        part = tuple(smem.allocate_tensor(cutlass.Float32, layout, 16) for layout in part_layouts())
        attend((query, key_cache, value_cache, context, workspace), part, blk, new_tokens, row, rank, end, splits)

    @cute.jit
    def attend(tensors, part, blk, new_tokens, row, rank, end, splits):
        """One block's share of row `row`: walk, merge its warps, then hand the result on (the
        context, a record for the merge, or the cluster's merge)."""
        query, key_cache, value_cache, context, workspace = tensors
        tidx, _, _ = cute.arch.thread_idx()
        warp = tidx // WARP
        token = row % new_tokens
        head0 = (row // new_tokens) * hpb  # this block's query heads: head0 .. head0 + hpb - 1
        kv_head = head0 // group
        # at least one step of the walk a warp (16 keys on tensor cores, 32 scalar): at short lengths
        # the warps past end get no keys and write an empty record, instead of every warp a part step
        parts = splits * warps if split else CLUSTER * warps
        share = cutlass.max((end + parts - 1) // parts, cutlass.Int32(16 if use_mma else WARP))
        start = (rank * warps + warp) * share  # each warp its own contiguous share
        stop = cutlass.min(start + share, end)
        if cutlass.const_expr(use_mma):
            walk_mma(query, key_cache, value_cache, part, head0, kv_head, token, start, stop)
        else:
            part_acc, part_m, part_l = part
            walk_scalar(query, key_cache, value_cache, part_m, part_l, part_acc, head0, kv_head, token, start, stop)
        if cutlass.const_expr(PDL and not PDL_EARLY):
            # the walk's reads are done: the next kernel may launch (it still waits for all of this
            # one), so its blocks do not sit on the SMs while this one streams. On the H200 that
            # changed little (63.4 -> 63.0 us at 32k); a plain launch is faster there (55.5 us) and
            # slower at 1k (7.6 against 6.9 us): docs/gpu-results.md, eighth session.
            cute.arch.griddepcontrol_launch_dependents()
        cute.arch.sync_threads()
        block_partial(part, blk, context, workspace, row, rank, splits, head0, token, tidx)
        if cutlass.const_expr(not split):
            cluster_merge(context, blk[0], blk[1], blk[2], head0, token, rank, tidx)

    @cute.jit
    def walk_scalar(  # noqa: C901 - issue 29 rewrites this exporter (schedule + kernel + kit)
        query, key_cache, value_cache, part_m, part_l, part_acc, head0, kv_head, token, start, stop
    ):
        """The scalar walk (groups of more than 8 heads, or CUTEDSL_ATTENTION_MMA=0), 32 keys a step.
        Each lane owns `cols` contiguous columns of the head dimension: its slice of q (per head), of
        every K and V row it reads (one 8- or 4-byte load), and of the output accumulator."""
        tidx, _, _ = cute.arch.thread_idx()
        warp = tidx // WARP
        lane = tidx % WARP
        q = cute.make_rmem_tensor((hpb * cols,), cutlass.Float32)
        m = cute.make_rmem_tensor((hpb,), cutlass.Float32)
        lsum = cute.make_rmem_tensor((hpb,), cutlass.Float32)  # over this lane's keys only
        acc = cute.make_rmem_tensor((hpb * cols,), cutlass.Float32)
        for g in cutlass.range_constexpr(hpb):
            qrow = cute.logical_divide(query[0, head0 + g, token, None], cute.make_layout(cols))
            for c in cutlass.range_constexpr(cols):
                q[g * cols + c] = qrow[c, lane].to(cutlass.Float32)
                acc[g * cols + c] = cutlass.Float32(0.0)
            m[g] = cutlass.Float32(NEG)
            lsum[g] = cutlass.Float32(0.0)
        part = cute.make_rmem_tensor((WARP,), cutlass.Float32)
        prob = cute.make_rmem_tensor((hpb,), cutlass.Float32)
        for base in cutlass.range(start, stop, WARP):
            masked = base + lane >= stop
            for g in cutlass.range_constexpr(hpb):
                # partial dot products of the 32 keys over this lane's columns ...
                for j in cutlass.range_constexpr(WARP):
                    kpos = cutlass.min(base + j, stop - 1)  # in bounds; keys past stop are masked below
                    k = cute.logical_divide(key_cache[0, kv_head, kpos, None], cute.make_layout(cols))[None, lane]
                    kv = k.load().to(cutlass.Float32)
                    dot = q[g * cols] * kv[0]
                    for c in cutlass.range_constexpr(1, cols):
                        dot = dot + q[g * cols + c] * kv[c]
                    part[j] = dot
                # ... summed across the warp by recursive halving: 31 shuffles leave lane L with the
                # score of key base + L (at each step a lane keeps the half its lane bit selects).
                for step in cutlass.range_constexpr(5):
                    half = 16 >> step
                    upper = (lane & half) != 0
                    for i in cutlass.range_constexpr(half):
                        keep = part[i]
                        send = part[i + half]
                        if upper:
                            keep = part[i + half]
                            send = part[i]
                        part[i] = keep + cute.arch.shuffle_sync_bfly(send, offset=half)
                sc = part[0]
                if masked:
                    sc = cutlass.Float32(-math.inf)
                m_new = cute.arch.fmax(m[g], cute.arch.warp_reduction_max(sc))
                alpha = cute.math.exp(m[g] - m_new)
                p = cute.math.exp(sc - m_new)  # 0 for a masked key
                lsum[g] = lsum[g] * alpha + p
                prob[g] = p.to(element).to(cutlass.Float32)  # as fused attention kernels feed P @ V
                m[g] = m_new
                for c in cutlass.range_constexpr(cols):
                    acc[g * cols + c] = acc[g * cols + c] * alpha
            for j in cutlass.range_constexpr(WARP):
                vpos = cutlass.min(base + j, stop - 1)  # a masked key has probability 0
                v = cute.logical_divide(value_cache[0, kv_head, vpos, None], cute.make_layout(cols))[None, lane]
                vv = v.load().to(cutlass.Float32)
                for g in cutlass.range_constexpr(hpb):
                    pj = cute.arch.shuffle_sync(prob[g], j)
                    for c in cutlass.range_constexpr(cols):
                        acc[g * cols + c] = acc[g * cols + c] + pj * vv[c]
        # this warp's partial: max, sum over its lanes, accumulator columns
        for g in cutlass.range_constexpr(hpb):
            total = cute.arch.warp_reduction_sum(lsum[g])
            if lane == 0:
                part_m[warp, g] = m[g]
                part_l[warp, g] = total
            for c in cutlass.range_constexpr(cols):
                part_acc[warp, g, lane * cols + c] = acc[g * cols + c]

    @cute.jit
    def block_partial(part, blk, context, workspace, row, rank, splits, head0, token, tidx):
        """The block's partial: its warps merged in warp order (an empty share has l = 0 and acc = 0),
        written as the context (a row of one split), a record for the merge, or (cluster) `blk`."""
        part_acc, part_m, part_l = part
        for i in cutlass.range(tidx, hpb * head_dim, threads):
            g = i // head_dim
            d = i - g * head_dim
            mb = part_m[0, g]
            for w in cutlass.range_constexpr(1, warps):
                mb = cute.arch.fmax(mb, part_m[w, g])
            num = cutlass.Float32(0.0)
            den = cutlass.Float32(0.0)
            for w in cutlass.range_constexpr(warps):
                weight = cute.math.exp(part_m[w, g] - mb)
                num = num + part_acc[w, g, d] * weight
                den = den + part_l[w, g] * weight
            if cutlass.const_expr(split):
                if splits == 1:  # a workspace too small for two splits of these rows: the block's is the result
                    context[0, head0 + g, token, d] = (num / den).to(element)
                else:  # this block's record; merge_kernel merges a row's records in split order
                    record = row * splits + rank
                    workspace[record, g, d] = num
                    if d == 0:
                        workspace[record, g, head_dim] = mb
                        workspace[record, g, head_dim + 1] = den
            else:
                blk[0][g, d] = num
                if d == 0:
                    blk[1][g] = mb
                    blk[2][g] = den

    @cute.jit
    def merge_records(workspace, context, row, g, d, splits, head0, token):
        """Column d of head g of row `row`: its `splits` records merged in split order. The loop over
        splits is unrolled to SPLITS with indices clamped to the last record (weight 0 past it), so
        the loads are independent and issue together. The first version (one block a row, a loop of
        dependent loads) took 11 / 19 / 45 us a call at 1k with 16 / 32 / 64 splits on the H200
        against 6.9 us for the cluster schedule: the time grew with the splits, not the keys."""
        first = row * splits
        ms = cute.make_rmem_tensor((SPLITS,), cutlass.Float32)
        mall = cutlass.Float32(NEG)
        for r in cutlass.range_constexpr(SPLITS):
            ms[r] = workspace[first + cutlass.min(r, splits - 1), g, head_dim]  # a repeat cannot raise the max
            mall = cute.arch.fmax(mall, ms[r])
        num = cutlass.Float32(0.0)
        den = cutlass.Float32(0.0)
        for r in cutlass.range_constexpr(SPLITS):
            at = first + cutlass.min(r, splits - 1)
            weight = cute.math.exp(ms[r] - mall)
            if r >= splits:
                weight = cutlass.Float32(0.0)
            num = num + workspace[at, g, d] * weight
            den = den + workspace[at, g, head_dim + 1] * weight
        context[0, head0 + g, token, d] = (num / den).to(element)

    @cute.jit
    def cluster_merge(context, blk_acc, blk_m, blk_l, head0, token, rank, tidx):
        """The cluster's result: blocks merged in rank order by rank 0, reading the others' shared memory."""
        cute.arch.cluster_arrive()
        cute.arch.cluster_wait()
        if rank == 0:
            for i in cutlass.range(tidx, hpb * head_dim, threads):
                g = i // head_dim
                d = i - g * head_dim
                ms = cute.make_rmem_tensor((CLUSTER,), cutlass.Float32)
                mall = cutlass.Float32(NEG)
                for r in cutlass.range_constexpr(CLUSTER):
                    ms[r] = remote(blk_m.iterator + g, r)
                    mall = cute.arch.fmax(mall, ms[r])
                num = cutlass.Float32(0.0)
                den = cutlass.Float32(0.0)
                for r in cutlass.range_constexpr(CLUSTER):
                    weight = cute.math.exp(ms[r] - mall)
                    num = num + remote(blk_acc.iterator + i, r) * weight
                    den = den + remote(blk_l.iterator + g, r) * weight
                context[0, head0 + g, token, d] = (num / den).to(element)
        cute.arch.cluster_arrive()  # the others keep their shared memory until rank 0 has read it
        cute.arch.cluster_wait()

    @cute.kernel
    def merge_kernel(workspace: cute.Tensor, context: cute.Tensor, new_tokens: cutlass.Int32, splits: cutlass.Int32):
        """split: one block per (row, head), a thread per column, merges the row's records in split
        order (a row of one split was written by its block)."""
        d, _, _ = cute.arch.thread_idx()
        bidx, _, _ = cute.arch.block_idx()
        g = bidx % hpb
        row = bidx // hpb
        if cutlass.const_expr(PDL):  # the records are the kernel before's output
            cute.arch.griddepcontrol_wait()
            if cutlass.const_expr(PDL_EARLY):
                cute.arch.griddepcontrol_launch_dependents()
        if splits > 1:
            merge_records(workspace, context, row, g, d, splits, (row // new_tokens) * hpb, row % new_tokens)

    smem_bytes = 4 * (hpb * head_dim + warps * hpb * head_dim + 2 * warps * hpb + 2 * hpb) + 16 * 8

    @cute.jit
    def run(
        query: cute.Tensor,
        key_cache: cute.Tensor,
        value_cache: cute.Tensor,
        kv_lengths: cute.Tensor,
        context: cute.Tensor,
        stream: cuda.CUstream,
    ):
        """The exported run(query, key_cache, value_cache, kv_lengths, context); `stream` is the TVM-FFI env stream."""
        new_tokens = cute.size(query, mode=[2])  # s: dynamic, from the tensor the engine passes
        attention_kernel(
            query, key_cache, value_cache, kv_lengths, context, new_tokens, context, cutlass.Int32(CLUSTER)
        ).launch(
            grid=(heads // hpb * new_tokens * CLUSTER, 1, 1),
            block=(threads, 1, 1),
            cluster=(CLUSTER, 1, 1),
            smem=smem_bytes,
            stream=stream,
            use_pdl=PDL,
        )

    @cute.jit
    def run_split(
        query: cute.Tensor,
        key_cache: cute.Tensor,
        value_cache: cute.Tensor,
        kv_lengths: cute.Tensor,
        workspace: cute.Tensor,
        context: cute.Tensor,
        stream: cuda.CUstream,
    ):
        """run(query, key_cache, value_cache, kv_lengths, workspace, context): split over blocks, merged
        by a second kernel; as many splits (up to SPLITS) as the
        workspace holds for these rows."""
        new_tokens = cute.size(query, mode=[2])
        rows = heads // hpb * new_tokens
        splits = cutlass.max(cutlass.min(cutlass.Int32(SPLITS), cutlass.Int32(partials) // rows), cutlass.Int32(1))
        records = cute.make_tensor(
            cute.recast_ptr(workspace.iterator, dtype=cutlass.Float32),
            cute.make_layout((partials, hpb, head_dim + 2), stride=(hpb * (head_dim + 2), head_dim + 2, 1)),
        )
        attention_kernel(query, key_cache, value_cache, kv_lengths, context, new_tokens, records, splits).launch(
            grid=(rows * splits, 1, 1),
            block=(threads, 1, 1),
            smem=smem_bytes,
            stream=stream,
            use_pdl=PDL,
        )
        merge_kernel(records, context, new_tokens, splits).launch(
            grid=(rows * hpb, 1, 1),
            block=(head_dim, 1, 1),
            stream=stream,
            use_pdl=PDL,
        )

    return run_split if split else run


def fake_arguments(dtype, heads, kv_heads, capacity, head_dim, workspace_bytes=0):
    """Compile-time stand-ins for run()'s arguments, in ABI order (s is one cute.sym_int())."""
    element = {"BF16": cutlass.BFloat16, "FP16": cutlass.Float16}[dtype]

    def tensor(dt, shape, align=None):  # contiguous row-major, like the engine's linear tensors
        return make_fake_compact_tensor(dt, shape, stride_order=tuple(reversed(range(len(shape)))), assumed_align=align)

    tokens = cute.sym_int()  # dynamic: query[2], context[2]
    return [
        tensor(element, (1, heads, tokens, head_dim)),  # query
        tensor(element, (1, kv_heads, capacity, head_dim), 16),  # key_cache: whole allocations, 16-byte loads
        tensor(element, (1, kv_heads, capacity, head_dim), 16),  # value_cache
        tensor(cutlass.Int32, (1,)),  # kv_lengths
        *([tensor(cutlass.Uint8, (workspace_bytes,), 16)] if workspace_bytes else []),  # the slot's, 256-aligned
        tensor(element, (1, heads, tokens, head_dim)),  # context
        make_fake_stream(use_tvm_ffi_env_stream=True),  # the TVM-FFI env stream, not a run() argument
    ]


# ---------------------------------------------------------------- compile, export, link


class ExportError(Exception):
    """Compile, export or link failed."""


STATIC_RUNTIME = "libcuda_dialect_runtime_static.a"


def cute_runtime_libdir():
    """The CuTe DSL runtime folder holding libcuda_dialect_runtime_static.a (cu13 libs preferred)."""
    candidates = []
    if os.environ.get("CUTE_DSL_RUNTIME_DIR"):
        candidates.append(Path(os.environ["CUTE_DSL_RUNTIME_DIR"]))
    try:
        from cutlass.cute.export.aot_config import get_libdir

        if get_libdir():
            candidates.append(Path(get_libdir()))
    except Exception:  # older CuTe DSL: search the package below
        pass
    package = Path(cutlass.__file__).resolve().parents[2]  # .../nvidia_cutlass_dsl
    candidates += [package / "cu13" / "lib", package / "cu12" / "lib"]
    for d in candidates:
        if (d / STATIC_RUNTIME).is_file():
            return d
    raise ExportError(
        f"{STATIC_RUNTIME} not found in the installed nvidia-cutlass-dsl; install its CUDA 13 libs "
        "(pip install 'nvidia-cutlass-dsl[cu13]') or set CUTE_DSL_RUNTIME_DIR"
    )


def cudart_libdir():
    """A folder with libcudart.so: CUDA_HOME, CUDA_PATH, the toolkit of nvcc, /usr/local/cuda; None to let gcc search."""
    homes = [os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH")]
    nvcc = shutil.which("nvcc")
    if nvcc:
        homes.append(str(Path(nvcc).resolve().parent.parent))
    homes.append("/usr/local/cuda")
    for home in filter(None, homes):
        for sub in ("lib64", "lib", "targets/x86_64-linux/lib", "targets/sbsa-linux/lib"):
            if (Path(home) / sub / "libcudart.so").exists():
                return Path(home) / sub
    return None


# Newer CuTe DSL wrappers report a CUDA error through this helper of libcute_dsl_runtime.so. Defining
# it in the DSO keeps the DSO self-contained: at run time it needs only libcudart and libtvm_ffi.
ERROR_SHIM_C = r"""
#include <stdio.h>
typedef void (*set_raised_parts_fn)(const char* kind, const char** parts, int num_parts);
__attribute__((visibility("hidden")))
void CuteDSLRT_TVMFFISetRaisedCudaError(set_raised_parts_fn set_raised, int code) {
  char number[32];
  const char* parts[2];
  if (!set_raised) return;
  snprintf(number, sizeof number, "%d", code);
  parts[0] = "CUDA error in the CuTe DSL kernel wrapper, cudaError_t ";
  parts[1] = number;
  set_raised("RuntimeError", parts, 2);
}
"""


def _run(cmd, what):
    r = subprocess.run([str(c) for c in cmd], capture_output=True, text=True)
    if r.returncode != 0:
        raise ExportError(f"{what} failed ({' '.join(map(str, cmd))}): {(r.stderr or r.stdout).strip()[-2000:]}")


def link(obj, dso, with_dsl_runtime=False):
    """Link the exported object with the CuTe DSL runtime archive and the CUDA runtime into a shared library.

    with_dsl_runtime: also link libcute_dsl_runtime.so (found at run time through the rpath), for a
    CuTe DSL whose wrapper needs more of it than the error helper above.
    """
    import tvm_ffi.libinfo

    cc = os.environ.get("CC", "gcc")
    runtime = cute_runtime_libdir()
    tvm_ffi_dir = Path(tvm_ffi.libinfo.find_libtvm_ffi()).parent
    cudart = cudart_libdir()
    shim_c = Path(obj).with_name("cute_dsl_error_shim.c")
    shim_c.write_text(ERROR_SHIM_C)
    shim_o = shim_c.with_suffix(".o")
    _run([cc, "-c", "-fPIC", "-O2", "-o", shim_o, shim_c], "compiling the error helper")
    cmd = (
        [cc, "-shared", "-o", dso, obj]
        + ([] if with_dsl_runtime else [shim_o])
        + [runtime / STATIC_RUNTIME, "-Wl,--exclude-libs,ALL", "-Wl,--as-needed"]
    )
    rpath = [str(d) for d in (cudart, tvm_ffi_dir) if d]
    if with_dsl_runtime:
        cmd += [f"-L{runtime}", "-lcute_dsl_runtime"]
        rpath.insert(0, str(runtime))
    if cudart:
        cmd += [f"-L{cudart}"]
    cmd += ["-lcudart", f"-L{tvm_ffi_dir}", "-ltvm_ffi", "-Wl,--no-as-needed", "-Wl,-rpath," + ":".join(rpath)]
    try:
        _run(cmd, "linking")
    except ExportError as e:
        raise ExportError(
            f"{e}" + ("" if cudart else "; set CUDA_HOME to the CUDA toolkit so libcudart is found")
        ) from None


def _load_check(dso):
    """Load the DSO we just built (our own code) and look up run; returns the error text, or None."""
    import tvm_ffi

    try:
        tvm_ffi.load_module(str(dso))["run"]
    except Exception as e:
        return str(e)
    return None


def export(output, shapes):
    """Compile run for `shapes`, export it for the TVM-FFI ABI, link it and put the DSO at `output` (never replaced)."""
    if cute is None:
        raise ExportError(
            f"the CuTe DSL is not importable ({CUTE_IMPORT_ERROR}); "
            "pip install 'nvidia-cutlass-dsl[cu13]' apache-tvm-ffi"
        )
    try:
        run = make_run(**shapes)
        compiled = cute.compile(run, *fake_arguments(**shapes), options="--enable-tvm-ffi")
    except Exception as e:
        raise ExportError(f"cute.compile failed: {type(e).__name__}: {e}") from e
    output = Path(output)
    with tempfile.TemporaryDirectory(prefix="cutedsl-export-") as tmp:
        obj = Path(tmp) / "run.o"
        try:
            compiled.export_to_c(str(obj), function_name="run", export_only_tvm_ffi_symbols=True)
        except TypeError:  # older CuTe DSL without export_only_tvm_ffi_symbols
            compiled.export_to_c(str(obj), function_name="run")
        fd, staged = tempfile.mkstemp(prefix=f".{output.name}.", suffix=".tmp.so", dir=output.parent)
        os.close(fd)
        try:
            link(obj, staged)
            problem = _load_check(staged)
            if (
                problem
                and "undefined symbol" in problem
                and (cute_runtime_libdir() / "libcute_dsl_runtime.so").exists()
            ):
                link(obj, staged, with_dsl_runtime=True)
                problem = _load_check(staged)
                if not problem:
                    print(
                        f"note: this DSO needs libcute_dsl_runtime.so at run time (rpath: {cute_runtime_libdir()})",
                        file=sys.stderr,
                    )
            if problem:
                raise ExportError(f"the linked DSO does not load: {problem}")
            os.chmod(staged, 0o755)
            try:
                os.link(staged, output)  # atomic, and never replaces an existing file
            except FileExistsError:
                raise ExportError(f"{output} appeared while exporting; choose a fresh path") from None
        finally:
            os.unlink(staged)


# ---------------------------------------------------------------- command line


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog=PROG,
        description=f"Export the CuTe DSL decode attention for {', '.join(BINDING_IDS)} as a TVM-FFI DSO "
        "(GPU-tested on the H200).",
    )
    parser.add_argument("--selection", required=True, help="selection receipt (.selection.json) of the recipe")
    parser.add_argument("--snapshot", default=None, help="graph snapshot the selection was made from (optional check)")
    parser.add_argument("--output", help="DSO to write (.so); never overwritten")
    parser.add_argument("--check-only", action="store_true", help="only check the selection (and snapshot)")
    args = parser.parse_args(argv)
    try:
        receipt, shapes = check_contract(args.selection, args.snapshot)
    except ContractError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return EXIT_CONTRACT
    described = (
        f"{shapes['dtype']} heads={shapes['heads']} kv_heads={shapes['kv_heads']} "
        f"capacity={shapes['capacity']} head_dim={shapes['head_dim']}"
    )
    if args.check_only:
        print(f"contract OK: {args.selection} is decode attention ({described})")
        print(f"binding_id={receipt['binding_id']}")
        print(f"abi_sha256={receipt['abi_sha256']}")
        return 0
    if not args.output:
        print(f"{PROG}: error: --output is required (or pass --check-only)", file=sys.stderr)
        return EXIT_CONTRACT
    output = Path(args.output)
    if output.exists():
        print(
            f"{PROG}: error: {output} exists; choose a fresh path (the exporter never overwrites a DSO)",
            file=sys.stderr,
        )
        return EXIT_CONTRACT
    if not output.parent.is_dir():
        print(f"{PROG}: error: folder {output.parent} does not exist; create it first", file=sys.stderr)
        return EXIT_CONTRACT
    try:
        export(output, shapes)
    except ExportError as e:
        print(f"{PROG}: error: {e}", file=sys.stderr)
        return EXIT_EXPORT
    print(f"binding_id={receipt['binding_id']}")
    print(f"abi_sha256={receipt['abi_sha256']}")
    print(f"shapes: {described}")
    hpb, mma = schedule(shapes["heads"], shapes["kv_heads"])
    walk = ("tensor cores, prefetch" if PREFETCH else "tensor cores") if mma else "scalar"
    if shapes["workspace_bytes"]:
        rows = shapes["heads"] // hpb
        most = min(SPLITS, partials_held(shapes["workspace_bytes"], hpb, shapes["head_dim"]) // rows)
        blocks = f"split {most} ways over blocks at 1 new token (workspace {shapes['workspace_bytes']} bytes)"
    else:
        blocks = f"cluster {CLUSTER}"
    launch = ", dependents launched early" if PDL_EARLY else ("" if PDL else ", plain launch")
    print(f"schedule={blocks}, {warps_for(bool(shapes['workspace_bytes']))} warps, {hpb} heads a block, {walk}{launch}")
    if SPLITS:  # what to declare at build for the split schedule (a bad knob was refused with a workspace)
        need = workspace_bytes_for(shapes["heads"], shapes["head_dim"], SPLITS)
        print(f"split_workspace_bytes={need} (`mcore build ... --workspace-bytes {need}`: {SPLITS} splits a row)")
    print(f"arch={os.environ.get('CUTE_DSL_ARCH') or 'the visible GPU'}")
    print(f"dso={output.resolve()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
