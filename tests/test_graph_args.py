"""The typed graph args write the manifest's `graph_args` object as the dicts did, in the same key
order (the structure key and the snapshot metadata hash it), and read it back."""

import json

import pytest

from mcore.families.graph_args import GraphArgs


def test_decoder_and_encoder_objects_key_for_key():
    dec = GraphArgs("bf16", max_cache_length=256, decoder_engine_layout="split")
    enc = GraphArgs("fp16", max_seq_length=128)
    assert (
        json.dumps(dec.to_dict()) == '{"precision": "bf16", "max_cache_length": 256, "decoder_engine_layout": "split"}'
    )
    assert json.dumps(enc.to_dict()) == '{"precision": "fp16", "max_seq_length": 128}'
    for g in (dec, enc):
        assert GraphArgs.from_dict(json.loads(json.dumps(g.to_dict()))) == g
    assert dec.cache_length == 256 and enc.seq_length == 128


def test_reading_the_other_kinds_length_is_a_bug_not_a_number():
    with pytest.raises(ValueError, match="max_cache_length"):
        _ = GraphArgs("fp32", max_seq_length=8).cache_length
    with pytest.raises(ValueError, match="max_seq_length"):
        _ = GraphArgs("fp32", max_cache_length=8).seq_length
