"""GPU evidence for generated CuTe DSL exporters (issue 5): DSOs exported from generated stubs
(`mcore kernel stub` + the exporter, CUTE_DSL_ARCH=sm_90a) bound into slot-ready bundles.

  - DistilBERT-base-sized (random weights, fp16, seq 256): layer-0 attention residual add,
    generated body; embedding gate vs native and engine time, alternating in one process.
  - demo:qwen3-tiny bf16: the logits zero-bias region, stub body written as a copy; token gate.

    python bench/cute_evidence_gpu.py EVIDENCE_DIR OUT_DIR
EVIDENCE_DIR holds residual-add-cutedsl.so, logits-cutedsl.so and distilbert-base/ (config).
"""

from __future__ import annotations

import json
import shutil
import statistics
import sys
import time
from pathlib import Path

import torch

from mcore.bundle.build import build_bundle
from mcore.model.buildargs import BuildArgs
from mcore.runtime.pipeline import DecoderPipeline, EncoderPipeline
from mcore.verify.compare import compare_embeddings, compare_tokens


def bindings(out: Path, name: str, binding_id: str, abi: str, dso: Path) -> Path:
    shutil.copy(dso, out / dso.name)
    path = out / name
    path.write_text(
        json.dumps(
            {
                "schema_version": 1,
                "bindings": [{"id": binding_id, "abi_sha256": abi, "library": f"./{dso.name}", "function": "run"}],
            }
        )
    )
    return path


def main() -> None:
    if len(sys.argv) != 3 or sys.argv[1].startswith("-"):
        raise SystemExit(f"usage: python bench/cute_evidence_gpu.py EVIDENCE_DIR OUT_DIR\n{__doc__}")
    ev, out = Path(sys.argv[1]), Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    # DistilBERT-base residual add
    args = BuildArgs(model=str(ev / "distilbert-base"), weights="random", precision="fp16")
    rid = ("distilbert.attention_residual_add@1", "encoder.layers.0.attention_residual")
    build_bundle(args, out / "d-native.bundle", device="cuda", overwrite=True)  # a rerun in OUT rebuilds
    slot = build_bundle(args, out / "d-slot.bundle", recipe=rid, device="cuda", overwrite=True).receipt
    print(f"residual add abi_sha256={slot.abi_sha256}")
    m = bindings(out, "d-bindings.json", slot.binding_id, slot.abi_sha256, ev / "residual-add-cutedsl.so")
    nat = EncoderPipeline(str(out / "d-native.bundle"), device="cuda")
    byok = EncoderPipeline(str(out / "d-slot.bundle"), kernel_bindings=str(m), device="cuda")
    prompt = "The quick brown fox jumps over the lazy dog."
    g = compare_embeddings({"embedding": nat.embed(prompt)}, {"embedding": byok.embed(prompt)}, 0.02, 0.999)
    print(" ".join(g.info), "|", g.line)
    times = {"native": [], "byok": []}
    for _ in range(5):
        nat.hidden_states(prompt), byok.hidden_states(prompt)
    for i in range(200):
        for name, p in (("native", nat), ("byok", byok)) if i % 2 == 0 else (("byok", byok), ("native", nat)):
            torch.cuda.synchronize()
            t = time.perf_counter()
            p.hidden_states(prompt)
            torch.cuda.synchronize()
            times[name].append((time.perf_counter() - t) * 1e3)
    mn, mb = statistics.median(times["native"]), statistics.median(times["byok"])
    print(
        f"distilbert-base engine time median native={mn:.3f} ms byok={mb:.3f} ms "
        f"(byok/native time {mb / mn:.4f}; throughput ratio {mn / mb:.4f}; 200 alternating iterations each)"
    )
    # Qwen3 tiny logits copy through the generated (hand-completed) exporter
    qa = BuildArgs(model="demo:qwen3-tiny", precision="bf16", max_cache_length=256, decoder_engine_layout="split")
    build_bundle(qa, out / "q-native.bundle", device="cuda", overwrite=True)
    qslot = build_bundle(
        qa,
        out / "q-slot.bundle",
        recipe=("qwen.decode_logits_copy@1", "decoder.logits_zero_bias"),
        device="cuda",
        overwrite=True,
    ).receipt
    print(f"logits copy abi_sha256={qslot.abi_sha256}")
    qm = bindings(out, "q-bindings.json", qslot.binding_id, qslot.abi_sha256, ev / "logits-cutedsl.so")
    p = "Explain grouped-query attention, KV caching, and decode latency."
    a = DecoderPipeline(str(out / "q-native.bundle"), device="cuda").generate(p, 64, stop_at_eos=False)
    b = DecoderPipeline(str(out / "q-slot.bundle"), kernel_bindings=str(qm), device="cuda").generate(
        p, 64, stop_at_eos=False
    )
    rec = lambda r: [{"prompt": r.prompt, "tokens": r.tokens, "text": r.text}]  # noqa: E731
    print("logits copy (CuTe DSO) tokens:", compare_tokens(rec(a), rec(b)).line)


if __name__ == "__main__":
    main()
