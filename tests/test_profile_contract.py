"""Profile files are a typed contract (issue 27: `mcore profile diff` read them with two checks and
raised 15 tracebacks; `1e999` passed as infinity): every field is checked at load into one line
naming the file and the field, exit 2; a property-based fuzz of the reader; and a diff that refuses
profiles of different engines, roles or devices."""

from __future__ import annotations

import json

import pytest
from hypothesis import given

from mcore.common.errors import UserError
from mcore.profile.profiler import load_profile

from .conftest import assert_user_error
from .profile_reports import fixed_report
from .test_fuzz_contracts import FUZZ, mutated, one_line_or_ok


def _write(path, report) -> str:
    path.write_text(json.dumps(report))
    return str(path)


def test_the_fixed_reports_are_valid_profiles(tmp_path):
    for engine in ("torch", "compiled"):
        assert load_profile(_write(tmp_path / f"{engine}.json", fixed_report(engine))).engine.name == engine


@pytest.mark.parametrize(
    "change, fragments",
    [
        (lambda p: p.update(step_seconds=None), ["field step_seconds must be a number"]),
        (lambda p: p["nodes"][0].update(seconds=-1), ["field nodes[0].seconds must be a finite number >= 0"]),
        (lambda p: p["nodes"][0].update(bytes=True), ["field nodes[0].bytes must be a number"]),
        (lambda p: p["candidates"][1].pop("command"), ["field candidates[1].command is missing"]),
        (lambda p: p["candidates"][1].update(kind="x"), ["field candidates[1].kind must be one of recipe, region"]),
        (lambda p: p["modules"][2].update(extra=1), ["field modules[2].'extra' is not a profile field"]),
        (lambda p: p.update(schema_version=1), ["field schema_version is 1, not 2", "mcore profile BUNDLE -o FILE"]),
        (lambda p: p.update(kind="mcore-snapshot"), ["not an mcore profile"]),
        (lambda p: p["engine"].update(name="tensorrt"), ["field engine.name must be one of compiled, torch"]),
        (lambda p: p["device"].update(memory_bytes="lots"), ["field device.memory_bytes must be an integer"]),
        (lambda p: p["bundle"].update(model="\ud800"), ["field bundle.model must be a string"]),
        (lambda p: p.update(nodes={}), ["field nodes must be a list"]),
        (lambda p: p.update(context=10**400), ["field context must be an integer"]),
        (lambda p: p.update(steps=1.5), ["field steps must be an integer"]),
    ],
)
def test_bad_fields_are_one_line_errors_naming_the_field(tmp_path, mcore, change, fragments):
    good, bad = fixed_report(), fixed_report()
    change(bad)
    a = _write(tmp_path / "a.json", good)
    b = tmp_path / "b.json"
    b.write_text(json.dumps(bad))
    assert_user_error(mcore("profile", "diff", a, b), str(b), *fragments)


def test_numbers_json_would_read_as_infinite_or_nan_are_refused(tmp_path, mcore):
    good = _write(tmp_path / "a.json", fixed_report())
    text = json.dumps(fixed_report())
    for bad_number, why in (
        ("1e999", "must be a finite number >= 0 (got inf)"),
        ("NaN", "non-standard JSON constant NaN"),
        ("-Infinity", "non-standard JSON constant -Infinity"),
    ):
        bad = tmp_path / "b.json"
        bad.write_text(text.replace('"step_seconds": 1.0', f'"step_seconds": {bad_number}'))
        assert_user_error(mcore("profile", "diff", good, bad), why)
    dup = tmp_path / "dup.json"
    dup.write_text(text.replace('"steps": 3', '"steps": 3, "steps": 4'))
    assert_user_error(mcore("profile", "diff", good, dup), "duplicate key 'steps'")
    assert_user_error(mcore("profile", "diff", good, tmp_path / "missing.json"), "missing.json")


def test_diff_refuses_profiles_of_other_engines_roles_or_devices(tmp_path, mcore):
    torch_p = _write(tmp_path / "t.json", fixed_report("torch"))
    comp = _write(tmp_path / "c.json", fixed_report("compiled"))
    assert_user_error(mcore("profile", "diff", torch_p, comp), "engine 'torch'", "engine 'compiled'")
    enc = fixed_report("compiled")
    enc["role"] = "prefill"
    assert_user_error(mcore("profile", "diff", comp, _write(tmp_path / "p.json", enc)), "role 'decode'", "'prefill'")
    gpu = fixed_report("compiled")
    gpu["device"] = {"type": "cuda", "name": "NVIDIA H200", "copy_bytes_per_s": 4e12, "sm_count": 132}
    assert_user_error(mcore("profile", "diff", comp, _write(tmp_path / "g.json", gpu)), "device 'cpu'", "'cuda'")


def test_diff_of_compiled_profiles_compares_region_by_region(tmp_path, mcore):
    a = fixed_report("compiled")
    b = fixed_report("compiled")
    b["between_kernels"]["seconds"] = 0.10
    b["slots"] = [
        dict(binding_id="my.kernel@1", calls=2, seconds=0.15, share=0.15, headroom_seconds=0.0)
        | {k: 0 for k in ("bytes", "flops", "bytes_per_s", "flops_per_s", "limit_seconds", "ratio_to_limit")}
    ]
    b["recipes"] = [
        dict(recipe="qwen.decode_attention_region@2", instance=f"decoder.layers.{i}.decode_attention")
        | dict(node_ids=[f"node:{i}"], output_shape_input=None, calls=1, seconds=0.075, share=0.075, headroom_seconds=0)
        | {k: 0 for k in ("bytes", "flops", "bytes_per_s", "flops_per_s", "limit_seconds", "ratio_to_limit")}
        for i in (0, 1)
    ]
    r = mcore("profile", "diff", _write(tmp_path / "a.json", a), _write(tmp_path / "b.json", b))
    assert r.code == 0, r
    assert "engine compiled, role decode, context 128" in r.out
    assert "between kernels:" in r.out and "(-20.000 ms, x0.833)" in r.out
    assert "slot my.kernel@1:" in r.out and "+150.000 ms" in r.out
    assert "  qwen.decode_attention_region@2: 0.000 -> 150.000 ms (+150.000)" in r.out
    assert "qwen.decode_attention_region@2 decoder.layers.1.decode_attention: 0.000 -> 75.000 ms" in r.out


# ---------------------------------------------------------------- property-based fuzz of the reader


@given(data=mutated(fixed_report("compiled")))
@FUZZ
def test_fuzz_profile_reader(data, tmp_path):
    path = tmp_path / "p.json"
    path.write_bytes(data)
    try:
        p = load_profile(path)
    except UserError as e:
        assert "\n" not in str(e) and str(path) in str(e)
        return
    from mcore.profile.view import diff_lines, top_lines

    top_lines(p, 5)  # whatever the reader accepts, the views can print
    diff_lines(p, p)


@given(data=mutated(fixed_report("torch")))
@FUZZ
def test_fuzz_profile_diff_cli(data, tmp_path, mcore):
    good = _write(tmp_path / "a.json", fixed_report("torch"))
    bad = tmp_path / "b.json"
    bad.write_bytes(data)
    one_line_or_ok(mcore("profile", "diff", good, bad))
    one_line_or_ok(mcore("profile", "diff", bad, good))
