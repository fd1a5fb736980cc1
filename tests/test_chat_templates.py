"""A checkpoint's chat template is someone's program: whatever it does (raises, divides by zero,
recurses, asks for a huge value, loops for hours), rendering it is one line, exit 2, in bounded time."""

from __future__ import annotations

import json
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from mcore.common.errors import UserError
from mcore.model.tokenization import render_template

from .conftest import assert_user_error
from .test_fuzz_contracts import FUZZ

CONTEXT = {"messages": [{"role": "user", "content": "hi"}], "add_generation_prompt": True}

BAD = {
    "division by zero": ("{{ 1//0 }}", "ZeroDivisionError"),
    "recursion": ("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", "recurses too deeply"),
    "a huge string": ("{{ 'x' * 10**10 }}", "would build a value of 10000000000 items"),
    "a huge list": ("{{ ([1] * 1000) * 100000 }}", "would build a value"),
    "a huge power": ("{{ 10 ** (10 ** 8) }}", "would compute 10 ** 100000000"),
    "strftime_now of a number": ("{{ strftime_now(5) }}", "strftime_now takes a format string"),
    "nested 100k loops": (
        "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}",
        "budget of 2000000 operations",
    ),
    "raise_exception": ("{{ raise_exception('no system role') }}", "failed: no system role"),
    "unsafe attribute": ("{{ ''.__class__.__mro__ }}", "unsafe"),
    "syntax": ("{% for %}", "failed"),
}


@pytest.mark.timing
@pytest.mark.parametrize("case", list(BAD))
def test_a_bad_template_is_one_line_in_bounded_time(case):
    template, says = BAD[case]
    t0 = time.monotonic()
    with pytest.raises(UserError, match=None) as e:
        render_template(template, CONTEXT, "tokenizer.json: the chat template")
    assert time.monotonic() - t0 < 10
    assert says in str(e.value) and "\n" not in str(e.value)
    assert str(e.value).startswith("tokenizer.json: the chat template")


def test_a_template_past_its_time_budget_is_stopped(monkeypatch):
    import mcore.model.tokenization as T

    monkeypatch.setattr(T, "TEMPLATE_SECONDS", 0.2)
    monkeypatch.setattr(T, "TEMPLATE_OPS", 10**12)
    loops = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
    with pytest.raises(UserError, match="time budget of 0.2 s"):
        render_template(loops, CONTEXT, "t")


def test_a_good_template_renders_as_before():
    text = render_template(
        "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}{{ strftime_now('%Y')|length }}",
        CONTEXT,
        "t",
    )
    assert text == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n4"


@pytest.mark.timing
def test_mcore_run_chat_with_a_hostile_template_is_one_line(tmp_path, mcore):
    from mcore.bundle.build import build_bundle
    from mcore.model.buildargs import BuildArgs

    from .test_bundle_contents import remake

    native = build_bundle(BuildArgs(model="demo:qwen3-tiny", max_cache_length=64), tmp_path / "n.bundle").bundle_path
    loops = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"

    def template(mem: dict) -> None:
        mem["tokenizer_config.json"] = json.dumps(
            {**json.loads(mem["tokenizer_config.json"]), "chat_template": loops}
        ).encode()

    bad = remake(native, tmp_path / "bad.bundle", members=template)
    t0 = time.monotonic()
    assert_user_error(mcore("run", bad, "--prompt", "hi", "--chat"), "chat template was stopped")
    assert time.monotonic() - t0 < 30


# ---------------------------------------------------------------- fuzz

PIECES = st.sampled_from(
    [
        "{{ 1//0 }}",
        "{{ messages[0].content }}",
        "{{ messages[5] }}",
        "{% for m in messages %}",
        "{% endfor %}",
        "{% for i in range(100000) %}",
        "{% if add_generation_prompt %}",
        "{% endif %}",
        "{{ 'ab' * 600000 }}",
        "{{ 2 ** 99999999 }}",
        "{{ strftime_now('%Y-%m') }}",
        "{{ strftime_now(none) }}",
        "{{ raise_exception('x') }}",
        "{% macro f(n) %}{{ f(n) }}{% endmacro %}{{ f(1) }}",
        "{{ bos_token }}",
        "{{ x.y.z }}",
        "{{ messages|tojson }}",
        "{% set x = namespace(a=1) %}{{ x.a }}",
        "{{ ''.join }}",
        "{{",
        "}}",
        "{%",
        "text",
        "\n",
    ]
)


@pytest.mark.timing
@given(parts=st.lists(PIECES, max_size=6))
@FUZZ
def test_fuzz_chat_templates(parts):
    t0 = time.monotonic()
    try:
        out = render_template("".join(parts), CONTEXT, "t")
        assert isinstance(out, str)
    except UserError as e:
        assert "\n" not in str(e) and str(e).startswith("t ")
    assert time.monotonic() - t0 < 15
