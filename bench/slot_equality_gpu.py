"""Does the identity-copy slot change anything? Native and slot pipelines in one process on the
Qwen3-8B-sized random config: each generates twice (run-to-run determinism), then both are fed
the same tokens in lockstep and their logits compared bit for bit at every step.

    python bench/slot_equality_gpu.py OUT_DIR [--tokens 64] [--cache 40960]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from qwen3_8b_config import write_config_folder  # noqa: E402

from mcore.bundle.build import build_bundle  # noqa: E402
from mcore.families.demo import materialize  # noqa: E402
from mcore.kernels.shipped import build_kernel  # noqa: E402
from mcore.model.buildargs import BuildArgs  # noqa: E402
from mcore.runtime.pipeline import DecoderPipeline  # noqa: E402

PROMPT = "Explain grouped-query attention, KV caching, and decode latency."


def first_diff(a, b):
    return next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), None)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--cache", type=int, default=40960)
    ap.add_argument(
        "--deterministic",
        action="store_true",
        help="torch.use_deterministic_algorithms(warn_only) + CUBLAS_WORKSPACE_CONFIG: names the culprits",
    )
    a = ap.parse_args()
    if a.deterministic:
        import os
        import warnings

        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=True)
        warnings.simplefilter("once")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    cfg = write_config_folder(out / "qwen3-8b-config")
    shutil.copy(materialize("qwen3-tiny") / "tokenizer.json", cfg)
    args = BuildArgs(
        model=str(cfg), weights="random", precision="bf16", max_cache_length=a.cache, decoder_engine_layout="split"
    )
    build_bundle(args, out / "native.bundle", device="cuda", overwrite=True)  # a rerun in OUT rebuilds
    res = build_bundle(
        args,
        out / "slot.bundle",
        recipe=("qwen.decode_logits_copy@1", "decoder.logits_zero_bias"),
        device="cuda",
        overwrite=True,
    )
    build_kernel("identity-copy", out / "kernel.so", cuda="on", overwrite=True)
    (out / "bindings.json").write_text(
        json.dumps(
            {
                "schema_version": 1,
                "bindings": [
                    {
                        "id": "qwen.decode_logits_copy@1",
                        "abi_sha256": res.receipt.abi_sha256,
                        "library": "./kernel.so",
                        "function": "run",
                    }
                ],
            }
        )
    )
    nat = DecoderPipeline(str(out / "native.bundle"), device="cuda")
    ext = DecoderPipeline(str(out / "slot.bundle"), kernel_bindings=str(out / "bindings.json"), device="cuda")
    runs = {}
    for name, p in (("native", nat), ("external", ext)):
        runs[name] = [p.generate(PROMPT, a.tokens, stop_at_eos=False).tokens for _ in range(2)]
        print(f"{name}: run1 == run2: {runs[name][0] == runs[name][1]} first diff {first_diff(*runs[name])}")
    print(
        f"native run1 == external run1: {runs['native'][0] == runs['external'][0]} "
        f"first diff {first_diff(runs['native'][0], runs['external'][0])}"
    )
    # lockstep: the same token stream into both; compare logits bit for bit
    seq = nat.encode(PROMPT) + runs["native"][0]
    n0 = len(nat.encode(PROMPT))
    worst = 0.0
    mismatched = 0
    margins = []
    for p in (nat, ext):
        for c in p.caches.values():
            c.zero_()
    cn = [nat.caches[n] for n in nat.cache_names]
    ce = [ext.caches[n] for n in ext.cache_names]
    ids = torch.tensor([seq[:n0]], dtype=torch.int32, device="cuda")
    ln = nat.runners["prefill"](ids, *cn)[0]
    le = ext.runners["prefill"](ids, *ce)[0]
    for i in range(n0, len(seq) - 1):
        t = torch.tensor([[seq[i]]], dtype=torch.int32, device="cuda")
        pos = torch.tensor([i], dtype=torch.int32, device="cuda")
        ln = nat.runners["decode"](t, pos, *cn)[0].clone()
        le = ext.runners["decode"](t, pos, *ce)[0].clone()
        d = (ln - le).abs().max().item()
        worst = max(worst, d)
        mismatched += int(d != 0)
        top = torch.topk(ln.float().reshape(-1), 2).values
        margins.append((top[0] - top[1]).item())
    print(f"lockstep decode steps={len(seq) - 1 - n0} steps_with_any_logit_difference={mismatched} max_abs={worst:g}")
    print(f"native top1-top2 logit margin: min={min(margins):.4g} median={sorted(margins)[len(margins) // 2]:.4g}")


if __name__ == "__main__":
    main()
