"""Generate a CuTe DSL exporter stub from a selection receipt and its graph snapshot (`mcore kernel stub`).

The generated file is Python that carries the ABI as constants and the kernel; the rest comes
from mcore's exporter kit (mcore/kernels/exporter_kit.py, imported as `from mcore import exporter_kit`):
the check of a selection/snapshot pair against the constants (each mismatch: one line, exit 2),
the ABI argument order, and the compile (`--enable-tvm-ffi`, TVM-FFI environment stream),
`export_to_c`, link and install of the DSO (never over an existing file). Where it runs it needs
mcore, the CuTe DSL (nvidia-cutlass-dsl), apache-tvm-ffi, gcc and the CUDA runtime.

When the region is a single op the generator knows (a copy, a cast between the boundary
dtypes, add, sub or mul of two same-shape tensors) the kernel body is generated and correct;
otherwise the body is a scaffold and export stops with a message naming what to implement.
"""

from __future__ import annotations

import json
import math
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..common.errors import UserError
from ..common.fileio import check_overwrite, install_file
from ..graph.snapshot import Snapshot, load_snapshot
from ..selection.patch import check_receipt_against
from ..selection.receipt import Receipt
from ..selection.region import load_receipt

TEMPLATE_NAME = "templates/cutedsl_exporter.py.tmpl"
THREADS = 256

CUTE_TYPES = {
    "FP16": "cutlass.Float16",
    "BF16": "cutlass.BFloat16",
    "FP32": "cutlass.Float32",
    "INT32": "cutlass.Int32",
}
FLOAT_DTYPES = ("FP16", "BF16", "FP32")

# The single ops the generator writes a body for. Bodies follow PyTorch: inputs are first
# converted to the output dtype (type promotion), FP16/BF16 math runs in FP32 and is rounded
# once, INT32 math wraps. The snapshot does not record scalar arguments such as add's
# `alpha`; the generator assumes alpha=1, which is what `a + b` / `a - b` export to.
BINARY_OPS = {"aten.add.Tensor": ("add", "+"), "aten.sub.Tensor": ("sub", "-"), "aten.mul.Tensor": ("mul", "*")}
COPY_OPS = ("aten.clone.default", "aten.alias.default", "aten.detach.default", "aten.lift_fresh_copy.default")
CAST_OPS = ("aten._to_copy.default", "aten.to.dtype", "aten.to.dtype_layout", "prims.convert_element_type.default")


@dataclass(frozen=True)
class KnownOp:
    kind: str  # "copy" | "cast" | "add" | "sub" | "mul"
    op: str  # the node's op, e.g. "aten.add.Tensor"
    node_id: str
    summary: str  # "output0 = input0 + input1"


@dataclass(frozen=True)
class StubResult:
    path: Path
    known: KnownOp | None  # None: the body is a scaffold the author must fill in
    reason: str  # why the body was not generated ("" when it was)
    binding_id: str
    abi_sha256: str
    example: str | None = None  # a hand-written kernel for this kind of region, to start from


# ---------------------------------------------------------------- region classification

# Hand-written CuTe DSL kernels for regions the generator cannot write a body for: op -> exporter.
WORKED_EXAMPLES = {"mcore.decode_attention.default": "kernels/cutedsl_decode_attention.py"}


def worked_example(receipt: Receipt | Mapping[str, Any], snapshot: Snapshot | Mapping[str, Any]) -> str | None:
    """The shipped exporter to start from when the region holds an op that has one (decode attention)."""
    receipt, snapshot = Receipt.of(receipt), Snapshot.of(snapshot)
    for nid in receipt.node_ids:
        node = snapshot.node_by_id.get(nid)
        if node is not None and node.op in WORKED_EXAMPLES:
            return WORKED_EXAMPLES[node.op]
    return None


def classify_region(
    receipt: Receipt | Mapping[str, Any], snapshot: Snapshot | Mapping[str, Any]
) -> tuple[KnownOp | None, str]:
    """(KnownOp, "") when the generator can write the body, else (None, why not). Either argument
    may be given as its JSON."""
    receipt, snapshot = Receipt.of(receipt), Snapshot.of(snapshot)
    ids = receipt.node_ids
    if len(ids) != 1:
        return (
            None,
            f"the region has {len(ids)} nodes; bodies are generated only for one copy, cast, add, sub or mul node",
        )
    node = snapshot.node(ids[0])
    op = node.op
    ins, outs = receipt.inputs, receipt.outputs
    out = outs[0]
    if node.outputs != receipt.output_tensor_ids:
        return None, f"{ids[0]} ({op}) has more than the one boundary output"
    if node.inputs != receipt.input_tensor_ids:
        return None, f"{ids[0]} ({op}) reads tensors other than its boundary inputs"
    if any(t.shape != out.shape for t in ins):
        return None, f"{ids[0]} ({op}) has inputs whose shapes differ from the output's (broadcasting)"
    if -1 not in out.shape and math.prod(out.shape) >= 2**31:
        return None, "the output has 2^31 elements or more (the generated kernel indexes with int32)"
    if op in BINARY_OPS:
        if len(ins) != 2:
            return None, f"{ids[0]} ({op}) has {len(ins)} tensor inputs (a scalar operand or x {BINARY_OPS[op][1]} x)"
        kind, sym = BINARY_OPS[op]
        return KnownOp(kind, op, ids[0], f"output0 = input0 {sym} input1"), ""
    if op in COPY_OPS:
        if len(ins) != 1 or ins[0].dtype != out.dtype:
            return None, f"{ids[0]} ({op}) is not a one-input copy"
        return KnownOp("copy", op, ids[0], "output0 = input0"), ""
    if op in CAST_OPS:
        if len(ins) != 1:
            return None, f"{ids[0]} ({op}) has {len(ins)} inputs"
        if ins[0].dtype == out.dtype:
            return None, f"{ids[0]} ({op}) casts to the same dtype; it is not treated as a known op"
        return KnownOp("cast", op, ids[0], f"output0 = input0 converted to {out.dtype}"), ""
    return None, f"{ids[0]} is {op}, which the generator does not write bodies for (known: copy, cast, add, sub, mul)"


# ---------------------------------------------------------------- code generation helpers


def _py(obj: Any) -> str:
    """A Python literal for JSON-like data (strings double-quoted, None/True/False)."""
    if obj is None or isinstance(obj, bool):
        return repr(obj)
    if isinstance(obj, (int, float)):
        return repr(obj)
    if isinstance(obj, str):
        return json.dumps(obj)
    if isinstance(obj, (list, tuple)):
        return "[" + ", ".join(_py(v) for v in obj) + "]"
    if isinstance(obj, dict):
        return "{" + ", ".join(f"{_py(k)}: {_py(v)}" for k, v in obj.items()) + "}"
    raise TypeError(f"cannot write {type(obj).__name__} as a literal")


def _doc(text: Any) -> str:
    """Text that is safe inside a triple-quoted docstring or a comment."""
    # a lone surrogate (a name from someone's JSON) is shown escaped: the file is written as UTF-8
    s = str(text).encode("utf-8", "backslashreplace").decode("utf-8")
    s = s.replace("\\", "/").replace('"""', "'''")
    return re.sub(r"[\x00-\x1f\x7f]", " ", s)


def _convert(expr: str, src: str, dst: str) -> str:
    """CuTe DSL expression converting `expr` from dtype `src` to `dst` as PyTorch does (through FP32)."""
    if src == dst:
        return expr
    if dst == "INT32":
        return (expr if src == "FP32" else f"{expr}.to(cutlass.Float32)") + ".to(cutlass.Int32)"
    if src == "FP32":
        return f"{expr}.to({CUTE_TYPES[dst]})"
    if dst == "FP32":
        return f"{expr}.to(cutlass.Float32)"
    return f"{expr}.to(cutlass.Float32).to({CUTE_TYPES[dst]})"


def _tensor_line(e: dict) -> str:
    return f"{e['param']:<9} {e['dtype']:<5} {str(e['shape']):<16} {e['tensor_id']} ({_doc(e.get('name') or '')})"


def _extra_text(i: int, a: dict) -> str:
    if a["type"] == "int":
        return f"extra{i}  int32 {a['value']}"
    if a["type"] == "float":
        return f"extra{i}  float {a['value']!r}"
    if a["type"] == "ptr":
        return f"extra{i}  null pointer (passed as None)"
    return f"extra{i}  none (passed as None)"


class _Ctx:
    """Everything the generator derives from the receipt and snapshot."""

    def __init__(self, receipt: Receipt, snapshot: Snapshot):
        self.receipt = receipt
        self.snapshot = snapshot
        # the generator's view of each boundary tensor (also written into the exporter as INPUTS/OUTPUTS)
        self.inputs: list[dict[str, Any]] = [
            {"param": f"input{i}", "tensor_id": e.tensor_id, "name": e.name, "dtype": e.dtype, "shape": list(e.shape)}
            for i, e in enumerate(receipt.inputs)
        ]
        self.outputs: list[dict[str, Any]] = [
            {"param": f"output{i}", "tensor_id": e.tensor_id, "name": e.name, "dtype": e.dtype, "shape": list(e.shape)}
            for i, e in enumerate(receipt.outputs)
        ]
        self.workspace = receipt.workspace_bytes
        self.extras = list(receipt.extra_args)
        self.rule = receipt.output_shape_input
        self.known, self.reason = classify_region(receipt, snapshot)

    # ABI-ordered run() parameters
    def params(self) -> list[str]:
        return self.receipt.call_params()

    def op(self, nid: str) -> str:
        return self.snapshot.node(nid).op

    def node_lines(self) -> list[str]:
        lines = []
        for nid in self.receipt.node_ids:
            n = self.snapshot.node(nid)
            lines.append(f"{nid:<10} {_doc(n.op)}  {', '.join(n.inputs) or '-'} -> {', '.join(n.outputs) or '-'}")
        return lines

    def dynamic(self) -> bool:
        return any(-1 in e["shape"] for e in self.inputs + self.outputs)

    def todo(self) -> str:
        ins = ", ".join(f"{e['param']} ({e['dtype']} {e['shape']})" for e in self.inputs)
        outs = ", ".join(f"{e['param']} ({e['dtype']} {e['shape']})" for e in self.outputs)
        region = ", ".join(f"{nid} {self.op(nid)}" for nid in self.receipt.node_ids)
        ws = f"{self.workspace} bytes (uint8 tensor `workspace`)" if self.workspace else "none"
        extras = "; ".join(_extra_text(i, a) for i, a in enumerate(self.extras)) or "none"
        example = worked_example(self.receipt, self.snapshot)
        hint = (
            (
                f" (worked example for this region: {example}, a split-KV decode attention that takes this "
                "recipe's receipt directly)"
            )
            if example
            else ""
        )
        return (
            f"write the body of region_kernel in this file so that it computes {outs} from {ins} as the region "
            f"does ({_doc(region)}); workspace: {ws}; extra args: {extras}; then set KERNEL_IMPLEMENTED = True" + hint
        )


def _doc_header(c: _Ctx, selection_name: str, snapshot_name: str, note: str) -> list[str]:
    """Provenance, then the region and what the body computes."""
    r = c.receipt
    meta = c.snapshot.metadata
    lines = [
        f'"""CuTe DSL exporter for the selection {_doc(r.binding_id)}.',
        "",
        "Generated by `mcore kernel stub` from",
        f"    selection: {_doc(selection_name)}",
        f"    snapshot:  {_doc(snapshot_name)}",
        "Edit the kernel freely. The contract check and the compile/export/link step come from mcore's",
        "exporter kit (`from mcore import exporter_kit`), so this file needs mcore installed where it runs.",
        "To start over, run `mcore kernel stub` again.",
    ]
    lines += [_doc(ln) for ln in note.splitlines()] + [""]
    graph = " ".join(f"{k}={_doc(meta[k])}" for k in ("family", "model", "engine_role") if meta.get(k))
    lines += [f"Region ({graph or 'graph'}; fingerprint {r.graph_fingerprint[:16]}...):"]
    lines += [f"    {ln}" for ln in c.node_lines()]
    return lines + _doc_body(c)


def _doc_body(c: _Ctx) -> list[str]:
    if c.known:
        lines = [
            f"Kernel body: generated: {c.known.summary}, elementwise ({c.known.op}).",
            "    FP16/BF16 math runs in FP32 and is rounded once; INT32 math wraps; inputs are first",
            "    converted to the output dtype, as in PyTorch.",
        ]
        if c.known.kind in ("add", "sub"):
            lines += [f"    The snapshot does not record {c.known.op}'s alpha; this body assumes alpha=1."]
        return lines
    lines = [
        "Kernel body: NOT generated: " + _doc(c.reason) + ".",
        "    Write region_kernel below, then set KERNEL_IMPLEMENTED = True; until then export stops.",
    ]
    example = worked_example(c.receipt, c.snapshot)
    if example:
        lines += [
            f"    Worked example for this region: {example} (split-KV decode attention, BF16/FP16,",
            "    head_dim 64/128, GQA); it takes this receipt directly: --selection RECEIPT --output KERNEL.so.",
        ]
    return lines


def _doc_call(c: _Ctx) -> list[str]:
    """The exported call, one argument a line in ABI order (Receipt.call_args)."""
    workspace = f"{'workspace':<9} UINT8 [{c.workspace}]  scratch, {c.workspace} bytes, contents undefined on entry"
    args = c.receipt.call_args(
        [_tensor_line(e) for e in c.inputs],
        workspace,
        [_tensor_line(e) for e in c.outputs],
        [_extra_text(i, a) for i, a in enumerate(c.extras)],
    )
    lines = ["", "Exported TVM-FFI function `run`, arguments in ABI call order:", f"    run({', '.join(c.params())})"]
    lines += [f"    {a}" for a in args]
    if not c.workspace:
        lines += ["    workspace: none (0 bytes)"]
    if not c.extras:
        lines += ["    extra args: none"]
    if c.rule is None:
        return lines + ["Output shape: fixed by the ABI."]
    return lines + [
        f"Output shape: output0 has the runtime shape of input{c.rule} (the engine allocates it so;",
        f"    OUTPUT_SHAPE_INPUT = {c.rule}); fake_arguments() gives both the same dynamic dims.",
    ]


def _doc_rules(selection_name: str, snapshot_name: str, exporter_name: str) -> list[str]:
    return [
        "Runtime shapes: a -1 dimension is dynamic. The kernel gets it from the tensor it is passed",
        "    (cute.size(tensor), tensor.shape) at run time, never from a constant; the TVM-FFI wrapper",
        "    checks every fixed dimension, dtype, device and contiguity, and that dims sharing one",
        "    cute.sym_int() in fake_arguments() agree.",
        "Stream: run() launches on the TVM-FFI environment stream, i.e. the engine's current CUDA stream",
        "    (the kit compiles it with make_fake_stream(use_tvm_ffi_env_stream=True)); it is not an argument",
        "    of the exported run. The code never synchronizes and never picks the default stream itself.",
        "Extra args: int and float arrive as runtime scalars; none and null ptr arrive as None.",
        "",
        "Use (needs mcore, nvidia-cutlass-dsl with its CUDA 13 libs, apache-tvm-ffi, gcc and libcudart):",
        f"    python {_doc(exporter_name)} --snapshot {_doc(snapshot_name)} --selection {_doc(selection_name)} "
        "--output KERNEL.so",
        "    add --check-only to run only the contract check (it needs no CuTe DSL).",
        "Every mismatch between those files and the constants below is refused with one line and exit 2;",
        "an existing output is never overwritten. With no GPU visible, CUTE_DSL_ARCH defaults to sm_90a",
        "(compile and export need no GPU; that DSO runs on sm_90 GPUs such as H100/H200).",
        "It prints binding_id=..., abi_sha256=... and dso=PATH; bind the DSO with function name `run`.",
        '"""',
    ]


def _docstring(c: _Ctx, selection_name: str, snapshot_name: str, exporter_name: str, note: str) -> str:
    lines = _doc_header(c, selection_name, snapshot_name, note) + _doc_call(c)
    return "\n".join(lines + _doc_rules(selection_name, snapshot_name, exporter_name))


def _constants(c: _Ctx) -> str:
    r = c.receipt
    out = [
        f"BINDING_ID = {_py(r.binding_id)}",
        f"GRAPH_FINGERPRINT = {_py(r.graph_fingerprint)}",
        f"ABI_SHA256 = {_py(r.abi_sha256)}",
        f"NODE_IDS = {_py(list(r.node_ids))}",
        "# Boundary tensors in call order; -1 marks a dynamic dimension (read from the tensor at run time).",
        "INPUTS = [",
    ]
    out += [f"    {_py(e)}," for e in c.inputs]
    out += [
        "]",
        f"WORKSPACE_BYTES = {c.workspace}  # > 0: a uint8 tensor of this many bytes follows the inputs",
        "OUTPUTS = [",
    ]
    out += [f"    {_py(e)}," for e in c.outputs]
    out += [
        "]",
        "# Fixed arguments after the outputs: int -> int32 scalar, float -> float32 scalar, none / null ptr -> None.",
        f"EXTRA_ARGS = {_py(c.extras)}",
        f"OUTPUT_SHAPE_INPUT = {_py(c.rule)}  # output 0 has the runtime shape of this input, or None (fixed)",
        "",
        f"KERNEL_BODY = {_py(c.known.kind if c.known else None)}  # what the generated body computes; None: you write it",
        f"KERNEL_IMPLEMENTED = {c.known is not None}",
        f"TODO = {_py('' if c.known else c.todo())}",
    ]
    return "\n".join(out)


def _dim_symbols(c: _Ctx) -> tuple[dict[str, int], dict[tuple[int, int], str]]:
    """Each tensor's group (tensors of one group share their dynamic dims) and one cute.sym_int()
    name per (group, dim) of a -1 dim. A generated elementwise body is one group; else the output
    shares its rule input's."""
    group: dict[str, int] = {}
    for e in c.inputs + c.outputs:
        group[e["param"]] = 0 if c.known else len(group)
    if c.rule is not None and not c.known:
        group["output0"] = group[f"input{c.rule}"]
    symbols: dict[tuple[int, int], str] = {}
    for e in c.inputs + c.outputs:
        for d, size in enumerate(e["shape"]):
            key = (group[e["param"]], d)
            if size == -1 and key not in symbols:
                symbols[key] = f"dim{len(symbols)}"
    return group, symbols


def _fake_arguments(c: _Ctx) -> list[str]:
    """The body of fake_arguments(): symbols for -1 dims, then one stand-in per run() argument, by
    role (the kit puts them in ABI order, and adds the stream)."""
    group, symbols = _dim_symbols(c)
    users: dict[str, list[str]] = {}
    for e in c.inputs + c.outputs:
        for d, size in enumerate(e["shape"]):
            if size == -1:
                users.setdefault(symbols[(group[e["param"]], d)], []).append(f"{e['param']}[{d}]")

    def tensor_line(e: dict) -> str:
        dims = [symbols[(group[e["param"]], d)] if s == -1 else str(s) for d, s in enumerate(e["shape"])]
        shape = "(" + ", ".join(dims) + ("," if len(dims) == 1 else "") + ")"
        return f"        tensor({CUTE_TYPES[e['dtype']]}, {shape}),  # {e['param']}  {e['tensor_id']}"

    def extra_line(i: int, a: dict) -> str:
        if a["type"] == "int":
            return f"        cutlass.Int32({a['value']}),  # extra{i}: int32 scalar"
        if a["type"] == "float":
            return f"        cutlass.Float32({a['value']!r}),  # extra{i}: float32 scalar"
        return f"        None,  # extra{i}: {'null ptr' if a['type'] == 'ptr' else 'none'}, passed as None"

    workspace = f"tensor(cutlass.Uint8, ({c.workspace},))" if c.workspace else "None"
    lines = [f"{name} = cute.sym_int()  # dynamic: {', '.join(used)}" for name, used in users.items()]
    lines += ["return kit.Boundary(", "    inputs=["]
    lines += [tensor_line(e) for e in c.inputs]
    lines += ["    ],", f"    workspace={workspace},  # WORKSPACE_BYTES bytes, or None", "    outputs=["]
    lines += [tensor_line(e) for e in c.outputs]
    lines += ["    ],", "    extras=["]
    lines += [extra_line(i, a) for i, a in enumerate(c.extras)]
    return lines + ["    ],", ")"]


def _scalar_type(a: dict) -> str | None:
    return {"int": "cutlass.Int32", "float": "cutlass.Float32"}.get(a["type"])


def _run_signature(c: _Ctx) -> str:
    """run()'s parameters in ABI order (Receipt.call_args), then the stream."""
    ps = c.receipt.call_args(
        [f"{e['param']}: cute.Tensor" for e in c.inputs],
        "workspace: cute.Tensor",
        [f"{e['param']}: cute.Tensor" for e in c.outputs],
        [f"extra{i}: {_scalar_type(a)}" if _scalar_type(a) else f"extra{i}" for i, a in enumerate(c.extras)],
    )
    return ", ".join([*ps, "stream: cuda.CUstream"])


def _known_kernel(c: _Ctx) -> tuple[list[str], list[str]]:
    """The generated elementwise region_kernel (its lines) and the arguments run() launches it with."""
    k = c.known
    assert k is not None
    D = c.outputs[0]["dtype"]
    if k.kind == "copy":
        body = ["output0[index] = input0[index]"]
    elif k.kind == "cast":
        body = [f"output0[index] = {_convert('input0[index]', c.inputs[0]['dtype'], D)}"]
    else:
        C = "FP32" if D in FLOAT_DTYPES else "INT32"
        sym = BINARY_OPS[k.op][1]
        body = [
            f"a = {_convert(_convert('input0[index]', c.inputs[0]['dtype'], D), D, C)}",
            f"b = {_convert(_convert('input1[index]', c.inputs[1]['dtype'], D), D, C)}",
            f"output0[index] = {_convert(f'(a {sym} b)', C, D)}",
        ]
    kparams = [f"{e['param']}: cute.Tensor" for e in c.inputs] + ["output0: cute.Tensor", "count: cutlass.Int32"]
    lines = [
        "    @cute.kernel",
        f"    def region_kernel({', '.join(kparams)}):",
        f'        """{k.summary}, elementwise over `count` elements ({k.node_id} {_doc(k.op)})."""',
        *_THREAD_INDEX,
    ]
    lines += [f"            {ln}" for ln in body]
    return lines, [f"flat({e['param']})" for e in c.inputs] + ["flat(output0)", "count"]


_THREAD_INDEX = [
    "        thread_x, _, _ = cute.arch.thread_idx()",
    "        block_x, _, _ = cute.arch.block_idx()",
    "        index = block_x * THREADS + thread_x",
    "        if index < count:",
]


def _scaffold_kernel(c: _Ctx) -> tuple[list[str], list[str]]:
    """The region_kernel scaffold of an unknown region: every tensor and scalar argument in ABI order
    (Receipt.call_args; none / null ptr extras are not passed), then the element count."""
    tensor: Callable[[dict], tuple[str, str] | None] = lambda e: (f"{e['param']}: cute.Tensor", f"flat({e['param']})")
    ordered = c.receipt.call_args(
        [tensor(e) for e in c.inputs],
        ("workspace: cute.Tensor", "flat(workspace)"),
        [tensor(e) for e in c.outputs],
        [(f"extra{i}: {_scalar_type(a)}", f"extra{i}") if _scalar_type(a) else None for i, a in enumerate(c.extras)],
    )
    pairs = [p for p in ordered if p is not None] + [("count: cutlass.Int32", "count")]
    lines = [
        "    @cute.kernel",
        f"    def region_kernel({', '.join(p for p, _ in pairs)}):",
        '        """TODO: compute the output from the inputs as the region does:',
    ]
    lines += [f"            {ln}" for ln in c.node_lines()]
    lines += [
        "        This scaffold gives each thread one element index of the flattened output0; pass the",
        "        tensors unflattened from run() (drop flat()) for their row-major shaped views.",
        '        """',
        *_THREAD_INDEX,
        "            pass  # TODO: output0[index] = ...",
    ]
    return lines, [a for _, a in pairs]


def _run_def(c: _Ctx, kargs: list[str]) -> list[str]:
    """run(): the element count, then one launch on the TVM-FFI environment stream."""
    out_e = c.outputs[0]
    count_note = (
        "read from output0's runtime shape"
        if -1 in out_e["shape"]
        else f"{math.prod(out_e['shape'])}, fixed by the ABI"
    )
    launch = [
        f"region_kernel({', '.join(kargs)}).launch(",
        "    grid=((count + THREADS - 1) // THREADS, 1, 1),",
        "    block=(THREADS, 1, 1),",
        "    stream=stream,",
        ")",
    ]
    lines = [
        "",
        "    @cute.jit",
        f"    def run({_run_signature(c)}):",
        f'        """The exported function run({", ".join(c.params())}); `stream` is the TVM-FFI env stream."""',
        f"        count = cute.size(output0)  # element count: {count_note}",
    ]
    if c.dynamic():
        return (
            lines
            + ["        if count > 0:  # an empty tensor needs no launch"]
            + [f"            {ln}" for ln in launch]
        )
    return lines + [f"        {ln}" for ln in launch]


def _kernel(c: _Ctx) -> str:
    kernel, kargs = _known_kernel(c) if c.known else _scaffold_kernel(c)
    L = [
        f"THREADS = {THREADS}  # threads per block; one thread per output element",
        "",
        "if cute is not None:",
        "",
        "    def flat(tensor):",
        '        """A 1-D view of a contiguous tensor: the same memory, cute.size(tensor) elements."""',
        "        return cute.make_tensor(tensor.iterator, cute.make_layout(cute.size(tensor)))",
        "",
        *kernel,
        *_run_def(c, kargs),
        "",
        "    def fake_arguments():",
        '        """Compile-time stand-ins for run()\'s arguments by role (-1 dims are cute.sym_int())."""',
        "",
        "        def tensor(dtype, shape):  # contiguous row-major, like the engine's linear tensors",
        "            return make_fake_compact_tensor(dtype, shape, stride_order=tuple(reversed(range(len(shape)))))",
        "",
    ]
    L += [f"        {ln}" for ln in _fake_arguments(c)]
    return "\n".join(L)


def _template() -> str:
    from .shipped import kernels_dir

    path = kernels_dir() / TEMPLATE_NAME
    if not path.is_file():
        raise UserError(f"stub template {path} is missing; restore it from the repository")
    return path.read_text(encoding="utf-8")


# ---------------------------------------------------------------- public API


def generate_exporter(
    receipt: Receipt | Mapping[str, Any],
    snapshot: Snapshot | Mapping[str, Any],
    *,
    selection_name: str = "SELECTION",
    snapshot_name: str = "SNAPSHOT",
    exporter_name: str = "THIS_FILE",
    note: str = "",
) -> str:
    """The exporter's Python source for a receipt and the snapshot it was made from (either may be
    given as its JSON, checked here).

    The names only appear in the generated docstring; `note` adds lines of provenance there.
    """
    receipt = Receipt.of(receipt, selection_name)
    snapshot = Snapshot.of(snapshot, snapshot_name)
    if receipt.graph_fingerprint != snapshot.fingerprint:
        raise UserError(
            f"{selection_name} was made from another graph than {snapshot_name} (fingerprints "
            f"{receipt.graph_fingerprint[:12]}... and {snapshot.fingerprint[:12]}...); "
            "pass the snapshot the selection was made from"
        )
    for nid in receipt.node_ids:
        if nid not in snapshot.node_by_id:
            raise UserError(f"{selection_name}: {nid} is not in {snapshot_name}; recreate the selection")
    for tid in receipt.input_tensor_ids + receipt.output_tensor_ids:
        if tid not in snapshot.tensor_by_id:
            raise UserError(f"{selection_name}: {tid} is not in {snapshot_name}; recreate the selection")
    # the region rules once more, on this snapshot (boundary dtypes, rank, shapes): the one validator
    check_receipt_against(receipt, snapshot, selection_name)
    _check_index_range(receipt, selection_name)
    c = _Ctx(receipt, snapshot)
    text = _template()
    for key, value in (
        ("@@DOCSTRING@@", _docstring(c, selection_name, snapshot_name, exporter_name, note)),
        ("@@CONSTANTS@@", _constants(c)),
        ("@@KERNEL@@", _kernel(c)),
    ):
        text = text.replace(key, value)
    compile(text, "<generated exporter>", "exec")  # a generator bug must not reach the user's disk
    return text


MAX_ELEMENTS = 2**31 - 1  # the generated kernels index elements with 32-bit integers


def _check_index_range(receipt: Receipt, where: str) -> None:
    """Every boundary tensor's fixed size fits the generated kernel's 32-bit element index."""
    for e in (*receipt.inputs, *receipt.outputs):
        n = math.prod(d for d in e.shape if d >= 0)
        if n > MAX_ELEMENTS:
            raise UserError(
                f"{where}: {e.tensor_id} {list(e.shape)} has {n} elements; the generated kernel indexes at most "
                f"{MAX_ELEMENTS} (32-bit); select a smaller region"
            )


def write_exporter(
    selection: str | os.PathLike,
    snapshot: str | os.PathLike,
    output: str | os.PathLike,
    overwrite: bool = False,
) -> StubResult:
    """Generate the exporter for a receipt file and its snapshot file and write it to `output`.

    The file is written atomically and never replaces an existing one unless `overwrite`.
    """
    output = check_overwrite(output, overwrite)
    receipt = load_receipt(selection)
    snap = load_snapshot(snapshot)
    text = generate_exporter(
        receipt, snap, selection_name=str(selection), snapshot_name=str(snapshot), exporter_name=str(output)
    )
    install_file(output, text.encode("utf-8"), overwrite)
    known, reason = classify_region(receipt, snap)
    return StubResult(
        path=output,
        known=known,
        reason=reason,
        binding_id=receipt.binding_id,
        abi_sha256=receipt.abi_sha256,
        example=worked_example(receipt, snap),
    )


__all__: Sequence[str] = (
    "KnownOp",
    "StubResult",
    "classify_region",
    "generate_exporter",
    "worked_example",
    "write_exporter",
)
