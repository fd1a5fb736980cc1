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
from mcore.engines.gemv_pass import GEMV_OPS
from mcore.model.buildargs import BuildArgs
from mcore.runtime.pipeline import DecoderPipeline

from .conftest import run_under_triton_interpreter

# (rows N, columns K, dtype): N and K not multiples of the blocks, one row, K below one block
CASES = [(1, 7, "float32"), (37, 300, "bfloat16"), (130, 1024, "float16"), (64, 64, "bfloat16"), (600, 96, "float32")]

SHORT_FP16 = (130, 200, "float16")  # rows and columns not multiples of the blocks

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
    # the plain test has the long rows (K 1024, 600 rows): here a short fp16 row keeps the interpreter quick
    glu_cases = [CASES[0], CASES[1], SHORT_FP16, CASES[3]]
    for case, res in zip(glu_cases, run_under_triton_interpreter(_INTERP_GLU, glu_cases), strict=True):
        n, _, dt = case
        assert res["same"] and res["shape"] == [[1, 1, n]] * 3, (case, res)
        if dt == "float32":
            assert max(res["err"]) < 1e-4 and res["far"] < 1e-5, (case, res)
        else:  # the halves and the output each one 16-bit rounding (the interpreter truncates: up to 2 ulp)
            ulp = 2**-7 if dt == "bfloat16" else 2**-10
            assert max(res["err"]) < 4 * ulp, (case, res)
            assert res["far"] < 8 * ulp, (case, res)


_INTERP_FUSED = r"""
import json, sys, torch
from mcore.ops.gemv import gemv_triton, rms_norm, silu_mul
out = []
for n, k, dt in json.loads(sys.argv[1]):
    g = torch.Generator().manual_seed(3 * n + k)
    dtype = getattr(torch, dt)
    x = (torch.randn(1, 1, k, generator=g) * 3).to(dtype)  # not unit scale: the norm has work to do
    nw = (1 + 0.5 * torch.randn(k, generator=g)).to(dtype)
    w = torch.randn(2 * n, k, generator=g).to(dtype)
    r = torch.randn(1, 1, 2 * n, generator=g).to(dtype)
    xd = x.double().reshape(k)
    exact_in = xd * nw.double() / torch.sqrt(xd.pow(2).mean() + 1e-6)
    configs = [None, (4, 64, 4, 2)]  # the default, a tile narrower than K
    res = {}
    # the norm in the prologue, against float64 of the unrounded normalised row
    outs = [gemv_triton(x, w, c, norm_weight=nw, eps=1e-6) for c in configs]
    ref = (exact_in @ w.double().T).reshape(1, 1, 2 * n)
    unfused = gemv_triton(rms_norm(x, nw, 1e-6), w)  # the norm rounded first, as the unfused step does
    res["norm_rel"] = [((o.double() - ref).norm() / ref.norm()).item() for o in outs]
    res["floor"] = ((ref.to(dtype).double() - ref).norm() / ref.norm()).item()
    res["unfused_rel"] = ((unfused.double() - ref).norm() / ref.norm()).item()
    res["norm_same"] = bool(torch.equal(outs[0], gemv_triton(x, w, norm_weight=nw, eps=1e-6)))
    # the norm and the gating together
    glu = [gemv_triton(x, w, c, glu=True, norm_weight=nw, eps=1e-6) for c in configs]
    prod = exact_in @ w.double().T
    gref = silu_mul(prod[:n].to(dtype), prod[n:].to(dtype)).double().reshape(1, 1, n)
    res["glu_err"] = [((o.double() - gref).abs() / (gref.abs() + 1e-3)).max().item() for o in glu]
    res["glu_shape"] = [list(o.shape) for o in glu]
    # the residual add in the epilogue: the product rounded, then the add, as the unfused step
    res["res_err"] = []
    for c in configs:
        want = r.double() + gemv_triton(x, w, c).double()
        res["res_err"].append(((gemv_triton(x, w, c, residual=r).double() - want).abs() / (want.abs() + 1e-3)).max().item())
    out.append(res)
print(json.dumps(out))
"""


FUSED_CASES = [CASES[0], CASES[1], SHORT_FP16]  # fp32, bf16, fp16; a row below one block, K not a multiple


def test_the_norm_and_residual_kernels_match_float64_under_the_triton_interpreter():
    """mcore::rms_gemv's kernel (the RMSNorm in the product's prologue, with and without the gating)
    against float64 of the unrounded normalised row, about as close as the unfused path (norm rounded
    first) is; mcore::gemv_add's (the residual add in the epilogue) against the plain product plus the
    residual, within the output's one rounding; several launch configurations."""
    for case, res in zip(FUSED_CASES, run_under_triton_interpreter(_INTERP_FUSED, FUSED_CASES), strict=True):
        n, _, dt = case
        assert res["norm_same"] and res["glu_shape"] == [[1, 1, n]] * 2, (case, res)
        if dt == "float32":
            assert max(res["norm_rel"]) < 1e-5 and max(res["glu_err"]) < 1e-4, (case, res)
            assert max(res["res_err"]) < 1e-6, (case, res)
        else:  # the output one 16-bit rounding (the interpreter truncates: up to 2x the floor)
            ulp = 2**-7 if dt == "bfloat16" else 2**-10
            assert max(res["norm_rel"]) < 2.5 * res["floor"] + 1e-6, (case, res)
            assert max(res["norm_rel"]) <= res["unfused_rel"] + res["floor"], (case, res)  # no worse than unfused
            # each half scaled by the norm and then rounded, the gating rounded: 3 roundings, truncated
            assert max(res["glu_err"]) < 6 * ulp, (case, res)
            assert max(res["res_err"]) <= 2 * ulp, (case, res)


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
    """How many one-row products of `role` run on an mcore::gemv kernel (with or without fusions)."""
    gm = pipe.runners[role].prepared.gm
    return sum(1 for n in gm.graph.nodes if n.target in GEMV_OPS)


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
    assert len(glu) == layers and targets.count(torch.ops.mcore.gemv.default) == 3 * layers + 1
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


def test_the_norms_and_residual_adds_move_into_the_products_around_them(tiny_bf16, monkeypatch):
    """MCORE_GEMV=1 MCORE_GEMV_NORM=1: every add + RMSNorm of the decode step leaves
    its kernel: each layer's two residual adds in the epilogues of o_proj and down (mcore::gemv_add),
    its two norms and the final one in the prologues of q/k/v, gate/up (with the gating) and lm_head
    (mcore::rms_gemv). The per-head q/k norms (not read by a product) stay (with the rotary prologue
    off: by default they move into the attention, tests/test_rope_attention.py). The same tokens and
    logits within bf16 rounding of the norms apart (the default); its own compiled code."""
    monkeypatch.setenv("MCORE_GEMV", "1")
    monkeypatch.setenv("MCORE_ATTN_ROPE", "0")
    apart = DecoderPipeline(str(tiny_bf16), device="cpu", engine="compiled")
    monkeypatch.setenv("MCORE_GEMV_NORM", "1")
    pipe = DecoderPipeline(str(tiny_bf16), device="cpu", engine="compiled")
    layers = int(pipe.config["num_hidden_layers"])
    nodes = list(pipe.runners["decode"].prepared.gm.graph.nodes)
    by = {op: [n for n in nodes if n.target is op] for op in GEMV_OPS}
    norms, adds = by[torch.ops.mcore.rms_gemv.default], by[torch.ops.mcore.gemv_add.default]
    assert len(norms) == 2 * layers + 1 and len(adds) == 2 * layers and not by[torch.ops.mcore.gemv.default]
    assert sum(n.args[4] for n in norms) == layers and not by[torch.ops.mcore.gemv_glu.default]  # gate/up: glu
    names = [n.args[1].name for n in norms]
    assert sum("input_layernorm" in x for x in names) == sum("post_attention_layernorm" in x for x in names) == layers
    assert names[-1] == "p_decoder_norm_weight"  # the final norm, in lm_head's prologue
    assert [n.target for n in nodes].count(torch.ops.aten.rsqrt.default) == 2 * layers  # q_norm, k_norm
    for n in adds:  # the residual is the layer's input or the attention's sum: a product or the embedding
        assert n.args[2].target in (torch.ops.mcore.gemv_add.default, torch.ops.aten.embedding.default), n.args
    assert pipe.runners["decode"].key != apart.runners["decode"].key
    prompt = "the quick brown fox"
    r = pipe.generate(prompt, 8, stop_at_eos=False)
    assert r.tokens == apart.generate(prompt, 8, stop_at_eos=False).tokens
    a = pipe.step_logits(r.prompt_tokens, r.tokens[:-1])
    b = apart.step_logits(r.prompt_tokens, r.tokens[:-1])
    for x, y in zip(a, b, strict=True):  # a bf16 ulp or two: the norms' sums in another order
        torch.testing.assert_close(x, y, atol=0.1, rtol=0.05)


def test_a_norm_or_sum_read_elsewhere_stays_apart():
    """The norm moves into a product only where nothing else reads its row or its intermediates, and
    the residual add only where the add is the product's only reader and needs no broadcast; what
    moves computes what it did."""
    from torch import fx

    from mcore.engines.gemv_pass import fuse_norms, fuse_residuals

    g = torch.Generator().manual_seed(0)
    w, w2 = torch.randn(8, 4, generator=g).to(torch.bfloat16), torch.randn(4, 8, generator=g).to(torch.bfloat16)
    nw = (1 + torch.rand(4, generator=g)).to(torch.bfloat16)

    class M(torch.nn.Module):
        def __init__(self, extra: bool):
            super().__init__()
            self.extra = extra

        def forward(self, h, nw, w, w2, r):
            h32 = h.float()
            normed = nw * (h32 * torch.rsqrt(h32.pow(2).mean(-1, keepdim=True) + 1e-6)).to(h.dtype)
            out = r + torch.ops.mcore.gemv(torch.ops.mcore.gemv(normed, w), w2)
            return (out, normed) if self.extra else (out,)

    def exported(module: torch.nn.Module, *args: torch.Tensor) -> fx.GraphModule:
        gm = torch.export.export(module, args).module()
        assert isinstance(gm, fx.GraphModule)
        for n in list(gm.graph.nodes):  # as the engine's graphs: no metadata asserts among the users
            if n.target is torch.ops.aten._assert_tensor_metadata.default:
                gm.graph.erase_node(n)
        return gm

    h, r = torch.randn(1, 4, generator=g).to(torch.bfloat16), torch.randn(1, 4, generator=g).to(torch.bfloat16)
    for extra in (False, True):
        gm = exported(M(extra), h, nw, w, w2, r)
        ph = [n for n in gm.graph.nodes if n.op == "placeholder"]
        assert fuse_norms(gm, {ph[1]: nw, ph[2]: w, ph[3]: w2}) == (0 if extra else 1)
        assert fuse_residuals(gm) == 1
        gm.recompile()
        for got, want in zip(gm(h, nw, w, w2, r), M(extra)(h, nw, w, w2, r), strict=True):
            torch.testing.assert_close(got, want, atol=0, rtol=0)  # CPU: the ops compute the unfused step

    class Broadcast(torch.nn.Module):
        def forward(self, x, w, r):
            return r + torch.ops.mcore.gemv(x, w)  # r [4, 8] against a [1, 8] product

    gm = exported(Broadcast(), torch.randn(1, 4), torch.randn(8, 4), torch.randn(4, 8))
    assert fuse_residuals(gm) == 0


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
    gemv = [k for k in kernels if k["kernel"] in {f"torch.ops.{op}" for op in GEMV_OPS}]
    # each one-row product a kernel of its own (with the residual adds and the final norm folded in)
    assert len(gemv) == len(linears) and all(len(set(k["nodes"]) & linears) == 1 for k in gemv)
    assert {n for k in gemv for n in k["nodes"]} >= linears
    assert {n.name for n in prepared.gm.graph.nodes if n.target is torch.ops.aten.linear.default} == linears


def test_the_fusion_report_names_the_gating_inside_the_gate_up_product(tiny_bf16, monkeypatch):
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


def test_the_fusion_report_puts_the_norms_and_residual_adds_in_the_products(tiny_bf16, monkeypatch):
    """With the norms fused (MCORE_GEMV_NORM=1), the kernel map charges each norm's nodes (its rsqrt among
    them) to the product it feeds and each residual add to the product before it: no kernel of the
    step computes a hidden-size norm or a residual add on its own."""
    from mcore.engines.kernel_map import fused_kernels
    from mcore.profile.compiled import engine_graph
    from mcore.profile.profiler import _role_inputs

    monkeypatch.setenv("MCORE_GEMV_NORM", "1")
    pipe = DecoderPipeline(str(tiny_bf16), device="cpu", engine="torch")
    original = pipe.runners["decode"].prepared.gm
    rsqrts = {n.name for n in original.graph.nodes if n.target is torch.ops.aten.rsqrt.default}
    prepared = engine_graph(pipe.runners["decode"].prepared)
    kernels = fused_kernels(prepared, _role_inputs(pipe, "decode", 5, None), gemv=True)
    layers = int(pipe.config["num_hidden_layers"])
    norm_kernels = [k for k in kernels if k["kernel"] == "torch.ops.mcore.rms_gemv.default"]
    add_kernels = [k for k in kernels if k["kernel"] == "torch.ops.mcore.gemv_add.default"]
    assert len(norm_kernels) == 2 * layers + 1 and len(add_kernels) == 2 * layers
    assert all(len(set(k["nodes"]) & rsqrts) == 1 for k in norm_kernels)
    per_head = rsqrts - {n for k in norm_kernels for n in k["nodes"]}
    assert len(per_head) == 2 * layers  # q_norm and k_norm stay in Inductor's kernels
    adds = {n.name for n in original.graph.nodes if n.target is torch.ops.aten.add.Tensor}
    assert all(len(set(k["nodes"]) & adds) == 1 for k in add_kernels)


# ------------------------------------------------------------------------------------------- GPU

gpu = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@gpu
@needs_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gpu_kernel_at_the_8b_shapes(dtype):
    """Fused q/k/v, gate/up, down and lm_head of Qwen3-8B, and a few odd sizes: against float64,
    bit-equal run to run, and the same bits replayed inside a CUDA graph; the same with the gating,
    the norm and the residual add folded in."""
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
    from mcore.ops.gemv import rms_norm

    # the add + RMSNorm folded in: the norm in the prologue of q/k/v, gate/up (gated) and lm_head, the
    # residual add in the epilogue of o_proj and down
    for n, k, glu in [(6144, 4096, False), (12288, 4096, True), (151936, 4096, False), (65, 300, True)]:
        g = torch.Generator(device="cuda").manual_seed(n - k)
        x = (torch.randn(1, 1, k, device="cuda", generator=g) * 4).to(dtype)
        nw = (1 + 0.3 * torch.randn(k, device="cuda", generator=g)).to(dtype)
        w = (torch.randn(2 * n if glu else n, k, device="cuda", generator=g) * 0.02).to(dtype)
        a = gemv_triton(x, w, glu=glu, norm_weight=nw, eps=1e-6)
        assert torch.equal(a, gemv_triton(x, w, glu=glu, norm_weight=nw, eps=1e-6)), (n, k)
        xd = x.double().reshape(k)
        prod = (xd * nw.double() / torch.sqrt(xd.pow(2).mean() + 1e-6)) @ w.double().T
        if glu:
            ref = silu_mul(prod[:n].to(dtype), prod[n:].to(dtype)).double().reshape(1, 1, n)
            assert ((a.double() - ref).abs() <= 3 * ref.abs() * 2**-7 + 1e-6).all(), (n, k)
        else:
            ref = prod.reshape(1, 1, n)
            rel = ((a.double() - ref).norm() / ref.norm()).item()
            floor = ((ref.to(dtype).double() - ref).norm() / ref.norm()).item()
            unfused = gemv_triton(rms_norm(x, nw, 1e-6), w)  # the norm rounded first
            assert rel < 1.5 * floor + 1e-6, (n, k, rel, floor)
            assert rel <= ((unfused.double() - ref).norm() / ref.norm()).item() + 1e-6, (n, k)
    for n, k in [(4096, 4096), (4096, 12288), (37, 300)]:
        g = torch.Generator(device="cuda").manual_seed(n + 7 * k)
        x = torch.randn(1, 1, k, device="cuda", generator=g).to(dtype)
        w = (torch.randn(n, k, device="cuda", generator=g) * 0.02).to(dtype)
        r = torch.randn(1, 1, n, device="cuda", generator=g).to(dtype)
        a = gemv_triton(x, w, residual=r)
        assert torch.equal(a, r + gemv_triton(x, w)), (n, k)  # the unfused step's bits
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            b = gemv_triton(x, w, residual=r)
        graph.replay()
        torch.cuda.synchronize()
        assert torch.equal(a, b), (n, k)


@gpu
@needs_cuda
@pytest.mark.parametrize(
    "inductor, glu, fused",
    [("none", "1", ""), (None, "1", ""), (None, "0", ""), (None, "1", "no-rope"), (None, "1", "norm")],
    ids=["plain", "defaults", "defaults-no-glu", "defaults-rope-apart", "defaults-and-every-launch-cut"],
)
def test_gpu_pipeline_with_gemv_is_deterministic_and_slots_keep_its_bits(tmp_path, monkeypatch, inductor, glu, fused):
    """mcore::gemv in the decode step: the same tokens twice, bit-identical logits with an
    identity-copy slot in lockstep, close to the op-by-op engine; with no extra Inductor settings
    and with the CUDA defaults. With the defaults' programmatic dependent launch (kernels launched
    while their predecessor drains) also bit-identical to the same compile launched plainly: a
    kernel that read its input early would show here."""
    from .test_compiled_engine import _bundles

    monkeypatch.setenv("MCORE_GEMV", "1")
    monkeypatch.setenv("MCORE_GEMV_GLU", glu)  # 1 (the default): the MLP's gating in the gate/up product's kernel
    if fused == "norm":  # the add + RMSNorm in the products around it
        monkeypatch.setenv("MCORE_GEMV_NORM", "1")
    # by default the q/k norms, rotation and cache writes run in the attention's split kernel
    if fused == "no-rope":
        monkeypatch.setenv("MCORE_ATTN_ROPE", "0")
    else:
        monkeypatch.delenv("MCORE_ATTN_ROPE", raising=False)
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
        n
        for n in nat.runners["decode"].prepared.gm.graph.nodes
        if n.target is torch.ops.mcore.gemv_glu.default or (n.target is torch.ops.mcore.rms_gemv.default and n.args[4])
    ]
    layers = int(nat.config["num_hidden_layers"])
    assert len(gated) == (layers if glu == "1" else 0)
    norms = [n for n in nat.runners["decode"].prepared.gm.graph.nodes if n.target is torch.ops.mcore.rms_gemv.default]
    assert len(norms) == (2 * layers + 1 if fused == "norm" else 0)
    ropes = [
        n
        for n in nat.runners["decode"].prepared.gm.graph.nodes
        if n.target is torch.ops.mcore.rope_decode_attention.default
    ]
    assert len(ropes) == (0 if fused == "no-rope" else layers)
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
