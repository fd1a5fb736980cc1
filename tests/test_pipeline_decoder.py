"""Generation through the torch engine vs transformers; KV cache in place; self-contained bundles."""

from __future__ import annotations

import os
import shutil

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from mcore.bundle.build import build_bundle
from mcore.common.errors import UserError
from mcore.model.buildargs import BuildArgs
from mcore.runtime.pipeline import DecoderPipeline
from tests.checkpoints import make_qwen3_checkpoint

PROMPT = "the quick brown fox jumps"


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return make_qwen3_checkpoint(
        tmp_path_factory.mktemp("qwen3ckpt") / "model", tie_word_embeddings=True, max_position_embeddings=4096
    )


def _bundle(ckpt, out, cache=64, **kw):
    args = BuildArgs(model=str(ckpt), precision="fp32", max_cache_length=cache, **kw)
    return build_bundle(args, out).bundle_path


@pytest.fixture(scope="module")
def native(ckpt, tmp_path_factory):
    return _bundle(ckpt, tmp_path_factory.mktemp("b") / "native.bundle")


def transformers_greedy(ckpt, ids, n):
    from transformers import Qwen3ForCausalLM

    model = Qwen3ForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()
    with torch.no_grad():
        out = model.generate(
            torch.tensor([ids]),
            max_new_tokens=n,
            min_new_tokens=n,
            do_sample=False,
            attention_mask=torch.ones(1, len(ids), dtype=torch.long),
            pad_token_id=0,
        )
    return out[0, len(ids) :].tolist()


def test_greedy_tokens_equal_transformers(ckpt, native):
    pipe = DecoderPipeline(str(native), device="cpu")
    r = pipe.generate(PROMPT, 20, greedy=True, stop_at_eos=False)
    assert len(r.tokens) == 20
    assert r.tokens == transformers_greedy(ckpt, r.prompt_tokens, 20)


def test_logits_match_transformers_each_step(ckpt, native):
    from transformers import Qwen3ForCausalLM

    pipe = DecoderPipeline(str(native), device="cpu")
    r = pipe.generate(PROMPT, 6, stop_at_eos=False)
    model = Qwen3ForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()
    seq = r.prompt_tokens + r.tokens
    with torch.no_grad():
        ref = model(torch.tensor([seq])).logits[0]
    # replay our graph step by step and compare each step's logits with the full-sequence reference
    caches = [torch.zeros_like(pipe.caches[n]) for n in pipe.cache_names]
    n0 = len(r.prompt_tokens)
    (lg,) = pipe.runners["prefill"](torch.tensor([r.prompt_tokens], dtype=torch.int32), *caches)
    torch.testing.assert_close(lg[0], ref[n0 - 1], atol=1e-4, rtol=1e-4)
    for i, tok in enumerate(r.tokens[:-1]):
        (lg,) = pipe.runners["decode"](
            torch.tensor([[tok]], dtype=torch.int32), torch.tensor([n0 + i], dtype=torch.int32), *caches
        )
        torch.testing.assert_close(lg[0], ref[n0 + i], atol=1e-4, rtol=1e-4)
    # a multi-token decode call (s=3) matches too
    (lg,) = pipe.runners["decode"](
        torch.tensor([seq[n0 - 1 : n0 + 2]], dtype=torch.int32), torch.tensor([n0 - 1], dtype=torch.int32), *caches
    )
    torch.testing.assert_close(lg[0], ref[n0 + 1], atol=1e-4, rtol=1e-4)


class AllocationLog(TorchDispatchMode):
    """Bytes of every tensor an op newly allocates (outputs that do not alias an input)."""

    def __init__(self):
        super().__init__()
        self.sizes: list[tuple[str, int]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        ins = {
            a.untyped_storage().data_ptr()
            for a in torch.utils._pytree.tree_leaves((args, kwargs))
            if isinstance(a, torch.Tensor)
        }
        for o in torch.utils._pytree.tree_leaves(out):
            if isinstance(o, torch.Tensor) and o.untyped_storage().data_ptr() not in ins:
                self.sizes.append((str(func), o.untyped_storage().nbytes()))
        return out


def decode_step_allocations(bundle, pos=10):
    pipe = DecoderPipeline(str(bundle), device="cpu")
    caches = [pipe.caches[n] for n in pipe.cache_names]
    ptrs = [c.data_ptr() for c in caches]
    pipe.generate(PROMPT, 2, stop_at_eos=False)
    log = AllocationLog()
    with log:
        pipe.runners["decode"](torch.tensor([[5]], dtype=torch.int32), torch.tensor([pos], dtype=torch.int32), *caches)
    assert [c.data_ptr() for c in caches] == ptrs  # the caches were written in place
    return log.sizes, caches[0].untyped_storage().nbytes()


def test_decode_step_cost_follows_active_length_not_capacity(ckpt, native, tmp_path):
    small, cache_small = decode_step_allocations(native)  # capacity 64
    big_bundle = _bundle(ckpt, tmp_path / "big.bundle", cache=4096)
    big, cache_big = decode_step_allocations(big_bundle)  # capacity 4096
    assert cache_big == 64 * cache_small
    assert max(n for _, n in big) < cache_big / 8, sorted(big, key=lambda x: -x[1])[:3]
    # the same allocations whatever the capacity: nothing is sized by it
    assert sorted(n for _, n in big) == sorted(n for _, n in small)


def test_cache_capacity_exceeded_is_clear(native):
    pipe = DecoderPipeline(str(native), device="cpu")
    with pytest.raises(UserError, match="KV cache holds 64"):
        pipe.generate(PROMPT, 200)


def test_bundle_is_self_contained(ckpt, tmp_path, monkeypatch):
    copy = tmp_path / "ckpt-copy"
    shutil.copytree(ckpt, copy)
    bundle = _bundle(copy, tmp_path / "own.bundle")
    want = DecoderPipeline(str(bundle), device="cpu").generate(PROMPT, 8, stop_at_eos=False).tokens
    shutil.rmtree(copy)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    got = DecoderPipeline(str(bundle), device="cpu").generate(PROMPT, 8, stop_at_eos=False).tokens
    assert got == want


def test_random_weights_bundle_is_deterministic(ckpt, tmp_path):
    b = _bundle(ckpt, tmp_path / "rand.bundle", weights="random", seed=3)
    t1 = DecoderPipeline(str(b), device="cpu").generate(PROMPT, 6, stop_at_eos=False).tokens
    t2 = DecoderPipeline(str(b), device="cpu").generate(PROMPT, 6, stop_at_eos=False).tokens
    assert t1 == t2
    assert os.path.getsize(b) < 200_000  # random weights are regenerated, not stored


@pytest.mark.parametrize("ahead", [False, True], ids=["step-by-step", "queued-ahead"])
def test_greedy_decode_queued_ahead_gives_the_same_tokens_and_stops_where_asked(ckpt, native, ahead):
    """decode_tokens with each next step queued before the pick is read (the CUDA default: the GPU
    never waits on the host between tokens) gives transformers' greedy tokens, as the step-by-step
    loop does; it stops at the count and right after an EOS (a step queued past it is dropped), and
    the next generation from the same pipeline is unchanged by that dropped step."""
    prompt = "the cat sat on the mat and then"  # its greedy tokens change along the way (most repeat one)
    pipe = DecoderPipeline(str(native), device="cpu")
    ids = pipe.encode(prompt)
    ref = transformers_greedy(ckpt, ids, 12)
    (first,) = pipe.generate(prompt, 1, stop_at_eos=False).tokens  # the prefill: the cache holds the prompt
    tokens, steps = pipe.decode_tokens(first, len(ids), 11, stop_at_eos=False, ahead=ahead)
    assert [first] + tokens == ref and len(steps) == 11
    k = next(i for i in range(2, 12) if ref[i] not in ref[:i])  # an EOS that first appears at token k
    pipe.eos_ids = {ref[k]}
    pipe.generate(prompt, 1, stop_at_eos=False)
    tokens, _ = pipe.decode_tokens(first, len(ids), 11, ahead=ahead)
    assert [first] + tokens == ref[: k + 1]
    assert pipe.generate(prompt, 12).tokens == ref[: k + 1]
    assert pipe.decode_tokens(ref[k], len(ids), 5, ahead=ahead) == ([], [])  # an EOS to start from: nothing
    with pytest.raises(UserError, match="past the KV cache"):
        pipe.decode_tokens(first, 60, 5, ahead=ahead)


def test_generation_reports_progress_and_cancels(native):
    from mcore.common.errors import Cancelled
    from mcore.common.progress import CancelToken, Progress

    pipe = DecoderPipeline(str(native), device="cpu")
    seen = []
    pipe.generate(PROMPT, 5, stop_at_eos=False, progress=Progress(lambda s, f: seen.append(f)))
    assert seen == [i / 5 for i in range(1, 5)]
    token = CancelToken()

    def cancel_at_three(step, frac):
        if frac >= 0.6:
            token.cancel()

    with pytest.raises(Cancelled):
        pipe.generate(PROMPT, 5, stop_at_eos=False, progress=Progress(cancel_at_three, token))
