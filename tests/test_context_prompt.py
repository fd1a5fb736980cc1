"""bench/context_prompt.py: the prompt that sets a decode benchmark's context (bench/perf_gate_gpu.sh CONTEXT=N)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"


@pytest.fixture(scope="module")
def tokenizer_json() -> Path:
    from mcore.families.demo import materialize

    return materialize("qwen3-tiny") / "tokenizer.json"


@pytest.mark.parametrize("n", [1, 100, 1024, 8192])
def test_the_prompt_fills_the_context_without_passing_it(tokenizer_json, n):
    """Encoded by the same tokenizer, the prompt is at most N tokens and within 1% (or 2 tokens) of N."""
    from tokenizers import Tokenizer

    r = subprocess.run(
        [sys.executable, str(BENCH / "context_prompt.py"), str(n), str(tokenizer_json)],
        capture_output=True,
        text=True,
        check=True,
    )
    tokens = len(Tokenizer.from_file(str(tokenizer_json)).encode(r.stdout.rstrip("\n")).ids)
    assert tokens <= n and n - tokens <= max(2, n // 100)


def test_a_bad_count_is_refused_in_one_line(tokenizer_json):
    r = subprocess.run(
        [sys.executable, str(BENCH / "context_prompt.py"), "0", str(tokenizer_json)], capture_output=True, text=True
    )
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "N >= 1" in r.stderr


def test_a_missing_tokenizer_is_named_in_one_line(tmp_path):
    missing = tmp_path / "none.json"
    r = subprocess.run(
        [sys.executable, str(BENCH / "context_prompt.py"), "10", str(missing)], capture_output=True, text=True
    )
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and str(missing) in r.stderr
