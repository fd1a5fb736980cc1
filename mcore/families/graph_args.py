"""The graph-producing arguments a family resolves from the build args (`Family.graph_args`): what
build_core, role_io, example_inputs, cache_shape and recipes read, and what a bundle manifest
records as `graph_args` (`to_dict()`, the same object key for key: a decoder's precision,
max_cache_length and decoder_engine_layout, an encoder's precision and max_seq_length)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class GraphArgs:
    precision: str
    max_cache_length: int | None = None  # decoders: the KV cache capacity
    decoder_engine_layout: str | None = None  # decoders
    max_seq_length: int | None = None  # encoders

    @property
    def cache_length(self) -> int:
        """A decoder's KV cache capacity."""
        if self.max_cache_length is None:
            raise ValueError("graph args without max_cache_length (an encoder's) read as a decoder's")
        return self.max_cache_length

    @property
    def seq_length(self) -> int:
        """An encoder's sequence length."""
        if self.max_seq_length is None:
            raise ValueError("graph args without max_seq_length (a decoder's) read as an encoder's")
        return self.max_seq_length

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"precision": self.precision}
        for k in ("max_cache_length", "decoder_engine_layout", "max_seq_length"):
            if getattr(self, k) is not None:
                out[k] = getattr(self, k)
        return out

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> GraphArgs:
        """A manifest's graph_args (check_graph_args has compared them with what the build args give)."""
        return cls(d["precision"], d.get("max_cache_length"), d.get("decoder_engine_layout"), d.get("max_seq_length"))
