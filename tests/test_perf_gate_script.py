"""bench/perf_gate_gpu.sh refuses what it cannot run before it builds or writes anything."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "bench" / "perf_gate_gpu.sh"


@pytest.mark.parametrize(
    ("env", "says"),
    [
        ({"GATES": "cute-attention"}, "cute-attention needs MODEL=8b (head_dim 128)"),
        (
            {"GATES": "native-vs-native:2 bogus"},
            "unknown gate bogus (native-vs-native, identity-copy, slow-copy, cute-attention)",
        ),
        ({"GATES": "native-vs-native", "CONTEXT": "12x"}, "CONTEXT=12x: 12x is not a token count"),
        ({"GATES": "native-vs-native", "CONTEXT": "0"}, "CONTEXT=0: 0 is not a token count"),
        ({"GATES": "native-vs-native", "CONTEXT": "1024,8k"}, "CONTEXT=1024,8k: 8k is not a token count"),
    ],
)
def test_a_gate_it_cannot_run_is_named_in_one_line_and_nothing_is_written(tmp_path, env, says):
    out = tmp_path / "gate"
    r = subprocess.run(
        ["bash", str(SCRIPT), str(out)], env={**os.environ, "DEVICE": "cpu", **env}, capture_output=True, text=True
    )
    assert r.returncode == 2 and r.stderr.startswith(f"perf_gate_gpu.sh: {says}"), r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not out.exists()
