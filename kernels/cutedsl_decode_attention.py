#!/usr/bin/env python3
"""CuTe DSL decode attention for the decoder families' attention recipe (tutorial step 5):
qwen.decode_attention_region@2 (Qwen3), llama.decode_attention_region@1, mistral.decode_attention_region@1
and qwen2.decode_attention_region@1, one region per layer with the same boundary.

STATUS: the GPU checks in tests/test_cutedsl_decode_attention.py (marked `gpu`, against
mcore.ops.attention.decode_attention_reference) and bench/attention_gpu.py (speed on the Qwen3-8B-sized
config) are what vouch for it; docs/gpu-results.md has their latest results on the H200, and
docs/cutedsl-decode-attention.md the measurements behind the schedule's defaults.

Written by hand (not by `mcore kernel stub`) as schedule + kernel + kit: the contract and the schedule
(`Plan`) here, the kernel below, and the rest (receipt check, ABI order, compile, export_to_c, link)
from mcore's exporter kit. Unlike a generated exporter it is not pinned to one graph: it serves every
receipt of these recipes whose ABI fits (any model of those families, any layer), and compiles for that
receipt's shapes: the published Llama 3.x, Mistral 7B and Qwen2.5 models have head_dim 64 or 128 and
1 to 8 query heads a KV head.

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

Semantics (mcore.ops.attention.decode_attention): query i of the s new tokens sits at position
length - s + i and attends the keys 0..length - s + i (causal among the new tokens).

Schedule (split-KV, flash-decoding). Without a workspace: one thread block cluster of CLUSTER blocks
per (KV head, new token), each block serving the whole GQA group (K and V read once per group); the
attended keys [0, end) are cut into CLUSTER * warps equal contiguous shares fixed by the length alone.
Groups of at most 8 heads walk 16 keys a step on tensor cores (`walk_mma`: mma.sync m16n8k16 for the
scores Q K^T, then context^T += V^T P^T with the probabilities kept in registers); larger groups (or
CUTEDSL_ATTENTION_MMA=0) walk 32 keys a step on CUDA cores (`walk_scalar`). Warps merge in warp order
through shared memory, then rank 0 merges the blocks in rank order through distributed shared memory:
deterministic, no atomics, no global scratch. With a workspace in the receipt: SPLITS blocks (no
cluster; fewer where the cache's capacity has fewer tiles, so a small cache's merge reads only records
that can hold keys) per (KV head, new token), the tensor-core walk dealing 64-key tiles round them (block r takes
tiles r, r + SPLITS, ...), each write a partial record (fp32 context row, max, sum per head) to the
workspace, and a second kernel merges a row's records in split order (deterministic, no atomics; the
workspace's contents on entry do not matter).

Numerics (mirroring mcore/ops/flash_decode.py): products and sums in fp32; the softmax in fp32 (exp
through ex2.approx); probabilities rounded to T for the product with V (the sum of probabilities is
not rounded); the context rounded to T once.

No host sync: the length is read from the device tensor inside the kernel, so the launch is the same on
every call and can be captured in a CUDA graph. The launch uses the TVM-FFI environment stream (the
engine's current stream) with programmatic dependent launch (Hopper; CUTEDSL_ATTENTION_PDL=0 turns it
off): the kernel may start while the kernel before it drains, waits for it (griddepcontrol.wait)
before touching global memory, and lets the next kernel launch: right after that wait with a
workspace (both kernels), once its walk has read the caches in a cluster.
Precondition (the engine guarantees it): s <= length <= C. Keys past C are never read.

Use (needs mcore, nvidia-cutlass-dsl with its CUDA 13 libs, apache-tvm-ffi, gcc and libcudart):
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

import json
import math
import os
import sys
from dataclasses import dataclass, replace

from mcore.kernels import exporter_kit as kit

# ---------------------------------------------------------------- the contract

# The attention recipe of each decoder family (mcore/families/decoder_family.py): one boundary, so one
# kernel serves them all. A receipt keeps its recipe's id as the binding id; this prints it back.
BINDING_IDS = (
    "qwen.decode_attention_region@2",
    "llama.decode_attention_region@1",
    "mistral.decode_attention_region@1",
    "qwen2.decode_attention_region@1",
)
DTYPES = ("BF16", "FP16")
HEAD_DIMS = (64, 128)
PATTERN = "query T [1,H,-1,D], key and value caches T [1,KV,C,D], INT32 [1] -> T [1,H,-1,D]"
RESELECT = (
    "select the region with `mcore build --recipe RECIPE INSTANCE` on a BF16 or FP16 build, RECIPE being "
    "the model's attention recipe (qwen.decode_attention_region@2 for Qwen3, <family>.decode_attention_region@1 "
    "for llama, mistral, qwen2)"
)
ARGUMENTS = kit.Boundary(["query", "key_cache", "value_cache", "kv_lengths"], "workspace", ["context"])  # run's names


def _is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def _boundary(receipt, where):
    """The boundary's shapes and dtypes, refused unless they are decode attention's pattern."""
    ins, outs = receipt.inputs, receipt.outputs
    shapes = [list(t.shape) for t in ins + outs]
    dts = [t.dtype for t in ins + outs]
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
        raise kit.ContractError(f"{where}: the boundary ({got}) is not decode attention ({PATTERN}); {RESELECT}")
    return shapes, dts


def _check_sizes(where, dts, heads, kv_heads, capacity, head_dim):
    t = dts[0]
    if t not in DTYPES or dts != [t, t, t, "INT32", t]:
        raise kit.ContractError(
            f"{where}: dtypes {', '.join(map(str, dts))} are not supported; this kernel takes BF16 or "
            "FP16 query, caches and context with INT32 lengths (build with --precision bf16 or fp16)"
        )
    if head_dim not in HEAD_DIMS:
        raise kit.ContractError(
            f"{where}: head_dim {head_dim} is not supported (this kernel takes {' or '.join(map(str, HEAD_DIMS))})"
        )
    if heads % kv_heads:
        raise kit.ContractError(f"{where}: {heads} query heads are not a multiple of {kv_heads} KV heads")
    if kv_heads * capacity * head_dim >= 2**31:
        raise kit.ContractError(
            f"{where}: a cache of {kv_heads}x{capacity}x{head_dim} elements is too large for 32-bit offsets"
        )


def _check_call(receipt, where, heads, head_dim):
    if receipt.extra_args or receipt.output_shape_input != 0:
        raise kit.ContractError(
            f"{where}: this kernel takes no extra args and its output is shaped like input 0 (the receipt "
            f"has extra args {json.dumps(list(receipt.extra_args))}, output like input "
            f"{receipt.output_shape_input}); {RESELECT}"
        )
    ws, least, splits = receipt.workspace_bytes, workspace_bytes_for(heads, head_dim, 2), SPLITS or DEFAULT_SPLITS
    if ws and ws < least:
        raise kit.ContractError(
            f"{where}: a workspace of {ws} bytes holds fewer than 2 partial results a head; give none "
            f"(--workspace-bytes 0) or at least {least} ({workspace_bytes_for(heads, head_dim, splits)} for "
            f"{splits} splits)"
        )


def attention_plan(receipt, where):
    """Refuse a receipt that is not this recipe's ABI; return the Plan to compile for it."""
    if receipt.binding_id not in BINDING_IDS:
        raise kit.ContractError(
            f"{where}: binding ID {receipt.binding_id!r} is not one of {', '.join(BINDING_IDS)}; {RESELECT}"
        )
    (q, k, _, _, _), dts = _boundary(receipt, where)
    heads, kv_heads, capacity, head_dim = q[1], k[1], k[2], q[3]
    _check_sizes(where, dts, heads, kv_heads, capacity, head_dim)
    _check_call(receipt, where, heads, head_dim)
    plan = Plan(dts[0], heads, kv_heads, capacity, head_dim, receipt.workspace_bytes)
    try:  # a bad tuning knob is bad input too: one line, exit 2, before anything compiles
        plan.check_knobs()
    except ValueError as e:
        raise kit.ContractError(str(e)) from None
    return plan


def check_contract(selection_path, snapshot_path=None):
    """Check the receipt (and the snapshot, when given); returns kit.Checked with the Plan. Raises
    kit.ContractError."""
    receipt = kit.read_receipt(selection_path, RESELECT)
    plan = attention_plan(receipt, str(selection_path))
    if snapshot_path is not None:
        kit.read_snapshot(snapshot_path, receipt)
    return kit.Checked(receipt, f"{selection_path} is decode attention ({plan.described})", plan, plan.report())


# ---------------------------------------------------------------- the schedule

WARP = 32
# Warps per block, each attending one contiguous share of the keys (CUTEDSL_ATTENTION_WARPS 4, 8 or 12;
# 12 fits the tensor-core walk's registers, not the scalar walk's). Unset: 8 in a cluster, 4 split over
# blocks (small blocks, many of them: the shape of the native engine's split-KV kernel).
_WARPS_ENV = os.environ.get("CUTEDSL_ATTENTION_WARPS", "")
WARPS = int(_WARPS_ENV) if _WARPS_ENV in ("4", "8", "12") else (None if not _WARPS_ENV else 0)  # 0: refused
# Blocks per (KV head, new token) without a workspace: a thread block cluster (Hopper; 8 is the portable
# size, 16 the non-portable one) that merges its blocks' partial results through distributed shared memory.
_CLUSTER_ENV = os.environ.get("CUTEDSL_ATTENTION_CLUSTER", "8")
CLUSTER = int(_CLUSTER_ENV) if _CLUSTER_ENV in ("1", "2", "4", "8", "16") else 0  # 0: refused
# Blocks per (KV head, new token) with a workspace (CUTEDSL_ATTENTION_SPLITS, 2-64): fewer where the
# workspace holds fewer partials (several new tokens). A cluster caps a row at 16 blocks; splits can fill the GPU.
DEFAULT_SPLITS = 32
_SPLITS_ENV = os.environ.get("CUTEDSL_ATTENTION_SPLITS", str(DEFAULT_SPLITS))
SPLITS = int(_SPLITS_ENV) if _SPLITS_ENV.isdigit() and 2 <= int(_SPLITS_ENV) <= 64 else 0  # 0: refused
# Query heads per block: 0 (the default) for the whole GQA group, else a divisor of it.
_HEADS_ENV = os.environ.get("CUTEDSL_ATTENTION_HEADS_PER_BLOCK", "0")
HEADS_PER_BLOCK = int(_HEADS_ENV) if _HEADS_ENV.isdigit() else 0
# Scores and context on tensor cores for groups of at most 8 heads; CUTEDSL_ATTENTION_MMA=0: the scalar walk
MMA = os.environ.get("CUTEDSL_ATTENTION_MMA", "1") != "0"
# CUTEDSL_ATTENTION_PREFETCH=1 (tensor-core walk, experimental): a warp issues the loads of its next
# 16 keys before the arithmetic of the current ones
PREFETCH = os.environ.get("CUTEDSL_ATTENTION_PREFETCH", "0") == "1"
# Programmatic dependent launch (Hopper), as the compiled engine launches its own kernels (mcore/ops/pdl.py).
# The split schedule's default, =early: each kernel lets its successor launch as soon as its wait
# returned, as the engine's Triton kernels do (the merge's 32 small blocks then wait beside the walk,
# and the next layer's kernel beside the merge). =1 (the cluster's default): the walk lets the next
# kernel launch once it has read the caches, so no other blocks sit on the SMs while it streams; the
# merge still right after its wait. =0: a plain launch.
_PDL_ENV = os.environ.get("CUTEDSL_ATTENTION_PDL", "")
PDL = _PDL_ENV != "0"
# The split schedule's register walk deals tiles of 16 keys a warp round the blocks (block r takes
# tiles r, r + SPLITS, ...; see `walk_interleaved`); CUTEDSL_ATTENTION_INTERLEAVE=0: one contiguous
# share a warp, as before the twenty-second session.
INTERLEAVE = os.environ.get("CUTEDSL_ATTENTION_INTERLEAVE", "1") != "0"

# CUTEDSL_ATTENTION_TMA=1 (split schedule, tensor-core walk; experimental): a producer warp streams each
# block's keys through a ring of CUTEDSL_ATTENTION_TMA_STAGES (2-6, default 2: 3 was slower on the H200)
# tiles of 16 keys a walking warp in shared memory, one bulk copy (cp.async.bulk, the copy engine) a K
# tile and one a V tile: a KV head's rows are contiguous in the cache, so a tile is one unpadded run of
# bytes (see `walk_tma`).
TMA = os.environ.get("CUTEDSL_ATTENTION_TMA", "0") == "1"
# CUTEDSL_ATTENTION_TMA_BANKS=1 (experimental, not yet run on a GPU): the ring's lanes read their chunks
# in an order that puts fewer lanes of a quarter warp on one bank (see `ring_pair`).
TMA_BANKS = os.environ.get("CUTEDSL_ATTENTION_TMA_BANKS", "0") == "1"
_STAGES_ENV = os.environ.get("CUTEDSL_ATTENTION_TMA_STAGES", "2")
TMA_STAGES = int(_STAGES_ENV) if _STAGES_ENV in ("2", "3", "4", "5", "6") else 0  # 0: refused

NEG = -1.0e30  # an empty share's running max: finite, so merges never compute inf - inf


def workspace_bytes_for(heads, head_dim, splits):
    """Workspace bytes for `splits` partial results (fp32 context row, max and sum) of every query
    head at one new token: what `--workspace-bytes` should be for that many splits."""
    return heads * splits * (head_dim + 2) * 4


@dataclass(frozen=True)
class Plan:
    """One export: the receipt's shapes and the schedule the knobs above choose for them. Every field
    and property is a compile-time constant of the kernel; only the token count s is dynamic."""

    dtype: str
    heads: int
    kv_heads: int
    capacity: int
    head_dim: int
    workspace_bytes: int = 0

    @property
    def group(self):
        return self.heads // self.kv_heads

    @property
    def hpb(self):
        """Query heads per block: the whole group reads K and V once for all of them."""
        return HEADS_PER_BLOCK if HEADS_PER_BLOCK and self.group % HEADS_PER_BLOCK == 0 else self.group

    @property
    def use_mma(self):
        return MMA and self.hpb <= 8

    @property
    def split(self):
        """Partial results through the workspace (split over blocks) instead of a cluster."""
        return self.workspace_bytes > 0

    @property
    def warps(self):
        return WARPS if WARPS is not None else (4 if self.split else 8)

    @property
    def tma(self):
        """Keys through a shared-memory ring by bulk copies (a producer warp besides the walking ones)."""
        return TMA and self.split and self.use_mma

    @property
    def interleave(self):
        """Tiles dealt round the blocks (the split schedule's register walk)."""
        return INTERLEAVE and self.split and self.use_mma and not self.tma

    @property
    def pdl_early(self):
        """The walk lets its successor launch right after its wait (see CUTEDSL_ATTENTION_PDL)."""
        return _PDL_ENV == "early" or (_PDL_ENV == "" and self.split)

    @property
    def threads(self):
        return (self.warps + (1 if self.tma else 0)) * WARP

    @property
    def tile(self):
        """Keys a ring stage holds: 16 for each walking warp."""
        return 16 * self.warps

    @property
    def most_splits(self):
        """Splits a row at most: SPLITS, or fewer where the capacity has fewer blocks' steps of keys
        (a block past them could never hold one; its empty record would still be written and merged)."""
        step = self.warps * (16 if self.use_mma else WARP)  # the keys a block walks a step
        return min(SPLITS, max(1, -(-self.capacity // step)))

    @property
    def ring_bytes(self):
        return TMA_STAGES * 2 * self.tile * 2 * self.head_dim

    @property
    def partials(self):
        """The partial records (hpb heads x (fp32 context row, max, sum)) the workspace holds."""
        return self.workspace_bytes // (4 * self.hpb * (self.head_dim + 2))

    @property
    def smem_bytes(self):
        hpb, d, warps = self.hpb, self.head_dim, self.warps
        base = 4 * (hpb * d + warps * hpb * d + 2 * warps * hpb + 2 * hpb) + 16 * 8 + 16  # + the pin
        return base + (128 + self.ring_bytes + 16 * TMA_STAGES if self.tma else 0)  # ring, aligned; mbarriers

    # the tensor-core walk: lane (g = lane / 4, t = lane % 4) of a warp
    @property
    def steps(self):
        """k-steps of the scores, and 16-column blocks of the context."""
        return self.head_dim // 16

    @property
    def qk_words(self):
        """32-bit words of a lane's quarter of a row (scores)."""
        return self.head_dim // 8

    @property
    def v_words(self):
        """32-bit words of a lane's eighth of a row (context)."""
        return self.head_dim // 16

    @property
    def element(self):
        return {"BF16": cutlass.BFloat16, "FP16": cutlass.Float16}[self.dtype]

    @property
    def pack(self):
        """Two fp32 into a word of two T, rounded to nearest even."""
        return "cvt.rn.bf16x2.f32" if self.dtype == "BF16" else "cvt.rn.f16x2.f32"

    @property
    def mma_ptx(self):
        return (
            f"mma.sync.aligned.m16n8k16.row.col.f32.{'bf16.bf16' if self.dtype == 'BF16' else 'f16.f16'}.f32 "
            "{$0,$1,$2,$3}, {$4,$5,$6,$7}, {$8,$9}, {$10,$11,$12,$13};"
        )

    @property
    def cols(self):
        """The scalar walk: head-dim columns per lane."""
        return self.head_dim // WARP

    @property
    def described(self):
        return (
            f"{self.dtype} heads={self.heads} kv_heads={self.kv_heads} capacity={self.capacity} "
            f"head_dim={self.head_dim}"
        )

    def report(self):
        """The lines printed after an export: shapes, the schedule built, the split workspace to declare."""
        walk = ("tensor cores, prefetch" if PREFETCH else "tensor cores") if self.use_mma else "scalar"
        if self.tma:
            walk = f"tensor cores, bulk copies through a ring of {TMA_STAGES} tiles of {self.tile} keys"
            walk += ", reads in bank order" if TMA_BANKS else ""
        if self.split:
            most = max(1, min(self.most_splits, self.partials // (self.heads // self.hpb)))
            blocks = f"split {most} ways over blocks at 1 new token (workspace {self.workspace_bytes} bytes)"
        else:
            blocks = f"cluster {CLUSTER}"
        walk += ", tiles dealt round the blocks" if self.interleave else ""
        launch = ", dependents launched early" if PDL and self.pdl_early else ("" if PDL else ", plain launch")
        lines = [
            f"shapes: {self.described}",
            f"schedule={blocks}, {self.warps} warps, {self.hpb} heads a block, {walk}{launch}",
        ]
        if SPLITS:  # what to declare at build for the split schedule (a bad knob is refused with a workspace)
            most = (self if self.split else replace(self, workspace_bytes=1)).most_splits  # the split plan's
            need = workspace_bytes_for(self.heads, self.head_dim, most)
            lines.append(
                f"split_workspace_bytes={need} (`mcore build ... --workspace-bytes {need}`: {most} splits a row)"
            )
        return lines

    def check_knobs(self):
        if _PDL_ENV not in ("", "0", "1", "early"):
            raise ValueError("CUTEDSL_ATTENTION_PDL must be 0, 1 or early (or unset)")
        if not CLUSTER:
            raise ValueError("CUTEDSL_ATTENTION_CLUSTER must be 1, 2, 4, 8 or 16")
        if WARPS == 0:
            raise ValueError("CUTEDSL_ATTENTION_WARPS must be 4, 8 or 12")
        if self.split and not SPLITS:
            raise ValueError("CUTEDSL_ATTENTION_SPLITS must be 2 to 64")
        if TMA_BANKS and not TMA:
            raise ValueError("CUTEDSL_ATTENTION_TMA_BANKS=1 orders the ring's reads: it needs CUTEDSL_ATTENTION_TMA=1")
        if TMA and not (self.split and self.use_mma and TMA_STAGES):
            raise ValueError(
                "CUTEDSL_ATTENTION_TMA=1 needs the split schedule (a workspace), the tensor-core walk (a GQA group "
                "of at most 8 heads) and CUTEDSL_ATTENTION_TMA_STAGES 2 to 6"
            )
        if self.tma and self.smem_bytes > 227 * 1024:  # an sm_90 block's most
            raise ValueError(
                f"CUTEDSL_ATTENTION_TMA_STAGES={TMA_STAGES} with {self.warps} warps needs {self.smem_bytes // 1024} KB "
                "of shared memory a block (at most 227 KB); use fewer stages or warps"
            )


# ---------------------------------------------------------------- the kernel

kit.default_arch()  # no GPU visible: compile for sm_90a (before the CuTe DSL is imported)

try:
    import cuda.bindings.driver as cuda
    import cutlass
    import cutlass.cute as cute
    from cutlass._mlir.dialects import llvm
    from cutlass.cute.runtime import make_fake_compact_tensor
except (ImportError, RuntimeError):  # no CuTe DSL, or no CUDA flavour of it: --check-only still works
    cute = None


def make_run(p):
    """The jit function run(query, key_cache, value_cache, kv_lengths, [workspace,] context, stream) for
    the plan (the workspace when the receipt has one: split over blocks, no cluster). Every plan field
    is a compile-time constant; the token count s comes from query's shape."""
    attention_kernel, merge_kernel = make_kernels(p)  # the knobs were checked with the contract (attention_plan)
    if p.split:
        return split_launcher(p, attention_kernel, merge_kernel)
    return cluster_launcher(p, attention_kernel)


def fake_arguments(p):
    """Compile-time stand-ins for run()'s arguments by role (s is one cute.sym_int()); the kit puts
    them in the receipt's ABI order and adds the TVM-FFI env stream."""

    def tensor(dt, shape, align=None):  # contiguous row-major, like the engine's linear tensors
        return make_fake_compact_tensor(dt, shape, stride_order=tuple(reversed(range(len(shape)))), assumed_align=align)

    tokens = cute.sym_int()  # dynamic: query[2], context[2]
    return kit.Boundary(
        inputs=[
            tensor(p.element, (1, p.heads, tokens, p.head_dim)),  # query
            tensor(
                p.element, (1, p.kv_heads, p.capacity, p.head_dim), 16
            ),  # key_cache: whole allocations, 16-byte loads
            tensor(p.element, (1, p.kv_heads, p.capacity, p.head_dim), 16),  # value_cache
            tensor(cutlass.Int32, (1,)),  # kv_lengths
        ],
        workspace=tensor(cutlass.Uint8, (p.workspace_bytes,), 16) if p.workspace_bytes else None,  # 256-aligned
        outputs=[tensor(p.element, (1, p.heads, tokens, p.head_dim))],  # context
    )


if cute is not None:

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

    def mma(p, acc, i, a, b):
        """acc[i*4 .. i*4+3] += A (4 words) B (2 words): one m16n8k16 tensor-core step."""
        f32 = cutlass.Float32.mlir_type
        res = llvm.inline_asm(
            llvm.StructType.get_literal([f32, f32, f32, f32]),
            [x.ir_value() for x in (*a, *b, acc[i * 4], acc[i * 4 + 1], acc[i * 4 + 2], acc[i * 4 + 3])],
            p.mma_ptx,
            "=f,=f,=f,=f,r,r,r,r,r,r,f,f,f,f",
            has_side_effects=False,
            is_align_stack=False,
            asm_dialect=llvm.AsmDialect.AD_ATT,
        )
        for j in range(4):
            acc[i * 4 + j] = cutlass.Float32(llvm.extractvalue(f32, res, [j]))

    def chunk_words(row, chunks):
        """The words of 16-byte pieces `chunks` (4 words each) of `row`, a row of 32-bit words
        (16-byte aligned: a cache row or a ring row), as 16-byte loads."""
        pieces = cute.logical_divide(row, cute.make_layout(4))
        out = []
        for chunk in chunks:
            v = pieces[None, chunk].load()
            for j in range(4):
                out.append(v[j])
        return out

    def words(cache32, kv_head, row, first, count):
        """`count` 32-bit words of a cache row from word `first` on (cache32: the cache viewed as Int32)."""
        return chunk_words(cache32[0, kv_head, row, None], [first // 4 + c for c in range(count // 4)])

    def k_rows(base, last, g):
        """The key rows a lane feeds the scores of keys base .. base + 15: row g of each block of 8
        (clamped to `last`: in bounds, masked)."""
        return [cutlass.min(base + kb * 8 + g, last) for kb in range(2)]

    def v_rows(base, last, t):
        """The value rows of keys base + 2t, 2t+1, 2t+8, 2t+9 (clamped rows have probability 0)."""
        return [cutlass.min(base + 2 * t + (r % 2) + 8 * (r // 2), last) for r in range(4)]

    def fetch_k(p, kc32, kv_head, base, last, g, t):
        """This lane's K words of keys base .. base + 15 (columns [t * D/4, (t + 1) * D/4))."""
        return [words(kc32, kv_head, row, t * p.qk_words, p.qk_words) for row in k_rows(base, last, g)]

    def fetch_v(p, vc32, kv_head, base, last, g, t):
        """This lane's V words of keys base + 2t, 2t+1, 2t+8, 2t+9 (columns [g * D/8, (g + 1) * D/8))."""
        return [words(vc32, kv_head, row, g * p.v_words, p.v_words) for row in v_rows(base, last, t)]

    def keep(buf, kw, vk):
        """Words from `fetch_k` and `fetch_v` into the register buffer `buf` (K words, then V words)."""
        flat = [w for row in kw + vk for w in row]
        for i in range(len(flat)):
            buf[i] = flat[i]

    def take(p, buf):
        """`keep`'s words back from `buf`, as values (so `buf` may be refilled)."""
        qk_words, v_words = p.qk_words, p.v_words
        vals = [buf[i] for i in range(2 * qk_words + 4 * v_words)]
        kw = [vals[kb * qk_words : (kb + 1) * qk_words] for kb in range(2)]
        vk = [vals[2 * qk_words + r * v_words : 2 * qk_words + (r + 1) * v_words] for r in range(4)]
        return kw, vk

    def out_col(p, lane, i, half):
        """The context column accumulator register i * 4 + 2 * half (+1) of `lane` holds."""
        return (lane // 4) * (p.head_dim // 8) + 2 * i + half

    @cute.jit
    def load_q(p, query, head0, token, g, t, chunks=None):
        """This lane's query words: row g of the group (zeros past it), the head-dim columns its K words
        hold (columns [t * D/4, (t + 1) * D/4), or `chunks`: 8-column pieces), packed in pairs exactly.
        Loaded by element: the query's alignment is not promised."""
        qk_words, hpb, pack = p.qk_words, p.hpb, p.pack
        qw = cute.make_rmem_tensor((qk_words,), cutlass.Int32)
        # every lane loads (rows past the group read the group's last row, then zeroed): no branch
        # around the loads, so they can go out before the length's arithmetic
        qrow_all = query[0, head0 + cutlass.min(g, hpb - 1), token, None]
        if cutlass.const_expr(chunks is None):
            qrow = cute.logical_divide(qrow_all, cute.make_layout(2 * qk_words))
            qv = qrow[None, t].load().to(cutlass.Float32)
            for w in cutlass.range_constexpr(qk_words):
                qw[w] = asm_i32(f"{pack} $0, $1, $2;", [qv[2 * w + 1], qv[2 * w]], "=r,f,f")
        else:
            qrow = cute.logical_divide(qrow_all, cute.make_layout(8))
            for c, chunk in enumerate(chunks):
                qv = qrow[None, chunk].load().to(cutlass.Float32)
                for w in cutlass.range_constexpr(4):
                    qw[c * 4 + w] = asm_i32(f"{pack} $0, $1, $2;", [qv[2 * w + 1], qv[2 * w]], "=r,f,f")
        if g >= hpb:
            for w in cutlass.range_constexpr(qk_words):
                qw[w] = cutlass.Int32(0)
        return qw

    @cute.jit
    def mma_step(p, qw, kw, get_v, acc, sc, m, lsum, base, stop, t):
        """Keys base .. base + 15 folded into this warp's (acc, m, lsum) on tensor cores: scores, an
        online softmax of row g, then context^T += V^T P^T. `get_v()` gives the V words (called after
        the softmax: the walk loads them there). Returns the new (m, lsum)."""
        steps, pack = p.steps, p.pack
        zero = cutlass.Int32(0)
        # scores: key block kb holds keys base + kb*8 + (0..7); this lane feeds key row g of each
        for kb in cutlass.range_constexpr(2):
            for j in cutlass.range_constexpr(4):
                sc[kb * 4 + j] = cutlass.Float32(0.0)
            for st in cutlass.range_constexpr(steps):
                mma(p, sc, kb, (qw[2 * st], zero, qw[2 * st + 1], zero), (kw[kb][2 * st], kw[kb][2 * st + 1]))
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
            mma(p, acc, i, (lo01, hi01, lo89, hi89), (pb0, pb1))
        return m_new, lsum

    @cute.jit
    def store_partial(p, part, acc, m, lsum, warp, lane, column=out_col):
        """This warp's partial into shared memory: row g's max and sum; context rows 2t, 2t+1 at this
        lane's columns (`column`: `out_col`, or `tma_col` for the ring's lane columns)."""
        hpb, steps = p.hpb, p.steps
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
                        part_acc[warp, 2 * t + r, column(p, lane, i, h)] = acc[i * 4 + 2 * h + r]

    @cute.jit
    def fresh_acc(p):
        steps = p.steps
        acc = cute.make_rmem_tensor((steps * 4,), cutlass.Float32)  # context^T: steps blocks x 4 registers
        for i in cutlass.range_constexpr(steps * 4):
            acc[i] = cutlass.Float32(0.0)
        return acc

    @cute.jit
    def walk_mma(p, key_cache, value_cache, part, kv_head, start, stop, qw):
        """A warp's keys [start, stop), 16 a step, loaded from global memory into registers (`qw`: this
        lane's query words, `load_q`)."""
        qk_words, v_words = p.qk_words, p.v_words
        tidx, _, _ = cute.arch.thread_idx()
        warp = tidx // WARP
        lane = tidx % WARP
        kc32 = cute.recast_tensor(key_cache, cutlass.Int32)  # 16-byte aligned allocations (fake_arguments)
        vc32 = cute.recast_tensor(value_cache, cutlass.Int32)
        g = lane // 4
        t = lane % 4
        acc = fresh_acc(p)
        m = cutlass.Float32(NEG)  # running max of row g
        lsum = cutlass.Float32(0.0)  # this lane's share of row g's sum
        sc = cute.make_rmem_tensor((8,), cutlass.Float32)  # scores: 2 key blocks x 4 registers
        last = cutlass.max(stop - 1, 0)  # rows past it are clamped to it (in bounds; masked below)
        buf = cute.make_rmem_tensor((2 * qk_words + 4 * v_words,), cutlass.Int32)  # PREFETCH: next keys
        if cutlass.const_expr(PREFETCH):
            keep(buf, fetch_k(p, kc32, kv_head, start, last, g, t), fetch_v(p, vc32, kv_head, start, last, g, t))
        for base in cutlass.range(start, stop, 16):
            if cutlass.const_expr(PREFETCH):
                kw, vk = take(p, buf)
                nxt = base + 16
                keep(buf, fetch_k(p, kc32, kv_head, nxt, last, g, t), fetch_v(p, vc32, kv_head, nxt, last, g, t))
                m, lsum = mma_step(p, qw, kw, lambda vk=vk: vk, acc, sc, m, lsum, base, stop, t)
            else:
                kw = fetch_k(p, kc32, kv_head, base, last, g, t)
                get_v = lambda base=base: fetch_v(p, vc32, kv_head, base, last, g, t)  # noqa: E731
                m, lsum = mma_step(p, qw, kw, get_v, acc, sc, m, lsum, base, stop, t)
        store_partial(p, part, acc, m, lsum, warp, lane)

    @cute.jit
    def walk_interleaved(p, key_cache, value_cache, part, kv_head, rank, splits, end, qw):
        """A warp's keys with tiles dealt round the blocks: block `rank` takes tiles rank, rank + splits, ...
        of 16 keys a warp, warp w keys 16 w .. 16 w + 15 of each, so at any moment the blocks read
        neighbouring tiles of the cache (one contiguous share a block read 3-4% slower at 8k and 32k
        on an H100). Reading the first tile before the length (its place does not depend on it) was
        0.5 us faster at 8k and 1 us slower at 1k (the blocks past the length read a tile for nothing):
        not kept."""
        tidx, _, _ = cute.arch.thread_idx()
        warp = tidx // WARP
        lane = tidx % WARP
        kc32 = cute.recast_tensor(key_cache, cutlass.Int32)
        vc32 = cute.recast_tensor(value_cache, cutlass.Int32)
        g = lane // 4
        t = lane % 4
        acc = fresh_acc(p)
        m = cutlass.Float32(NEG)
        lsum = cutlass.Float32(0.0)
        sc = cute.make_rmem_tensor((8,), cutlass.Float32)
        last = cutlass.max(end - 1, 0)  # rows past it are clamped to it (in bounds; masked)
        for base in cutlass.range(rank * p.tile + 16 * warp, end, splits * p.tile):
            kw = fetch_k(p, kc32, kv_head, base, last, g, t)
            get_v = lambda base=base: fetch_v(p, vc32, kv_head, base, last, g, t)  # noqa: E731
            m, lsum = mma_step(p, qw, kw, get_v, acc, sc, m, lsum, base, end, t)
        store_partial(p, part, acc, m, lsum, warp, lane)

    # The TMA walk (CUTEDSL_ATTENTION_TMA=1, split schedule). A producer warp (the last; one lane)
    # streams the block's keys, a tile (16 keys a walking warp) at a time, into a ring of TMA_STAGES
    # stages: one bulk copy of the tile's K rows and one of its V rows (a KV head's rows are contiguous,
    # so a tile is one run of bytes; per-row copies were the tenth session's bottleneck), completing on
    # the stage's "full" mbarrier. Each walking warp takes its 16 keys of every tile into registers and
    # releases the stage on its "empty" mbarrier. Rows are unpadded (2 D bytes: 0 mod 128), so the lane
    # columns keep a quarter warp's reads on few banks each: K chunks (8 columns) {2t, 2t+1, 2t+8, 2t+9}
    # (2 lanes a bank), V chunks {g, g+8} (4 lanes a bank); D = 64 takes the first half of each.
    # Only the keys below the block's stop are copied: a stage's other rows hold older tiles or nothing,
    # so their scores are masked and their V words zeroed (0 x NaN would not be 0).
    def k_chunks(p, t):
        return [2 * t + 8 * j + c for j in range(p.head_dim // 64) for c in range(2)]

    def v_chunks(p, g):
        if TMA_BANKS and p.head_dim == 128:  # two bank groups, g and g + 4, instead of g twice
            return [g, 8 + (g + 4) % 8]
        return [g + 8 * j for j in range(p.head_dim // 64)]

    def tma_col(p, lane, i, half):
        """The context column accumulator register i * 4 + 2 * half (+1) of `lane` holds (TMA walk)."""
        return v_chunks(p, lane // 4)[i // 4] * 8 + 2 * (i % 4) + half

    def select(flag, a, b):
        """a where the Int32 `flag` is nonzero, else b (one selp)."""
        return asm_i32("{ .reg .pred q; setp.ne.s32 q, $1, 0; selp.b32 $0, $2, $3, q; }", [flag, a, b], "=r,r,r,r")

    def ring_pair(ring32, stage, which, row, ca, cb, flag):
        """The words of chunks ca and cb of a ring row, read cb first where `flag` (0 or 1) is set and
        put back in place. With unpadded rows a chunk's bank group is its index mod 8, so lanes that
        read one chunk each of the same group at once wait for each other: K's lanes g and g + 1 (same
        t, other rows) share a group, V's lanes t = 0..3 (same g, other rows) too. Flipping the order
        on odd g (K) or odd t (V) halves the lanes a group serves."""
        first = ring_words(ring32, stage, which, row, [ca + (cb - ca) * flag])
        second = ring_words(ring32, stage, which, row, [cb + (ca - cb) * flag])
        pairs = list(zip(first, second, strict=True))
        return [select(flag, y, x) for x, y in pairs] + [select(flag, x, y) for x, y in pairs]

    def ring_chunks(p, ring32, stage, which, row, chunks, flag):
        """`ring_words` of `chunks` (pairs of them in turn read through `ring_pair`)."""
        if not TMA_BANKS or len(chunks) < 2:
            return ring_words(ring32, stage, which, row, chunks)
        out = []
        for i in range(0, len(chunks), 2):
            out += ring_pair(ring32, stage, which, row, chunks[i], chunks[i + 1], flag)
        return out

    def ring_words(ring32, stage, which, row, chunks):
        """The words of `chunks` of row `row` of the K (which 0) or V (1) tile in ring stage `stage`."""
        return chunk_words(ring32[stage, which, row, None], chunks)

    def bulk_copy(dst, src, nbytes, mbar):
        """`nbytes` from global `src` into shared `dst`, completing on mbarrier `mbar` (a multiple of 16)."""
        llvm.inline_asm(
            None,
            [dst.toint().ir_value(), src.toint().ir_value(), nbytes.ir_value(), mbar.toint().ir_value()],
            "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [$0], [$1], $2, [$3];",
            "r,l,r,r,~{memory}",
            has_side_effects=True,
            is_align_stack=False,
            asm_dialect=llvm.AsmDialect.AD_ATT,
        )

    @cute.jit
    def produce(p, key_cache, value_cache, ring32, bars, kv_head, start, stop, tiles):
        """The producer (one lane): tile j of the block's keys into stage j % TMA_STAGES once the
        walking warps released it; only keys below `stop` are copied."""
        tile, row_bytes = p.tile, 2 * p.head_dim
        for j in cutlass.range(0, tiles, 1):
            stage = j % TMA_STAGES
            cute.arch.mbarrier_wait(bars.iterator + TMA_STAGES + stage, ((j // TMA_STAGES) % 2) ^ 1)
            first = start + j * tile
            nbytes = cutlass.min(stop - first, tile) * row_bytes
            cute.arch.mbarrier_arrive_and_expect_tx(bars.iterator + stage, 2 * nbytes)
            bulk_copy(
                ring32[stage, 0, 0, None].iterator,
                key_cache[0, kv_head, first, None].iterator,
                nbytes,
                bars.iterator + stage,
            )
            bulk_copy(
                ring32[stage, 1, 0, None].iterator,
                value_cache[0, kv_head, first, None].iterator,
                nbytes,
                bars.iterator + stage,
            )

    @cute.jit
    def consume(p, qw, acc, ring32, bars, start, stop, tiles, warp, lane):
        """A walking warp: keys start + j tile + 16 warp .. + 15 of every tile j; returns (m, lsum)."""
        v_words = p.v_words
        g = lane // 4
        t = lane % 4
        m = cutlass.Float32(NEG)
        lsum = cutlass.Float32(0.0)
        sc = cute.make_rmem_tensor((8,), cutlass.Float32)
        vbuf = cute.make_rmem_tensor((4 * v_words,), cutlass.Int32)
        zero = cutlass.Int32(0)
        first = 16 * warp
        for j in cutlass.range(0, tiles, 1):
            stage = j % TMA_STAGES
            cute.arch.mbarrier_wait(bars.iterator + stage, (j // TMA_STAGES) % 2)
            base = start + j * p.tile + first
            kw = [ring_chunks(p, ring32, stage, 0, first + kb * 8 + g, k_chunks(p, t), g % 2) for kb in range(2)]
            for r in cutlass.range_constexpr(4):
                key = 2 * t + (r % 2) + 8 * (r // 2)
                words_r = ring_chunks(p, ring32, stage, 1, first + key, v_chunks(p, g), t % 2)
                for i in cutlass.range_constexpr(v_words):
                    vbuf[r * v_words + i] = words_r[i]
                if base + key >= stop:  # not copied: whatever the stage holds there must not reach the sums
                    for i in cutlass.range_constexpr(v_words):
                        vbuf[r * v_words + i] = zero
            vk = [[vbuf[r * v_words + i] for i in range(v_words)] for r in range(4)]
            cute.arch.sync_warp()  # every lane has its words: the stage may be refilled
            if lane == 0:
                cute.arch.mbarrier_arrive(bars.iterator + TMA_STAGES + stage)
            m, lsum = mma_step(p, qw, kw, lambda vk=vk: vk, acc, sc, m, lsum, base, stop, t)
        return m, lsum

    @cute.jit
    def ring_barriers(p, bars):
        """The ring's mbarriers initialised (shared memory only: done before the kernel's wait)."""
        tidx, _, _ = cute.arch.thread_idx()
        if tidx == 0:
            for s in cutlass.range_constexpr(TMA_STAGES):
                cute.arch.mbarrier_init(bars.iterator + s, 1)  # full: the producer's arrival and the bytes
                cute.arch.mbarrier_init(bars.iterator + TMA_STAGES + s, p.warps)  # empty: each walking warp
            cute.arch.mbarrier_init_fence()
        cute.arch.sync_threads()

    @cute.jit
    def walk_tma(p, key_cache, value_cache, ring32, bars, part, kv_head, start, stop, qw):
        """The block's keys [start, stop) through the shared-memory ring (its barriers initialised)."""
        warps = p.warps
        tidx, _, _ = cute.arch.thread_idx()
        warp = tidx // WARP
        lane = tidx % WARP
        tiles = cutlass.max((stop - start + p.tile - 1) // p.tile, 0)
        if warp == warps:
            if lane == 0:
                produce(p, key_cache, value_cache, ring32, bars, kv_head, start, stop, tiles)
        else:
            acc = fresh_acc(p)
            m, lsum = consume(p, qw, acc, ring32, bars, start, stop, tiles, warp, lane)
            store_partial(p, part, acc, m, lsum, warp, lane, tma_col)

    def part_layouts(p):
        """Each warp's (accumulator, max, sum) in shared memory."""
        warps, hpb, head_dim = p.warps, p.hpb, p.head_dim
        return (
            cute.make_layout((warps, hpb, head_dim), stride=(hpb * head_dim, head_dim, 1)),
            cute.make_layout((warps, hpb), stride=(hpb, 1)),
            cute.make_layout((warps, hpb), stride=(hpb, 1)),
        )

    def row_end(p, length, token, new_tokens):
        """The keys row `token` attends: [0, end) (causal among the new tokens; never past the cache)."""
        return cutlass.min(length - new_tokens + token + 1, p.capacity)

    @cute.jit
    def attend(p, tensors, part, blk, place, new_tokens, kv_lengths, splits, ring=None):
        """One block's share of its row (`place`: row, rank, token, head0): walk, merge its warps, then
        hand the result on (the context, a record for the merge, or the cluster's merge)."""
        split = p.split
        row, rank, token, head0 = place  # this block's query heads: head0 .. head0 + hpb - 1
        query, key_cache, value_cache, context, workspace = tensors
        tidx, _, _ = cute.arch.thread_idx()
        lane = tidx % WARP
        kv_head = head0 // p.group
        qw = None
        if cutlass.const_expr(p.use_mma):
            # the query does not depend on the length: its loads go out with the length's
            qw = load_q(p, query, head0, token, lane // 4, lane % 4, k_chunks(p, lane % 4) if p.tma else None)
        end = row_end(p, kv_lengths[0], token, new_tokens)  # the length is read on the device: no host sync
        if cutlass.const_expr(p.interleave):
            walk_interleaved(p, key_cache, value_cache, part, kv_head, rank, splits, end, qw)
        else:
            attend_shares(p, query, key_cache, value_cache, part, ring, head0, kv_head, token, rank, splits, end, qw)
        if cutlass.const_expr(PDL and not p.pdl_early):
            # the walk's reads are done: the next kernel may launch (it still waits for all of this
            # one), so its blocks do not sit on the SMs while this one streams
            cute.arch.griddepcontrol_launch_dependents()
        cute.arch.sync_threads()
        block_partial(p, part, blk, context, workspace, row, rank, splits, head0, token, tidx)
        if cutlass.const_expr(not split):
            cluster_merge(p, context, blk[0], blk[1], blk[2], head0, token, rank, tidx)

    @cute.jit
    def attend_shares(p, query, key_cache, value_cache, part, ring, head0, kv_head, token, rank, splits, end, qw):
        """The walk over contiguous shares: the block's (the ring) or each warp's."""
        split, warps = p.split, p.warps
        tidx, _, _ = cute.arch.thread_idx()
        warp = tidx // WARP
        # at least one step of the walk a warp (16 keys on tensor cores, 32 scalar): at short lengths
        # the warps past end get no keys and write an empty record, instead of every warp a part step
        parts = splits * warps if split else CLUSTER * warps
        share = cutlass.max((end + parts - 1) // parts, cutlass.Int32(16 if p.use_mma else WARP))
        if cutlass.const_expr(p.tma):  # the block's keys, one contiguous share, through the ring
            start = rank * warps * share
            stop = cutlass.min(start + warps * share, end)
            walk_tma(p, key_cache, value_cache, ring[0], ring[1], part, kv_head, start, stop, qw)
        else:  # each warp its own contiguous share
            start = (rank * warps + warp) * share
            stop = cutlass.min(start + share, end)
            if cutlass.const_expr(p.use_mma):
                walk_mma(p, key_cache, value_cache, part, kv_head, start, stop, qw)
            else:
                part_acc, part_m, part_l = part
                walk_scalar(
                    p, query, key_cache, value_cache, part_m, part_l, part_acc, head0, kv_head, token, start, stop
                )

    @cute.jit
    def walk_scalar(plan, query, key_cache, value_cache, part_m, part_l, part_acc, head0, kv_head, token, start, stop):
        """The scalar walk (groups of more than 8 heads, or CUTEDSL_ATTENTION_MMA=0), 32 keys a step.
        Each lane owns `cols` contiguous columns of the head dimension: its slice of q (per head), of
        every K and V row it reads (one 8- or 4-byte load), and of the output accumulator."""
        hpb, cols = plan.hpb, plan.cols
        tidx, _, _ = cute.arch.thread_idx()
        warp = tidx // WARP
        lane = tidx % WARP
        q = cute.make_rmem_tensor((hpb * cols,), cutlass.Float32)
        m = cute.make_rmem_tensor((hpb,), cutlass.Float32)
        lsum = cute.make_rmem_tensor((hpb,), cutlass.Float32)  # over this lane's keys only
        acc = cute.make_rmem_tensor((hpb * cols,), cutlass.Float32)
        scalar_start(plan, query, head0, token, lane, q, m, lsum, acc)
        part = cute.make_rmem_tensor((WARP,), cutlass.Float32)
        prob = cute.make_rmem_tensor((hpb,), cutlass.Float32)
        for base in cutlass.range(start, stop, WARP):
            masked = base + lane >= stop
            for g in cutlass.range_constexpr(hpb):
                scalar_dots(plan, q, key_cache, kv_head, base, stop, g, lane, part)
                warp_halving_sum(part, lane)
                sc = part[0]
                if masked:
                    sc = cutlass.Float32(-math.inf)
                m_new = cute.arch.fmax(m[g], cute.arch.warp_reduction_max(sc))
                alpha = cute.math.exp(m[g] - m_new)
                p = cute.math.exp(sc - m_new)  # 0 for a masked key
                lsum[g] = lsum[g] * alpha + p
                prob[g] = p.to(plan.element).to(cutlass.Float32)  # as fused attention kernels feed P @ V
                m[g] = m_new
                for c in cutlass.range_constexpr(cols):
                    acc[g * cols + c] = acc[g * cols + c] * alpha
            scalar_pv(plan, value_cache, kv_head, base, stop, lane, prob, acc)
        scalar_store(plan, part_m, part_l, part_acc, m, lsum, acc, warp, lane)

    @cute.jit
    def scalar_start(plan, query, head0, token, lane, q, m, lsum, acc):
        """The scalar walk's registers before the first key: this lane's slice of q, empty softmax."""
        hpb, cols = plan.hpb, plan.cols
        for g in cutlass.range_constexpr(hpb):
            qrow = cute.logical_divide(query[0, head0 + g, token, None], cute.make_layout(cols))
            for c in cutlass.range_constexpr(cols):
                q[g * cols + c] = qrow[c, lane].to(cutlass.Float32)
                acc[g * cols + c] = cutlass.Float32(0.0)
            m[g] = cutlass.Float32(NEG)
            lsum[g] = cutlass.Float32(0.0)

    @cute.jit
    def scalar_dots(plan, q, key_cache, kv_head, base, stop, g, lane, part):
        """part[j]: head g's partial dot product with key base + j over this lane's columns."""
        cols = plan.cols
        for j in cutlass.range_constexpr(WARP):
            kpos = cutlass.min(base + j, stop - 1)  # in bounds; keys past stop are masked below
            k = cute.logical_divide(key_cache[0, kv_head, kpos, None], cute.make_layout(cols))[None, lane]
            kv = k.load().to(cutlass.Float32)
            dot = q[g * cols] * kv[0]
            for c in cutlass.range_constexpr(1, cols):
                dot = dot + q[g * cols + c] * kv[c]
            part[j] = dot

    @cute.jit
    def warp_halving_sum(part, lane):
        """The 32 partial sums summed across the warp by recursive halving: 31 shuffles leave lane L
        with the total of part[L] in part[0] (at each step a lane keeps the half its lane bit selects)."""
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

    @cute.jit
    def scalar_pv(plan, value_cache, kv_head, base, stop, lane, prob, acc):
        """acc += P @ V for keys base .. base + 31: each V row read once, its probability broadcast."""
        hpb, cols = plan.hpb, plan.cols
        for j in cutlass.range_constexpr(WARP):
            vpos = cutlass.min(base + j, stop - 1)  # a masked key has probability 0
            v = cute.logical_divide(value_cache[0, kv_head, vpos, None], cute.make_layout(cols))[None, lane]
            vv = v.load().to(cutlass.Float32)
            for g in cutlass.range_constexpr(hpb):
                pj = cute.arch.shuffle_sync(prob[g], j)
                for c in cutlass.range_constexpr(cols):
                    acc[g * cols + c] = acc[g * cols + c] + pj * vv[c]

    @cute.jit
    def scalar_store(plan, part_m, part_l, part_acc, m, lsum, acc, warp, lane):
        """This warp's partial into shared memory: max, sum over its lanes, accumulator columns."""
        hpb, cols = plan.hpb, plan.cols
        for g in cutlass.range_constexpr(hpb):
            total = cute.arch.warp_reduction_sum(lsum[g])
            if lane == 0:
                part_m[warp, g] = m[g]
                part_l[warp, g] = total
            for c in cutlass.range_constexpr(cols):
                part_acc[warp, g, lane * cols + c] = acc[g * cols + c]

    @cute.jit
    def block_partial(p, part, blk, context, workspace, row, rank, splits, head0, token, tidx):
        """The block's partial: its warps merged in warp order (an empty share has l = 0 and acc = 0),
        written as the context (a row of one split), a record for the merge, or (cluster) `blk`."""
        hpb, head_dim, threads, warps = p.hpb, p.head_dim, p.threads, p.warps
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
            if cutlass.const_expr(p.split):
                if splits == 1:  # a workspace too small for two splits of these rows: the block's is the result
                    context[0, head0 + g, token, d] = (num / den).to(p.element)
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
    def merge_records(p, workspace, context, row, g, d, splits, head0, token):
        """Column d of head g of row `row`: its `splits` records merged in split order. The loop over
        splits is unrolled to the plan's most splits with indices clamped to the last record (weight 0 past it), so
        the loads are independent and issue together (a loop of dependent loads grew with the splits:
        docs/cutedsl-decode-attention.md); every record's words are loaded before any arithmetic."""
        head_dim = p.head_dim
        first = row * splits
        most = p.most_splits
        ms = cute.make_rmem_tensor((most,), cutlass.Float32)
        ls = cute.make_rmem_tensor((most,), cutlass.Float32)
        cs = cute.make_rmem_tensor((most,), cutlass.Float32)
        mall = cutlass.Float32(NEG)
        for r in cutlass.range_constexpr(most):
            at = first + cutlass.min(r, splits - 1)
            ms[r] = workspace[at, g, head_dim]  # a repeat cannot raise the max
            ls[r] = workspace[at, g, head_dim + 1]  # every load before any arithmetic
            cs[r] = workspace[at, g, d]
        for r in cutlass.range_constexpr(most):
            mall = cute.arch.fmax(mall, ms[r])
        num = cutlass.Float32(0.0)
        den = cutlass.Float32(0.0)
        for r in cutlass.range_constexpr(most):
            weight = cute.math.exp(ms[r] - mall)
            if r >= splits:
                weight = cutlass.Float32(0.0)
            num = num + cs[r] * weight
            den = den + ls[r] * weight
        context[0, head0 + g, token, d] = (num / den).to(p.element)

    @cute.jit
    def cluster_merge(p, context, blk_acc, blk_m, blk_l, head0, token, rank, tidx):
        """The cluster's result: blocks merged in rank order by rank 0, reading the others' shared memory."""
        hpb, head_dim, threads = p.hpb, p.head_dim, p.threads
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
                context[0, head0 + g, token, d] = (num / den).to(p.element)
        cute.arch.cluster_arrive()  # the others keep their shared memory until rank 0 has read it
        cute.arch.cluster_wait()

    def make_kernels(p):
        """The plan's two entry points: the walk (a block's share of a row) and, split over blocks, the merge."""
        hpb, head_dim, split = p.hpb, p.head_dim, p.split

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
            place = (row, rank, row % new_tokens, (row // new_tokens) * hpb)  # row, rank, token, head0
            smem = cutlass.memory.SmemAllocator()
            pin = smem.allocate_tensor(cutlass.Int32, cute.make_layout(1), 16)
            blk = (
                smem.allocate_tensor(cutlass.Float32, cute.make_layout((hpb, head_dim), stride=(head_dim, 1)), 16),
                smem.allocate_tensor(cutlass.Float32, cute.make_layout(hpb), 16),
                smem.allocate_tensor(cutlass.Float32, cute.make_layout(hpb), 16),
            )  # the block's (accumulator, max, sum)
            part = tuple(smem.allocate_tensor(cutlass.Float32, layout, 16) for layout in part_layouts(p))
            ring = None
            if cutlass.const_expr(p.tma):  # (the ring as words, its mbarriers: full, then empty)
                words = smem.allocate_tensor(
                    cutlass.Int32,
                    cute.make_layout(
                        (TMA_STAGES, 2, p.tile, head_dim // 2),
                        stride=(p.tile * head_dim, p.tile * head_dim // 2, head_dim // 2, 1),
                    ),
                    128,
                )
                ring = (words, smem.allocate_tensor(cutlass.Int64, cute.make_layout(2 * TMA_STAGES), 16))
                ring_barriers(p, ring[1])
            if cutlass.const_expr(PDL):  # every input is an earlier kernel's output; no global memory before this
                # the block's place from its index and the arguments alone, stored so that ptxas computes
                # it before the wait (else it put both integer divisions, ~85 instructions, after it: on
                # the path of every call once the kernel before has finished; 0.05-0.12 us a call on an H100)
                pin[0] = place[0] + place[1] + place[2] + place[3]
                cute.arch.griddepcontrol_wait()
                if cutlass.const_expr(p.pdl_early):
                    cute.arch.griddepcontrol_launch_dependents()
            attend(
                p,
                (query, key_cache, value_cache, context, workspace),
                part,
                blk,
                place,
                new_tokens,
                kv_lengths,
                splits,
                ring,
            )

        @cute.kernel
        def merge_kernel(
            workspace: cute.Tensor, context: cute.Tensor, new_tokens: cutlass.Int32, splits: cutlass.Int32
        ):
            """split: one block per (row, head), a thread per column, merges the row's records in split
            order (a row of one split was written by its block)."""
            d, _, _ = cute.arch.thread_idx()
            bidx, _, _ = cute.arch.block_idx()
            g = bidx % hpb
            row = bidx // hpb
            if cutlass.const_expr(PDL):  # the records are the kernel before's output
                cute.arch.griddepcontrol_wait()
                cute.arch.griddepcontrol_launch_dependents()  # the merge is small: its successor may wait beside it
            if splits > 1:
                merge_records(p, workspace, context, row, g, d, splits, (row // new_tokens) * hpb, row % new_tokens)

        return attention_kernel, merge_kernel

    def cluster_launcher(p, attention_kernel):
        """run(query, key_cache, value_cache, kv_lengths, context): one cluster per row merges its blocks."""
        heads, hpb, threads, smem_bytes = p.heads, p.hpb, p.threads, p.smem_bytes

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

        return run

    def split_launcher(p, attention_kernel, merge_kernel):
        """run(query, key_cache, value_cache, kv_lengths, workspace, context): records, then the merge."""
        heads, hpb, threads, smem_bytes, partials, head_dim, most = (
            p.heads,
            p.hpb,
            p.threads,
            p.smem_bytes,
            p.partials,
            p.head_dim,
            p.most_splits,
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
            by a second kernel; as many splits (up to the plan's most) as the
            workspace holds for these rows."""
            new_tokens = cute.size(query, mode=[2])
            rows = heads // hpb * new_tokens
            splits = cutlass.max(cutlass.min(cutlass.Int32(most), cutlass.Int32(partials) // rows), cutlass.Int32(1))
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
                # with the ring, the merge asks for the walk's shared memory too: consecutive walks and
                # merges then keep one shared-memory carveout (H200: 0.3-0.8 us a call faster)
                smem=smem_bytes if p.tma else 0,
                stream=stream,
                use_pdl=PDL,
            )

        return run_split


# ---------------------------------------------------------------- command line (check, compile, export, link: the kit)


def main(argv=None):
    exporter = kit.Exporter(
        description=f"Export the CuTe DSL decode attention for {', '.join(BINDING_IDS)} as a TVM-FFI DSO "
        "(GPU-tested on the H200).",
        check=check_contract,
        kernel=lambda checked: kit.Kernel(make_run(checked.detail), ARGUMENTS, fake_arguments(checked.detail)),
        snapshot_required=False,
    )
    return kit.main(exporter, argv)


if __name__ == "__main__":
    sys.exit(main())
