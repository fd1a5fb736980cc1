"""Engines side by side on an 8B-sized bf16 config, batch 1, one run on the GPU (issues 8, 32).

    python3 bench/engine_gpu.py OUT_DIR [--model qwen3-8b|llama3.1-8b] [--contexts 128,1024,8192,32768]
                                [--capacity 40960] [--parts roofline,compiled,torch,hf-eager,hf-compiled]
                                [--steps 30] [--no-reload]
    python3 bench/engine_gpu.py OUT_DIR --parts roofline,startup,compiled,reference,prefill
                                --contexts 1024,32768 --steps 20 --extra-capacity=      (issue 32)

--model picks the config (bench/model_configs.py: Qwen3-8B, the default, or Llama-3.1-8B; random
weights). --no-reload skips the compiled engine's cached-reload run (the cold compile's row stays).

startup (bench/startup.py): whole `mcore run` processes, the first token printed: cold (empty
caches), warm (a second process), and a fine-tune's first (another checkpoint, same config); the
`compiled` row is then a reload from that cache. reference: the compile as it was before regional
compilation (MCORE_REGIONAL=0), cold, in a cache of its own: its step time and logits hash beside
the default's. prefill: prefill's time and share of the bf16 peak at 1k/8k/32k prompts, mcore's
compiled engine beside transformers (eager, sdpa attention).

Rows: the copy-bandwidth roofline (weights read once per token), mcore's compiled engine (cold
compile, then a cached reload in a fresh process), mcore's op-by-op engine, transformers eager
(DynamicCache after a real prefill) and transformers with a StaticCache and
torch.compile(mode="reduce-overhead", fullgraph=True) (the gpt-fast recipe). Decode is timed as a
user's greedy loop runs it: one step, argmax on the device, one read of the token, per token, at a
context of N cached tokens. Every part runs in its own process; a failing peer is reported, not hidden.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
DEV = os.environ.get("BENCH_DEVICE", "cuda")  # cpu: a smoke run of the script itself
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

from bench.startup import MODES, cache_env, mode_env, prime_bytecode, startup_rows  # noqa: E402
from bench.startup import table as startup_table  # noqa: E402


def _sync():
    import torch

    if DEV == "cuda":
        torch.cuda.synchronize()


def _median_ms(fn, steps: int) -> float:
    times = []
    for _ in range(steps):
        _sync()
        t = time.perf_counter()
        fn()
        _sync()
        times.append((time.perf_counter() - t) * 1e3)
    return statistics.median(times)


def bench_config(model: str) -> dict:
    """The config benchmarked: the 8B-sized one `--model` names (bench/model_configs.py), or
    BENCH_CONFIG (JSON; a CPU smoke run of the script)."""
    from bench.model_configs import config_of

    return json.loads(os.environ["BENCH_CONFIG"]) if "BENCH_CONFIG" in os.environ else config_of(model)


def _emit(rec: dict) -> None:
    print("RESULT " + json.dumps(rec), flush=True)


# ------------------------------------------------------------------------------------------ parts


def part_roofline(a) -> None:
    import torch

    n = 4 << 30  # 4 GiB each way: far past L2
    src = torch.empty(n, dtype=torch.uint8, device=DEV).random_()
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(10):
        dst.copy_(src)
    end.record()
    _sync()
    s = start.elapsed_time(end) / 10 / 1e3
    bw = 2 * n / s  # bytes read plus written
    from bench.model_configs import head_dim

    c = bench_config(a.model)
    h, i, L, v, d = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"], c["vocab_size"], head_dim(c)
    qkv = h * (c["num_attention_heads"] + 2 * c["num_key_value_heads"]) * d
    o = c["num_attention_heads"] * d * h
    weights = 2 * (L * (qkv + o + 3 * h * i) + v * h)  # bf16 bytes read per token (embedding row aside)
    kv_per_token = 2 * 2 * L * c["num_key_value_heads"] * d  # K and V bytes per cached position
    _emit({"part": "roofline", "copy_TBps": bw / 1e12, "weight_bytes": weights, "kv_bytes_per_position": kv_per_token})


def _bundle(a) -> str:
    return str(Path(a.out) / f"native-{a.model}-{a.capacity}.bundle")


def _determinism(pipe, save: str | None = None) -> dict:
    """Logits of a fixed 64-token prompt and 16 forced tokens, twice in this process: equal bit for
    bit? Their hash lets the table compare the cached reload (another process) with the cold run;
    `save`: the logits kept in that file, for comparing variants that change the bits."""
    import hashlib

    import torch

    g, vocab = torch.Generator().manual_seed(1), int(pipe.config["vocab_size"])
    prompt = torch.randint(0, vocab, (64,), generator=g).tolist()
    forced = torch.randint(0, vocab, (16,), generator=g).tolist()
    first = pipe.step_logits(prompt, forced)
    again = pipe.step_logits(prompt, forced)
    digest = hashlib.sha256(b"".join(x.numpy().tobytes() for x in first)).hexdigest()[:16]
    if save:
        torch.save(torch.stack([x.reshape(-1).float() for x in first]), save)
    return {
        "same_bits_twice": all(torch.equal(x, y) for x, y in zip(first, again, strict=True)),
        "logits_sha256": digest,
    }


def part_mcore(a) -> None:
    import torch

    from mcore.common.progress import Progress
    from mcore.runtime.pipeline import DecoderPipeline

    t0 = time.perf_counter()
    stamps = []

    def note(step, frac):  # where load time goes, kept in the part's log
        stamps.append(f"{time.perf_counter() - t0:7.2f}s {step}")
        print(stamps[-1], file=sys.stderr, flush=True)

    if a.prefill_only:
        _emit(_prefill_variant(a, note))
        return
    if a.decode_only:  # quick variant checks: load with the op-by-op engine, compile the decode role alone
        pipe, runner = _one_role(a, "decode", note)
        runner.prepare(
            pipe.step_ids, pipe.cache_length, *[pipe.caches[n] for n in pipe.cache_names], progress=Progress(note)
        )
        pipe.runners["decode"] = runner
        pipe.engine_name = "compiled-decode-only"
    else:
        profiler = None
        if a.profile_load:  # where a load's seconds go, by function (the timings below pay its overhead)
            import cProfile

            profiler = cProfile.Profile()
            profiler.enable()
        pipe = DecoderPipeline(_bundle(a), device=DEV, engine=a.engine, progress=Progress(note))
        if profiler is not None:
            import io
            import pstats

            profiler.disable()
            text = io.StringIO()
            stats = pstats.Stats(profiler, stream=text)
            stats.sort_stats("tottime").print_stats(40)  # own time first: cumulative mixes in recursion
            stats.sort_stats("cumulative").print_stats(60)
            Path(a.profile_load).write_text(text.getvalue())
    load_s = time.perf_counter() - t0
    compile_s = sum(getattr(r, "compile_s", 0.0) or 0.0 for r in pipe.runners.values())
    caches = [pipe.caches[n] for n in pipe.cache_names]
    g = torch.Generator(device=DEV).manual_seed(0)
    for c in caches:  # never time on zeros
        c.normal_(generator=g)
    dec = pipe.runners["decode"]
    vocab = int(pipe.config["vocab_size"])
    rec = {
        "part": f"mcore-{pipe.engine_name}",
        "capacity": a.capacity,
        "load_s": load_s,
        "compile_s": compile_s,
        "engine": pipe.engine_lines(),
        "load_stamps": stamps,
        "decode_ms": {},
    }
    tok = [1234 % vocab]  # any token of the vocabulary (a smoke config's may be small)

    def step():
        pipe.step_ids.fill_(tok[0])
        (logits,) = dec(pipe.step_ids, pipe.cache_length, *caches)
        tok[0] = int(torch.argmax(logits).item()) % vocab

    for n in a.contexts:
        pipe.cache_length.fill_(n)
        for _ in range(3):
            step()
        count = a.steps if pipe.engine_name != "torch" else min(a.steps, 8)
        rec["decode_ms"][n] = _median_ms(step, count)
        # the product's own greedy loop (mcore run, generate): each next step queued before the pick is read
        _, seconds = pipe.decode_tokens(tok[0], n, count + 3, stop_at_eos=False)
        rec.setdefault("loop_ms", {})[n] = statistics.median(seconds[3:]) * 1e3
    if (1024 in a.contexts or a.ttft) and not a.decode_only:
        ids = torch.randint(0, vocab, (1, 1024), dtype=torch.int32, device=DEV, generator=g)

        def first():
            (logits,) = pipe.runners["prefill"](ids, *caches)
            int(torch.argmax(logits).item())

        first()
        rec["ttft_1k_ms"] = _median_ms(first, 5)
    if a.prefill and not a.decode_only:
        rec["prefill_ms"] = _prefill_ms(lambda ids: pipe.runners["prefill"](ids, *caches)[0], a.prefill, vocab)
    # deliverable 3 on this config: the same bits twice, and after a reload (a decode-only variant:
    # its own decode step after the op-by-op prefill, kept for the comparison between variants)
    rec.update(_determinism(pipe, a.save_logits))
    if getattr(dec, "graphs", None) is not None:
        rec["decode_replays_cuda_graph"] = bool(dec.graphs) and dec.calls_compiled == 0
        rec["decode_graph_nodes"] = graph_nodes(dec, (pipe.step_ids, pipe.cache_length, *caches))
    _emit(rec)


def _one_role(a, role: str, note):
    """(the pipeline loaded with the op-by-op engine, a compiled runner of its `role` alone, not yet
    prepared): a variant compiles only the role it compares, as the compiled engine would."""
    from mcore.common.progress import Progress
    from mcore.engines.compiled import CompiledRoleRunner, fuse_projections
    from mcore.engines.fusion import fuse_sibling_projections
    from mcore.runtime.pipeline import DecoderPipeline

    pipe = DecoderPipeline(_bundle(a), device=DEV, engine="torch", progress=Progress(note))
    prepared = pipe.runners[role].prepared
    if fuse_projections():
        fuse_sibling_projections(prepared)
    return pipe, CompiledRoleRunner(prepared, pipe.device, f"{role}-variant-{os.getpid()}")


def _prefill_variant(a, note) -> dict:
    """A prefill-only variant: load with the op-by-op engine, compile the prefill role alone as the
    compiled engine does (dynamic token count), time each prompt length; the logits of a fixed 1k
    prompt twice (the same bits?) and saved for the comparison between variants."""
    import hashlib

    import torch

    from mcore.common.progress import Progress

    t0 = time.perf_counter()
    pipe, runner = _one_role(a, "prefill", note)
    caches = [pipe.caches[n] for n in pipe.cache_names]
    vocab = int(pipe.config["vocab_size"])
    g = torch.Generator(device=DEV).manual_seed(1)
    ids = torch.randint(0, vocab, (1, min(1024, a.capacity)), dtype=torch.int32, device=DEV, generator=g)
    runner.prepare(ids, *caches, progress=Progress(note), fixed_shapes=False)
    load_s = time.perf_counter() - t0
    first, again = (runner(ids, *caches)[0].float().cpu() for _ in range(2))
    rec = {
        "part": "mcore-prefill",
        "load_s": load_s,
        "engine": [f"prefill compiled in {runner.compile_s:.1f} s"],
        "same_bits_twice": bool(torch.equal(first, again)),
        "logits_of": f"a {ids.shape[1]}-token prompt's last token",
        "logits_sha256": hashlib.sha256(first.numpy().tobytes()).hexdigest()[:16],
        "prefill_ms": _prefill_ms(lambda x: runner(x, *caches)[0], a.prefill, vocab),
    }
    if a.save_logits:
        torch.save(first.reshape(1, -1), a.save_logits)
    return rec


def run_variants(a, recs: list, spec: str, role: str, cache: Path) -> list[tuple[str, Path]]:
    """Each ';'-separated variant of `spec` (space-separated env settings, or 'default') as a
    `role`-only mcore part in a process of its own, its rows added to `recs`; (variant, its saved
    logits) for the comparison between variants."""
    saved = []
    for i, variant in enumerate(v for v in spec.split(";") if v):
        env = dict(kv.split("=", 1) for kv in variant.split() if kv != "default")
        env["MCORE_CACHE_DIR"] = f"{cache}-{role}-variants"
        logits = Path(a.out) / f"{role}-variant-{i}-logits.pt"
        for r in run_part(a, "mcore", f"--{role}-only", "--save-logits", str(logits), env=env):
            r["label"] = f"{role}-only {variant}"
            recs.append(r)
        saved.append((variant, logits))
    return saved


def _prefill_ms(run, lengths: list[int], vocab: int, reps: int = 3) -> dict:
    """Median time of a prompt's prefill (its logits read back) at each length, after one warm-up."""
    import torch

    out = {}
    g = torch.Generator(device=DEV).manual_seed(3)
    for n in lengths:
        ids = torch.randint(0, vocab, (1, n), dtype=torch.int32, device=DEV, generator=g)

        def once(ids=ids):
            int(torch.argmax(run(ids)).item())

        once()
        out[n] = _median_ms(once, reps)
    return out


def prefill_flops(n: int, model: str) -> float:
    """Multiply-adds x2 of a prefill of n tokens on the 8B config: every projection over n rows,
    causal attention (half of the n x n scores and context), the logits of the last row only."""
    from bench.model_configs import head_dim

    c = bench_config(model)
    h, i, L, v = c["hidden_size"], c["intermediate_size"], c["num_hidden_layers"], c["vocab_size"]
    hq, hk, d = c["num_attention_heads"], c["num_key_value_heads"], head_dim(c)
    per_token = L * (h * (hq + 2 * hk) * d + hq * d * h + 3 * h * i)
    attention = L * 2 * (n * (n + 1) / 2) * hq * d  # QK^T and PV over the causal half
    return 2 * (n * per_token + attention + h * v)


def prefill_table(recs: list[dict], peak: float, model: str) -> str:
    rows = [r for r in recs if r.get("prefill_ms")]
    if not rows:
        return ""
    lengths = sorted({int(n) for r in rows for n in r["prefill_ms"]})
    head = f"{'prefill (one prompt, logits of its last token)':48} " + " ".join(f"{n:>22}" for n in lengths)
    lines = [f"prefill: ms and share of the bf16 peak ({peak / 1e12:.0f} TFLOPS)", head, "-" * len(head)]
    for r in rows:
        cells = []
        for n in lengths:
            ms = r["prefill_ms"].get(str(n), r["prefill_ms"].get(n))
            cells.append(
                f"{'-':>22}" if ms is None else f"{ms:9.1f} ms {prefill_flops(n, model) / (ms / 1e3) / peak:6.1%}"
            )
        lines.append(f"{r.get('label', r['part']):48} " + " ".join(f"{c:>22}" for c in cells))
    return "\n".join(lines)


def graph_nodes(runner, inputs) -> dict:
    """The decode step's CUDA graph node counts by type (kernel, memcpy, ...): how many launches a
    token costs. Captured once more with the graph kept (torch's own capture does not keep it)."""
    import torch

    try:
        from cuda.bindings import runtime as rt

        graph = torch.cuda.CUDAGraph(keep_graph=True)
        with torch.cuda.graph(graph):
            runner._run(inputs)
        raw = graph.raw_cuda_graph()
        err, _, count = rt.cudaGraphGetNodes(raw, 0)
        err, nodes, count = rt.cudaGraphGetNodes(raw, count)
        kinds: dict[str, int] = {}
        for node in nodes:
            err, kind = rt.cudaGraphNodeGetType(node)
            name = getattr(kind, "name", str(kind)).replace("cudaGraphNodeType", "").lower()
            kinds[name] = kinds.get(name, 0) + 1
        graph.reset()
        return kinds
    except Exception as e:  # noqa: BLE001 - a count is a diagnostic: the timings stand without it
        return {"unavailable": f"{type(e).__name__}: {str(e)[:120]}"}


def _hf_model(a):
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    conf = bench_config(a.model)
    cfg = AutoConfig.for_model(**{k: v for k, v in conf.items() if k != "architectures"})
    torch.manual_seed(0)
    with torch.device(DEV):
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.bfloat16).eval()
    return model


def part_hf_eager(a) -> None:
    import torch
    from transformers import DynamicCache

    model = _hf_model(a)
    rec = {"part": "transformers-eager", "decode_ms": {}}
    if a.prefill:
        with torch.no_grad():

            def prefill(ids):
                out = model(
                    input_ids=ids, past_key_values=DynamicCache(config=model.config), use_cache=True, logits_to_keep=1
                )
                return out.logits[0, -1]

            rec["prefill_ms"] = _prefill_ms(prefill, a.prefill, model.config.vocab_size)
        if a.prefill_only:
            _emit(rec)
            return
    g = torch.Generator(device=DEV).manual_seed(0)
    with torch.no_grad():
        for n in a.contexts:
            cache = DynamicCache(config=model.config)
            ids = torch.randint(0, model.config.vocab_size, (1, n), device=DEV, generator=g)
            _sync()
            t = time.perf_counter()
            out = model(input_ids=ids, past_key_values=cache, use_cache=True, logits_to_keep=1)
            tok = int(out.logits[0, -1].argmax().item())
            if n == 1024:
                rec["ttft_1k_ms"] = (time.perf_counter() - t) * 1e3  # first call: a cold-ish figure
            pos = [n]

            def step(tok=tok, cache=cache, pos=pos):
                o = model(
                    input_ids=torch.tensor([[tok]], device=DEV),
                    past_key_values=cache,
                    use_cache=True,
                    cache_position=torch.tensor([pos[0]], device=DEV),
                )
                int(o.logits[0, -1].argmax().item())
                pos[0] += 1

            for _ in range(2):
                step()
            rec["decode_ms"][n] = _median_ms(step, min(a.steps, 10))
            cache = out = step = None  # free this context's cache (step holds it too) before the next
            torch.cuda.empty_cache()
    _emit(rec)


def part_hf_compiled(a) -> None:
    import torch
    from transformers import StaticCache

    model = _hf_model(a)
    rec = {"part": "transformers-static-compiled", "capacity": a.capacity, "decode_ms": {}}
    try:
        cache = StaticCache(config=model.config, max_cache_len=a.capacity)

        def decode_one(ids, pos):  # the documented static-cache recipe: one step and its greedy pick
            logits = model(
                ids,
                position_ids=pos[None],
                cache_position=pos,
                past_key_values=cache,
                use_cache=True,
                return_dict=False,
            )[0]
            return torch.argmax(logits[:, -1], dim=-1)

        with torch.no_grad():  # one eager step allocates the cache's lazily made tensors outside any CUDA graph
            decode_one(torch.tensor([[1234]], device=DEV), torch.tensor([0], device=DEV))
        fwd = torch.compile(decode_one, mode="reduce-overhead", fullgraph=True)
        tok = [1234]
        pos = [0]

        def step():
            torch.compiler.cudagraph_mark_step_begin()
            out = fwd(torch.tensor([[tok[0]]], device=DEV), torch.tensor([pos[0]], device=DEV))
            tok[0] = int(out.item())

        with torch.no_grad():
            t = time.perf_counter()
            for _ in range(3):  # compile, record, replay
                step()
            _sync()
            rec["compile_s"] = time.perf_counter() - t
            for n in a.contexts:
                if n >= a.capacity:
                    continue
                pos[0] = n
                for _ in range(2):
                    step()
                rec["decode_ms"][n] = _median_ms(step, a.steps)
    except Exception as e:  # report the peer's failure honestly
        rec["error"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300] if str(e) else ''}"
    _emit(rec)


PARTS = {"roofline": part_roofline, "mcore": part_mcore, "hf-eager": part_hf_eager, "hf-compiled": part_hf_compiled}


# ------------------------------------------------------------------------------------------ driver


def run_part(a, name: str, *extra: str, env: dict | None = None, timeout: int = 900) -> list[dict]:
    tag = "-".join(
        f"{k}{v}" for k, v in sorted((env or {}).items()) if k.startswith("MCORE_") and k != "MCORE_CACHE_DIR"
    )
    cmd = [
        sys.executable,
        __file__,
        a.out,
        "--part",
        name,
        "--contexts",
        ",".join(map(str, a.contexts)),
        "--capacity",
        str(a.capacity),
        "--steps",
        str(a.steps),
        "--prefill",
        ",".join(map(str, a.prefill)),
        "--model",
        a.model,
        *extra,
    ]
    t = time.perf_counter()
    r = subprocess.run(cmd, capture_output=True, text=True, env={**os.environ, **(env or {})}, timeout=timeout)
    wall = time.perf_counter() - t
    log = Path(a.out) / f"{name}-{'-'.join(extra).replace('--', '').replace('/', '_')}-{a.capacity}{tag}.log"
    log.write_text(r.stdout + r.stderr)
    recs = [json.loads(line[7:]) for line in r.stdout.splitlines() if line.startswith("RESULT ")]
    if r.returncode != 0 or not recs:
        tail = (r.stderr.strip().splitlines() or ["no output"])[-1]
        recs = [{"part": name + " ".join(extra), "error": f"exit {r.returncode}: {tail[:300]}"}]
    for rec in recs:
        rec["process_s"] = wall
    return recs


def build(a) -> tuple[Path, Path]:
    """The 8B-sized bundle (OUT/native-MODEL-CAP.bundle) and a fine-tune of it (same config, other weights)."""
    from bench.model_configs import MODELS
    from bench.startup import build_pair

    names = (f"native-{a.model}", f"finetune-{a.model}")
    tuned = "startup" in a.parts.split(",")  # only the startup part runs the fine-tune
    return build_pair(
        Path(a.out), bench_config(a.model), DEV, a.capacity, names=names, demo=MODELS[a.model][1], fine_tune=tuned
    )


def determinism(recs: list[dict]) -> str:
    """One line per mcore row that checked its bits (deliverable 3 on the 8B-sized config)."""
    rows = [r for r in recs if "logits_sha256" in r]
    lines = []
    for r in rows:
        first = next(x for x in rows if x.get("logits_of") == r.get("logits_of"))  # the same logits measured
        same = "the same as" if r["logits_sha256"] == first["logits_sha256"] else "DIFFERENT from"
        lines.append(
            f"determinism, {r.get('label') or r.get('part')}: logits of {r.get('logits_of', '17 steps')} bit-identical twice in one process: "
            f"{'yes' if r['same_bits_twice'] else 'NO'}; sha256 {r['logits_sha256']} ({same} the first such row's)"
        )
    return "\n".join(lines)


def variant_logits(saved: list[tuple[str, Path]], what: str = "") -> str:
    """Each variant's logits (decode-only: 64-token prompt, 16 forced steps; prefill-only: `what`)
    against the first variant's: how far a variant that changes the bits moves them, and the
    greedy picks it keeps."""
    import torch

    have = [(v, torch.load(p)) for v, p in saved if p.exists()]
    if len(have) < 2:
        return ""
    base_v, base = have[0]
    lines = []
    for v, x in have[1:]:
        diff = (x - base).abs().max().item()
        cos = torch.nn.functional.cosine_similarity(x, base, dim=-1).min().item()
        picks = (x.argmax(-1) == base.argmax(-1)).sum().item()
        lines.append(
            f"logits{', ' + what if what else ''}, {v} against {base_v}: max_abs {diff:.4g}, lowest cosine {cos:.6f}, "
            f"same greedy pick {picks}/{len(x)} steps{' (bit-identical)' if torch.equal(x, base) else ''}"
        )
    return "\n".join(lines)


def table(recs: list[dict], contexts: list[int]) -> str:
    roof = next((r for r in recs if r.get("part") == "roofline"), None)
    lines = []
    if roof:
        floor = roof["weight_bytes"] / (roof["copy_TBps"] * 1e12) * 1e3
        lines.append(
            f"roofline: copy {roof['copy_TBps']:.2f} TB/s; weights {roof['weight_bytes'] / 1e9:.2f} GB "
            f"-> {floor:.2f} ms/token ({1e3 / floor:.0f} tok/s) plus KV "
            f"{roof['kv_bytes_per_position'] / 1e3:.0f} kB per cached position"
        )
    head = (
        f"{'engine':34} {'cap':>6} "
        + " ".join(f"{'ctx ' + str(n):>16}" for n in contexts)
        + f" {'ttft 1k':>9} {'compile':>8} {'load':>7}"
    )
    lines += [head, "-" * len(head)]
    for r in recs:
        if r.get("part") == "roofline":
            continue
        if "error" in r:
            lines.append(f"{r['part']:34} ERROR {r['error']}")
            continue
        if not r.get("decode_ms"):
            continue  # a prefill-only row (the prefill table shows it)
        cells = []
        for n in contexts:
            ms = r["decode_ms"].get(str(n), r["decode_ms"].get(n))
            if ms is None:
                cells.append(f"{'-':>16}")
                continue
            cell = f"{ms:6.2f}ms {1e3 / ms:5.0f}/s"
            if roof:
                ideal = (roof["weight_bytes"] + n * roof["kv_bytes_per_position"]) / (roof["copy_TBps"] * 1e12) * 1e3
                cell = f"{ms:5.2f} {1e3 / ms:4.0f}/s {ideal / ms:3.0%}"
            cells.append(f"{cell:>16}")
        ttft = f"{r['ttft_1k_ms']:7.1f}ms" if "ttft_1k_ms" in r else f"{'-':>9}"
        comp = f"{r['compile_s']:6.1f}s" if r.get("compile_s") else f"{'-':>7}"
        load = f"{r['load_s']:6.1f}s" if "load_s" in r else f"{'-':>7}"
        lines.append(
            f"{r.get('label', r['part']):34} {r.get('capacity', ''):>6} "
            + " ".join(cells)
            + f" {ttft:>9} {comp:>8} {load:>7}"
        )
    for r in recs:
        if r.get("decode_graph_nodes"):
            counts = ", ".join(f"{v} {k}" for k, v in r["decode_graph_nodes"].items())
            lines.append(f"decode step graph, {r.get('label', r['part'])}: {counts}")
    lines.append("cells: ms/token, tokens/s, share of the roofline (weights + the context's KV at the copy rate)")
    return "\n".join(lines)


def main() -> None:  # noqa: C901 - benchmark driver, one branch per arm and option
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--contexts", default="128,1024,8192,32768")
    ap.add_argument("--capacity", type=int, default=40960)
    ap.add_argument(
        "--extra-capacity", default="4096", help="compiled engine and peer also at these capacities (ctx 1k)"
    )
    ap.add_argument("--parts", default="roofline,compiled,torch,hf-eager,hf-compiled")
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--model", default="qwen3-8b", choices=["qwen3-8b", "llama3.1-8b"], help="bench/model_configs.py")
    ap.add_argument("--no-reload", action="store_true", help="skip the compiled engine's cached-reload run")
    ap.add_argument("--peer-capacities", default=None, help="transformers static cache capacities (default: as ours)")
    ap.add_argument("--part", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--engine", default="compiled", help=argparse.SUPPRESS)
    ap.add_argument("--ttft", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--label", default="", help=argparse.SUPPRESS)  # names a part's log apart from its twin's
    ap.add_argument("--decode-only", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--prefill-only", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--save-logits", default=None, help=argparse.SUPPRESS)
    ap.add_argument(
        "--prefill", default="", help="prefill lengths timed by the mcore parts (the `prefill` part sets them)"
    )
    ap.add_argument("--peak-tflops", type=float, default=989.4, help="bf16 dense peak (H200 SXM: 989.4)")
    ap.add_argument(
        "--profile-load",
        nargs="?",
        const="profile",
        default=None,
        help="one more cached reload under cProfile: where its seconds go (OUT/load-profile.txt)",
    )
    ap.add_argument(
        "--prefill-variants",
        default="",
        help="prefill-only compiled variants timed at --prefill lengths, ';'-separated, each space-separated "
        "env settings or 'default' (e.g. 'MCORE_PREFILL_ROWS=0;default')",
    )
    ap.add_argument(
        "--variants",
        default="",
        help="decode-only compiled variants, ';'-separated, each space-separated env settings "
        "(e.g. 'MCORE_GEMV=0;MCORE_INDUCTOR=triton.enable_pdl,combo_kernels MCORE_GEMV=1')",
    )
    a = ap.parse_args()
    a.contexts = [int(x) for x in a.contexts.split(",") if x]
    a.prefill = [int(x) for x in a.prefill.split(",") if x]
    Path(a.out).mkdir(parents=True, exist_ok=True)
    if a.part:
        PARTS[a.part](a)
        return
    parts = a.parts.split(",")
    cache = Path(a.out) / "mcore-cache"

    class Recs(list):  # every result is saved and shown as it comes, so a cut-off run keeps what it had
        def append(self, r):
            super().append(r)
            (Path(a.out) / "engine_gpu.json").write_text(json.dumps(list(self), indent=1))
            if r.get("part") == "startup":
                return  # startup_rows prints each process as it ends
            if r.get("part") != "roofline" and not r.get("decode_ms") and "error" not in r:
                print(f"{r.get('label', r['part'])}: prefill ms {r.get('prefill_ms')}", flush=True)
                return
            lines = table([r], a.contexts).splitlines()
            print(lines[0] if r.get("part") == "roofline" else lines[-2], flush=True)

        def __iadd__(self, rs):
            for r in rs:
                self.append(r)
            return self

    recs: list[dict] = Recs()
    if "roofline" in parts:
        recs += run_part(a, "roofline")
    caps = [a.capacity] + [int(c) for c in a.extra_capacity.split(",") if c]
    if "prefill" in parts and not a.prefill:
        a.prefill = [1024, 8192, 32768]
    pair = None
    if {"compiled", "torch", "startup", "reference"} & set(parts) or a.variants or a.prefill_variants:
        for cap in caps:
            b = argparse.Namespace(**{**vars(a), "capacity": cap})
            t = time.perf_counter()
            built = build(b)
            pair = pair or built  # the main capacity's: startup runs those
            print(f"bundles capacity {cap}: {time.perf_counter() - t:.1f} s", flush=True)
    env = cache_env(cache)
    if "startup" in parts:  # issue 32: whole processes; the compiled row below reloads from their cache
        assert pair is not None
        print(f"bytecode primed: {prime_bytecode({}):.1f} s", flush=True)
        recs += startup_rows(Path(a.out), *pair, DEV, ["regional"], note=lambda m: print(m, flush=True), hashed=False)
        env = mode_env(Path(a.out), "regional", DEV)
    if "compiled" in parts:
        runs = [("mcore compiled (cold compile)", ())]
        if not a.no_reload:
            runs.append(("mcore compiled (cached reload)", ("--label", "cached")))
        if "startup" in parts:
            runs = runs[1:]  # cold: the startup rows (whole `mcore run` processes)
        else:
            shutil.rmtree(cache, ignore_errors=True)
        if a.profile_load:  # its timings pay cProfile's overhead: kept out of the table
            runs.append(("profiled", ("--profile-load", str(Path(a.out) / "load-profile.txt"))))
        for label, more in runs:
            b = argparse.Namespace(**{**vars(a), **({"contexts": [1024], "steps": 3} if label == "profiled" else {})})
            for r in run_part(b, "mcore", "--engine", "compiled", *more, env=env):
                r["label"] = label
                if label == "profiled":
                    print("profiled cached reload: " + " | ".join(r.get("load_stamps", [])), flush=True)
                    continue
                recs.append(r)
    if "reference" in parts:  # the compile before regions (MCORE_REGIONAL=0), cold: step time and bits beside
        ref = Path(a.out) / "reference-cache"
        shutil.rmtree(ref, ignore_errors=True)
        for r in run_part(
            a, "mcore", "--engine", "compiled", "--label", "whole", env={**cache_env(ref), **MODES["whole"]}
        ):
            r["label"] = "mcore whole-graph compile, cold"
            recs.append(r)
    if "prefill" in parts and "hf-eager" not in parts:
        for r in run_part(a, "hf-eager", "--prefill-only"):
            r["label"] = "transformers eager (sdpa)"
            recs.append(r)
    if "hf-compiled" in parts:
        peer_caps = [int(c) for c in (a.peer_capacities or ",".join(map(str, caps))).split(",") if c]
        for cap in peer_caps:
            b = argparse.Namespace(**{**vars(a), "capacity": cap, "contexts": [n for n in a.contexts if n < cap]})
            for r in run_part(b, "hf-compiled"):
                r["label"] = "transformers static+compile"
                recs.append(r)
    if "hf-eager" in parts:
        recs += run_part(a, "hf-eager")
    if "compiled" in parts:
        for cap in caps[1:]:  # the decode step at another capacity (the prefill compile is the same work)
            b = argparse.Namespace(**{**vars(a), "capacity": cap, "contexts": [n for n in a.contexts if n < cap]})
            for r in run_part(b, "mcore", "--decode-only", env=env):
                r["label"] = f"mcore compiled decode (capacity {cap})"
                recs.append(r)
    saved = run_variants(a, recs, a.variants, "decode", cache)
    saved_prefill = run_variants(a, recs, a.prefill_variants, "prefill", cache)
    if "torch" in parts:
        for r in run_part(a, "mcore", "--engine", "torch", env={"MCORE_CACHE_DIR": str(cache)}):
            r["label"] = "mcore torch (op by op)"
            recs.append(r)

    for r in recs:
        for line in r.get("engine", []):
            print(f"  {r.get('label', r['part'])}: {line}")
    for r in recs:  # the same steps through the product's greedy loop (Pipeline.decode_tokens)
        if r.get("loop_ms"):
            cells = ", ".join(f"{float(v):.2f} ms at {k}" for k, v in r["loop_ms"].items())
            print(f"  {r.get('label', r['part'])}, mcore's greedy loop (next step queued ahead): {cells}")
    for r in recs:  # where each mcore load's seconds went (progress stamps, seconds since the part began)
        if r.get("load_stamps"):
            print(f"  {r.get('label', r['part'])} load: " + " | ".join(x.strip() for x in r["load_stamps"]))
    print(f"model: {a.model} (bench/model_configs.py), bf16, random weights, capacity {a.capacity}")
    print(table([r for r in recs if r.get("part") != "startup"], a.contexts))
    print(determinism(recs))
    print(variant_logits(saved))
    print(variant_logits(saved_prefill, "the prompt's last token (1k tokens, or the capacity)"))
    starts = [r for r in recs if r.get("part") == "startup"]
    if starts:
        print(startup_table(starts))
    print(prefill_table(recs, a.peak_tflops * 1e12, a.model))


if __name__ == "__main__":
    main()
