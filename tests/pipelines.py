"""Helpers for tests that look into a loaded pipeline's graphs and outputs."""

from __future__ import annotations

import torch

from mcore.runtime.pipeline import DecoderPipeline


def graph_targets(pipe: DecoderPipeline, role: str) -> list:
    """The call targets of a role's prepared graph, in graph order."""
    return [n.target for n in pipe.runners[role].prepared.gm.graph.nodes]


def prefill_outputs(pipe: DecoderPipeline, ids: list[int]) -> torch.Tensor:
    """The prefill role's logits and every KV cache it wrote, from zeroed caches, as one flat tensor."""
    for c in pipe.cache_list:
        c.zero_()
    (logits,) = pipe.runners["prefill"](torch.tensor([ids], dtype=torch.int32), *pipe.cache_list)
    return torch.cat([logits.reshape(-1).float(), *(c.reshape(-1).float() for c in pipe.cache_list)])
