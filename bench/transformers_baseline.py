"""Baseline: transformers eager greedy generation tokens/s on a config (random weights, bf16, CUDA).

    python bench/transformers_baseline.py CONFIG_FOLDER --tokens 64 [--runs 3]
Prints `transformers_eager tokens_per_sec=... generated_tokens_mean=...`.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from transformers import AutoConfig, AutoModelForCausalLM


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("config")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    cfg = AutoConfig.from_pretrained(a.config)
    torch.manual_seed(0)
    with torch.device("cuda"):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).eval()
    ids = torch.tensor([[1000, 2000, 3000]], device="cuda")
    kw = dict(
        max_new_tokens=a.tokens,
        min_new_tokens=a.tokens,
        do_sample=False,
        pad_token_id=0,
        attention_mask=torch.ones_like(ids),
    )
    with torch.no_grad():
        model.generate(ids, **kw)  # warm-up
        rates = []
        for _ in range(a.runs):
            torch.cuda.synchronize()
            t = time.perf_counter()
            out = model.generate(ids, **kw)
            torch.cuda.synchronize()
            rates.append((out.shape[1] - ids.shape[1]) / (time.perf_counter() - t))
    print(
        f"transformers_eager generated_tokens_mean={a.tokens:.2f} tokens_per_sec={statistics.median(rates):.2f} "
        f"runs={[round(r, 2) for r in rates]}"
    )


if __name__ == "__main__":
    main()
