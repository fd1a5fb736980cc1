"""Generate the shipped guided tutorials by running them.

Every step goes through workbench.actions (the same code the TUI and replay use) in a fresh
temporary workdir; the recorded results (fingerprints, ABI hashes, tokens, gate verdicts) are
saved with the steps. Regenerate after graph-producing code changes:

    python sessions/make_sessions.py              # all tutorials
    python sessions/make_sessions.py qwen-manual  # one
"""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

import torch  # noqa: E402

from mcore.common.errors import UserError  # noqa: E402
from mcore.graph.snapshot import load_snapshot  # noqa: E402
from mcore.model.buildargs import BuildArgs  # noqa: E402
from mcore.selection.recipes import find_recipe  # noqa: E402
from workbench.actions import ActionContext  # noqa: E402
from workbench.dispatch import run_action  # noqa: E402
from workbench.session import Session  # noqa: E402

QWEN_ARGS = (
    BuildArgs("demo:qwen3-tiny", precision="fp32", max_cache_length=256, decoder_engine_layout="split")
    .validate()
    .to_dict()
)
ATTN_ARGS = (
    BuildArgs("demo:qwen3-tiny-hd64", precision="bf16", max_cache_length=256, decoder_engine_layout="split")
    .validate()
    .to_dict()
)
ATTN_RECIPE = "qwen.decode_attention_region@2"
# the split schedule's workspace, as the exporter's split_workspace_bytes for this receipt: 8 heads x 4
# splits (the 256-key cache's 64-key tiles) x an fp32 context row, max and sum (64 + 2 words). On an
# H100 the split schedule took 3.0 us a call at this model's contexts, the cluster one (no workspace)
# 3.7-3.9, native 4.1 (docs/gpu-results.md, twenty-third session)
ATTN_WORKSPACE = 8 * 4 * (64 + 2) * 4
# 5% of the largest logit of this model (8.1), the bound the CuTe kernel's GPU pipeline test holds
# against native: another kernel reduces in another order, so bf16 logits differ in their last bits.
ATTN_MAX_ABS = 0.4
DISTILBERT_ARGS = BuildArgs("demo:distilbert-tiny", precision="fp32").validate().to_dict()
QWEN_PROMPT = "Explain grouped-query attention, KV caching, and decode latency."
QWEN_TOKENS = 16
DISTILBERT_PROMPT = "The quick brown fox jumps over the lazy dog."
# a pair at a time until the interval decides, at most 6 (a replay's time stays a few minutes); on
# CUDA the device time per step spreads +-0.5% between processes and each process reloads the
# compiled engine (20-26 s on the H200), so 3 pairs decide there
PERF = {"pairs": "auto", "max_pairs": 6, "min_ratio": 0.98, "warmup": 1}
PERF_CUDA = {"pairs": "auto", "max_pairs": 3, "min_ratio": 0.98, "warmup": 1}


class Recorder:
    def __init__(self, session: Session, workdir: Path):
        self.session = session
        self.ctx = ActionContext(workdir=workdir, log=lambda line: print(f"      {line}", file=sys.stderr))

    def step(
        self,
        action: str,
        title: str,
        text: str,
        expect_error: bool = False,
        requires: str | None = None,
        **params: Any,
    ) -> dict:
        n = len(self.session.steps) + 1
        print(f"  [{n}] {action}: {title}", file=sys.stderr, flush=True)
        guide = {"title": title, "text": text}
        if requires == "cuda" and not torch.cuda.is_available():
            print("      not run: needs CUDA (recorded as not_run; a replay with CUDA runs it)", file=sys.stderr)
            self.session.record(action, params, guide=guide, requires=requires, not_run=True)
            return {}
        results, error = run_action(self.ctx, action, params)
        if expect_error and error is None:
            raise SystemExit(f"step {n} ({action}) was meant to fail but succeeded")
        if not expect_error and error is not None:
            raise SystemExit(f"step {n} ({action}) failed: {error}")
        if error is not None:
            print(f"      expected error: {error}", file=sys.stderr)
        self.session.record(action, params, results, error=error, guide=guide, requires=requires)
        return results or {}

    def path(self, rel: str) -> Path:
        return self.ctx.path(rel)


def recipe_nodes(snapshot_path: Path, recipe_id: str, instance: str) -> list[str]:
    return list(find_recipe(load_snapshot(snapshot_path), recipe_id, instance).node_ids)


def have_stubgen() -> bool:
    try:
        import mcore.kernels.stubgen  # noqa: F401
    except ImportError:
        return False
    return True


# ---------------------------------------------------------------------------- tutorials


def qwen_recipe(r: Recorder) -> None:
    a = QWEN_ARGS
    r.step(
        "capture_graph",
        "Capture the decode graph",
        "Every engine role is a graph of ATen ops captured with torch.export. The decode role runs one token "
        "against the fixed-capacity KV cache. Capturing needs no weights: the snapshot records every node and "
        "tensor with a deterministic ID, and its fingerprint ties later selections to exactly these build "
        "arguments (fp32, 256-token cache, split layout). Change any of them and you must select again.",
        build_args=a,
        engine_role="decode",
        snapshot="decode.graph.json",
    )
    r.step(
        "list_recipes",
        "See which recipes the family publishes",
        "A recipe is a versioned, family-owned shortcut for a known region. Each instance resolves to exact "
        "node IDs in this snapshot. Nothing is ever picked for you: you name one recipe and one instance. "
        "This tutorial uses qwen.decode_logits_copy@1, instance decoder.logits_zero_bias: the LM head's "
        "zero bias add, which an identity copy reproduces exactly.",
        snapshot="decode.graph.json",
    )
    r.step(
        "build_bundle",
        "Build the slot-ready bundle from the recipe",
        "One command captures every role, resolves the recipe, runs the same select_region() validator a "
        "manual selection goes through and replaces the region with a kernel slot. It writes the bundle and "
        "the selection receipt beside it. The receipt holds the boundary tensors, the graph fingerprint and "
        "the ABI hash your kernel must match. The kernel itself is not stored in the bundle.",
        build_args=a,
        recipe=["qwen.decode_logits_copy@1", "decoder.logits_zero_bias"],
        output="qwen3-slot-ready.bundle",
    )
    r.step(
        "build_kernel",
        "Build the identity-copy kernel",
        "The example kernel copies its input to its output, which is what adding a zero bias does. It is a "
        "TVM-FFI shared library exporting run(input, output); on a GPU it copies asynchronously on the "
        "engine's current stream. Loading a DSO runs native code, so only bind libraries you trust.",
        name="identity-copy",
        output="kernel.so",
        overwrite=True,
    )
    r.step(
        "write_bindings",
        "Bind the kernel in a manifest",
        "The bindings manifest names, for each slot, the binding ID, the ABI hash copied from the receipt, "
        "the library (relative to the manifest, never outside its folder) and the function. There is no DSO "
        "hash on purpose: any library implementing the same ABI can be bound the next time a pipeline loads.",
        receipt="qwen3-slot-ready.selection.json",
        library="kernel.so",
        manifest="kernel-bindings.json",
    )
    r.step(
        "build_bundle",
        "Build the native bundle for comparison",
        "The reference is built with the identical build arguments and no slot, so the only difference "
        "between the two bundles is the region your kernel replaces.",
        build_args=a,
        output="qwen3-native.bundle",
    )
    r.step(
        "generate",
        "Generate with the native bundle",
        "Greedy decoding makes the output deterministic, so the token IDs are a fair smoke test.",
        bundle="qwen3-native.bundle",
        prompt=QWEN_PROMPT,
        max_new_tokens=QWEN_TOKENS,
        output="native.jsonl",
    )
    r.step(
        "generate",
        "Generate with your kernel bound",
        "Binding happens only now, while the pipeline is constructed: every slot must be bound exactly once "
        "and the ABI hash must match, or loading fails and names the slot. A running pipeline is never "
        "rebound; to try another DSO, construct a new pipeline.",
        bundle="qwen3-slot-ready.bundle",
        kernel_bindings="kernel-bindings.json",
        prompt=QWEN_PROMPT,
        max_new_tokens=QWEN_TOKENS,
        output="external.jsonl",
    )
    r.step(
        "gate_tokens",
        "Correctness gate: identical tokens",
        "Both runs must produce exactly the same token IDs. Passing proves equality for this smoke input "
        "only; it is not a full numerical qualification.",
        native="native.jsonl",
        external="external.jsonl",
    )
    r.step(
        "gate_perf",
        "No-regression gate: measured, with its uncertainty",
        "Fresh processes run native and external in alternating pairs (on CUDA each run's device time per "
        "step, elsewhere its fastest step). The gate takes the pairs' external/native ratios and their spread: "
        "PROMOTE when the whole confidence interval of the ratio is at or above 0.98, REJECT when it is below, "
        "INCONCLUSIVE when it straddles 0.98 and the pairs cannot tell. It adds a pair at a time until it "
        "decides (at most 6 here). The numbers are measured; replay compares the verdict with this recording "
        "and reports a changed verdict as a difference.",
        native_bundle="qwen3-native.bundle",
        external_bundle="qwen3-slot-ready.bundle",
        kernel_bindings="kernel-bindings.json",
        prompt=QWEN_PROMPT,
        max_new_tokens=QWEN_TOKENS,
        **PERF,
    )


def qwen_attention(r: Recorder) -> None:
    a = ATTN_ARGS
    layer0 = "qwen3-attention-slot.selection.decoder.layers.0.decode_attention.json"
    r.step(
        "capture_graph",
        "Capture the decode graph (head dim 64)",
        "Tutorial step 5 applies the recipe flow to attention. This demo model has head dim 64, a size the "
        "Qwen3 family uses and the shipped CuTe DSL kernel is written for (qwen3-tiny's 16 is not), bf16, a "
        "256-token KV cache.",
        build_args=a,
        engine_role="decode",
        snapshot="decode.graph.json",
    )
    r.step(
        "list_recipes",
        "One attention recipe instance per layer",
        "qwen.decode_attention_region@2 has one instance per layer. Its boundary: the scaled query "
        "[1, H, -1, D], the key and value caches [1, KV, capacity, D] and the INT32[1] active length in; the "
        "context [1, H, -1, D] out. The query arrives already scaled, so the kernel's softmax scale is 1.0.",
        snapshot="decode.graph.json",
    )
    r.step(
        "build_bundle",
        "Build the slot-ready bundle: every layer's attention",
        "`all-instances` names every instance of the recipe explicitly (never a silent default): each "
        "layer's attention becomes an opaque slot, and one receipt per instance is written beside the bundle. "
        f"`--workspace-bytes {ATTN_WORKSPACE}` gives each slot a scratch buffer the kernel may use (the number "
        "the exporter prints as split_workspace_bytes for this receipt); it becomes part of the ABI and its "
        "hash. The bundle is built for CUDA: the kernel runs only there.",
        build_args=a,
        recipe=[ATTN_RECIPE, "all-instances"],
        device="cuda",
        workspace_bytes=ATTN_WORKSPACE,
        output="qwen3-attention-slot.bundle",
    )
    r.step(
        "export_kernel",
        "Export the CuTe DSL decode attention",
        "The shipped exporter (kernels/cutedsl_decode_attention.py) checks the receipt against what its kernel "
        "implements (dtype, head dim, GQA, the workspace's size), compiles the kernel with the CuTe DSL for "
        "sm_90 and exports it through TVM-FFI as one DSO. With the workspace it builds the split schedule: "
        "each KV head's keys dealt in 64-key tiles over 4 blocks, whose partial results a second kernel merges "
        "(on an H100 3.0 us a call here, against 3.7 without a workspace and 4.1 for native). No GPU is "
        "needed to export; running it needs an sm_90 GPU (H100/H200).",
        exporter="cutedsl-decode-attention",
        receipt=layer0,
        snapshot="decode.graph.json",
        output="attention.so",
    )
    r.step(
        "write_bindings",
        "One manifest entry binds every layer",
        "Every layer's slot has the same binding ID and ABI hash, so one entry binds them all; `mcore inspect` "
        "says how many slots a binding serves.",
        receipt=layer0,
        library="attention.so",
        manifest="attention-kernel-bindings.json",
    )
    r.step(
        "build_bundle",
        "Build the native bundle for comparison",
        "The reference: identical build arguments and no slot, so the attention kernel is the only difference.",
        build_args=a,
        device="cuda",
        output="qwen3-native.bundle",
    )
    r.step(
        "generate",
        "Generate with the native bundle",
        "Greedy decoding on the GPU with the native attention (the engine's own split-KV kernel).",
        requires="cuda",
        bundle="qwen3-native.bundle",
        prompt=QWEN_PROMPT,
        max_new_tokens=QWEN_TOKENS,
        output="native.jsonl",
    )
    r.step(
        "generate",
        "Generate with the CuTe kernel in every layer",
        "The DSO binds while the pipeline loads; the kernel reads the active length from the device tensor, "
        "so the decode step still replays as one CUDA graph.",
        requires="cuda",
        bundle="qwen3-attention-slot.bundle",
        kernel_bindings="attention-kernel-bindings.json",
        prompt=QWEN_PROMPT,
        max_new_tokens=QWEN_TOKENS,
        output="external.jsonl",
    )
    r.step(
        "gate_logits",
        "Correctness gate: logits in lockstep",
        "Both bundles are stepped on the native greedy tokens and their logits compared at every step. Another "
        "attention kernel sums in another order, so bit equality is not expected here: the gate allows "
        f"{ATTN_MAX_ABS} (5% of this model's largest logit) and says where they first diverge.",
        requires="cuda",
        native_bundle="qwen3-native.bundle",
        external_bundle="qwen3-attention-slot.bundle",
        kernel_bindings="attention-kernel-bindings.json",
        prompt=QWEN_PROMPT,
        max_new_tokens=QWEN_TOKENS,
        max_abs=ATTN_MAX_ABS,
    )
    r.step(
        "gate_perf",
        "No-regression gate",
        "Fresh-process pairs on each run's device time per decode step: PROMOTE when the confidence interval "
        "of the external/native ratio clears 0.98, REJECT when it falls below, INCONCLUSIVE when it straddles. "
        "On a model this small every boundary shows (docs/gpu-results.md).",
        requires="cuda",
        native_bundle="qwen3-native.bundle",
        external_bundle="qwen3-attention-slot.bundle",
        kernel_bindings="attention-kernel-bindings.json",
        prompt=QWEN_PROMPT,
        max_new_tokens=QWEN_TOKENS,
        **PERF_CUDA,
    )


def qwen_manual(r: Recorder) -> None:
    a = QWEN_ARGS
    r.step(
        "capture_graph",
        "Capture the decode graph",
        "The manual path starts from the same snapshot. Node IDs are a receipt for this exact build, not a "
        "stable API: always take them from your own capture.",
        build_args=a,
        engine_role="decode",
        snapshot="decode.graph.json",
    )
    shown = r.step(
        "list_nodes",
        "Look at the last nodes of the graph",
        "The tail of the decode graph is the LM head, the zero-bias add (a constant, a cast and an "
        "elementwise sum) and the final cast that produces the logits output. Follow the tensor edges "
        "to see where a region starts and ends.",
        snapshot="decode.graph.json",
        last=6,
    )
    nodes = recipe_nodes(r.path("decode.graph.json"), "qwen.decode_logits_copy@1", "decoder.logits_zero_bias")
    final = shown["ids"][-1]
    r.step(
        "select_nodes",
        "Try a region that swallows the network output",
        "Including the final cast would put the network's logits output inside the region. The validator "
        "refuses it: a region may not contain a network output. Rejections name the rule and the tensor, "
        "so you know which node to leave out.",
        expect_error=True,
        snapshot="decode.graph.json",
        node_ids=nodes + [final],
        binding_id="qwen3.decode.logits_copy.manual@1",
        workspace_bytes=0,
        receipt="rejected.selection.json",
    )
    r.step(
        "select_nodes",
        "Select the three bias nodes by hand",
        "Circle the constant, the cast and the sum, and leave the final cast in the graph. The region is "
        "connected, convex and has exactly one output, so the validator writes a receipt. Its ABI hash "
        "equals the recipe's, because the call contract is the same.",
        snapshot="decode.graph.json",
        node_ids=nodes,
        binding_id="qwen3.decode.logits_copy.manual@1",
        workspace_bytes=0,
        receipt="manual.selection.json",
    )
    r.step(
        "build_bundle",
        "Build the slot-ready bundle from your receipt",
        "The graph-patch build re-checks the receipt against a fresh capture: same fingerprint, same "
        "boundary, same ABI. Then it is the ordinary build; only the way the region was chosen differs.",
        build_args=a,
        graph_patch="manual.selection.json",
        output="qwen3-manual-slot-ready.bundle",
    )
    r.step(
        "build_kernel",
        "Reuse the identity-copy kernel",
        "This boundary is the same logits copy, so the identity-copy DSO implements it. For any other "
        "boundary, implement the exact call order in its receipt first.",
        name="identity-copy",
        output="kernel.so",
        overwrite=True,
    )
    r.step(
        "write_bindings",
        "Bind it under your own binding ID",
        "The manifest now names qwen3.decode.logits_copy.manual@1 with the ABI hash from manual.selection.json.",
        receipt="manual.selection.json",
        library="kernel.so",
        manifest="kernel-bindings.json",
    )
    r.step(
        "build_bundle",
        "Build the native bundle",
        "The reference uses the same build arguments and has no slot. Building it in this workdir keeps the "
        "tutorial self-contained.",
        build_args=a,
        output="qwen3-native.bundle",
    )
    r.step(
        "generate",
        "Generate with the native bundle",
        "Greedy decoding of the same prompt as the recipe tutorial; these tokens are the reference.",
        bundle="qwen3-native.bundle",
        prompt=QWEN_PROMPT,
        max_new_tokens=QWEN_TOKENS,
        output="native.jsonl",
    )
    r.step(
        "generate",
        "Generate through your manual slot",
        "The identity-copy DSO is bound while this pipeline is constructed, under the manual binding ID. "
        "The slot does not care how its region was chosen.",
        bundle="qwen3-manual-slot-ready.bundle",
        kernel_bindings="kernel-bindings.json",
        prompt=QWEN_PROMPT,
        max_new_tokens=QWEN_TOKENS,
        output="external.jsonl",
    )
    r.step(
        "gate_tokens",
        "Correctness gate: identical tokens",
        "Same tokens as the native bundle: the manual region is wired exactly like the recipe's.",
        native="native.jsonl",
        external="external.jsonl",
    )


def distilbert_residual(r: Recorder) -> None:
    a = DISTILBERT_ARGS
    r.step(
        "capture_graph",
        "Capture the encoder graph",
        "DistilBERT keeps the graph small. Its one engine role, encoder, maps padded token IDs and a mask "
        "to hidden states.",
        build_args=a,
        engine_role="encoder",
        snapshot="encoder.graph.json",
    )
    r.step(
        "list_nodes",
        "Narrow the display to elementwise sums",
        "--match filters what is shown (ID, op, layer type, name or module path); it never selects. The "
        "first attention residual add lives under encoder.layers.0.attention_residual: it adds the "
        "attention projection to the layer's input.",
        snapshot="encoder.graph.json",
        match="*ElementWiseOperation.SUM*",
    )
    nodes = recipe_nodes(
        r.path("encoder.graph.json"), "distilbert.attention_residual_add@1", "encoder.layers.0.attention_residual"
    )
    if len(nodes) != 1:
        raise SystemExit(f"expected one residual-add node in layer 0, found {nodes}")
    binding = "distilbert.layer0.attention_residual_add@1"
    r.step(
        "select_nodes",
        "Select layer 0's residual add",
        "One node, two boundary inputs (hidden state and attention projection) and one output, all FP32 "
        "with fixed shapes. The receipt records that ordered contract: run(input0, input1, output0), no "
        "workspace, no extra arguments.",
        snapshot="encoder.graph.json",
        node_ids=nodes,
        binding_id=binding,
        workspace_bytes=0,
        receipt="residual-add.selection.json",
    )
    if have_stubgen():
        r.step(
            "kernel_stub",
            "Generate a CuTe DSL exporter stub",
            "The generator turns the receipt and snapshot into a self-contained CuTe DSL exporter: the ABI as "
            "constants, a check that refuses another selection, the kernel and the TVM-FFI export on the "
            "engine's current stream. For a single add it writes the body too; for other regions it leaves a "
            "scaffold naming what to implement. Running the exporter needs a GPU and the CuTe DSL; this "
            "step only writes the file.",
            receipt="residual-add.selection.json",
            snapshot="encoder.graph.json",
            output="export_residual_add.py",
            overwrite=True,
        )
    r.step(
        "build_kernel",
        "Build the residual-add kernel",
        "This tutorial binds a ready-made residual-add DSO (out = a + b) with the same ABI; it runs on the "
        "CPU here and on the GPU's current stream where CUDA is available.",
        name="residual-add",
        output="residual-add.so",
        overwrite=True,
    )
    r.step(
        "write_bindings",
        "Bind it",
        "Same manifest format as the Qwen tutorial, with this selection's binding ID and ABI hash.",
        receipt="residual-add.selection.json",
        library="residual-add.so",
        manifest="kernel-bindings.json",
    )
    r.step(
        "build_bundle",
        "Build the slot-ready bundle",
        "The graph-patch build replaces the single sum node with the kernel slot.",
        build_args=a,
        graph_patch="residual-add.selection.json",
        output="distilbert-slot-ready.bundle",
    )
    r.step(
        "build_bundle",
        "Build the native bundle",
        "The matched reference: the same build arguments and no slot, so the residual add stays in the graph.",
        build_args=a,
        output="distilbert-native.bundle",
    )
    r.step(
        "embed",
        "Embed with the native bundle",
        "The full hidden-state tensor, flattened, as `mcore embed` prints it.",
        bundle="distilbert-native.bundle",
        prompt=DISTILBERT_PROMPT,
        output="native.json",
    )
    r.step(
        "embed",
        "Embed with your kernel bound",
        "Layer 0's residual add now runs in the DSO bound at load time; everything else is unchanged.",
        bundle="distilbert-slot-ready.bundle",
        kernel_bindings="kernel-bindings.json",
        prompt=DISTILBERT_PROMPT,
        output="byok.json",
    )
    r.step(
        "gate_embeddings",
        "Correctness gate: embeddings",
        "Compare whole embeddings instead of bytes: moving a rounding point can shift later layers a little. "
        "The gate requires max |difference| <= 0.02 and cosine similarity >= 0.999.",
        native="native.json",
        external="byok.json",
        max_abs=0.02,
        min_cosine=0.999,
    )
    r.step(
        "gate_perf",
        "No-regression gate",
        "A single scalar add is not worth a kernel launch: on real GPUs this example measures slower than "
        "the native graph and must not ship as an acceleration. The verdict (PROMOTE, REJECT, or INCONCLUSIVE "
        "when the interval of the ratio straddles 0.98) comes from measurements on this machine; replay "
        "compares it with this recording.",
        native_bundle="distilbert-native.bundle",
        external_bundle="distilbert-slot-ready.bundle",
        kernel_bindings="kernel-bindings.json",
        prompt=DISTILBERT_PROMPT,
        **PERF,
    )


TUTORIALS: dict[str, tuple[str, str, Callable[[Recorder], None]]] = {
    "qwen-recipe": (
        "Qwen3 tiny: bring your own kernel with a family recipe",
        "Tutorial steps 1-4: recipe selection, slot-ready build, load-time binding, token and performance gates.",
        qwen_recipe,
    ),
    "qwen-manual": (
        "Qwen3 tiny: select the same region by hand",
        "Tutorial step 6: raw node IDs, the region validator, a graph-patch build and the token gate.",
        qwen_manual,
    ),
    "qwen-attention": (
        "Qwen3 tiny (head dim 64): a CuTe DSL decode-attention kernel in every layer",
        "Tutorial step 5: the attention recipe for all instances, the shipped CuTe DSL exporter, one "
        "binding for every layer; the GPU steps run where CUDA is.",
        qwen_attention,
    ),
    "distilbert-residual": (
        "DistilBERT tiny: a residual-add kernel on a hand-picked node",
        "Tutorial step 7: a manual one-node region, kernel stub, embedding and performance gates.",
        distilbert_residual,
    ),
}


def make(name: str, out_dir: Path, keep: Path | None = None) -> Path:
    title, description, fn = TUTORIALS[name]
    session = Session.new(title, guided=True, name=name, description=description)
    work = Path(tempfile.mkdtemp(prefix=f"session-{name}-")) if keep is None else keep / name
    print(f"{name}: running in {work}", file=sys.stderr)
    try:
        fn(Recorder(session, work))
    finally:
        if keep is None:
            shutil.rmtree(work, ignore_errors=True)
    path = session.save(out_dir / f"{name}.json")
    print(f"{name}: {len(session.steps)} steps saved to {path}", file=sys.stderr)
    return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "names", nargs="*", metavar="NAME", help=f"tutorials to generate: {', '.join(TUTORIALS)} (default: all)"
    )
    p.add_argument("--out", default=str(HERE), help="folder for the session files (default: sessions/)")
    p.add_argument("--keep", default=None, help="keep each tutorial's artifacts under this folder")
    ns = p.parse_args(argv)
    unknown = [n for n in ns.names if n not in TUTORIALS]
    if unknown:
        p.error(f"unknown tutorial(s) {', '.join(unknown)}; choose from {', '.join(TUTORIALS)}")
    try:
        for name in ns.names or list(TUTORIALS):
            make(name, Path(ns.out), Path(ns.keep) if ns.keep else None)
    except UserError as e:
        print(f"make_sessions: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
