"""FlashInfer's batch-1 decode attention on the CuTe bench's shapes: the FlashInfer rows of
bench/attention_gpu.py (issue 31, deliverable 3).

FlashInfer takes the attended length on the host: its paged decode plans the split schedule from the
host page table (`plan`, before a CUDA graph is captured or replayed) and its single decode takes the
length from the shape of a contiguous [KV, n, D] cache. The slot passes the length as an int32 on the
device and is replayed inside the engine's CUDA graph at every length, with no host step between
layers. So the rows here plan on the host for each context: what FlashInfer does outside the slot.

Planning once for the whole capacity and rewriting only the page table (indptr, indices, last page
length) from the device length does not work (the row that did so is, by every sign, what stalled
the tenth session's FlashInfer child): with
use_cuda_graph the plan always splits the keys (split_kv), fixing kv_chunk_size and the tiles
(request_indices, kv_tile_indices, o_indptr, block_valid_mask) for the capacity. The paged kernel
(data/include/flashinfer/attention/decode.cuh, BatchDecodeWithPagedKVCacheDevice) then computes a
tile's keys as chunk_end - chunk_start in uint32, chunk_start = tile * kv_chunk_size and
chunk_end = min(chunk_start + kv_chunk_size, kv_len): every tile that starts past the device length
wraps to about 4e9 keys: a loop of ~5e8 steps of 8 keys a block (GQA 4), re-reading the cache's
first row where the protective page lookup clamps it, so the call does not finish in any budget
(and would be wrong if it did). flashinfer-python 0.7.4, read in the carried sources. Following
a device length needs the tile tables rewritten on the device as well (FlashInfer's private plan
layout in its int workspace), the "length patch" kernels/README.md describes.
"""

from __future__ import annotations

import hashlib
import os
import sys
import tarfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

PAGE = 16  # keys a page: FlashInfer splits a request's keys at page boundaries


def load(archive: str | None) -> tuple[Any, str]:
    """(flashinfer, its version) or (None, why it is not there). `archive`: bench/flashinfer_carry.py's
    output, unpacked once under /tmp and put first on sys.path; the JIT cache goes under /tmp too."""
    if archive:
        if not Path(archive).is_file():
            return None, f"{archive} not found (bench/flashinfer_carry.py makes it)"
        digest = hashlib.sha256(Path(archive).read_bytes()).hexdigest()[:12]
        root = Path("/tmp") / f"flashinfer-carry-{digest}"
        if not (root / "flashinfer" / "__init__.py").is_file():
            with tarfile.open(archive) as tar:
                tar.extractall(root, filter="data")
        sys.path.insert(0, str(root))
    os.environ.setdefault("FLASHINFER_WORKSPACE_BASE", "/tmp/flashinfer-jit")
    try:
        import flashinfer
    except Exception as e:  # noqa: BLE001 - any import failure is a reason to skip the rows
        return None, f"flashinfer is not importable ({type(e).__name__}: {str(e)[:200]})"
    return flashinfer, f"flashinfer {flashinfer.__version__} from {Path(flashinfer.__file__).parent}"


class PagedDecode:
    """BatchDecodeWithPagedKVCacheWrapper (backend fa2) over the bench's own caches [1, KV, C, D]:
    each KV head is one request of `group` query heads and one KV head, whose pages are the 16-key
    runs of that head's rows, so the cache is read in place (NHD pages [KV C/16, 16, 1, D])."""

    def __init__(self, fi: Any, kv: int, capacity: int, d: int, group: int, tensor_cores: bool):
        self.kv, self.pages, self.d, self.group = kv, capacity // PAGE, d, group
        dev = torch.device("cuda")
        self.indptr = torch.zeros(kv + 1, dtype=torch.int32, device=dev)
        self.indices = torch.zeros(kv * self.pages, dtype=torch.int32, device=dev)
        self.last = torch.zeros(kv, dtype=torch.int32, device=dev)
        self.wrapper = fi.BatchDecodeWithPagedKVCacheWrapper(
            torch.zeros(256 << 20, dtype=torch.uint8, device=dev),
            "NHD",
            use_cuda_graph=True,
            use_tensor_cores=tensor_cores,
            paged_kv_indptr_buffer=self.indptr,
            paged_kv_indices_buffer=self.indices,
            paged_kv_last_page_len_buffer=self.last,
            backend="fa2",
        )

    def plan(self, n: int) -> None:
        """The host plan for n attended keys a head (outside any graph)."""
        used = -(-n // PAGE)
        heads = torch.arange(self.kv, dtype=torch.int32)
        indices = (heads[:, None] * self.pages + torch.arange(used, dtype=torch.int32)[None, :]).reshape(-1)
        self.wrapper.plan(
            heads.new_tensor(list(range(0, (self.kv + 1) * used, used))),
            indices,
            torch.full((self.kv,), n - (used - 1) * PAGE, dtype=torch.int32),
            self.group,
            1,
            self.d,
            PAGE,
            q_data_type=torch.bfloat16,
            kv_data_type=torch.bfloat16,
            sm_scale=1.0,  # the query arrives scaled
        )

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, out: torch.Tensor) -> None:
        shape = (self.kv * self.pages, PAGE, 1, self.d)
        self.wrapper.run(
            q.view(self.kv, self.group, self.d),
            (k.view(shape), v.view(shape)),
            out=out.view(self.kv, self.group, self.d),
        )


def single_decode(fi: Any) -> Callable[[torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]:
    """single_decode_with_kv_cache on contiguous HND caches [KV, n, D] (the length is their shape)."""

    def run(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        out = fi.single_decode_with_kv_cache(q.view(-1, q.shape[-1]), k, v, kv_layout="HND", sm_scale=1.0)
        return out.view(q.shape)

    return run
