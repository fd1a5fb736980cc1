"""`mcore verify reference`: the engine against transformers on the same checkpoint, per step."""

from __future__ import annotations

import builtins
import re

import pytest
import transformers  # noqa: F401 - the reference; a test dependency, so its absence fails here

from .checkpoints import make_qwen3_bos_checkpoint, make_sentence_encoder_checkpoint
from .conftest import assert_user_error


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    from mcore.cli.main import main

    base = tmp_path_factory.mktemp("ref")
    q = make_qwen3_bos_checkpoint(base / "qwen3")
    e = make_sentence_encoder_checkpoint(base / "bert", "bert")
    assert main(["build", str(q), "--max-cache-length", "64", "-o", str(base / "q.bundle")]) == 0
    assert main(["build", str(e), "-o", str(base / "e.bundle")]) == 0
    return {"q": (q, base / "q.bundle"), "e": (e, base / "e.bundle")}


def _steps(out: str) -> list[tuple[int, float, float, int, int]]:
    rows = re.findall(r"step (\d+) \([^)]*\): max_abs=(\S+) cosine=(\S+) engine_token=(\d+) reference_token=(\d+)", out)
    return [(int(a), float(b), float(c), int(d), int(e)) for a, b, c, d, e in rows]


@pytest.mark.parametrize("chat", [False, True])
def test_decoder_matches_transformers_step_by_step(built, mcore, chat):
    ckpt, bundle = built["q"]
    res = mcore(
        "verify",
        "reference",
        bundle,
        "--checkpoint",
        ckpt,
        "--prompt",
        "The quick brown fox",
        "--max-new-tokens",
        "6",
        *(["--chat"] if chat else []),
    )
    assert res.code == 0, res
    steps = _steps(res.out)
    assert [s[0] for s in steps] == list(range(6))
    assert all(m < 1e-4 and c > 0.99999 and e == r for _, m, c, e, r in steps)
    assert "token IDs equal to transformers' tokenizer" in res.out
    assert "first_diverging_token=none" in res.out
    assert res.out.strip().splitlines()[-1].startswith("PASS: reference check (6 step(s)")


def test_encoder_matches_transformers(built, mcore):
    ckpt, bundle = built["e"]
    res = mcore("verify", "reference", bundle, "--checkpoint", ckpt, "--prompt", "The Quick brown FOX.")
    assert res.code == 0, res
    m = re.search(r"encoder hidden states: max_abs=(\S+) cosine=(\S+)", res.out)
    assert m and float(m.group(1)) < 1e-4 and float(m.group(2)) > 0.99999


def test_a_wrong_engine_is_caught(built, mcore, monkeypatch):
    """Break the engine's logits (a stand-in for a wrong kernel or family): the check fails and
    names the first diverging step."""
    from mcore.runtime import pipeline as P

    ckpt, bundle = built["q"]
    real_init = P.DecoderPipeline.__init__

    def init(self, *a, **kw):
        real_init(self, *a, **kw)
        dec = self.runners["decode"]

        def broken(ids, cl, *caches):
            (logits,) = dec(ids, cl, *caches)
            return (logits.flip(-1),)

        self.runners["decode"] = broken

    monkeypatch.setattr(P.DecoderPipeline, "__init__", init)
    res = mcore(
        "verify", "reference", bundle, "--checkpoint", ckpt, "--prompt", "The quick brown fox", "--max-new-tokens", "3"
    )
    assert res.code == 1, res
    assert "first_diverging_token=step 1" in res.out
    assert res.out.strip().splitlines()[-1].startswith("FAIL: reference check")


def test_checkpoint_must_be_the_bundles(built, mcore):
    ckpt, _ = built["e"]
    _, qbundle = built["q"]
    assert_user_error(
        mcore("verify", "reference", qbundle, "--checkpoint", ckpt, "--prompt", "hi"),
        "config.json differs from the bundle's",
    )


def test_without_transformers_says_how_to_install(built, mcore, monkeypatch):
    real_import = builtins.__import__

    def no_transformers(name, *a, **kw):
        if name == "transformers" or name.startswith("transformers."):
            raise ImportError(name)
        return real_import(name, *a, **kw)

    monkeypatch.setattr(builtins, "__import__", no_transformers)
    ckpt, bundle = built["q"]
    assert_user_error(
        mcore("verify", "reference", bundle, "--checkpoint", ckpt, "--prompt", "hi"), "pip install transformers"
    )


def _scaled_copy(src, dst, name: str, factor: float):
    """The checkpoint at `src` with one tensor scaled (config untouched): transformers then computes
    what a bundle with that tensor scaled would."""
    import shutil

    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    (path,) = [p for p in dst.glob("*.safetensors")]
    state = load_file(str(path))
    state[name] = state[name] * factor
    save_file(state, str(path), metadata={"format": "pt"})
    return dst


@pytest.mark.parametrize("tensor,factor,rel", [("model.norm.weight", 2.0, 0.5), ("lm_head.weight", 1.5, 1 / 3)])
def test_values_are_gated_not_only_their_direction(built, mcore, monkeypatch, tmp_path, tensor, factor, rel):
    """A doubled final norm (or lm_head x1.5) keeps every cosine at 1.0 and every greedy token: the
    weight comparison names the tensor, and the relative error fails the values by itself."""
    import mcore.verify.reference as V

    ckpt, bundle = built["q"]
    other = _scaled_copy(ckpt, tmp_path / "scaled", tensor, factor)
    args = (
        "verify",
        "reference",
        bundle,
        "--checkpoint",
        other,
        "--prompt",
        "The quick brown fox",
        "--max-new-tokens",
        "3",
    )
    res = mcore(*args)
    assert res.code == 1, res
    assert "the bundle's weights are not the checkpoint's: 1 of" in res.out
    assert tensor.removeprefix("model.") in res.out
    monkeypatch.setattr(V, "weights_differences", lambda *a: [])  # the values alone
    res = mcore(*args)
    assert res.code == 1, res
    steps = _steps(res.out)
    assert all(c > 0.99999 and e == r for _, _, c, e, r in steps)  # what passed before
    rels = [float(x) for x in re.findall(r"reference_token=\d+ rel=(\S+)", res.out)]
    assert len(rels) == 3 and all(abs(x - rel) < 1e-3 for x in rels)
    assert res.out.strip().splitlines()[-1].startswith("FAIL: reference check") and "rel <= 0.05" in res.out


def test_a_bundle_whose_weights_are_not_those_it_recorded_is_named(built, mcore, tmp_path):
    from .test_bundle_contents import remake

    ckpt, bundle = built["q"]

    def swap(m):
        d = m["weights"]["tensor_sha256"]
        a, b = sorted(d)[:2]
        d[a], d[b] = d[b], d[a]

    bad = remake(bundle, tmp_path / "bad.bundle", swap)
    res = mcore("verify", "reference", bad, "--checkpoint", ckpt, "--prompt", "hi")
    assert res.code == 1 and "not those it recorded at build: 2 of" in res.out, res


def test_transformers_failing_to_load_the_checkpoint_is_one_line(built, mcore, tmp_path):
    import shutil

    ckpt, bundle = built["q"]
    other = tmp_path / "ckpt"
    shutil.copytree(ckpt, other)
    (other / "tokenizer_config.json").write_text('{"eos_token": 7}')  # mcore ignores it; transformers raises
    res = mcore("verify", "reference", bundle, "--checkpoint", other, "--prompt", "hi")
    assert_user_error(res, "transformers could not load the checkpoint's tokenizer")
    (other / "tokenizer_config.json").write_text((ckpt / "tokenizer_config.json").read_text())
    # the weights under another file name: mcore's reader takes a folder's one safetensors file, transformers does not
    (other / "model.safetensors").rename(other / "weights.safetensors")
    res = mcore("verify", "reference", bundle, "--checkpoint", other, "--prompt", "hi")
    assert_user_error(res, "transformers could not load the checkpoint")


def test_max_rel_must_be_a_finite_number(built, mcore):
    ckpt, bundle = built["q"]
    assert_user_error(
        mcore("verify", "reference", bundle, "--checkpoint", ckpt, "--prompt", "hi", "--max-rel", "nan"), "--max-rel"
    )


def test_a_prompt_past_the_kv_cache_is_refused_before_anything_loads(built, mcore):
    # it was said once the pipeline had loaded (on an 8B model a minute or more of compiling)
    ckpt, bundle = built["q"]
    r = mcore("verify", "reference", bundle, "--checkpoint", ckpt, "--prompt", "hi", "--max-new-tokens", "999")
    assert_user_error(r, "+ --max-new-tokens 999 need", "but the KV cache holds 64")
    assert "pipeline ready" not in r.err and "transformers" not in r.err
