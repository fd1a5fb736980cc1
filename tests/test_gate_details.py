"""The gates' typed details (mcore/verify/details.py) write the JSON object each gate returned before they
were typed, key for key and in order: the EXPECTED strings are what the dict-returning gates (before issue 29)
gave on these inputs, dumped with json.dumps. from_dict reads each back to an equal value."""

from __future__ import annotations

import json

import pytest

from mcore.verify import details as D
from mcore.verify import logits as L
from mcore.verify import reference as RF
from mcore.verify.compare import compare_embeddings, compare_tokens
from mcore.verify.perf import perf_gate

# fmt: off
EXPECTED = {
    'tok_pass': '{"records": 1, "tokens": 3}',
    'tok_diff': '{"records": 1, "first_record": 1, "first_position": 2, "native": 3, "external": "<end>"}',
    'tok_diff2': '{"records": 1, "first_record": 1, "first_position": 1, "a": 2, "b": 5}',
    'tok_count': '{"records": 1, "a_records": 2, "b_records": 1}',
    'emb_pass': '{"values": 2, "max_abs": 0.0009999999999998899, "cosine": 0.9999999800159909, "max_abs_limit": 0.02, "min_cosine": 0.999}',
    'emb_fail': '{"values": 2, "max_abs": 0.5, "cosine": 0.9965457582448796, "max_abs_limit": 0.02, "min_cosine": 0.999, "reason": "max_abs 0.5 > 0.02; cosine 0.996545758 < 0.999"}',
    'emb_len': '{"values": 2, "x_values": 2, "y_values": 1}',
    'emb_nan': '{"values": 2, "reason": "non-finite values"}',
    'emb_zero': '{"values": 2, "max_abs": 0.0, "reason": "zero-norm embedding"}',
    'perf_promote': '{"pairs": 3, "pairs_requested": 3, "warmup": 0, "min_ratio": 0.98, "confidence": 0.95, "native": [100.0, 100.0, 100.0], "external": [101.0, 101.0, 101.0], "ratios": [1.01, 1.01, 1.01], "order": [["native", "external"], ["external", "native"], ["native", "external"]], "verdict": "PROMOTE", "ratio": 1.01, "median_ratio": 1.01, "interval": {"low": 1.01, "high": 1.01, "confidence": 0.95, "t": 4.302652729749752, "sd_log": 0.0}, "rule": "PROMOTE when the whole 95% t-interval of the pairs\' mean log-ratio (mean \\u00b1 t \\u00d7 sd / \\u221apairs) is at or above 0.98, REJECT when it is wholly below, INCONCLUSIVE when it straddles", "stop": null, "native_median": 100.0, "external_median": 101.0, "unit": "embeddings/s", "metric": "throughput", "generated_tokens_mean": null}',
    'perf_auto': '{"pairs": 3, "pairs_requested": "auto", "warmup": 0, "min_ratio": 0.98, "confidence": 0.95, "native": [100.0, 100.0, 100.0], "external": [50.0, 50.0, 50.0], "ratios": [0.5, 0.5, 0.5], "order": [["native", "external"], ["external", "native"], ["native", "external"]], "verdict": "REJECT", "ratio": 0.5, "median_ratio": 0.5, "interval": {"low": 0.5, "high": 0.5, "confidence": 0.995, "t": 14.08904727555273, "sd_log": 0.0}, "rule": "PROMOTE when the whole 99.5% t-interval of the pairs\' mean log-ratio (mean \\u00b1 t \\u00d7 sd / \\u221apairs) is at or above 0.98, REJECT when it is wholly below, INCONCLUSIVE when it straddles; --pairs auto checks after each pair from pair 3 to pair 12, each check at 99.5% (Bonferroni over 10 checks: 95% overall)", "stop": "decided after 3 pairs", "native_median": 100.0, "external_median": 50.0, "unit": "embeddings/s", "metric": "throughput", "generated_tokens_mean": null}',
    'perf_fail': '{"pairs": 0, "pairs_requested": 3, "warmup": 0, "min_ratio": 0.98, "confidence": 0.95, "native": [], "external": [], "ratios": [], "order": [["native", "external"]], "verdict": "FAIL"}',
    'perf_fail_warm': '{"pairs": 0, "pairs_requested": 3, "warmup": 1, "min_ratio": 0.98, "confidence": 0.95, "native": [], "external": [], "ratios": [], "order": [], "verdict": "FAIL"}',
    'logits': '{"steps": [{"step": 0, "max_abs": 0.0, "native": 5, "external": 5}, {"step": 1, "max_abs": 0.5, "native": 6, "external": 7}], "max_abs": 0.5, "first_divergence": 1, "tokens": [1, 2, 5, 6], "limit": 0.0, "engine": "torch", "device": "cpu"}',
    'ref_dec': '{"prompt_tokens": 7, "steps": [{"step": 0, "max_abs": 0.01, "rel": 0.001, "cosine": 0.9999, "engine_token": 3, "reference_token": 3}, {"step": 1, "max_abs": 0.02, "rel": 0.002, "cosine": 0.99, "engine_token": 4, "reference_token": 5}], "first_diverging_step": 1, "min_cosine": 0.99, "max_abs": 0.02, "max_rel": 0.002}',
    'ref_enc': '{"prompt_tokens": 3, "steps": [{"step": 0, "max_abs": 0.01, "rel": 0.001, "cosine": 0.9999, "engine_token": null, "reference_token": null}], "first_diverging_step": null, "min_cosine": 0.9999, "max_abs": 0.01, "max_rel": 0.001}',
}
# fmt: on


def _rec(tokens: list[int]) -> dict:
    return {"prompt": "x", "tokens": tokens}


def _speed(n: int) -> str:
    return f"echo 'embeddings_per_sec={n}'"


def _reference(steps: list, decoder: bool, limits: tuple, prompt_tokens: int):
    return RF._verdict(steps, decoder, limits, [], prompt_tokens)


S = RF.StepStats
LOGIT_STEPS = [
    {"step": 0, "max_abs": 0.0, "native": 5, "external": 5},
    {"step": 1, "max_abs": 0.5, "native": 6, "external": 7},
]
SCENARIOS = {
    "tok_pass": lambda: compare_tokens([_rec([1, 2, 3])], [_rec([1, 2, 3])]),
    "tok_diff": lambda: compare_tokens([_rec([1, 2, 3])], [_rec([1, 2])]),
    "tok_diff2": lambda: compare_tokens([_rec([1, 2, 3])], [_rec([1, 5, 3])], labels=("a", "b")),
    "emb_pass": lambda: compare_embeddings([1.0, 2.0], [1.0, 2.001]),
    "emb_fail": lambda: compare_embeddings([1.0, 2.0], [1.0, 2.5], labels=("x", "y")),
    "emb_len": lambda: compare_embeddings([1.0, 2.0], [1.0], labels=("x", "y")),
    "emb_nan": lambda: compare_embeddings([1.0, float("nan")], [1.0, 1.0]),
    "emb_zero": lambda: compare_embeddings([0.0, 0.0], [0.0, 0.0]),
    "perf_promote": lambda: perf_gate(_speed(100), _speed(101), pairs=3, warmup=0),
    "perf_auto": lambda: perf_gate(_speed(100), _speed(50), pairs="auto", warmup=0),
    "perf_fail": lambda: perf_gate(_speed(100), "exit 3", pairs=3, warmup=0),
    "perf_fail_warm": lambda: perf_gate(_speed(100), "exit 3", pairs=3, warmup=1),
    "logits": lambda: L._lockstep_result(LOGIT_STEPS, 1, [1, 2, 5, 6], 0.0, "torch", "cpu"),
    "ref_dec": lambda: _reference(
        [S(0, 0.01, 0.9999, 3, 3, 0.001), S(1, 0.02, 0.99, 4, 5, 0.002)], True, (0.999, None, 0.05), 7
    ),
    "ref_enc": lambda: _reference([S(0, 0.01, 0.9999, None, None, 0.001)], False, (0.999, 0.1, 0.05), 3),
}
LABELS = {"tok_diff2": ("a", "b"), "emb_fail": ("x", "y"), "emb_len": ("x", "y")}


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_details_write_the_json_the_gates_wrote(name):
    assert json.dumps(SCENARIOS[name]().details.to_dict()) == EXPECTED[name]


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_details_read_back_equal(name):
    d = SCENARIOS[name]().details
    data = json.loads(json.dumps(d.to_dict()))
    kw = {"labels": LABELS[name]} if name in LABELS else {}
    back = type(d).from_dict(data, **kw)
    assert back == d and json.dumps(back.to_dict()) == EXPECTED[name]


def test_a_recorded_token_count_fail_still_reads_back():
    """Unequal record counts were a FAIL with each side's count until they became a usage error: a
    session that recorded one still reads back, and the gate now refuses the same input (exit 2)."""
    from mcore.common.errors import UserError

    back = D.TokensDetails.from_dict(json.loads(EXPECTED["tok_count"]), labels=("a", "b"))
    assert back == D.TokensDetails(1, counts=(2, 1), labels=("a", "b"))
    assert json.dumps(back.to_dict()) == EXPECTED["tok_count"]
    with pytest.raises(UserError, match="a has 2 records but b has 1"):
        compare_tokens([_rec([1]), _rec([2])], [_rec([1])], labels=("a", "b"))


def test_reference_cases_that_stop_before_any_step():
    """The weights or the token IDs differ: the gate returns before a step runs (a bundle is needed to
    reach them through reference_check; the objects are what it builds)."""
    wrong = D.ReferenceDetails(weights_differ=("model.norm.weight differs",))
    assert wrong.to_dict() == {"weights_differ": ["model.norm.weight differs"]}
    tokens = D.ReferenceDetails(5, token_mismatch_at=2)
    assert json.dumps(tokens.to_dict()) == '{"prompt_tokens": 5, "steps": [], "token_mismatch_at": 2}'
    for d in (wrong, tokens):
        assert D.ReferenceDetails.from_dict(d.to_dict()) == d and d.worst is None


def test_perf_ratio_is_the_decisions():
    decided, failed = SCENARIOS["perf_auto"]().details, SCENARIOS["perf_fail"]().details
    assert decided.decision is not None and decided.ratio == decided.decision.ratio == 0.5
    assert failed.decision is None and failed.ratio is None and failed.order == (("native", "external"),)
