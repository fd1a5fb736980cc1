"""The tutorial's two Python snippets, copied verbatim from the seed tutorial
(shared/seed/byok-tutorial.txt, step 4 and step 7), so tests can prove that the product's
output lines and files work with the tutorial's code unchanged (DESIGN.md §8).

Run one with `run_snippet(SNIPPET, arg1, arg2)`: like the tutorial's `python - A B <<'PY'`.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

# Tutorial step 4: `python - native.perf.log external.perf.log <<'PY' ... PY`
STEP4_PERF_SNIPPET = '''import re
import sys

def result(path):
    text = open(path, encoding="utf-8").read()
    matches = re.findall(
        r"generated_tokens_mean=([0-9.]+).*tokens_per_sec=([0-9.]+)", text
    )
    if not matches:
        raise SystemExit(f"{path}: benchmark result was not reported")
    generated_tokens, throughput = matches[-1]
    return float(generated_tokens), float(throughput)

native_tokens, native_throughput = result(sys.argv[1])
external_tokens, external_throughput = result(sys.argv[2])
print(f"native={native_throughput:.2f} external={external_throughput:.2f} tokens/s")
if external_tokens != native_tokens:
    raise SystemExit("FAIL: generated-token means differ")
if native_throughput <= 0 or external_throughput <= 0:
    raise SystemExit("FAIL: throughput must be positive")
ratio = external_throughput / native_throughput
if ratio < 0.98:
    raise SystemExit(f"FAIL: external/native throughput is {ratio:.4f}, below 0.98")
print(f"PASS: external/native throughput is {ratio:.4f}")
'''

# Tutorial step 7: `python - native.json byok.json <<'PY' ... PY`
STEP7_EMBEDDING_SNIPPET = '''import json
import math
import sys

with open(sys.argv[1], encoding="utf-8") as file:
    native = json.load(file)["embedding"]
with open(sys.argv[2], encoding="utf-8") as file:
    byok = json.load(file)["embedding"]
if not native or len(native) != len(byok):
    raise SystemExit("FAIL: embedding lengths differ")
max_abs = max(abs(a - b) for a, b in zip(native, byok))
denominator = math.sqrt(
    sum(value * value for value in native) * sum(value * value for value in byok)
)
cosine = sum(a * b for a, b in zip(native, byok)) / denominator
print(f"values={len(native)} max_abs={max_abs:.6g} cosine={cosine:.9f}")
if max_abs > 0.02 or cosine < 0.999:
    raise SystemExit("FAIL: numerical gate")
print("PASS: numerical gate")
'''

_REPO = Path(__file__).resolve().parents[1]


def tutorial_path() -> Path | None:
    """The seed tutorial, where this checkout can see it (repo/shared or a sibling shared/)."""
    for root in (_REPO, _REPO.parent):
        p = root / "shared" / "seed" / "byok-tutorial.txt"
        if p.is_file():
            return p
    return None


def run_snippet(snippet: str, *args: str | Path, timeout: float = 60) -> subprocess.CompletedProcess:
    """Run a snippet exactly as the tutorial does: the code on stdin of `python -`, files as argv."""
    return subprocess.run(
        [sys.executable, "-", *map(str, args)], input=snippet, text=True, capture_output=True, timeout=timeout
    )
