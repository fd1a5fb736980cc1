"""Start-up as a user meets it (issue 32): whole `mcore run` processes, first token printed.

    python3 bench/startup.py OUT [--device cpu|cuda] [--config 8b|deep-narrow] [--modes regional,whole]
                                [--capacity N] [--skip-build]

For each compile mode (regional: the default, each distinct region of a role graph compiled once,
the decode role in a helper process where the engine does that (CUDA); whole: MCORE_REGIONAL=0
MCORE_PARALLEL_ROLES=0, each role graph compiled as one, in this process, as before) in a cache of its own, emptied
first: the cold process (`mcore run A --prompt ... --max-new-tokens 1`, empty caches), a warm second
process, then the first process of a fine-tune B (another checkpoint folder, other random weights,
the same config) on the now warm cache; then, in one more process, the logits of a fixed prompt and
forced tokens hashed (the modes must agree bit for bit). Times: the first token printed (seconds
from the process start to its stdout line), the process's end, and its CPU seconds (user + system,
children included: on a shared CPU the wall clock measures the neighbours too).

bench/engine_gpu.py runs `startup_rows` as its `startup` part on the GPU; on a CPU, the deep narrow
config (the 8B's 36 layers at hidden 256) shows the same compile work per layer.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

PROMPT = "The capital of France is"
# the default, and the compile as it was before issue 32 (each role graph whole, one after the other)
MODES = {"regional": {}, "whole": {"MCORE_REGIONAL": "0", "MCORE_PARALLEL_ROLES": "0"}}


def deep_narrow() -> dict:
    """The 8B config's depth and structure at a width a CPU compiles: 36 layers, hidden 256."""
    from qwen3_8b_config import QWEN3_8B

    return dict(
        QWEN3_8B,
        hidden_size=256,
        intermediate_size=512,
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=64,
        vocab_size=2048,
        max_position_embeddings=4096,
    )


def build_pair(
    out: Path,
    config: dict,
    device: str,
    capacity: int,
    names: tuple[str, str] = ("a", "b"),
    demo: str = "qwen3-tiny",
    fine_tune: bool = True,
) -> tuple[Path, Path]:
    """Bundle A and its 'fine-tune' B (OUT/NAME-CAPACITY.bundle): two checkpoint folders with the
    same config.json (B's also names where it came from, as a fine-tune's does), other random
    weights, the tokenizer of demo model `demo` (its IDs fit the vocabulary). `fine_tune=False`
    builds A alone (B's path is still returned)."""
    from qwen3_8b_config import write_config_folder

    from mcore.bundle.build import build_bundle
    from mcore.families.demo import materialize
    from mcore.model.buildargs import BuildArgs

    paths = []
    for name, seed, extra in ((names[0], 0, {}), (names[1], 1, {"_name_or_path": "someone/fine-tune"})):
        bundle = out / f"{name}-{capacity}.bundle"
        paths.append(bundle)
        if bundle.exists() or (seed and not fine_tune):
            continue
        folder = write_config_folder(out / f"cfg-{name}", {**config, **extra})
        for f in ("tokenizer.json", "tokenizer_config.json"):
            shutil.copy(materialize(demo) / f, folder)
        t = time.perf_counter()
        args = BuildArgs(model=str(folder), weights="random", seed=seed, precision="bf16", max_cache_length=capacity)
        build_bundle(args, str(bundle), device=device)
        print(f"built {bundle.name}: {time.perf_counter() - t:.1f} s", flush=True)
    return paths[0], paths[1]


def cache_env(cache: Path) -> dict[str, str]:
    """Every cache a compile writes, under one folder (emptied for a cold start)."""
    return {
        "MCORE_CACHE_DIR": str(cache),
        "TORCHINDUCTOR_CACHE_DIR": str(cache / "inductor"),
        "TRITON_CACHE_DIR": str(cache / "triton"),
    }


def run_process(cmd: list[str], env: dict[str, str], log: Path, timeout: float = 420) -> dict:
    """One whole process: seconds to its first stdout line (`mcore run` prints the generated text
    there once it has it; its progress goes to stderr, kept in `log`), to its end, and its CPU seconds."""
    t0 = time.perf_counter()
    first = None
    with open(log, "w") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, text=True, env={**os.environ, **env})
        assert proc.stdout is not None
        watchdog = threading.Timer(timeout, proc.kill)  # a hung process costs the run this long at most
        watchdog.start()
        text = []
        for line in proc.stdout:
            if first is None:
                first = time.perf_counter() - t0
            text.append(line)
        _, status, usage = os.wait4(proc.pid, 0)
        watchdog.cancel()
    proc.returncode = os.waitstatus_to_exitcode(status)
    end = time.perf_counter() - t0
    rec = {"first_token_s": first, "process_s": end, "cpu_s": usage.ru_utime + usage.ru_stime, "rc": proc.returncode}
    rec["text"] = "".join(text)[:200]
    if proc.returncode != 0 or first is None:
        lines = log.read_text().strip().splitlines()
        rec["error"] = (lines[-1] if lines else "no output")[:300]
        rec["first_token_s"] = None
    return rec


def mcore_run(bundle: Path, device: str) -> list[str]:
    return [sys.executable, "-m", "mcore", "run", str(bundle), "--engine", "compiled", "--device", device,
            "--prompt", PROMPT, "--max-new-tokens", "1", "--greedy"]  # fmt: skip


def prime_bytecode(env: dict[str, str]) -> float:
    """Import what a compile imports once, in a process of its own: where site-packages keep no
    bytecode (the GPU image), the first process would otherwise compile torch's sources to bytecode
    (seconds) inside the cold start (with PYTHONPYCACHEPREFIX set, as gpu_session.sh does)."""
    t = time.perf_counter()
    code = (
        "import importlib.util, mcore.runtime.pipeline, mcore.engines.compiled, torch._inductor.compile_fx, torch.export\n"
        "import torch._inductor.async_compile, torch._inductor.compile_worker.subproc_pool\n"
        "if importlib.util.find_spec('triton'): import triton, torch._inductor.codegen.triton"
    )
    subprocess.run([sys.executable, "-c", code], env={**os.environ, **env}, check=False)
    return time.perf_counter() - t


def startup_rows(
    out: Path, a: Path, b: Path, device: str, modes: list[str], note=print, hashed: bool = True
) -> list[dict]:
    """Per mode: cold A, warm A, fine-tune B's first process, the logits hash (module doc; not
    with `hashed=False`, where the caller hashes them). The caches stay: `startup_cache(out, mode)`."""
    rows = []
    for mode in modes:
        cache = startup_cache(out, mode)
        shutil.rmtree(cache, ignore_errors=True)
        env = mode_env(out, mode, device)
        rec: dict = {"part": "startup", "mode": mode}
        for label, bundle in (("cold", a), ("warm", a), ("fine_tune", b)):
            rec[label] = run_process(mcore_run(bundle, device), env, out / f"startup-{mode}-{label}.log")
            note(f"startup {mode} {label}: {fmt(rec[label])}")
        if hashed:
            rec["logits_sha256"] = logits_hash(a, device, env)
        rows.append(rec)
    return rows


def startup_cache(out: Path, mode: str) -> Path:
    return out / f"startup-cache-{mode}"


def mode_env(out: Path, mode: str, device: str) -> dict[str, str]:
    """The environment of a process of `mode`, over that mode's startup cache."""
    env = {**cache_env(startup_cache(out, mode)), **MODES[mode]}
    if device == "cpu":  # compile as on CUDA: precompiled roles (Inductor alone, kept as artifacts)
        env["MCORE_PRECOMPILED"] = "1"
    return env


def logits_hash(bundle: Path, device: str, env: dict[str, str]) -> str:
    """The part_hash process's digest (its own process, over `env`'s caches)."""
    r = subprocess.run(
        [sys.executable, __file__, str(bundle.parent), "--part", "hash", "--device", device, "--bundle", str(bundle)],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
    )
    got = [line[5:].strip() for line in r.stdout.splitlines() if line.startswith("HASH ")]
    return got[0] if got else f"error: {(r.stderr.strip().splitlines() or ['?'])[-1][:200]}"


def fmt(r: dict) -> str:
    if r.get("first_token_s") is None:
        return f"FAILED ({r.get('error', 'no token')})"
    return f"{r['first_token_s']:6.1f} s ({r['process_s']:.1f} s process, {r['cpu_s']:.0f} cpu-s)"


def table(rows: list[dict]) -> str:
    head = (
        f"{'compile mode':14} {'cold A (empty caches)':>36} {'warm A (second process)':>36} {'fine-tune B (first)':>36}"
    )
    lines = [
        "startup: whole `mcore run BUNDLE --prompt ... --max-new-tokens 1` processes; first token printed "
        "(process end, CPU seconds)",
        head,
        "-" * len(head),
    ]
    for r in rows:
        lines.append(f"{r['mode']:14} " + " ".join(f"{fmt(r[k]):>36}" for k in ("cold", "warm", "fine_tune")))
    hashes = {r["mode"]: r.get("logits_sha256") for r in rows if r.get("logits_sha256")}
    if not hashes:
        return "\n".join(lines)
    same = len(set(hashes.values())) == 1 and not any(str(h).startswith("error") for h in hashes.values())
    lines.append(
        "logits (prompt of 64 tokens + 16 forced steps) sha256: "
        + ", ".join(f"{m} {h}" for m, h in hashes.items())
        + (" (bit-identical)" if same and len(hashes) > 1 else "" if len(hashes) == 1 else " (DIFFERENT)")
    )
    return "\n".join(lines)


def part_hash(ns: argparse.Namespace) -> None:
    import hashlib

    import torch

    from mcore.runtime.pipeline import DecoderPipeline

    pipe = DecoderPipeline(ns.bundle, device=ns.device, engine="compiled")
    g, vocab = torch.Generator().manual_seed(1), int(pipe.config["vocab_size"])
    prompt = torch.randint(0, vocab, (64,), generator=g).tolist()
    forced = torch.randint(0, vocab, (16,), generator=g).tolist()
    logits = pipe.step_logits(prompt, forced) + pipe.step_logits(prompt[:1], forced[:2])
    print("HASH " + hashlib.sha256(b"".join(x.numpy().tobytes() for x in logits)).hexdigest()[:16], flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--config", choices=("deep-narrow", "8b"), default="deep-narrow")
    ap.add_argument("--modes", default="regional,whole")
    ap.add_argument("--capacity", type=int, default=2048)
    ap.add_argument("--part", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--bundle", default=None, help=argparse.SUPPRESS)
    ns = ap.parse_args()
    out = Path(ns.out)
    out.mkdir(parents=True, exist_ok=True)
    if ns.part == "hash":
        part_hash(ns)
        return
    modes = [m for m in ns.modes.split(",") if m]
    unknown = [m for m in modes if m not in MODES]
    if unknown:
        ap.error(f"--modes: unknown {unknown}; use {', '.join(MODES)}")
    from qwen3_8b_config import QWEN3_8B

    a, b = build_pair(out, QWEN3_8B if ns.config == "8b" else deep_narrow(), ns.device, ns.capacity)
    print(f"bytecode primed: {prime_bytecode({}):.1f} s", flush=True)
    rows = startup_rows(out, a, b, ns.device, modes)
    (out / "startup.json").write_text(json.dumps(rows, indent=1))
    print(table(rows))


if __name__ == "__main__":
    main()
