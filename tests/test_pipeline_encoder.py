"""Encoder bundles through the torch engine vs transformers; embed output and pooling."""

from __future__ import annotations

import json

import pytest
import torch

from mcore.bundle.build import build_bundle
from mcore.common.errors import UserError
from mcore.model.buildargs import BuildArgs
from mcore.runtime.pipeline import EncoderPipeline
from tests.checkpoints import make_bert_checkpoint, make_distilbert_checkpoint

PROMPT = "The quick brown fox jumps over the lazy dog."


@pytest.fixture(scope="module", params=["distilbert", "bert"])
def case(request, tmp_path_factory):
    d = tmp_path_factory.mktemp(request.param)
    maker = make_distilbert_checkpoint if request.param == "distilbert" else make_bert_checkpoint
    ckpt = maker(d / "model")
    bundle = build_bundle(BuildArgs(model=str(ckpt), precision="fp32", max_seq_length=64), d / "enc.bundle").bundle_path
    return request.param, ckpt, bundle


def reference(kind, ckpt, ids, mask):
    from transformers import BertModel, DistilBertModel

    cls = DistilBertModel if kind == "distilbert" else BertModel
    model = cls.from_pretrained(ckpt, dtype=torch.float32).eval()
    with torch.no_grad():
        return model(input_ids=ids[None].long(), attention_mask=mask[None].long()).last_hidden_state[0]


def test_hidden_states_match_transformers(case):
    kind, ckpt, bundle = case
    pipe = EncoderPipeline(str(bundle), device="cpu")
    ids, mask, n = pipe.inputs(PROMPT)
    hidden, n2 = pipe.hidden_states(PROMPT)
    assert hidden.shape == (64, 64) and n == n2
    ref = reference(kind, ckpt, ids, mask)
    torch.testing.assert_close(hidden[:n], ref[:n], atol=1e-4, rtol=1e-4)


def test_embed_flat_and_pooled(case, mcore):
    kind, ckpt, bundle = case
    pipe = EncoderPipeline(str(bundle), device="cpu")
    hidden, n = pipe.hidden_states(PROMPT)
    flat = pipe.embed(PROMPT)
    assert len(flat) == 64 * 64 and flat == hidden.reshape(-1).tolist()
    torch.testing.assert_close(torch.tensor(pipe.embed(PROMPT, "mean")), hidden[:n].mean(0))
    assert pipe.embed(PROMPT, "cls") == hidden[0].tolist()
    r = mcore("embed", bundle, "--prompt", PROMPT, "--pooling", "mean", "--device", "cpu")
    assert r.code == 0, r
    assert json.loads(r.out)["embedding"] == pytest.approx(hidden[:n].mean(0).tolist(), abs=1e-6)
    assert "{" not in r.err  # logs on stderr, JSON only on stdout


def test_prompt_longer_than_sequence_is_clear(case):
    _, _, bundle = case
    pipe = EncoderPipeline(str(bundle), device="cpu")
    with pytest.raises(UserError, match="--max-seq-length is 64"):
        pipe.embed("word " * 200)


def test_wrong_pipeline_kind_is_clear(case, mcore):
    _, _, bundle = case
    r = mcore("run", bundle, "--prompt", "x", "--greedy")
    assert r.code == 2 and "use `mcore embed`" in r.err
