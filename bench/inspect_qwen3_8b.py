"""Benchmark: `mcore graph inspect` of a Qwen3-8B-sized decode graph with no weights.

Targets (issue 2): under 20 s and under 2 GiB peak memory on a 2-core machine.
Runs the real CLI in a fresh process (so imports count) and reads its peak RSS.

    python bench/inspect_qwen3_8b.py [--runs 3]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from qwen3_8b_config import write_config_folder  # noqa: E402

TARGET_S = 20.0
TARGET_GIB = 2.0


def one_run(model: Path, out: Path) -> tuple[float, float]:
    cmd = [
        sys.executable,
        "-m",
        "mcore",
        "graph",
        "inspect",
        "--engine-role",
        "decode",
        "--snapshot",
        str(out),
        str(model),
        "--precision",
        "bf16",
        "--max-cache-length",
        "40960",
        "--decoder-engine-layout",
        "split",
    ]
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    t = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True)
    dt = time.perf_counter() - t
    if r.returncode != 0:
        sys.exit(f"inspect failed: {r.stderr.strip().splitlines()[-1] if r.stderr else r.returncode}")
    peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return dt, max(peak_kib, before) / (1024 * 1024)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as d:
        model = write_config_folder(Path(d) / "qwen3-8b-config")
        out = Path(d) / "decode.graph.json"
        times, peaks = [], []
        for _ in range(a.runs):
            dt, gib = one_run(model, out)
            times.append(dt)
            peaks.append(gib)
        snap = json.loads(out.read_text())
    med = statistics.median(times)
    peak = max(peaks)
    print(
        f"cores={os.cpu_count()} nodes={len(snap['nodes'])} tensors={len(snap['tensors'])} "
        f"recipes={len(snap.get('recipes', []))}"
    )
    print(
        f"inspect_seconds median={med:.2f} runs={[round(t, 2) for t in times]} target<{TARGET_S} ratio={med / TARGET_S:.2f}"
    )
    print(f"peak_rss_gib={peak:.2f} target<{TARGET_GIB} ratio={peak / TARGET_GIB:.2f}")


if __name__ == "__main__":
    main()
