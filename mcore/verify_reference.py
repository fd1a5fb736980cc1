"""`mcore verify reference`: the engine against transformers on the same checkpoint and prompt.

The check a user runs before trusting any kernel comparison: if the native engine does not
match the framework, a kernel gate against it proves nothing. Decoders run greedy in lockstep
(both models consume the reference's token at every step, so later steps stay comparable after
a divergence) and compare the FP32 logits per step; encoders compare the hidden states of the
real (unpadded) positions. The token IDs of the prompt are compared with transformers' tokenizer
first. transformers is optional: it is imported here only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Optional

import torch

from .bundle_manifest import BundleManifest
from .errors import UserError
from .progress import NO_PROGRESS, Progress
from .verify import GateResult, check_limits

INSTALL_HINT = "transformers is not installed; install it (pip install transformers) to compare against the reference"


def _transformers():
    try:
        import transformers
    except ImportError:
        raise UserError(INSTALL_HINT) from None
    transformers.utils.logging.disable_progress_bar()  # stderr carries mcore's own progress
    return transformers


@dataclass
class StepStats:
    step: int
    max_abs: float
    cosine: float
    engine_token: Optional[int] = None
    reference_token: Optional[int] = None

    def line(self) -> str:
        if self.engine_token is None:
            return f"encoder hidden states: max_abs={self.max_abs:.6g} cosine={self.cosine:.9f}"
        name = "prefill" if self.step == 0 else f"decode {self.step}"
        toks = f" engine_token={self.engine_token} reference_token={self.reference_token}"
        return f"step {self.step} ({name}): max_abs={self.max_abs:.6g} cosine={self.cosine:.9f}{toks}"


def stats(a: torch.Tensor, b: torch.Tensor) -> tuple[float, float]:
    """(max |a-b|, cosine) in float64; NaN anywhere gives a NaN cosine (a failure)."""
    x, y = a.detach().double().reshape(-1).cpu(), b.detach().double().reshape(-1).cpu()
    max_abs = float((x - y).abs().max())
    denom = float(x.norm() * y.norm())
    cosine = float(x @ y) / denom if denom > 0 else float("nan")
    return max_abs, cosine


def _reference_folder(bundle_config: dict, manifest: BundleManifest, checkpoint: str) -> str:
    from .families.source import resolve_model

    if manifest.weights["kind"] == "random":
        raise UserError("this bundle was built with --weights random; there is no checkpoint to compare with")
    source = resolve_model(checkpoint)
    if json.dumps(source.config, sort_keys=True) != json.dumps(bundle_config, sort_keys=True):
        raise UserError(
            f"{checkpoint}: its config.json differs from the bundle's; pass the checkpoint the bundle was built from"
        )
    return str(source.path)


def reference_check(
    bundle_path: str,
    checkpoint: str,
    prompt: str,
    max_new_tokens: int = 8,
    chat: bool = False,
    kernel_bindings: Optional[str] = None,
    device: Optional[str] = None,
    min_cosine: float = 0.999,
    max_abs: Optional[float] = None,
    progress: Progress = NO_PROGRESS,
    announce=None,
) -> GateResult:
    """Run the bundle's engine and transformers on `checkpoint` with `prompt`; PASS when the prompt's
    token IDs agree, no greedy token diverges and every step's cosine >= min_cosine (and max_abs
    <= the limit, when one is given)."""
    check_limits(min_cosine, max_abs)
    if not isinstance(prompt, str) or not prompt:
        raise UserError("--prompt must be a non-empty string")
    if isinstance(max_new_tokens, bool) or not isinstance(max_new_tokens, int) or max_new_tokens < 1:
        raise UserError(f"--max-new-tokens {max_new_tokens!r} must be at least 1")
    tf = _transformers()
    from .bundle import open_bundle
    from .families import bundle_kind
    from .pipeline import DecoderPipeline, EncoderPipeline

    bundle = open_bundle(bundle_path)
    manifest = bundle.runnable()
    config = json.loads(bundle.read("config.json"))
    folder = _reference_folder(config, manifest, checkpoint)
    decoder = bundle_kind(manifest) == "decoder"
    if chat and not decoder:
        raise UserError("--chat applies to decoders only; this bundle is an encoder")
    cls = DecoderPipeline if decoder else EncoderPipeline
    kw = {"announce": announce} if announce else {}
    pipe = cls(bundle_path, kernel_bindings=kernel_bindings, device=device, progress=progress, bundle=bundle, **kw)
    dtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[pipe.gargs["precision"]]

    progress.report("loading the transformers reference", 0.0)
    ref_tok = tf.AutoTokenizer.from_pretrained(folder)
    ids = pipe.encode(prompt, chat=chat)
    if chat:
        text = ref_tok.apply_chat_template(
            [{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False
        )
        ref_ids = list(ref_tok(text, add_special_tokens=False)["input_ids"])
    else:
        ref_ids = list(ref_tok(prompt)["input_ids"])
    info = [
        f"reference: transformers {tf.__version__} on {pipe.device}, {pipe.gargs['precision']}, checkpoint {checkpoint}"
    ]
    details: dict[str, Any] = {"prompt_tokens": len(ids), "steps": []}
    if ids != ref_ids:
        at = next((i for i, (a, b) in enumerate(zip(ids, ref_ids)) if a != b), min(len(ids), len(ref_ids)))
        info.append(
            f"prompt token IDs differ from transformers' tokenizer at position {at} "
            f"(engine {ids[at : at + 4]}, transformers {ref_ids[at : at + 4]}; lengths {len(ids)} and {len(ref_ids)})"
        )
        details["token_mismatch_at"] = at
        return GateResult(False, "FAIL: reference check (tokenization differs)", details, info)
    info.append(f"prompt_tokens={len(ids)} (token IDs equal to transformers' tokenizer)")

    auto = tf.AutoModelForCausalLM if decoder else tf.AutoModel
    model = auto.from_pretrained(folder, dtype=dtype).to(pipe.device).eval()
    steps = (
        _decoder_steps(pipe, model, ids, max_new_tokens, progress) if decoder else [_encoder_step(pipe, model, prompt)]
    )
    first_div = next((s.step for s in steps if s.engine_token != s.reference_token), None)
    for s in steps:
        info.append(s.line())
        details["steps"].append(
            {
                "step": s.step,
                "max_abs": s.max_abs,
                "cosine": s.cosine,
                "engine_token": s.engine_token,
                "reference_token": s.reference_token,
            }
        )
    worst_cos = min(s.cosine for s in steps)
    worst_abs = max(s.max_abs for s in steps)
    details.update({"first_diverging_step": first_div, "min_cosine": worst_cos, "max_abs": worst_abs})
    if decoder:
        info.append("first_diverging_token=" + ("none" if first_div is None else f"step {first_div}"))
    summary = f"{len(steps)} step(s), max_abs={worst_abs:.6g}, min cosine={worst_cos:.9f}"
    ok = first_div is None and worst_cos >= min_cosine and (max_abs is None or worst_abs <= max_abs)
    return GateResult(ok, f"{'PASS' if ok else 'FAIL'}: reference check ({summary})", details, info)


def _decoder_steps(pipe: Any, model: Any, ids: list[int], n: int, progress: Progress) -> list[StepStats]:
    """Prefill then n-1 decode steps on both sides, each fed the reference's greedy token."""
    need = len(ids) + n - 1
    if need > pipe.capacity:
        raise UserError(
            f"prompt ({len(ids)} tokens) + --max-new-tokens {n} need {need} cache slots but the "
            f"bundle's KV cache holds {pipe.capacity}; ask for fewer tokens"
        )
    import inspect

    # transformers renamed past_key_values to cache (5.x); use whichever this version takes.
    new_api = "cache" in inspect.signature(model.forward).parameters
    key = "cache" if new_api else "past_key_values"
    dev = pipe.device
    caches = [pipe.caches[name].zero_() for name in pipe.cache_names]
    out: list[StepStats] = []
    with torch.no_grad():
        (logits,) = pipe.runners["prefill"](torch.tensor([ids], dtype=torch.int32, device=dev), *caches)
        ref = model(torch.tensor([ids], device=dev), use_cache=True)
        past = getattr(ref, key)
        ref_logits = ref.logits[0, -1].float()
        pos = len(ids)
        for step in range(n):
            progress.report(f"step {step + 1}/{n}", (step + 1) / n)
            engine = logits.reshape(-1).float()
            m, c = stats(engine, ref_logits)
            e_tok, r_tok = int(engine.argmax()), int(ref_logits.argmax())
            out.append(StepStats(step, m, c, e_tok, r_tok))
            if step == n - 1:
                break
            pipe.cache_length.fill_(pos)
            (logits,) = pipe.runners["decode"](
                torch.tensor([[r_tok]], dtype=torch.int32, device=dev), pipe.cache_length, *caches
            )
            ref = model(torch.tensor([[r_tok]], device=dev), use_cache=True, **{key: past})
            past = getattr(ref, key)
            ref_logits = ref.logits[0, -1].float()
            pos += 1
    return out


def _encoder_step(pipe: Any, model: Any, prompt: str) -> StepStats:
    """The hidden states of the real positions against transformers' last_hidden_state."""
    hidden, n = pipe.hidden_states(prompt)
    ids, _, _ = pipe.inputs(prompt)
    with torch.no_grad():
        ref = model(
            input_ids=ids[:n].to(torch.int64)[None],
            attention_mask=torch.ones(1, n, dtype=torch.int64, device=ids.device),
        )
    m, c = stats(hidden[:n], ref.last_hidden_state[0])
    return StepStats(0, m, c)
