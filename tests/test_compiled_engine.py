"""The compiled engine (Inductor; CUDA-graph replay on GPU) against the op-by-op reference engine.

CPU: Inductor's C++ backend runs the same prepared graph (slots opaque), so the engine's plumbing
is checked in CI: same tokens, close logits, slots kept as one opaque node, cache reuse, clear
errors. GPU (pytest -m gpu): the decode step replays as a CUDA graph and is deterministic; a native
and an identity-copy-slot pipeline give bit-identical logits in lockstep.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from mcore.bundle.build import build_bundle
from mcore.common import cache
from mcore.common.errors import Cancelled, UserError
from mcore.common.progress import CancelToken, Progress
from mcore.kernels.shipped import build_kernel
from mcore.model.buildargs import BuildArgs
from mcore.runtime.pipeline import DecoderPipeline, EncoderPipeline

from .conftest import assert_user_error
from .pipelines import graph_targets, prefill_outputs

PROMPT = "the quick brown fox"
RECIPE = ("qwen.decode_logits_copy@1", "decoder.logits_zero_bias")


def _bundles(
    folder: Path, precision: str, device: str, model: str = "demo:qwen3-tiny", recipe: tuple[str, str] = RECIPE
) -> tuple[Path, Path, Path]:
    """A native and a logits-copy slot bundle of `model`, plus a bindings manifest for identity-copy."""
    args = BuildArgs(model=model, precision=precision, max_cache_length=128)
    native = build_bundle(args, folder / "native.bundle", device=device).bundle_path
    res = build_bundle(args, folder / "slot.bundle", recipe=recipe, device=device)
    build_kernel("identity-copy", folder / "kernel.so", cuda="on" if device == "cuda" else "off", overwrite=True)
    manifest = folder / "bindings.json"
    manifest.write_text(
        json.dumps(
            {
                "schema_version": 1,
                "bindings": [
                    {
                        "id": recipe[0],
                        "abi_sha256": res.receipt.abi_sha256,
                        "library": "./kernel.so",
                        "function": "run",
                    }
                ],
            }
        )
    )
    return native, res.bundle_path, manifest


@pytest.fixture(scope="module")
def cpu_bundles(tmp_path_factory):
    return _bundles(tmp_path_factory.mktemp("compiled-cpu"), "fp32", "cpu")


def test_cpu_compiled_matches_the_reference_engine(cpu_bundles):
    native, slot, manifest = cpu_bundles
    ref = DecoderPipeline(str(native), device="cpu", engine="torch")
    comp = DecoderPipeline(str(native), device="cpu", engine="compiled")
    assert comp.engine_name == "compiled" and ref.engine_name == "torch"
    a = ref.generate(PROMPT, 12, stop_at_eos=False)
    b = comp.generate(PROMPT, 12, stop_at_eos=False)
    assert a.tokens == b.tokens
    la = ref.step_logits(a.prompt_tokens, a.tokens[:-1])
    lb = comp.step_logits(a.prompt_tokens, a.tokens[:-1])
    for x, y in zip(la, lb, strict=True):
        torch.testing.assert_close(y, x, atol=2e-5, rtol=2e-5)
    # a multi-token decode call (a new shape) runs compiled too, with the same numbers
    caches = [comp.caches[n] for n in comp.cache_names]
    seq = a.prompt_tokens + a.tokens
    comp.step_logits(a.prompt_tokens[:-1], [])
    (lg,) = comp.runners["decode"](
        torch.tensor([seq[len(a.prompt_tokens) - 1 : len(a.prompt_tokens) + 2]], dtype=torch.int32),
        torch.tensor([len(a.prompt_tokens) - 1], dtype=torch.int32),
        *caches,
    )
    torch.testing.assert_close(lg.float(), la[2], atol=2e-5, rtol=2e-5)
    lines = comp.engine_lines()
    assert any("decode: compiled (Inductor)" in line for line in lines), lines


def test_pipelines_of_one_structure_share_the_compiled_code_and_keep_their_own_weights(tmp_path):
    """Two checkpoints of one config (seeded random weights: a fine-tune's situation) in one process:
    the second pipeline's roles call the function the first one compiled (no second trace) with its own
    weights, so each gives the tokens and logits of its own op-by-op engine; a third pipeline under
    another MCORE_CACHE_DIR compiles afresh."""
    from mcore.engines import compiled

    paths = [
        build_bundle(
            BuildArgs(model="demo:qwen3-tiny", precision="fp32", max_cache_length=64, weights="random", seed=seed),
            tmp_path / f"seed{seed}.bundle",
            device="cpu",
        ).bundle_path
        for seed in (1, 2)
    ]
    a, b = (DecoderPipeline(str(p), device="cpu", engine="compiled") for p in paths)
    assert all(b.runners[r].fn is a.runners[r].fn for r in ("prefill", "decode"))
    outputs = []
    for pipe, path in zip((a, b), paths, strict=True):
        ref = DecoderPipeline(str(path), device="cpu", engine="torch")
        r = pipe.generate(PROMPT, 6, stop_at_eos=False)
        assert r.tokens == ref.generate(PROMPT, 6, stop_at_eos=False).tokens
        mine = pipe.step_logits(r.prompt_tokens, r.tokens[:-1])
        for x, y in zip(mine, ref.step_logits(r.prompt_tokens, r.tokens[:-1]), strict=True):
            torch.testing.assert_close(x, y, atol=2e-5, rtol=2e-5)
        outputs.append(mine[0])
    assert not torch.allclose(outputs[0], outputs[1])  # two models, not one twice
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("MCORE_CACHE_DIR", str(tmp_path / "other-cache"))
        c = DecoderPipeline(str(paths[0]), device="cpu", engine="compiled")
    assert c.runners["decode"].fn is not a.runners["decode"].fn
    assert len(compiled._DYNAMO) <= compiled._DYNAMO_MAX


@pytest.mark.parametrize("model", ["demo:llama-tiny", "demo:qwen2-tiny"])
def test_cpu_compiled_runs_the_other_families(tmp_path, model, monkeypatch):
    """Llama (GQA 4, tied, no q/k norms) and Qwen2 (q/k/v biases: their projections stay unfused)
    compiled: the reference engine's tokens, close logits, a logits-copy slot kept as one opaque node,
    and the prefill rewrite of mcore/engines/prefill_pass.py in every layer (each context reaches
    o_proj through mcore::prefill_attention_rows) with the bits of the prefill compiled without it."""
    family = model.removeprefix("demo:").split("-")[0]
    native, slot, manifest = _bundles(
        tmp_path, "fp32", "cpu", model, (f"{family}.decode_logits_copy@1", "decoder.logits_zero_bias")
    )
    ref = DecoderPipeline(str(native), device="cpu", engine="torch")
    comp = DecoderPipeline(str(slot), kernel_bindings=str(manifest), device="cpu", engine="compiled")
    a = ref.generate(PROMPT, 10, stop_at_eos=False)
    assert comp.generate(PROMPT, 10, stop_at_eos=False).tokens == a.tokens
    for x, y in zip(
        ref.step_logits(a.prompt_tokens, a.tokens[:-1]), comp.step_logits(a.prompt_tokens, a.tokens[:-1]), strict=True
    ):
        torch.testing.assert_close(y, x, atol=1e-4, rtol=1e-4)  # fp32 in another order (qwen2-tiny's logits are larger)
    gm = comp.runners["decode"].prepared.gm
    slots = [n for n in gm.graph.nodes if n.op == "call_function" and n.target is torch.ops.mcore.slot.default]
    assert [n.meta["mcore_binding_id"] for n in slots] == [f"{family}.decode_logits_copy@1"]
    rows = torch.ops.mcore.prefill_attention_rows.default
    assert graph_targets(comp, "prefill").count(rows) == int(comp.config["num_hidden_layers"])
    monkeypatch.setenv("MCORE_PREFILL_ROWS", "0")
    plain = DecoderPipeline(str(slot), kernel_bindings=str(manifest), device="cpu", engine="compiled")
    assert rows not in graph_targets(plain, "prefill")
    assert torch.equal(prefill_outputs(comp, a.prompt_tokens), prefill_outputs(plain, a.prompt_tokens))


def test_cpu_slot_stays_one_opaque_node_and_runs(cpu_bundles):
    native, slot, manifest = cpu_bundles
    pipe = DecoderPipeline(str(slot), kernel_bindings=str(manifest), device="cpu", engine="compiled")
    gm = pipe.runners["decode"].prepared.gm
    slots = [n for n in gm.graph.nodes if n.op == "call_function" and n.target is torch.ops.mcore.slot.default]
    assert len(slots) == 1 and slots[0].meta["mcore_binding_id"] == RECIPE[0]
    # the slot node replaced the region: no zero-bias add is left in the graph
    assert not any(
        "logits_zero_bias" in str(n.meta.get("nn_module_stack", ""))
        for n in gm.graph.nodes
        if n.op == "call_function" and n is not slots[0]
    )
    calls = []
    call = pipe.slot_calls[0]
    inner = call.fn
    call.fn = lambda *a: (calls.append(len(a)), inner(*a))  # the compiled graph calls the bound kernel
    ref = DecoderPipeline(str(native), device="cpu", engine="compiled")
    r = pipe.generate(PROMPT, 8, stop_at_eos=False)
    assert len(calls) == 7  # one per decode step (prefill has no slot)
    assert r.tokens == ref.generate(PROMPT, 8, stop_at_eos=False).tokens


def test_cpu_second_load_reuses_the_compiled_cache(cpu_bundles):
    native, _, _ = cpu_bundles
    DecoderPipeline(str(native), device="cpu", engine="compiled")
    again = DecoderPipeline(str(native), device="cpu", engine="compiled")
    assert all(r.cached for r in again.runners.values())
    assert all("(cached)" in line for line in again.engine_lines())


def test_cpu_precompiled_artifact_is_saved_then_loaded(cpu_bundles, tmp_path, monkeypatch):
    """MCORE_PRECOMPILED=1: each role (prefill with a symbolic token count, decode fixed) is compiled
    without Dynamo into an artifact file with a role record beside it; the next load reads those
    and captures nothing; the numbers are those of the default compiled path, prompts of 1 token
    and of many included; a damaged artifact or record is compiled again, never trusted."""
    import mcore.runtime.pipeline

    native, _, _ = cpu_bundles
    default = DecoderPipeline(str(native), device="cpu", engine="compiled")
    monkeypatch.setenv("MCORE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("MCORE_PRECOMPILED", "1")
    first = DecoderPipeline(str(native), device="cpu", engine="compiled")
    folder = tmp_path / "cache" / "compiled"
    artifacts = sorted(folder.glob("*.artifact"))
    records = sorted(folder.glob("*.role.json"))
    assert len(artifacts) == 2 and len(records) == 2
    assert {first.runners[r].artifact for r in ("prefill", "decode")} == set(artifacts)

    captures = []
    real_capture = mcore.runtime.pipeline.capture_cached
    monkeypatch.setattr(
        mcore.runtime.pipeline, "capture_cached", lambda *a, **k: captures.append(a) or real_capture(*a, **k)
    )
    again = DecoderPipeline(str(native), device="cpu", engine="compiled")
    assert captures == []  # neither role graph was captured: both came from their records
    assert all(r.cached and "precompiled artifact" in r.describe() for r in again.runners.values())
    assert {r: s.fingerprint for r, s in again.snapshots.items()} == {
        r: s.fingerprint for r, s in default.snapshots.items()
    }
    for prompt in (PROMPT, "the", "the quick brown fox jumps over the lazy dog " * 3):
        ids = default.encode(prompt)
        tokens = default.generate(prompt, 6, stop_at_eos=False).tokens
        want = default.step_logits(ids, tokens[:-1])
        for pipe in (first, again):
            got = pipe.step_logits(ids, tokens[:-1])
            assert all(torch.equal(x, y) for x, y in zip(want, got, strict=True)), (prompt, len(ids))
    assert len(default.encode("the")) == 1  # the one-token prompt ran through the symbolic prefill

    # a valid artifact of the other role under decode's name, and two same-shaped weights swapped in
    # prefill's record: each entry's record (sha256 of its file, its own hash) tells, before unpickling
    tokens = default.generate(PROMPT, 6, stop_at_eos=False).tokens
    art = {r: first.runners[r].artifact for r in ("prefill", "decode")}
    record = art["prefill"].with_name(art["prefill"].name.replace(".artifact", ".role.json"))
    shutil.copyfile(art["prefill"], art["decode"])
    data = json.loads(record.read_text())
    names = data["state_names"]
    a, b = (n for n in names if n.endswith("layernorm.weight") and "layers.0." in n)
    i, j = names.index(a), names.index(b)
    names[i], names[j] = b, a
    record.write_text(json.dumps(data))
    notes: list[str] = []
    monkeypatch.setattr(cache, "_note_sink", notes.append)
    loads = []
    monkeypatch.setattr(torch._inductor.CompiledArtifact, "load", lambda *a, **k: loads.append(a))
    third = DecoderPipeline(str(native), device="cpu", engine="compiled")
    assert len(captures) == 2 and loads == []  # both roles captured again, neither artifact unpickled
    assert third.generate(PROMPT, 6, stop_at_eos=False).tokens == tokens
    assert any("decode" in n and "differs from its record (sha256)" in n for n in notes), notes
    assert any("prefill" in n and "was edited" in n for n in notes), notes
    assert "snapshot" in record.read_text() and art["decode"].read_bytes() != art["prefill"].read_bytes()


def test_cpu_precompiled_slot_pipelines_each_call_their_own_kernel(cpu_bundles, tmp_path, monkeypatch):
    """Compiled code names its slot by the pipeline's slot key: a second slot pipeline in one process
    (other keys) gets its own artifact and calls its own bound kernel, never the first one's."""
    _, slot, manifest = cpu_bundles
    monkeypatch.setenv("MCORE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("MCORE_PRECOMPILED", "1")
    pipes = [DecoderPipeline(str(slot), kernel_bindings=str(manifest), device="cpu", engine="compiled") for _ in "ab"]
    assert pipes[0].runners["decode"].artifact != pipes[1].runners["decode"].artifact
    calls = {0: 0, 1: 0}
    for i, pipe in enumerate(pipes):
        (call,) = pipe.slot_calls
        inner = call.fn

        def counted(*a, i=i, inner=inner):
            calls[i] += 1
            return inner(*a)

        call.fn = counted
    pipes[1].generate(PROMPT, 5, stop_at_eos=False)
    assert calls == {0: 0, 1: 4}  # four decode steps, all through the second pipeline's slot


def test_cpu_slot_pipeline_after_a_dropped_one_reuses_its_keys_and_compiled_code(cpu_bundles, tmp_path, monkeypatch):
    """Slot keys are freed with their pipeline: one loaded after another was dropped gets the same
    keys, so it loads the first one's precompiled roles instead of compiling (the workbench reloads
    a slot pipeline after each rebuild of a kernel); it runs its own bound kernel."""
    _, slot, manifest = cpu_bundles
    monkeypatch.setenv("MCORE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("MCORE_PRECOMPILED", "1")
    first = DecoderPipeline(str(slot), kernel_bindings=str(manifest), device="cpu", engine="compiled")
    keys = [c.key for c in first.slot_calls]
    tokens = first.generate(PROMPT, 5, stop_at_eos=False).tokens
    assert not first.runners["decode"].cached  # compiled here
    del first  # whatever cycles hold it, the next pipeline's load collects
    second = DecoderPipeline(str(slot), kernel_bindings=str(manifest), device="cpu", engine="compiled")
    assert [c.key for c in second.slot_calls] == keys
    assert all(r.cached and "precompiled artifact" in r.describe() for r in second.runners.values())
    (call,) = second.slot_calls
    inner, seen = call.fn, []
    call.fn = lambda *a: seen.append(1) or inner(*a)
    assert second.generate(PROMPT, 5, stop_at_eos=False).tokens == tokens and len(seen) == 4


def test_cpu_compile_is_cancellable(cpu_bundles):
    native, _, _ = cpu_bundles
    token = CancelToken()
    seen = []

    def cb(step, frac):
        seen.append(step)
        if step.startswith("compiling"):
            token.cancel()

    with pytest.raises(Cancelled):
        DecoderPipeline(str(native), device="cpu", engine="compiled", progress=Progress(cb, token))
    assert any(s.startswith("compiling prefill") for s in seen)


def test_engine_choice_errors(cpu_bundles, mcore):
    native, _, _ = cpu_bundles
    assert DecoderPipeline(str(native), device="cpu").engine_name == "torch"  # auto on CPU
    with pytest.raises(UserError, match="tensorrt engine is not available"):
        DecoderPipeline(str(native), device="cpu", engine="tensorrt")
    assert_user_error(mcore("run", native, "--prompt", "x", "--engine", "fast"), "unknown engine 'fast'")


def test_precompiled_roles_and_gemv_are_cuda_defaults_that_env_overrides(monkeypatch):
    """On CUDA the engine precompiles its roles and runs one-row products on mcore::gemv (both
    measured faster on the H200); on CPU neither unless asked; =0 and =1 override either way."""
    from mcore.engines.compiled import compile_key, precompiled
    from mcore.ops.gemv import enabled as gemv_enabled

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    for name, on in (("MCORE_PRECOMPILED", precompiled), ("MCORE_GEMV", gemv_enabled)):
        monkeypatch.delenv(name, raising=False)
        assert on(cuda) and not on(cpu), name
        monkeypatch.setenv(name, "0")
        assert not on(cuda), name
        monkeypatch.setenv(name, "1")
        assert on(cpu), name
    monkeypatch.setenv("MCORE_GEMV", "0")
    without = compile_key("f" * 64, [], cpu)
    monkeypatch.setenv("MCORE_GEMV", "1")
    assert compile_key("f" * 64, [], cpu) != without  # a rewritten graph is other compiled code


def test_combo_kernels_and_programmatic_dependent_launch_are_cuda_defaults(monkeypatch):
    """On CUDA the engine compiles with Inductor's combo kernels, and on Hopper and later with
    programmatic dependent launch (together 4.91 -> 4.46 ms a step on the H200); on CPU with
    neither. MCORE_INDUCTOR replaces the defaults; 'none' turns them off."""
    from mcore.ops import inductor, pdl

    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    monkeypatch.delenv("MCORE_INDUCTOR", raising=False)
    capability = {"sm": (9, 0)}
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: capability["sm"])
    assert inductor.settings(cpu) == [] and not pdl.requested(cpu)
    assert inductor.settings(cuda) == ["combo_kernels", "triton.enable_pdl"] and pdl.requested(cuda)
    capability["sm"] = (8, 0)  # an A100: no programmatic dependent launch
    assert inductor.settings(cuda) == ["combo_kernels"] and not pdl.requested(cuda)
    capability["sm"] = (9, 0)
    monkeypatch.setenv("MCORE_INDUCTOR", "none")
    assert inductor.settings(cuda) == [] and not pdl.requested(cuda)
    monkeypatch.setenv("MCORE_INDUCTOR", "triton.enable_pdl")
    assert inductor.settings(cuda) == ["triton.enable_pdl"] and pdl.requested(cuda)
    assert inductor.settings(cpu) == ["triton.enable_pdl"] and not pdl.requested(cpu)  # asked, but no GPU


def test_extra_inductor_settings_are_checked_and_enter_the_cache_key(cpu_bundles, mcore, monkeypatch):
    """MCORE_INDUCTOR names boolean Inductor settings (benchmark variants, or to turn the CUDA
    defaults off): they reach the compiler and the cache key; a name torch does not have is one
    line, exit 2."""
    from mcore.engines.compiled import compile_key, compile_options

    cpu = torch.device("cpu")
    plain = compile_key("f" * 64, [], cpu)
    monkeypatch.setenv("MCORE_INDUCTOR", "combo_kernels")
    assert compile_options(cpu, True)["combo_kernels"] is True
    assert "combo_kernels" not in compile_options(cpu, False)  # the decode step's, not prefill's
    assert compile_key("f" * 64, [], cpu) != plain
    monkeypatch.setenv("MCORE_INDUCTOR", "none")
    assert "combo_kernels" not in compile_options(cpu, True) and compile_key("f" * 64, [], cpu) == plain
    monkeypatch.setenv("MCORE_INDUCTOR", "combo_kernels,no_such_setting")
    native, _, _ = cpu_bundles
    assert_user_error(
        mcore("run", native, "--prompt", "x", "--engine", "compiled"),
        "MCORE_INDUCTOR: 'no_such_setting' is not a boolean Inductor setting",
    )
    monkeypatch.setenv("MCORE_INDUCTOR", "combo_kernels")  # the engine line names what the step compiled with
    r = mcore("run", native, "--prompt", "x y", "--max-new-tokens", "2", "--greedy", "--engine", "compiled")
    assert r.code == 0, r
    lines = [ln for ln in (r.out + r.err).splitlines() if ln.startswith("[engine]")]
    assert any("decode: compiled (Inductor, combo_kernels" in ln for ln in lines), lines
    assert any("prefill: compiled (Inductor)" in ln for ln in lines), lines  # prefill: no extra settings


def test_cpu_run_names_the_engine(cpu_bundles, mcore):
    native, _, _ = cpu_bundles
    r = mcore(
        "run",
        native,
        "--prompt",
        "x y",
        "--max-new-tokens",
        "3",
        "--greedy",
        "--engine",
        "compiled",
        "--warmup",
        "1",
        "--benchmark",
        "2",
    )
    assert r.code == 0, r
    assert "engine=compiled" in r.out and "tokens_per_sec=" in r.out
    assert "[engine] compiled: decode: compiled (Inductor)" in r.err


# ------------------------------------------------------------------------------------------- GPU

gpu = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.fixture(scope="module")
def gpu_bundles(tmp_path_factory):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    return _bundles(tmp_path_factory.mktemp("compiled-gpu"), "bf16", "cuda")


@gpu
@needs_cuda
def test_gpu_decode_replays_a_cuda_graph_and_is_deterministic(gpu_bundles):
    native, _, _ = gpu_bundles
    pipe = DecoderPipeline(str(native), device="cuda")  # auto: compiled on CUDA
    assert pipe.engine_name == "compiled"
    dec = pipe.runners["decode"]
    a = pipe.generate(PROMPT, 40, stop_at_eos=False)
    b = pipe.generate(PROMPT, 40, stop_at_eos=False)
    assert a.tokens == b.tokens
    assert dec.graphs, "the decode role was not captured as a CUDA graph"
    assert dec.calls_compiled == 0, f"{dec.calls_compiled} decode calls ran outside the CUDA graph"
    la = pipe.step_logits(a.prompt_tokens, a.tokens[:-1])
    lb = pipe.step_logits(a.prompt_tokens, a.tokens[:-1])
    assert [i for i, (x, y) in enumerate(zip(la, lb, strict=True)) if not torch.equal(x, y)] == []
    # a second pipeline in the same process gives the same bits
    other = DecoderPipeline(str(native), device="cuda")
    lc = other.step_logits(a.prompt_tokens, a.tokens[:-1])
    assert [i for i, (x, y) in enumerate(zip(la, lc, strict=True)) if not torch.equal(x, y)] == []
    # and each generated token is a maximum of those logits (ties may pick either index)
    assert [i for i, (x, t) in enumerate(zip(la, a.tokens, strict=True)) if x.reshape(-1)[t] != x.max()] == []


@gpu
@pytest.mark.timing
@needs_cuda
def test_gpu_device_step_time_is_measured_and_repeatable(gpu_bundles):
    """The device time per decode step (verify perf --metric device) is below the wall time per
    token and agrees with itself across pipelines of one bundle within a few percent."""
    native, _, _ = gpu_bundles
    times = []
    for _ in range(2):
        pipe = DecoderPipeline(str(native), device="cuda")
        r = pipe.generate(PROMPT, 16, stop_at_eos=False, timed=True)
        times.append(pipe.device_step_seconds(len(r.prompt_tokens) + 8, reps=400))
        wall = sorted(r.step_s)[len(r.step_s) // 2]
        assert 0 < times[-1] <= wall * 1.05, (times[-1], wall)
    assert abs(times[0] - times[1]) <= 0.05 * times[0], times


@gpu
@pytest.mark.timing
@needs_cuda
def test_gpu_device_time_does_not_measure_the_host():
    """A call whose host work (200 us of busy waiting) dwarfs its GPU work (one small add): the
    device time is the GPU's, far below the host's time per call, and close to the same add timed
    with no host work in between."""
    import time

    from mcore.runtime.pipeline import device_seconds

    x = torch.zeros(1024, device="cuda")

    def slow_host():
        t = time.perf_counter() + 200e-6
        while time.perf_counter() < t:
            pass
        x.add_(1.0)

    fast = device_seconds(lambda: x.add_(1.0), torch.device("cuda"), reps=200)
    slow = device_seconds(slow_host, torch.device("cuda"), reps=200)
    assert fast is not None and slow is not None
    assert slow < 50e-6, slow  # the host took >= 200 us a call
    assert slow < 3 * fast + 5e-6, (slow, fast)


@gpu
@needs_cuda
def test_gpu_identity_copy_slot_is_bit_identical_in_lockstep(gpu_bundles):
    native, slot, manifest = gpu_bundles
    nat = DecoderPipeline(str(native), device="cuda")
    ext = DecoderPipeline(str(slot), kernel_bindings=str(manifest), device="cuda")
    r = nat.generate(PROMPT, 48, stop_at_eos=False)
    assert ext.generate(PROMPT, 48, stop_at_eos=False).tokens == r.tokens
    ln = nat.step_logits(r.prompt_tokens, r.tokens[:-1])
    le = ext.step_logits(r.prompt_tokens, r.tokens[:-1])
    assert all(torch.equal(x, y) for x, y in zip(ln, le, strict=True))
    assert ext.runners["decode"].graphs  # the slot call was captured inside the CUDA graph


@gpu
@needs_cuda
def test_gpu_precompiled_reload_captures_nothing_and_keeps_the_bits(gpu_bundles, tmp_path, monkeypatch):
    """MCORE_PRECOMPILED=1 on the GPU: the artifacts carry the Triton code; a reload takes both roles
    from them (no capture), still replays the decode step as a CUDA graph, and computes the bits of
    the default compiled path; an identity-copy slot pipeline compiled the same way keeps them too."""
    import mcore.runtime.pipeline

    native, slot, manifest = gpu_bundles
    default = DecoderPipeline(str(native), device="cuda")
    monkeypatch.setenv("MCORE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("MCORE_PRECOMPILED", "1")
    DecoderPipeline(str(native), device="cuda")
    DecoderPipeline(str(slot), kernel_bindings=str(manifest), device="cuda")
    captures = []
    real_capture = mcore.runtime.pipeline.capture_cached
    monkeypatch.setattr(
        mcore.runtime.pipeline, "capture_cached", lambda *a, **k: captures.append(a) or real_capture(*a, **k)
    )
    nat = DecoderPipeline(str(native), device="cuda")
    assert captures == [] and nat.runners["decode"].graphs
    assert all("precompiled artifact" in r.describe() for r in nat.runners.values())
    # a slot pipeline's slot keys are new in this process (each pipeline calls its own kernels), so it
    # compiles its own artifact here; a fresh process would load it (the CLI's case)
    ext = DecoderPipeline(str(slot), kernel_bindings=str(manifest), device="cuda")
    for prompt in (PROMPT, "the"):
        r = default.generate(prompt, 16, stop_at_eos=False)
        want = default.step_logits(r.prompt_tokens, r.tokens[:-1])
        for pipe in (nat, ext):
            assert pipe.generate(prompt, 16, stop_at_eos=False).tokens == r.tokens
            got = pipe.step_logits(r.prompt_tokens, r.tokens[:-1])
            assert all(torch.equal(x, y) for x, y in zip(want, got, strict=True)), prompt


@pytest.fixture(scope="module")
def llama_gpu_bundles(tmp_path_factory):
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    recipe = ("llama.decode_logits_copy@1", "decoder.logits_zero_bias")
    return _bundles(tmp_path_factory.mktemp("compiled-gpu-llama"), "bf16", "cuda", "demo:llama-tiny", recipe)


@gpu
@needs_cuda
def test_gpu_llama_replays_a_cuda_graph_and_an_identity_slot_keeps_the_bits(llama_gpu_bundles):
    """demo:llama-tiny (GQA 4, tied, llama3 RoPE) compiled on the GPU: the decode step replays as a CUDA
    graph, twice the same bits, and an identity-copy slot in lockstep changes none of them."""
    native, slot, manifest = llama_gpu_bundles
    nat = DecoderPipeline(str(native), device="cuda")
    ext = DecoderPipeline(str(slot), kernel_bindings=str(manifest), device="cuda")
    r = nat.generate(PROMPT, 40, stop_at_eos=False)
    assert nat.runners["decode"].graphs and nat.runners["decode"].calls_compiled == 0
    assert ext.generate(PROMPT, 40, stop_at_eos=False).tokens == r.tokens
    ln = nat.step_logits(r.prompt_tokens, r.tokens[:-1])
    assert all(torch.equal(x, y) for x, y in zip(ln, nat.step_logits(r.prompt_tokens, r.tokens[:-1]), strict=True))
    assert all(torch.equal(x, y) for x, y in zip(ln, ext.step_logits(r.prompt_tokens, r.tokens[:-1]), strict=True))
    assert ext.runners["decode"].graphs


@gpu
@needs_cuda
def test_gpu_compiled_close_to_reference_engine_fp32(tmp_path):
    args = BuildArgs(model="demo:qwen3-tiny", precision="fp32", max_cache_length=256)
    native = build_bundle(args, tmp_path / "n.bundle", device="cuda").bundle_path
    ref = DecoderPipeline(str(native), device="cuda", engine="torch")
    comp = DecoderPipeline(str(native), device="cuda", engine="compiled")
    r = ref.generate(PROMPT, 24, stop_at_eos=False)
    assert comp.generate(PROMPT, 24, stop_at_eos=False).tokens == r.tokens
    for x, y in zip(
        ref.step_logits(r.prompt_tokens, r.tokens[:-1]), comp.step_logits(r.prompt_tokens, r.tokens[:-1]), strict=True
    ):
        torch.testing.assert_close(y, x, atol=1e-3, rtol=1e-3)


@gpu
@needs_cuda
def test_gpu_encoder_compiled_matches_reference(tmp_path):
    args = BuildArgs(model="demo:distilbert-tiny", precision="fp32")
    b = build_bundle(args, tmp_path / "e.bundle", device="cuda").bundle_path
    ref = EncoderPipeline(str(b), device="cuda", engine="torch")
    comp = EncoderPipeline(str(b), device="cuda")
    assert comp.engine_name == "compiled" and comp.runners["encoder"].graphs
    for prompt in ("a short one", "another, somewhat longer prompt for the encoder"):
        x, n = ref.hidden_states(prompt)
        y, m = comp.hidden_states(prompt)
        torch.testing.assert_close(y[:n].float(), x[:n].float(), atol=1e-3, rtol=1e-3)
