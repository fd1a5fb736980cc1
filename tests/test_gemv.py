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
from mcore.ops.gemv import gemv_config, gemv_triton, silu_mul
out = []
for n, k, dt in json.loads(sys.argv[1]):
    g = torch.Generator().manual_seed(n + k)
    dtype = getattr(torch, dt)
    x = torch.randn(1, 1, k, generator=g).to(dtype)
    w = torch.randn(2 * n, k, generator=g).to(dtype)  # gate rows, then up rows
    configs = [None, (1, 16, 4, 1), (4, 64, 4, 2)]  # the default, one output row a program, a tile narrower than K
    outs = [gemv_triton(x, w, c, glu=True) for c in configs]
    prod = x.double().reshape(k) @ w.double().T
    gate, up = prod[:n].to(dtype), prod[n:].to(dtype)  # each half rounded as the unfused step stores it
    ref = silu_mul(gate, up).double().reshape(1, 1, n)
    exact = (torch.nn.functional.silu(prod[:n]) * prod[n:]).reshape(1, 1, n)
    err = [((o.double() - ref).abs() / (ref.abs() + 1e-3)).max().item() for o in outs]
    far = ((outs[0].double() - exact).norm() / exact.norm()).item()
    out.append({"shape": [list(o.shape) for o in outs], "same": bool(torch.equal(outs[0], gemv_triton(x, w, glu=True))),
                "err": err, "far": far})
print(json.dumps(out))
"""


def test_the_gated_kernel_matches_the_float64_reference_under_the_triton_interpreter():
    """mcore::gemv_glu's kernel: the fused gate/up product with silu(gate) * up in its epilogue,
    against float64 of the two halves rounded as the unfused step stores them (then the gating in
    fp32, rounded once), for several launch configurations, and close to the exact float64 gating."""
    for case, res in zip(CASES, run_under_triton_interpreter(_INTERP_GLU, CASES), strict=True):
        n, _, dt = case
        assert res["same"] and res["shape"] == [[1, 1, n]] * 3, (case, res)
        if dt == "float32":
            assert max(res["err"]) < 1e-4 and res["far"] < 1e-5, (case, res)
        else:  # the halves and the output each one 16-bit rounding (the interpreter truncates: up to 2 ulp)
            ulp = 2**-7 if dt == "bfloat16" else 2**-10
            assert max(res["err"]) < 4 * ulp, (case, res)
            assert res["far"] < 8 * ulp, (case, res)


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
    down per layer, and lm_head) becomes mcore::gemv (MCORE_GEMV_GLU=0: the gating left alone);
    prefill (many rows) keeps aten.linear; the tokens are those of the default compiled engine."""
    default = DecoderPipeline(str(tiny_bf16), device="cpu", engine="compiled")
    monkeypatch.setenv("MCORE_GEMV", "1")
    monkeypatch.setenv("MCORE_GEMV_GLU", "0")
    pipe = DecoderPipeline(str(tiny_bf16), device="cpu", engine="compiled")
    layers = int(pipe.config["num_hidden_layers"])
    assert _gemv_nodes(pipe, "decode") == 4 * layers + 1
    assert _gemv_nodes(pipe, "prefill") == 0
    linears = [n for n in pipe.runners["decode"].prepared.gm.graph.nodes if n.target is torch.ops.aten.linear.default]
    assert linears == []
    assert pipe.runners["decode"].key != default.runners["decode"].key  # its own compiled code
    prompt = "the quick brown fox"
    assert pipe.generate(prompt, 8, stop_at_eos=False).tokens == default.generate(prompt, 8, stop_at_eos=False).tokens


def test_the_gating_moves_into_the_gate_up_products_epilogue(tiny_bf16, monkeypatch):
    """MCORE_GEMV=1 (the gating's fusion on by default): each layer's fused gate/up product and its
    silu(gate) * up become one mcore::gemv_glu over the same concatenated weight (no silu, no gating
    product, no slice of that product left in the decode step); the other products stay mcore::gemv;
    its own compiled code; the same logits bit for bit as with the gating a kernel of its own
    (MCORE_GEMV_GLU=0), since both round each half and then the gating once."""
    from mcore.engines.compiled import compile_key

    monkeypatch.setenv("MCORE_GEMV", "1")
    monkeypatch.setenv("MCORE_GEMV_GLU", "0")
    plain = DecoderPipeline(str(tiny_bf16), device="cpu", engine="compiled")
    monkeypatch.delenv("MCORE_GEMV_GLU")
    pipe = DecoderPipeline(str(tiny_bf16), device="cpu", engine="compiled")
    layers = int(pipe.config["num_hidden_layers"])
    gm = pipe.runners["decode"].prepared.gm
    targets = [n.target for n in gm.graph.nodes]
    glu = [n for n in gm.graph.nodes if n.target is torch.ops.mcore.gemv_glu.default]
    assert len(glu) == layers and _gemv_nodes(pipe, "decode") == 3 * layers + 1
    assert all(n.args[1].name.startswith("mcore_fused_weight_") for n in glu)
    assert all([u.target for u in n.users] == [torch.ops.mcore.gemv.default] for n in glu)  # straight into down
    assert torch.ops.aten.silu.default not in targets
    assert torch.ops.aten.silu.default in [n.target for n in pipe.runners["prefill"].prepared.gm.graph.nodes]
    assert pipe.runners["decode"].key != plain.runners["decode"].key
    assert compile_key("f" * 64, [], torch.device("cpu")) != plain.runners["decode"].key
    prompt = "the quick brown fox"
    r = pipe.generate(prompt, 8, stop_at_eos=False)
    assert r.tokens == plain.generate(prompt, 8, stop_at_eos=False).tokens
    a = pipe.step_logits(r.prompt_tokens, r.tokens[:-1])
    b = plain.step_logits(r.prompt_tokens, r.tokens[:-1])
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def test_a_product_read_elsewhere_keeps_its_gating_apart():
    """The gating moves into the product only where nothing else reads the product's halves: a graph
    that also returns the gate half keeps mcore::gemv and its silu."""
    from torch import fx

    from mcore.engines.gemv_pass import fuse_gating

    w = torch.randn(8, 4, dtype=torch.bfloat16)

    class M(torch.nn.Module):
        def forward(self, x, w):
            y = torch.ops.mcore.gemv(x, w)
            g, u = y[..., :4], y[..., 4:8]
            return torch.nn.functional.silu(g) * u, g

    for keep_gate, expect in ((True, 0), (False, 1)):
        gm = torch.export.export(M(), (torch.randn(1, 4, dtype=torch.bfloat16), w)).module()
        assert isinstance(gm, fx.GraphModule)
        graph = gm.graph
        if not keep_gate:  # drop the second output: only the gating reads the halves
            out = next(n for n in graph.nodes if n.op == "output")
            out.args = ((out.args[0][0],),)
            graph.eliminate_dead_code()
        ph = [n for n in graph.nodes if n.op == "placeholder"]
        assert fuse_gating(gm, {ph[1]: w}) == expect
        targets = [n.target for n in graph.nodes]
        assert (torch.ops.mcore.gemv_glu.default in targets) == bool(expect)
        assert (torch.ops.aten.silu.default in targets) == (not expect)


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


def test_the_fusion_report_names_the_gating_inside_the_gate_up_product(tiny_bf16):
    """On the graph as the compiled engine prepares it (siblings fused, the one-row products on
    mcore::gemv), the gate/up product's kernel computes the gating too: the kernel map puts each
    layer's silu and gating product in that kernel, beside the gate and up projections it stands for."""
    from mcore.engines.kernel_map import fused_kernels
    from mcore.profile.compiled import engine_graph
    from mcore.profile.profiler import _role_inputs

    pipe = DecoderPipeline(str(tiny_bf16), device="cpu", engine="torch")
    prepared = engine_graph(pipe.runners["decode"].prepared)
    inputs = _role_inputs(pipe, "decode", 5, None)
    silus = {n.name for n in prepared.gm.graph.nodes if n.target is torch.ops.aten.silu.default}
    kernels = [
        k for k in fused_kernels(prepared, inputs, gemv=True) if k["kernel"].startswith("torch.ops.mcore.gemv_glu")
    ]
    assert len(kernels) == len(silus) == int(pipe.config["num_hidden_layers"])
    linears = {
        n.name for n in pipe.runners["decode"].prepared.gm.graph.nodes if n.target is torch.ops.aten.linear.default
    }
    for k in kernels:  # the engine's fused product, the gate and up projections, silu and the gating product
        names = set(k["nodes"])
        assert len(names) == 5 and len(names & silus) == 1 and len(names & linears) == 2, names


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

    for n, k in [(12288, 4096), (65, 300)]:  # the gate/up product with its gating (mcore::gemv_glu)
        g = torch.Generator(device="cuda").manual_seed(n * k)
        x = torch.randn(1, 1, k, device="cuda", generator=g).to(dtype)
        w = (torch.randn(2 * n, k, device="cuda", generator=g) * 0.05).to(dtype)
        a = gemv_triton(x, w, glu=True)
        assert torch.equal(a, gemv_triton(x, w, glu=True)), (n, k)
        # the unfused kernel's two halves and the gating computed after them: sigmoid's last fp32 bit
        # may differ (Triton's against torch's), so at most one 16-bit step apart, and almost all equal
        halves = gemv_triton(x, w)
        b = silu_mul(halves[..., :n], halves[..., n:])
        step = b.float().abs() * 2**-7 + 1e-30
        assert ((a.float() - b.float()).abs() <= step).all() and (a == b).float().mean() > 0.99, (n, k)
        prod = x.double().reshape(k) @ w.double().T
        ref = silu_mul(prod[:n].to(dtype), prod[n:].to(dtype)).double().reshape(1, 1, n)
        assert ((a.double() - ref).abs() <= 2 * ref.abs() * 2**-7 + 1e-6).all(), (n, k)


@gpu
@needs_cuda
@pytest.mark.parametrize(
    "inductor, glu", [("none", "1"), (None, "1"), (None, "0")], ids=["plain", "defaults", "defaults-no-glu"]
)
def test_gpu_pipeline_with_gemv_is_deterministic_and_slots_keep_its_bits(tmp_path, monkeypatch, inductor, glu):
    """mcore::gemv in the decode step: the same tokens twice, bit-identical logits with an
    identity-copy slot in lockstep, close to the op-by-op engine; with no extra Inductor settings
    and with the CUDA defaults. With the defaults' programmatic dependent launch (kernels launched
    while their predecessor drains) also bit-identical to the same compile launched plainly: a
    kernel that read its input early would show here."""
    from .test_compiled_engine import _bundles

    monkeypatch.setenv("MCORE_GEMV", "1")
    monkeypatch.setenv("MCORE_GEMV_GLU", glu)  # 1 (the default): the MLP's gating in the gate/up product's kernel
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
    gated = [n for n in nat.runners["decode"].prepared.gm.graph.nodes if n.target is torch.ops.mcore.gemv_glu.default]
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
