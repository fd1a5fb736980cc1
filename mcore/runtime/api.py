"""Helpers that exist for mcore's public API (see mcore/__init__.py).

Imported lazily through ``mcore.open_pipeline``; importing this module imports torch.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from ..bundle.container import Bundle
from ..common.progress import NO_PROGRESS, Progress
from ..families import bundle_kind
from .bindings import open_bound_bundle
from .pipeline import DecoderPipeline, EncoderPipeline, Pipeline


def open_pipeline(
    bundle: str | os.PathLike | Bundle,
    kernel_bindings: str | None = None,
    *,
    device: str | None = None,
    engine: str = "auto",
    progress: Progress = NO_PROGRESS,
    announce: Callable[[str], None] | None = None,
) -> Pipeline:
    """The pipeline a bundle's family kind calls for: DecoderPipeline for a decoder bundle,
    EncoderPipeline for an encoder one. ``bundle`` is a path (opened and verified here) or an
    already opened Bundle (not re-read). The kind is the manifest's ``family_kind``, else the
    family's own kind (the same rule the pipelines use to refuse the wrong verb)."""
    if isinstance(bundle, Bundle):
        b, path = bundle, str(bundle.path)
    else:
        b, path = open_bound_bundle(bundle, kernel_bindings), os.fspath(bundle)
    kind = bundle_kind(b.runnable())
    cls = DecoderPipeline if kind == "decoder" else EncoderPipeline
    return cls(
        path,
        kernel_bindings=kernel_bindings,
        device=device,
        engine=engine,
        progress=progress,
        announce=announce,
        bundle=b,
    )
