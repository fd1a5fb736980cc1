"""Two bench/engine_gpu.py runs side by side: the compiled engine's decode step of model A against
model B's at each context, in ms/token and as a share of each model's own roofline (its weights
plus the context's KV cache at the measured copy rate; the models read different bytes a token).

    python3 bench/compare_models.py A/engine_gpu.json B/engine_gpu.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def rows(path: Path) -> tuple[dict | None, dict | None]:
    """(the roofline record, the compiled engine's cold-compile record) of one run, None where absent."""
    recs = json.loads(path.read_text()) if path.is_file() else []
    roof = next((r for r in recs if r.get("part") == "roofline"), None)
    comp = next((r for r in recs if str(r.get("part", "")).startswith("mcore-compiled") and "error" not in r), None)
    return roof, comp


def share(roof: dict, ms: float, n: int) -> float:
    ideal_s = (roof["weight_bytes"] + n * roof["kv_bytes_per_position"]) / (roof["copy_TBps"] * 1e12)
    return ideal_s * 1e3 / ms


def main(a: str, b: str) -> int:
    (ra, ca), (rb, cb) = rows(Path(a)), rows(Path(b))
    if not (ra and ca and rb and cb):
        print(
            f"summary: a run is missing its roofline or compiled row ({a}: {bool(ra and ca)}, {b}: {bool(rb and cb)})"
        )
        return 1
    print(f"== decode step, compiled engine (cold-compile process): A={a} B={b}")
    print("| context | A ms/token | B ms/token | A/B time | A share of its roofline | B share | shares A-B |")
    for key, ms_a in sorted(ca["decode_ms"].items(), key=lambda kv: int(kv[0])):
        ms_b = cb["decode_ms"].get(key)
        if ms_b is None:
            continue
        n = int(key)
        sa, sb = share(ra, ms_a, n), share(rb, ms_b, n)
        print(
            f"| {n} | {ms_a:.3f} | {ms_b:.3f} | {ms_a / ms_b:.3f} | {sa:.1%} | {sb:.1%} | {100 * (sa - sb):+.1f} pt |"
        )
    print("A is as fast as B at a context when A/B time <= 1.03 (and its roofline share is within 3 points)")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]) if len(sys.argv) == 3 else print(__doc__) or 2)
