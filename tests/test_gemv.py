"""mcore::gemv, the decode step's one-row matrix products (mcore/ops/gemv.py), and the compiled engine's
rewrite to it (MCORE_GEMV=1, mcore/engines/gemv_pass.py).

CPU: the Triton kernel under Triton's interpreter against float64 (in a subprocess: the interpreter
is chosen when triton is imported), and the rewrite on a demo pipeline (the op is F.linear on CPU).
GPU (pytest -m gpu): the compiled kernel at the Qwen3-8B shapes against float64, run to run and
inside a CUDA graph, and a pipeline that uses it: deterministic, and bit-identical to an
identity-copy slot pipeline in lockstep."""

from __future__ import annotations

import pytest
import torch

from mcore.bundle.build import build_bundle
from mcore.model.buildargs import BuildArgs
from mcore.runtime.pipeline import DecoderPipeline

from .conftest import run_under_triton_interpreter

# (rows N, columns K, dtype): N and K not multiples of the blocks, one row, K below one block
CASES = [(1, 7, "float32"), (37, 300, "bfloat16"), (130, 1024, "float16"), (64, 64, "bfloat16"), (600, 96, "float32")]

_INTERP = r"""
import json, sys, torch
from mcore.ops.gemv import gemv_triton
out = []
for n, k, dt in json.loads(sys.argv[1]):
    g = torch.Generator().manual_seed(n * k)
    dtype = getattr(torch, dt)
    x = torch.randn(1, 1, k, generator=g).to(dtype)
    w = torch.randn(n, k, generator=g).to(dtype)
    a, b = gemv_triton(x, w), gemv_triton(x, w)
    ref = (x.double().reshape(k) @ w.double().T).reshape(1, 1, n)
    rel = ((a.double() - ref).norm() / ref.norm()).item()
    floor = ((ref.to(dtype).double() - ref).norm() / ref.norm()).item()  # rounding the exact result
    out.append({"shape": list(a.shape) == list(ref.shape), "same": bool(torch.equal(a, b)), "rel": rel, "floor": floor})
print(json.dumps(out))
"""


def test_kernel_matches_the_float64_reference_under_the_triton_interpreter():
    for case, res in zip(CASES, run_under_triton_interpreter(_INTERP, CASES), strict=True):
        assert res["shape"] and res["same"], (case, res)
        if case[2] == "float32":  # fp32 accumulation over K terms
            assert res["rel"] < 1e-6, (case, res)
        else:  # one rounding of the output; the interpreter rounds bf16 by truncation (up to 2x)
            assert res["rel"] < 2.5 * res["floor"] + 1e-6, (case, res)


_INTERP_GLU = r"""
import json, sys, torch
from mcore.ops.gemv import gemv_triton, silu_mul
out = []
for n, k, dt in json.loads(sys.argv[1]):
    g = torch.Generator().manual_seed(n + k)
    dtype = getattr(torch, dt)
    gate, up = (torch.randn(1, 1, k, generator=g) * 2).to(dtype), torch.randn(1, 1, k, generator=g).to(dtype)
    w = torch.randn(n, k, generator=g).to(dtype)
    a = gemv_triton(gate, w, up=up)
    x = silu_mul(gate, up).double().reshape(k)  # the gating as the kernel rounds it
    ref = (x @ w.double().T).reshape(1, 1, n)
    exact = ((torch.nn.functional.silu(gate.double()) * up.double()).reshape(k) @ w.double().T).reshape(1, 1, n)
    rel = ((a.double() - ref).norm() / ref.norm()).item()
    floor = ((ref.to(dtype).double() - ref).norm() / ref.norm()).item()
    far = ((a.double() - exact).norm() / exact.norm()).item()
    out.append({"same": bool(torch.equal(a, gemv_triton(gate, w, up=up))), "rel": rel, "floor": floor, "far": far})
print(json.dumps(out))
"""


def test_the_gated_kernel_matches_the_float64_reference_under_the_triton_interpreter():
    """mcore::gemv_silu_mul's kernel (MCORE_GEMV_GLU=1): silu(gate) * up rounded once to the input
    dtype, then the product in fp32: against float64 of that rounded gating, and close to the
    exact float64 result (the one rounding of the gating is all that differs)."""
    for case, res in zip(CASES, run_under_triton_interpreter(_INTERP_GLU, CASES), strict=True):
        assert res["same"], (case, res)
        if case[2] == "float32":
            assert res["rel"] < 1e-5 and res["far"] < 1e-5, (case, res)
        else:  # the interpreter truncates to 16 bits, the gating and the output: up to 1 ulp each
            assert res["rel"] < 5 * res["floor"] + 1e-5, (case, res)
            assert res["far"] < 2e-2, (case, res)


def test_config_keeps_every_sm_busy_and_blocks_whole():
    from mcore.ops.gemv import gemv_config

    for n, k in [(6144, 4096), (24576, 4096), (4096, 12288), (151936, 4096), (64, 64), (1, 7)]:
        block_n, block_k, warps, stages = gemv_config(n, k, sms=132)
        assert block_n >= 1 and block_n & (block_n - 1) == 0 and block_k & (block_k - 1) == 0
        assert block_k <= 1024 and block_k >= min(k, 16) and warps in (4, 8) and stages >= 1
        assert -(-n // block_n) >= min(4 * 132, n)  # at least 4 programs an SM where there are rows for them


def test_bad_inputs_are_refused():
    from mcore.ops.gemv import gemv_triton

    with pytest.raises(ValueError, match="not one row"):
        gemv_triton(torch.zeros(2, 8), torch.zeros(4, 8))
    with pytest.raises(ValueError, match="not one row"):
        gemv_triton(torch.zeros(1, 8, dtype=torch.bfloat16), torch.zeros(4, 8))


@pytest.fixture(scope="module")
def tiny_bf16(tmp_path_factory):
    args = BuildArgs(model="demo:qwen3-tiny", precision="bf16", max_cache_length=128)
    return build_bundle(args, tmp_path_factory.mktemp("gemv") / "n.bundle", device="cpu").bundle_path


def _gemv_nodes(pipe: DecoderPipeline, role: str) -> int:
    gm = pipe.runners[role].prepared.gm
    return sum(1 for n in gm.graph.nodes if n.target is torch.ops.mcore.gemv.default)


def test_the_engine_rewrites_the_decode_steps_one_row_products(tiny_bf16, monkeypatch):
    """MCORE_GEMV=1: every one-row linear of the decode step (fused q/k/v, o_proj, fused gate/up,
    down per layer, and lm_head) becomes mcore::gemv; prefill (many rows) keeps aten.linear; the
    tokens are those of the default compiled engine."""
    default = DecoderPipeline(str(tiny_bf16), device="cpu", engine="compiled")
    monkeypatch.setenv("MCORE_GEMV", "1")
    pipe = DecoderPipeline(str(tiny_bf16), device="cpu", engine="compiled")
    layers = int(pipe.config["num_hidden_layers"])
    assert _gemv_nodes(pipe, "decode") == 4 * layers + 1
    assert _gemv_nodes(pipe, "prefill") == 0
    linears = [n for n in pipe.runners["decode"].prepared.gm.graph.nodes if n.target is torch.ops.aten.linear.default]
    assert linears == []
    assert pipe.runners["decode"].key != default.runners["decode"].key  # its own compiled code
    prompt = "the quick brown fox"
    assert pipe.generate(prompt, 8, stop_at_eos=False).tokens == default.generate(prompt, 8, stop_at_eos=False).tokens


def test_the_gating_moves_into_the_down_projection_when_asked(tiny_bf16, monkeypatch):
    """MCORE_GEMV=1 MCORE_GEMV_GLU=1: each layer's silu(gate) * up feeding the down projection
    becomes one mcore::gemv_silu_mul (no silu or gating product left in the decode step); other
    products stay mcore::gemv; its own compiled code; tokens as without it."""
    from mcore.engines.compiled import compile_key

    monkeypatch.setenv("MCORE_GEMV", "1")
    plain = DecoderPipeline(str(tiny_bf16), device="cpu", engine="compiled")
    monkeypatch.setenv("MCORE_GEMV_GLU", "1")
    pipe = DecoderPipeline(str(tiny_bf16), device="cpu", engine="compiled")
    layers = int(pipe.config["num_hidden_layers"])
    gm = pipe.runners["decode"].prepared.gm
    targets = [n.target for n in gm.graph.nodes]
    assert targets.count(torch.ops.mcore.gemv_silu_mul.default) == layers
    assert _gemv_nodes(pipe, "decode") == 3 * layers + 1
    assert torch.ops.aten.silu.default not in targets
    assert torch.ops.aten.silu.default in [n.target for n in pipe.runners["prefill"].prepared.gm.graph.nodes]
    assert pipe.runners["decode"].key != plain.runners["decode"].key
    assert compile_key("f" * 64, [], torch.device("cpu")) != plain.runners["decode"].key
    prompt = "the quick brown fox"
    assert pipe.generate(prompt, 8, stop_at_eos=False).tokens == plain.generate(prompt, 8, stop_at_eos=False).tokens


def test_programmatic_dependent_launch_is_asked_for_by_name_and_needs_hopper(monkeypatch):
    from mcore.ops import pdl

    monkeypatch.setenv("MCORE_INDUCTOR", "combo_kernels, triton.enable_pdl")
    assert not pdl.requested(torch.device("cpu")) and pdl.launch_options(torch.device("cpu")) == {}
    if torch.cuda.is_available():
        hopper = torch.cuda.get_device_capability()[0] >= 9
        assert pdl.launch_options(torch.device("cuda")) == ({"launch_pdl": True} if hopper else {})
        monkeypatch.setenv("MCORE_INDUCTOR", "combo_kernels")
        assert not pdl.requested(torch.device("cuda"))


def test_the_fusion_report_shows_the_gemv_kernels_the_engine_runs(tiny_bf16):
    """`mcore profile --fusion` on a decode step where the engine uses mcore::gemv (CUDA by
    default; asked for here): each one-row product is a kernel of its own, named for the op, and
    the profiled graph is left as it was."""
    from mcore.engines.kernel_map import fused_kernels
    from mcore.profile.profiler import _role_inputs

    pipe = DecoderPipeline(str(tiny_bf16), device="cpu", engine="torch")
    prepared = pipe.runners["decode"].prepared
    inputs = _role_inputs(pipe, "decode", 5, None)
    linears = {n.name for n in prepared.gm.graph.nodes if n.target is torch.ops.aten.linear.default}
    kernels = fused_kernels(prepared, inputs, gemv=True)
    gemv = [k for k in kernels if k["kernel"].startswith("torch.ops.mcore.gemv")]
    assert len(gemv) == len(linears) and {n for k in gemv for n in k["nodes"]} == linears
    assert {n.name for n in prepared.gm.graph.nodes if n.target is torch.ops.aten.linear.default} == linears


def test_the_fusion_report_names_the_gating_inside_the_down_projection(tiny_bf16, monkeypatch):
    """With MCORE_GEMV_GLU=1 the down projection's kernel computes the gating too: the fusion report
    puts each layer's silu and gating product in that kernel, with the down projection's own node."""
    from mcore.engines.kernel_map import fused_kernels
    from mcore.profile.profiler import _role_inputs

    monkeypatch.setenv("MCORE_GEMV_GLU", "1")
    pipe = DecoderPipeline(str(tiny_bf16), device="cpu", engine="torch")
    prepared = pipe.runners["decode"].prepared
    inputs = _role_inputs(pipe, "decode", 5, None)
    silus = {n.name for n in prepared.gm.graph.nodes if n.target is torch.ops.aten.silu.default}
    kernels = [k for k in fused_kernels(prepared, inputs, gemv=True) if "gemv_silu_mul" in k["kernel"]]
    assert len(kernels) == len(silus) == int(pipe.config["num_hidden_layers"])
    assert {n for k in kernels for n in k["nodes"]} >= silus
    assert all(len(k["nodes"]) == 3 for k in kernels)  # silu, the gating product, the down projection


# ------------------------------------------------------------------------------------------- GPU

gpu = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@gpu
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gpu_kernel_at_the_8b_shapes(dtype):
    """Fused q/k/v, gate/up, down and lm_head of Qwen3-8B, and a few odd sizes: against float64,
    bit-equal run to run, and the same bits replayed inside a CUDA graph."""
    from mcore.ops.gemv import gemv_triton

    for n, k in [(6144, 4096), (24576, 4096), (4096, 12288), (151936, 4096), (37, 300), (130, 64)]:
        g = torch.Generator(device="cuda").manual_seed(n + k)
        x = torch.randn(1, 1, k, device="cuda", generator=g).to(dtype)
        w = (torch.randn(n, k, device="cuda", generator=g) * 0.02).to(dtype)
        a = gemv_triton(x, w)
        assert torch.equal(a, gemv_triton(x, w)), (n, k)
        ref = (x.double().reshape(k) @ w.double().T).reshape(1, 1, n)
        rel = ((a.double() - ref).norm() / ref.norm()).item()
        floor = ((ref.to(dtype).double() - ref).norm() / ref.norm()).item()
        assert rel < 1.5 * floor + 1e-6, (n, k, rel, floor)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            b = gemv_triton(x, w)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(a, b), (n, k)
    from mcore.ops.gemv import silu_mul

    for n, k in [(4096, 12288), (130, 300)]:  # the down projection with its gating (MCORE_GEMV_GLU=1)
        g = torch.Generator(device="cuda").manual_seed(n * k)
        gate, up = (torch.randn(2, 1, 1, k, device="cuda", generator=g) * 2).to(dtype)
        w = (torch.randn(n, k, device="cuda", generator=g) * 0.02).to(dtype)
        a = gemv_triton(gate, w, up=up)
        assert torch.equal(a, gemv_triton(gate, w, up=up)), (n, k)
        ref = (silu_mul(gate, up).double().reshape(k) @ w.double().T).reshape(1, 1, n)
        rel = ((a.double() - ref).norm() / ref.norm()).item()
        floor = ((ref.to(dtype).double() - ref).norm() / ref.norm()).item()
        assert rel < 1.5 * floor + 1e-5, (n, k, rel, floor)


@gpu
@needs_cuda
@pytest.mark.parametrize(
    "inductor, glu", [("none", "0"), (None, "0"), (None, "1")], ids=["plain", "defaults", "defaults-glu"]
)
def test_gpu_pipeline_with_gemv_is_deterministic_and_slots_keep_its_bits(tmp_path, monkeypatch, inductor, glu):
    """mcore::gemv in the decode step: the same tokens twice, bit-identical logits with an
    identity-copy slot in lockstep, close to the op-by-op engine; with no extra Inductor settings
    and with the CUDA defaults. With the defaults' programmatic dependent launch (kernels launched
    while their predecessor drains) also bit-identical to the same compile launched plainly: a
    kernel that read its input early would show here."""
    from .test_compiled_engine import _bundles

    monkeypatch.setenv("MCORE_GEMV", "1")
    monkeypatch.setenv("MCORE_GEMV_GLU", glu)  # 1: the MLP's gating inside the down projection's kernel
    monkeypatch.setenv("MCORE_CACHE_DIR", str(tmp_path / "cache"))
    # each pipeline compiles its decode role itself: a role a helper process compiled is loaded
    # without its graph, and this test reads the graph's gemv nodes
    monkeypatch.setenv("MCORE_PARALLEL_ROLES", "0")
    native, slot, manifest = _bundles(tmp_path, "bf16", "cuda")
    # against the defaults, "plain" differs in the launch alone: combo kernels, no PDL
    monkeypatch.setenv("MCORE_INDUCTOR", "combo_kernels" if inductor is None else inductor)
    plain = DecoderPipeline(str(native), device="cuda") if inductor is None else None
    if inductor is None:  # the CUDA defaults: combo kernels, and PDL on Hopper
        monkeypatch.delenv("MCORE_INDUCTOR")
    nat = DecoderPipeline(str(native), device="cuda")
    assert _gemv_nodes(nat, "decode") > 0 and nat.runners["decode"].graphs
    gated = [
        n for n in nat.runners["decode"].prepared.gm.graph.nodes if n.target is torch.ops.mcore.gemv_silu_mul.default
    ]
    assert len(gated) == (int(nat.config["num_hidden_layers"]) if glu == "1" else 0)
    prompt = "the quick brown fox"
    r = nat.generate(prompt, 24, stop_at_eos=False)
    assert nat.generate(prompt, 24, stop_at_eos=False).tokens == r.tokens
    ext = DecoderPipeline(str(slot), kernel_bindings=str(manifest), device="cuda")
    ln = nat.step_logits(r.prompt_tokens, r.tokens[:-1])
    le = ext.step_logits(r.prompt_tokens, r.tokens[:-1])
    assert all(torch.equal(x, y) for x, y in zip(ln, le, strict=True))
    ref = DecoderPipeline(str(native), device="cuda", engine="torch")
    for x, y in zip(ref.step_logits(r.prompt_tokens, r.tokens[:-1]), ln, strict=True):
        torch.testing.assert_close(x, y, atol=0.15, rtol=0.05)  # bf16 rounding between engines
    if plain is not None:
        assert all(
            torch.equal(x, y) for x, y in zip(plain.step_logits(r.prompt_tokens, r.tokens[:-1]), ln, strict=True)
        )
