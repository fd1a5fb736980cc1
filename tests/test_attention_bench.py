"""bench/attention_gpu.py's whole-step part on the CPU with a 2-layer config: native against itself,
as two bound "variants" in one process. What the GPU numbers rest on: identical pipelines agree
exactly in lockstep, every variant gets its own rows, and the verdict is the perf gate's interval
rule over the rounds (never a bare median)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"


@pytest.mark.slow
def test_the_pipelines_part_compares_each_bound_variant_with_native(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    monkeypatch.setattr(sys, "argv", ["attention_gpu.py"])
    import attention_gpu as bench
    import model_configs

    from mcore import BuildArgs, build_bundle
    from mcore.verify.interval import ratio_interval
    from mcore.verify.perf import PERF_DEFAULTS

    tiny = dict(model_configs.QWEN3_8B, num_hidden_layers=2, hidden_size=128, intermediate_size=256)
    tiny.update(num_attention_heads=4, num_key_value_heads=2, head_dim=32)
    monkeypatch.setitem(model_configs.MODELS, "tiny", (tiny, "qwen3-tiny"))
    for name in ("MODEL", "CONFIG", "RECIPE", "WORKSPACE", "DEV"):
        monkeypatch.setattr(bench, name, getattr(bench, name))  # use_model sets them: put them back after
    monkeypatch.setattr(bench, "RESULTS", {})
    bench.use_model("tiny")
    bench.DEV = "cpu"
    cfg = model_configs.write_model_folder(tmp_path / "cfg", "tiny")
    args = BuildArgs(model=str(cfg), weights="random", precision="bf16", max_cache_length=256)
    native = tmp_path / "native.bundle"
    build_bundle(args, native, device="cpu")
    manifest = tmp_path / "none.json"
    manifest.write_text(json.dumps({"schema_version": 1, "bindings": []}))

    bench.pipelines(tmp_path, native, [("A", native, manifest), ("B", native, manifest)], [64, 200], 2)

    saved = json.loads((tmp_path / "attention.json").read_text())["pipelines"]
    assert [e["variant"] for e in saved] == ["A", "B"]
    for entry in saved:
        assert all(s["max_abs"] == 0.0 and s["same_pick"] for s in entry["lockstep"])
        assert [r["context"] for r in entry["steps"]] == [64, 200]
        for r in entry["steps"]:
            pairs = [a / b for a, b in zip(r["rounds"]["native"], r["rounds"]["external"], strict=True)]
            ci = ratio_interval(pairs, PERF_DEFAULTS.confidence)
            assert r["interval"] == [ci.low, ci.high] and r["verdict"] == ci.verdict(PERF_DEFAULTS.min_ratio)
            assert r["logits"]["max_abs"] == 0.0
    table = bench.table()
    assert "bound in all 2 layers: A" in table and "bound in all 2 layers: B" in table


def test_the_variants_to_time_are_named_by_index(monkeypatch):
    """--variants picks which of VARIANTS the kernel part exports (the bound ones always among them);
    an index past the list is refused with a one-line usage error, exit 2."""
    monkeypatch.syspath_prepend(str(BENCH))
    import attention_gpu

    monkeypatch.setattr(sys, "argv", ["attention_gpu.py", "out", "--variants", "3,5", "--bind", "1"])
    assert attention_gpu.parse().variants == {1, 3, 5}
    monkeypatch.setattr(sys, "argv", ["attention_gpu.py", "out"])
    assert attention_gpu.parse().variants is None
    monkeypatch.setattr(sys, "argv", ["attention_gpu.py", "out", "--variants", f"1,{len(attention_gpu.VARIANTS)}"])
    with pytest.raises(SystemExit) as e:
        attention_gpu.parse()
    assert e.value.code == 2


def test_variants_exported_here_are_used_on_the_gpu_only_for_their_own_receipt(tmp_path, monkeypatch, capsys):
    """--export-only exports the variants without a GPU (sm_90a) and indexes them by their receipt's
    ABI; --prebuilt uses such a DSO only for a receipt of that ABI and only unchanged, else exports."""
    monkeypatch.syspath_prepend(str(BENCH))
    monkeypatch.setattr(sys, "argv", ["attention_gpu.py"])
    import attention_gpu as bench

    for name in ("MODEL", "CONFIG", "RECIPE", "WORKSPACE", "DEV"):
        monkeypatch.setattr(bench, name, getattr(bench, name))
    monkeypatch.setattr(bench, "RESULTS", {})
    bench.use_model("qwen3-tiny-hd64")
    bench.DEV = "cpu"
    split = list(bench.VARIANTS).index(bench.SHIPPED_SPLIT)
    pre = tmp_path / "pre"
    pre.mkdir()
    bench.export_only(pre, 256, {split})
    index = json.loads((pre / bench.PREBUILT).read_text())
    assert list(index) == [str(split)] and index[str(split)]["name"] == bench.SHIPPED_SPLIT
    receipt = pre / "attn-ws.selection.decoder.layers.0.decode_attention.json"
    assert index[str(split)]["abi_sha256"] == bench.abi_of(receipt)

    run = tmp_path / "run"
    run.mkdir()
    capsys.readouterr()
    _, _, dsos = bench.build(run, 256, native=False, only={split}, prebuilt=pre)
    assert "prebuilt" in capsys.readouterr().out
    assert dsos[bench.SHIPPED_SPLIT].read_bytes() == (pre / f"attn-{split}.so").read_bytes()
    assert json.loads((run / "attention.json").read_text())["build"]["export_s"][bench.SHIPPED_SPLIT] == 0.0

    entry, src = index[str(split)], pre / f"attn-{split}.so"
    assert bench.why_not_prebuilt(entry, src, bench.SHIPPED_SPLIT, receipt) == ""
    assert bench.why_not_prebuilt(None, src, bench.SHIPPED_SPLIT, receipt) == "none in the folder"
    assert bench.why_not_prebuilt(entry, src, "CuTe split 64 x 4 warps", receipt) == "another variant's"
    other = dict(entry, abi_sha256="0" * 64)
    assert bench.why_not_prebuilt(other, src, bench.SHIPPED_SPLIT, receipt).startswith("exported for ABI 000000000000")
    src.write_bytes(src.read_bytes() + b"\0")
    assert bench.why_not_prebuilt(entry, src, bench.SHIPPED_SPLIT, receipt) == "its bytes changed since the export"
