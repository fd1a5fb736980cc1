"""`mcore verify reference`: the engine against transformers on the same checkpoint and prompt.

The check a user runs before trusting any kernel comparison: if the native engine does not
match the framework, a kernel gate against it proves nothing. Decoders run greedy in lockstep
(both models consume the reference's token at every step, so later steps stay comparable after
a divergence) and compare the FP32 logits per step; encoders compare the hidden states of the
real (unpadded) positions. The token IDs of the prompt are compared with transformers' tokenizer
first. The gate checks values, not only their direction: a relative error (the largest
difference over the reference's largest magnitude) catches a bundle whose final norm is doubled,
which keeps every cosine at 1.0 and every token. The bundle's weights are compared tensor by
tensor (sha256) with the checkpoint's first. transformers is optional: it is imported here only,
and reads the checkpoint with use_safetensors (no pickled weights).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from typing import Any

import torch

from ..bundle.manifest import BundleManifest
from ..common.errors import UserError, first_few
from ..common.progress import NO_PROGRESS, Progress
from ..families.graph_args import GraphArgs
from .compare import GateResult, check_limits, check_threshold
from .details import ReferenceDetails, ReferenceStep, ReferenceWorst
from .gates import REFERENCE_MAX_REL

INSTALL_HINT = "transformers is not installed; install it (pip install transformers) to compare against the reference"


def _transformers():
    try:
        import transformers
    except ImportError:
        raise UserError(INSTALL_HINT) from None
    transformers.utils.logging.disable_progress_bar()  # stderr carries mcore's own progress
    return transformers


DEFAULT_MAX_REL = REFERENCE_MAX_REL  # written once, in mcore/verify/gates.py


@dataclass
class StepStats:
    step: int
    max_abs: float
    cosine: float
    engine_token: int | None = None
    reference_token: int | None = None
    rel: float = 0.0  # max_abs over the reference's largest magnitude

    def line(self) -> str:
        vals = f"max_abs={self.max_abs:.6g} cosine={self.cosine:.9f}"
        if self.engine_token is None:
            return f"encoder hidden states: {vals} rel={self.rel:.6g}"
        name = "prefill" if self.step == 0 else f"decode {self.step}"
        toks = f" engine_token={self.engine_token} reference_token={self.reference_token}"
        return f"step {self.step} ({name}): {vals}{toks} rel={self.rel:.6g}"


def stats(a: torch.Tensor, b: torch.Tensor) -> tuple[float, float, float]:
    """(max |a-b|, cosine, max |a-b| / max |b|) in float64, `b` the reference; NaN anywhere gives a
    NaN cosine and relative error (a failure)."""
    x, y = a.detach().double().reshape(-1).cpu(), b.detach().double().reshape(-1).cpu()
    max_abs = float((x - y).abs().max())
    denom = float(x.norm() * y.norm())
    cosine = float(x @ y) / denom if denom > 0 else float("nan")
    scale = float(y.abs().max())
    rel = max_abs / scale if scale > 0 else (0.0 if max_abs == 0 else float("inf"))
    return max_abs, cosine, rel if math.isfinite(max_abs) else float("nan")


def _reference_source(bundle_config: dict, manifest: BundleManifest, checkpoint: str) -> Any:
    from ..families.source import resolve_model

    if manifest.weights["kind"] == "random":
        raise UserError("this bundle was built with --weights random; there is no checkpoint to compare with")
    source = resolve_model(checkpoint)
    if json.dumps(source.config, sort_keys=True) != json.dumps(bundle_config, sort_keys=True):
        raise UserError(
            f"{checkpoint}: its config.json differs from the bundle's; pass the checkpoint the bundle was built from"
        )
    return source


def weights_differences(bundle: Any, manifest: BundleManifest, source: Any) -> list[str]:
    """Why the bundle's weights are not the checkpoint's (empty when every tensor's sha256 agrees):
    the bundle's stored tensors against the tensors a build from `source` stores, and against the
    sha256s the bundle recorded at build."""
    from ..bundle.build import stored_state, tensor_sha256
    from ..bundle.contents import load_weights
    from ..families import get_family
    from ..graph.capture import build_core

    w = manifest.weights
    where = f"{bundle.path}: member {w['member']}"
    mine = {n: tensor_sha256(t) for n, t in load_weights(bundle.read(w["member"]), {}, where).items()}
    out = []
    recorded = w.get("tensor_sha256")
    if recorded is not None and recorded != mine:
        differ = sorted(n for n in set(recorded) | set(mine) if recorded.get(n) != mine.get(n))
        out.append(f"the bundle's weights are not those it recorded at build: {_names(differ, len(mine))}")
    family = get_family(manifest.family)
    core = build_core(family, source.config, GraphArgs.from_dict(manifest.graph_args), "cpu")
    family.load_checkpoint(core, source)
    theirs = {n: tensor_sha256(t) for n, t in stored_state(core)[0].items()}
    del core
    differ = sorted(n for n in set(theirs) | set(mine) if theirs.get(n) != mine.get(n))
    if differ:
        out.append(f"the bundle's weights are not the checkpoint's: {_names(differ, len(theirs))}")
    return out


def _names(differ: list[str], total: int) -> str:
    return f"{len(differ)} of {total} tensor(s) differ ({first_few(differ)})"


def _transformers_call(what: str, fn: Any, *args: Any, **kw: Any) -> Any:
    """A call into transformers; its failures (a checkpoint it cannot load or run) as one line."""
    try:
        return fn(*args, **kw)
    except UserError:
        raise
    except Exception as e:  # noqa: BLE001 - transformers raises anything from OSError to KeyError
        first = (str(e).strip().splitlines() or [""])[0][:200]
        raise UserError(f"transformers could not {what} ({type(e).__name__}: {first}); check the checkpoint") from None


def reference_check(
    bundle_path: str,
    checkpoint: str,
    prompt: str,
    max_new_tokens: int = 8,
    chat: bool = False,
    kernel_bindings: str | None = None,
    device: str | None = None,
    min_cosine: float = 0.999,
    max_abs: float | None = None,
    progress: Progress = NO_PROGRESS,
    announce=None,
    max_rel: float = DEFAULT_MAX_REL,
) -> GateResult[ReferenceDetails]:
    """Run the bundle's engine and transformers on `checkpoint` with `prompt`; PASS when the bundle's
    weights are the checkpoint's, the prompt's token IDs agree, no greedy token diverges, every
    step's cosine >= min_cosine and relative error <= max_rel (and max_abs <= the limit, when one is given)."""
    check_limits(min_cosine, max_abs)
    check_threshold("--max-rel", max_rel, 0.0)
    if not isinstance(prompt, str) or not prompt:
        raise UserError("--prompt must be a non-empty string")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise UserError(f"--max-new-tokens {max_new_tokens!r} must be at least 1")
    tf = _transformers()
    from ..bundle.container import open_bundle
    from ..bundle.contents import check_family, read_json_member

    bundle = open_bundle(bundle_path)
    manifest = bundle.runnable()
    check_family(manifest, bundle_path)
    source = _reference_source(read_json_member(bundle, "config.json"), manifest, checkpoint)
    progress.report("comparing the bundle's weights with the checkpoint's", 0.0)
    wrong = weights_differences(bundle, manifest, source)
    if wrong:
        details = ReferenceDetails(weights_differ=tuple(wrong))
        return GateResult(
            False, "FAIL: reference check (the bundle's weights are not the checkpoint's)", details, wrong
        )
    limits = (min_cosine, max_abs, max_rel)
    return _compare(
        tf,
        bundle,
        manifest,
        str(source.path),
        checkpoint,
        prompt,
        max_new_tokens,
        chat,
        limits,
        dict(kernel_bindings=kernel_bindings, device=device, progress=progress, announce=announce),
    )


def _compare(
    tf: Any,
    bundle: Any,
    manifest: BundleManifest,
    folder: str,
    checkpoint: str,
    prompt: str,
    n: int,
    chat: bool,
    limits: tuple,
    load: dict,
) -> GateResult[ReferenceDetails]:
    """The engine against transformers on `prompt`: token IDs, then per step values and tokens."""
    from ..families import bundle_kind
    from ..runtime.pipeline import DecoderPipeline, EncoderPipeline, check_prompts_fit

    decoder = bundle_kind(manifest) == "decoder"
    if chat and not decoder:
        raise UserError("--chat applies to decoders only; this bundle is an encoder")
    check_prompts_fit(bundle, [prompt], n, chat)  # before the pipeline and transformers load
    progress = load["progress"]
    cls = DecoderPipeline if decoder else EncoderPipeline
    kw = {"announce": load["announce"]} if load["announce"] else {}
    pipe = cls(
        str(bundle.path),
        kernel_bindings=load["kernel_bindings"],
        device=load["device"],
        progress=progress,
        bundle=bundle,
        **kw,
    )
    dtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[pipe.gargs.precision]
    progress.report("loading the transformers reference", 0.0)
    ref_tok = _transformers_call("load the checkpoint's tokenizer", tf.AutoTokenizer.from_pretrained, folder)
    ids = pipe.encode(prompt, chat=chat)
    ref_ids = _transformers_call("tokenize the prompt", _reference_ids, ref_tok, prompt, chat)
    info = [
        f"reference: transformers {tf.__version__} on {pipe.device}, {pipe.gargs.precision}, checkpoint {checkpoint}",
        "weights: every tensor's sha256 equals the checkpoint's",
    ]
    if ids != ref_ids:
        at = next(
            (i for i, (a, b) in enumerate(zip(ids, ref_ids, strict=False)) if a != b), min(len(ids), len(ref_ids))
        )
        info.append(
            f"prompt token IDs differ from transformers' tokenizer at position {at} "
            f"(engine {ids[at : at + 4]}, transformers {ref_ids[at : at + 4]}; lengths {len(ids)} and {len(ref_ids)})"
        )
        details = ReferenceDetails(len(ids), token_mismatch_at=at)
        return GateResult(False, "FAIL: reference check (tokenization differs)", details, info)
    info.append(f"prompt_tokens={len(ids)} (token IDs equal to transformers' tokenizer)")
    auto = tf.AutoModelForCausalLM if decoder else tf.AutoModel
    model = _transformers_call("load the checkpoint", auto.from_pretrained, folder, dtype=dtype, use_safetensors=True)
    model = model.to(pipe.device).eval()
    steps = _decoder_steps(pipe, model, ids, n, progress) if decoder else [_encoder_step(pipe, model, prompt)]
    return _verdict(steps, decoder, limits, info, len(ids))


def _reference_ids(ref_tok: Any, prompt: str, chat: bool) -> list[int]:
    if chat:
        text = ref_tok.apply_chat_template(
            [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False
        )
        return list(ref_tok(text, add_special_tokens=False)["input_ids"])
    return list(ref_tok(prompt)["input_ids"])


def _verdict(
    steps: list[StepStats], decoder: bool, limits: tuple, info: list[str], prompt_tokens: int
) -> GateResult[ReferenceDetails]:
    min_cosine, max_abs, max_rel = limits
    first_div = next((s.step for s in steps if s.engine_token != s.reference_token), None)
    info.extend(s.line() for s in steps)
    worst_cos = min(s.cosine for s in steps)
    worst_abs = max(s.max_abs for s in steps)
    worst_rel = max(s.rel for s in steps)
    details = ReferenceDetails(
        prompt_tokens,
        tuple(ReferenceStep(s.step, s.max_abs, s.rel, s.cosine, s.engine_token, s.reference_token) for s in steps),
        worst=ReferenceWorst(first_div, worst_cos, worst_abs, worst_rel),
    )
    if decoder:
        info.append("first_diverging_token=" + ("none" if first_div is None else f"step {first_div}"))
    rule = f"rel <= {max_rel:g}, cosine >= {min_cosine:g}" + (
        f", max_abs <= {max_abs:g}" if max_abs is not None else ""
    )
    info.append(f"rule: same tokens, every step {rule}")
    summary = f"{len(steps)} step(s), max_abs={worst_abs:.6g}, max rel={worst_rel:.6g}, min cosine={worst_cos:.9f}"
    ok = (
        first_div is None
        and worst_cos >= min_cosine
        and worst_rel <= max_rel
        and (max_abs is None or worst_abs <= max_abs)
    )
    return GateResult(ok, f"{'PASS' if ok else 'FAIL'}: reference check ({summary})", details, info)


def _decoder_steps(pipe: Any, model: Any, ids: list[int], n: int, progress: Progress) -> list[StepStats]:
    """Prefill then n-1 decode steps on both sides, each fed the reference's greedy token (the KV
    cache holds them: check_prompts_fit said so before anything loaded)."""
    import inspect

    # transformers renamed past_key_values to cache (5.x); use whichever this version takes.
    new_api = "cache" in inspect.signature(model.forward).parameters
    key = "cache" if new_api else "past_key_values"
    dev = pipe.device
    caches = [pipe.caches[name].zero_() for name in pipe.cache_names]
    out: list[StepStats] = []
    with torch.no_grad():
        (logits,) = pipe.runners["prefill"](torch.tensor([ids], dtype=torch.int32, device=dev), *caches)
        ref = _transformers_call("run the checkpoint", model, torch.tensor([ids], device=dev), use_cache=True)
        past = getattr(ref, key)
        ref_logits = ref.logits[0, -1].float()
        pos = len(ids)
        for step in range(n):
            progress.report(f"step {step + 1}/{n}", (step + 1) / n)
            engine = logits.reshape(-1).float()
            m, c, rel = stats(engine, ref_logits)
            e_tok, r_tok = int(engine.argmax()), int(ref_logits.argmax())
            out.append(StepStats(step, m, c, e_tok, r_tok, rel))
            if step == n - 1:
                break
            pipe.cache_length.fill_(pos)
            (logits,) = pipe.runners["decode"](
                torch.tensor([[r_tok]], dtype=torch.int32, device=dev), pipe.cache_length, *caches
            )
            ref = _transformers_call(
                "run the checkpoint", model, torch.tensor([[r_tok]], device=dev), use_cache=True, **{key: past}
            )
            past = getattr(ref, key)
            ref_logits = ref.logits[0, -1].float()
            pos += 1
    return out


def _encoder_step(pipe: Any, model: Any, prompt: str) -> StepStats:
    """The hidden states of the real positions against transformers' last_hidden_state."""
    hidden, n = pipe.hidden_states(prompt)
    ids, _, _ = pipe.inputs(prompt)
    with torch.no_grad():
        ref = _transformers_call(
            "run the checkpoint",
            model,
            input_ids=ids[:n].to(torch.int64)[None],
            attention_mask=torch.ones(1, n, dtype=torch.int64, device=ids.device),
        )
    m, c, rel = stats(hidden[:n], ref.last_hidden_state[0])
    return StepStats(0, m, c, rel=rel)
