"""Pipelines: load a bundle, bind kernel slots (only here), run generation or embeddings.

Binding happens only while a pipeline is constructed; a running pipeline is never
rebound. Two pipelines from one bundle may hold different compatible bindings.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from ..bundle.contents import (
    check_family,
    check_graph_args,
    check_slots,
    check_weights,
    load_weights,
    read_json_member,
    read_text_member,
    weights_header,
)
from ..common.devices import parse_device
from ..common.errors import UserError
from ..common.progress import NO_PROGRESS, Progress
from ..engines import get_engine, resolve_engine_name
from ..engines.role_helper import RoleHelper, helper_wanted
from ..engines.slots import SlotCall, release_dropped
from ..engines.structure import RoleStructure, structure_key
from ..families import bundle_kind, get_family
from ..families.base import ModelSource
from ..families.graph_args import GraphArgs
from ..graph.capture import build_core, capture_cached, graph_metadata
from ..graph.from_export import TORCH_DTYPES
from ..graph.snapshot import Snapshot, Tensor
from .bindings import bind_slots, open_bound_bundle


def resolve_device(name: str | None) -> torch.device:
    """The device a pipeline runs on: `name`'s (parse_device's rule) if this machine has it; auto
    (None) picks CUDA when there is a GPU."""
    dev = parse_device(name)
    if dev is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise UserError(f"--device {name}: no CUDA GPU is available here; use --device cpu")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise UserError(
                f"--device {name}: this machine has {torch.cuda.device_count()} CUDA device(s); "
                f"use cuda:0..cuda:{torch.cuda.device_count() - 1}"
            )
    return dev


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def device_seconds(run: Callable[[], Any], device: torch.device, reps: int = 200, rounds: int = 5) -> float | None:
    """Device time of one call of `run`: the median over `rounds` of `reps` calls enqueued back to
    back between two CUDA events, what a kernel in a slot changes without the host's per-token work
    (which, on a small model, varies more between processes than any kernel does). Each round is
    queued behind a GPU spin that outlasts the host's enqueueing, so the GPU never waits for the
    host: where a call's host work exceeds its GPU time, timing without the spin measured the host.
    None off CUDA."""
    if device.type != "cuda":
        return None
    for _ in range(3):
        run()
    torch.cuda.synchronize(device)
    t0 = time.perf_counter()
    for _ in range(reps):
        run()
    enqueue_s = time.perf_counter() - t0  # the host's enqueueing time for `reps` calls (no sync)
    torch.cuda.synchronize(device)
    # spin cycles: twice that at 2 GHz (no H100/H200 clock is higher, so the spin only lasts longer)
    spin = int((2 * enqueue_s + 1e-3) * 2e9)
    times = []
    for _ in range(rounds):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(spin)
        start.record()
        for _ in range(reps):
            run()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / reps)
    return sorted(times)[len(times) // 2]


def bundle_tokenizer(bundle: Any, config: dict, where: str):
    """The bundle's tokenizer, configured as transformers configures it (mcore.model.tokenization)."""
    from ..model.tokenization import TOKENIZER_CONFIG, TOKENIZER_JSON, TextTokenizer

    names = set(bundle.names())
    tok_config = read_json_member(bundle, TOKENIZER_CONFIG) if TOKENIZER_CONFIG in names else {}
    model_type = config.get("model_type")
    return TextTokenizer(
        read_text_member(bundle, TOKENIZER_JSON),
        tok_config,
        model_type if isinstance(model_type, str) else "",
        f"{where}: {TOKENIZER_JSON}",
    )


def load_core(bundle: Any, family: Any, config: dict, m: Any, device: torch.device) -> torch.nn.Module:
    """The model with the bundle's weights: stored names, shapes and dtypes checked against the
    model's state before any tensor loads (another model's weights are refused, one line)."""
    core = build_core(family, config, GraphArgs.from_dict(m.graph_args), device)
    w = m.weights
    if w["kind"] == "random":
        family.random_init(core, w["seed"])
        return core
    where = f"{bundle.path}: member {w['member']}"
    blob = bundle.read(w["member"])
    aliases = w.get("aliases", {})
    check_weights(weights_header(blob, where), aliases, core.state_dict(), where)
    core.load_state_dict(load_weights(blob, aliases, where), strict=True)
    return core


class Pipeline:
    """A constructed engine over one bundle with its kernel slots bound."""

    KIND: str | None = None  # "decoder" / "encoder": the bundles a subclass runs
    chat = False  # encode prompts through the checkpoint's chat template (`mcore run --chat`)

    def __init__(
        self,
        bundle_path: str,
        kernel_bindings: str | None = None,
        device: str | None = None,
        engine: str = "auto",
        progress: Progress = NO_PROGRESS,
        announce: Callable[[str], None] | None = None,
        bundle: Any = None,
    ):
        progress.report("checking bundle integrity", 0.0)
        m = self._open(bundle_path, bundle, kernel_bindings)
        self.device = resolve_device(device or m.device)
        self.engine_name = resolve_engine_name(engine, self.device)
        progress.report("binding kernel slots", 0.05)
        bind_kw = {"announce": announce} if announce else {}
        self.kernels = bind_slots(kernel_bindings, m.kernel_slots, **bind_kw)
        args, source = self._load_model(m, bundle_path, progress)
        engine_ = get_engine(self.engine_name, self.device)
        self.runners: dict[str, Any] = {}
        self.snapshots: dict[str, Snapshot] = {}
        self.slot_calls: list[SlotCall] = []
        if m.kernel_slots:
            release_dropped()  # a dropped pipeline's slot keys (and compiled code) serve this one
        self._engine = engine_
        self._capture_from = (args, source, bundle_path)
        self._roles: dict[str, tuple[str, dict[str, torch.Tensor], list, RoleStructure]] = {}
        self._pending: dict[str, RoleHelper] = {}  # roles a helper process compiles (role_helper.py)
        missing = self._load_precompiled(m, source, progress)
        self._capture_missing(m, missing, bundle_path, progress)
        self.runners = {r: self.runners[r] for r in self._roles if r in self.runners}  # the bundle's order
        self.kind = self.family.kind
        self._progress = progress

    def _open(self, bundle_path: str, bundle: Any, kernel_bindings: str | None) -> Any:
        """The bundle (opened here unless given) and its runnable manifest, refused for the wrong verb."""
        self.bundle = bundle if bundle is not None else open_bound_bundle(bundle_path, kernel_bindings)
        m = self.bundle.runnable()
        self.manifest = m
        # the wrong verb is an input error: say so before any DSO is bound or weights load
        check_family(m, str(self.bundle.path))
        kind = bundle_kind(m)
        if self.KIND is not None and kind != self.KIND:
            article, verb = ("an", "mcore embed") if kind == "encoder" else ("a", "mcore run")
            raise UserError(f"{self.bundle.path}: a {m.family} bundle is {article} {kind}; use `{verb}`")
        return m

    def _load_model(self, m: Any, bundle_path: str, progress: Progress) -> tuple[Any, ModelSource]:
        """Family, config, tokenizer and the weights-loaded core; returns the checked graph args and the source."""
        self.family = get_family(m.family)
        self.config = read_json_member(self.bundle, "config.json")
        args, self.gargs = check_graph_args(self.family, self.config, m, str(self.bundle.path))
        source = ModelSource(
            spec=m.model.spec, family=m.family, config=self.config, path=None, revision=m.model.revision
        )
        self.tokenizer = bundle_tokenizer(self.bundle, self.config, bundle_path)
        self.special = m.special_tokens or {}
        progress.report("loading weights", 0.15)
        self.core = load_core(self.bundle, self.family, self.config, m, self.device).eval()
        return args, source

    def _load_precompiled(self, m: Any, source: ModelSource, progress: Progress) -> list[str]:
        """Bind every role's slots and take the roles the engine has precompiled; returns the rest, in order."""
        missing = []
        for i, role in enumerate(m.roles):
            if self._load_role(m, role, source):
                progress.report(f"loaded precompiled {role} graph", 0.3 + 0.3 * (i + 1) / len(m.roles))
            else:
                missing.append(role)
        return missing

    def _capture_missing(self, m: Any, missing: list[str], bundle_path: str, progress: Progress) -> None:
        """Capture the roles without precompiled code; a helper process compiles all but the first where it pays."""
        helper = None
        wanted = len(missing) > 1 and helper_wanted(
            self.device, self._engine, bool(m.kernel_slots), self.family, self.config, self.gargs, self.core
        )
        if wanted:
            helper = RoleHelper.start(bundle_path, missing[1:], self.device)
        try:
            for i, role in enumerate(missing):
                if helper is not None and role in helper.roles:
                    self._pending[role] = helper
                    continue
                progress.report(f"capturing {role} graph", 0.3 + 0.3 * i / len(missing))
                self._capture_role(role)
        except BaseException:
            if helper is not None:
                helper.stop()
            raise

    def _load_role(self, m: Any, role: str, source: ModelSource) -> bool:
        """Bind the role's slots and take it precompiled where the engine has it; False where it
        must be captured and compiled."""
        module = self.family.role_module(self.core, role)
        state: dict[str, torch.Tensor] = dict(module.named_parameters(remove_duplicate=False))
        state.update(dict(module.named_buffers(remove_duplicate=False)))
        slots = []
        for slot in m.slots_of(role):
            call = SlotCall(slot)
            call.bind(self.kernels[slot.binding_id].function, self.device)
            self.slot_calls.append(call)
            slots.append((slot, call))
        structure = RoleStructure(
            structure_key(self.family, self.config, self.gargs, role),
            graph_metadata(source, self.family, self.gargs, role),
        )
        expected = m.roles[role].fingerprint
        self._roles[role] = (expected, state, slots, structure)
        loaded = self._engine.load_role(expected, role, state, slots, self.device, structure)
        if loaded is None:
            return False
        # precompiled: its record holds the snapshot, checked against the bundle's fingerprint
        self.runners[role], self.snapshots[role] = loaded
        return True

    def _capture_role(self, role: str) -> None:
        expected, state, slots, _ = self._roles[role]
        args, source, bundle_path = self._capture_from
        keep = self._engine.keeps_captures(self.device)
        cap = capture_cached(args, role, expected, (source, self.family, self.gargs), save=keep)
        if cap.snapshot.fingerprint != expected:
            raise UserError(
                f"{bundle_path}: the {role} graph this mcore captures ({cap.snapshot.fingerprint[:12]}…) "
                f"differs from the bundle's ({expected[:12]}…); rebuild the bundle with this mcore"
            )
        check_slots(self.manifest.slots_of(role), cap.snapshot, str(self.bundle.path))
        self.runners[role] = self._engine.compile_role(cap, state, slots, self.device)
        self.snapshots[role] = cap.snapshot

    def _take_from_helper(self, role: str, progress: Progress) -> None:
        """The role its helper process compiled, loaded as a precompiled role; captured and compiled
        here instead where the helper failed."""
        helper = self._pending.pop(role)
        progress.report(f"waiting for the {role} graph (compiled beside this one)", 0.0)
        expected, state, slots, structure = self._roles[role]
        loaded = (
            self._engine.load_role(expected, role, state, slots, self.device, structure)
            if helper.wait(progress)
            else None
        )
        if loaded is None:
            progress.report(f"capturing {role} graph (its helper process failed: {helper.failure()})", 0.0)
            self._capture_role(role)
            return
        helper.done()
        self.runners[role], self.snapshots[role] = loaded
        self.runners[role].compiled_beside = True
        self.runners = {r: self.runners[r] for r in self._roles if r in self.runners}  # the bundle's order

    def _ready(self, examples: dict[str, tuple[tuple[torch.Tensor, ...], bool]]) -> None:
        """Let each role's runner compile (and capture) on the pipeline's own buffers: role ->
        (inputs, fixed_shapes). Cancellable between roles and stages."""
        progress = self._progress
        try:
            for i, (role, (inputs, fixed)) in enumerate(examples.items()):
                part = progress.part(0.6 + 0.4 * i / len(examples), 0.6 + 0.4 * (i + 1) / len(examples))
                if role in self._pending:
                    self._take_from_helper(role, part)
                self.runners[role].prepare(*inputs, progress=part, fixed_shapes=fixed)
        finally:
            for helper in self._pending.values():
                helper.stop()
        progress.report(f"pipeline ready (engine {self.engine_name})", 1.0)

    def engine_lines(self) -> list[str]:
        """How each role runs, one line each (for logs, `mcore run` and the TUI)."""
        return [f"[engine] {self.engine_name}: {r.describe()}" for r in self.runners.values()]

    # ------------------------------------------------------------ shared
    def state_inputs(self, role: str) -> list[tuple[str, Tensor]]:
        snap = self.snapshots[role]
        return [(snap.tensor(t).name or t, snap.tensor(t)) for t in snap.inputs]

    def encode(self, prompt: str, chat: bool | None = None) -> list[int]:
        """Token IDs as transformers' tokenizer gives them (with `chat`, default `self.chat`: the
        checkpoint's chat template around the prompt, as apply_chat_template renders and tokenizes it)."""
        return encode_prompt(self.tokenizer, prompt, self.chat if chat is None else chat)

    def decode_text(self, ids: Sequence[int]) -> str:
        return self.tokenizer.decode(list(ids))


def encode_prompt(tokenizer: Any, prompt: str, chat: bool) -> list[int]:
    """A prompt's token IDs (with `chat`: inside the checkpoint's chat template); one rule for the
    pipeline and for the checks made before it loads."""
    from ..model.tokenization import check_prompt

    check_prompt(prompt, "prompt")
    if chat:
        ids = tokenizer.encode(tokenizer.render_chat(prompt), add_special_tokens=False)
    else:
        ids = tokenizer.encode(prompt)
    if not ids:
        raise UserError("the prompt encodes to no tokens; give a non-empty --prompt")
    return ids


def check_fits(prompt_tokens: int, max_new_tokens: int, capacity: int) -> None:
    """The prompt and the tokens to generate fit the KV cache."""
    if max_new_tokens < 1:
        raise UserError(f"--max-new-tokens {max_new_tokens} must be at least 1")
    need = prompt_tokens + max_new_tokens - 1
    if need > capacity:
        raise UserError(
            f"prompt ({prompt_tokens} tokens) + --max-new-tokens {max_new_tokens} need {need} cache slots "
            f"but the KV cache holds {capacity}; ask for fewer tokens or rebuild with a larger "
            "--max-cache-length"
        )


def check_prompts_fit(bundle: Any, prompts: Sequence[str], max_new_tokens: int, chat: bool) -> None:
    """From a decoder bundle's tokenizer and recorded KV capacity, before any DSO or weight loads: the
    chat template exists (with `chat`), and each prompt with the tokens to generate fits the cache.
    Any other bundle passes: the pipeline names the verb it needs."""
    if not (chat or prompts) or bundle_kind(bundle.runnable()) != "decoder":
        return
    tok = bundle_tokenizer(bundle, read_json_member(bundle, "config.json"), str(bundle.path))
    if chat:
        tok.render_chat("")
    capacity = bundle.runnable().graph_args.get("max_cache_length")
    if isinstance(capacity, int):
        for p in prompts:
            check_fits(len(encode_prompt(tok, p, chat)), max_new_tokens, capacity)


class DecoderBuffers:
    """A decoder pipeline's own buffers (the KV caches, one step's token and position) and the
    example inputs its roles compile on; `state_inputs` are a role's (name, tensor) graph inputs.
    The role helper process (role_helper.py) compiles on buffers made the same way."""

    def __init__(self, state_inputs: list[tuple[str, Tensor]], gargs: GraphArgs, device: torch.device):
        self.caches: dict[str, torch.Tensor] = {}
        for name, t in state_inputs:
            if name in ("input_ids", "cache_length"):
                continue
            if -1 in t.shape:
                raise RuntimeError(f"state input {name} has a dynamic shape")
            self.caches[name] = torch.zeros(t.shape, dtype=TORCH_DTYPES[t.dtype], device=device)
        self.cache_names = [n for n, _ in state_inputs if n in self.caches]
        self.capacity = gargs.cache_length
        self.cache_length = torch.zeros(1, dtype=torch.int32, device=device)
        self.step_ids = torch.zeros(1, 1, dtype=torch.int32, device=device)
        self.prompt = torch.zeros(1, min(2, self.capacity), dtype=torch.int32, device=device)

    def examples(self) -> dict[str, tuple[tuple[torch.Tensor, ...], bool]]:
        """role -> (inputs, fixed shapes): prefill varies in length (compiled with a dynamic token
        count); a decode step is fixed."""
        caches = tuple(self.caches[n] for n in self.cache_names)
        return {
            "prefill": ((self.prompt, *caches), False),
            "decode": ((self.step_ids, self.cache_length, *caches), True),
        }


@dataclass
class GenerationResult:
    prompt: str
    prompt_tokens: list[int]
    tokens: list[int]
    text: str
    ttft_s: float = 0.0
    step_s: list[float] = field(default_factory=list)
    total_s: float = 0.0


class DecoderPipeline(Pipeline):
    """Prefill then decode over a fixed-capacity KV cache owned by the pipeline."""

    KIND = "decoder"

    def __init__(self, *a: Any, **kw: Any):
        super().__init__(*a, **kw)
        # both roles take the caches in one order; the decode role's snapshot may still be on its
        # way from a helper process (role_helper.py), then the prefill role's names them
        buffers = DecoderBuffers(
            self.state_inputs("decode" if "decode" in self.snapshots else "prefill"), self.gargs, self.device
        )
        self.caches, self.cache_names = buffers.caches, buffers.cache_names
        self.cache_list = caches = tuple(self.caches[n] for n in self.cache_names)
        self.capacity = buffers.capacity
        self.cache_length, self.step_ids = buffers.cache_length, buffers.step_ids
        # every end token the checkpoint names (Llama 3 instruct ends a turn with its third, <|eot_id|>)
        eos = self.special.get("eos_token_ids") or self.special.get("eos_token_id")
        self.eos_ids = set(eos if isinstance(eos, list) else ([eos] if eos is not None else []))
        self._ready(buffers.examples())
        if [n for n, _ in self.state_inputs("decode") if n in self.caches] != self.cache_names:
            raise RuntimeError("the prefill and decode roles take the KV caches in different orders")
        for c in caches:  # compiling ran the roles once on these buffers
            c.zero_()

    def generate(
        self,
        prompt: str,
        max_new_tokens: int,
        greedy: bool = True,
        stop_at_eos: bool = True,
        temperature: float = 1.0,
        top_k: int = 0,
        seed: int = 0,
        timed: bool = False,
        progress: Progress = NO_PROGRESS,
    ) -> GenerationResult:
        ids = self.encode(prompt)
        check_fits(len(ids), max_new_tokens, self.capacity)
        gen = None if greedy else torch.Generator(device=self.device).manual_seed(seed)
        t0 = time.perf_counter()
        inp = torch.tensor([ids], dtype=torch.int32, device=self.device)
        (logits,) = self.runners["prefill"](inp, *self.cache_list)
        tok = self._pick(logits, greedy, temperature, top_k, gen)
        out = [tok]
        if timed:
            sync(self.device)
        t_first = time.perf_counter()
        if greedy:
            more, steps = self.decode_tokens(tok, len(ids), max_new_tokens - 1, stop_at_eos, progress)
            out += more
        else:
            steps = []
            pos = len(ids)
            while len(out) < max_new_tokens and not (stop_at_eos and tok in self.eos_ids):
                progress.report(f"generated {len(out)}/{max_new_tokens} tokens", len(out) / max_new_tokens)
                ts = time.perf_counter()
                tok = self._pick(self._step(tok, pos), False, temperature, top_k, gen)
                out.append(tok)
                pos += 1
                steps.append(time.perf_counter() - ts)
        t_end = time.perf_counter()
        return GenerationResult(prompt, ids, out, self.decode_text(out), t_first - t0, steps, t_end - t0)

    def decode_tokens(
        self,
        token: int,
        position: int,
        count: int,
        stop_at_eos: bool = True,
        progress: Progress = NO_PROGRESS,
        ahead: bool | None = None,
    ) -> tuple[list[int], list[float]]:
        """Greedy decode steps after `token` (at cache position `position`): up to `count` new tokens,
        fewer where one is an EOS and `stop_at_eos`; returns (tokens, seconds per token).

        With `ahead` (the default on CUDA) each step's greedy pick stays on the device and feeds the
        next step there, which is queued before the pick is read: the GPU never waits for the host's
        turnaround between tokens (a read, a few launches). A step queued after an EOS is dropped (it
        wrote a cache slot no one reads). The picks are the same either way: the same argmax of the
        same logits."""
        if position + count > self.capacity:
            raise UserError(f"position {position} + {count} tokens is past the KV cache ({self.capacity})")
        ahead = self.device.type == "cuda" if ahead is None else ahead

        def queue(src: Any, pos: int) -> torch.Tensor:  # one step and its greedy pick, left on the device
            return self._greedy(self._step(src, pos))

        out: list[int] = []
        steps: list[float] = []
        if count < 1 or (stop_at_eos and token in self.eos_ids):
            return out, steps
        queued = time.perf_counter()
        pending: torch.Tensor | None = queue(token, position)
        while pending is not None:
            progress.report(f"generated {len(out) + 1}/{count + 1} tokens", (len(out) + 1) / (count + 1))
            ts = time.perf_counter()
            pick, pending = pending, None
            last = len(out) + 1 == count
            if ahead and not last:  # the next step goes in before this pick is read
                pending = queue(pick, position + len(out) + 1)
            tok = int(pick.item())
            # ahead, a token costs the wait between picks; without, its step ran when it was queued
            steps.append(time.perf_counter() - (ts if ahead else queued))
            out.append(tok)
            stop = stop_at_eos and tok in self.eos_ids
            if not ahead and not last and not stop:
                queued = time.perf_counter()
                pending = queue(tok, position + len(out))
            if stop:
                break
        return out, steps

    def _step(self, token: Any, position: int) -> torch.Tensor:
        """One decode step fed `token` (an int, or a pick still on the device) at cache position
        `position`: its logits. The inputs are the decode role's own buffers (a CUDA graph replays
        over them); nothing here waits for the device."""
        if isinstance(token, int):
            self.step_ids.fill_(token)
        else:
            self.step_ids.copy_(token.view(1, 1))
        self.cache_length.fill_(position)
        (logits,) = self.runners["decode"](self.step_ids, self.cache_length, *self.cache_list)
        return logits

    def device_step_seconds(self, position: int, reps: int = 200) -> float | None:
        """Device time of one decode step at `position` (steps enqueued back to back; each writes the
        same cache slot, so the cache is scratch afterwards). None off CUDA."""
        if not 0 <= position < self.capacity:
            raise UserError(f"position {position} is outside the KV cache (0..{self.capacity - 1})")
        self.cache_length.fill_(position)
        return device_seconds(
            lambda: self.runners["decode"](self.step_ids, self.cache_length, *self.cache_list), self.device, reps
        )

    def step_logits(self, prompt_ids: Sequence[int], tokens: Sequence[int]) -> list[torch.Tensor]:
        """Logits (fp32, on the CPU) after the prompt and after each forced token: the lockstep view that
        gates compare bit for bit. Starts from an empty cache."""
        if len(prompt_ids) + len(tokens) > self.capacity:
            raise UserError(
                f"{len(prompt_ids)} prompt + {len(tokens)} forced tokens exceed the KV cache ({self.capacity})"
            )
        for c in self.cache_list:
            c.zero_()
        (logits,) = self.runners["prefill"](
            torch.tensor([list(prompt_ids)], dtype=torch.int32, device=self.device), *self.cache_list
        )
        out = [logits.float().cpu()]
        for pos, tok in enumerate(tokens, start=len(prompt_ids)):
            out.append(self._step(int(tok), pos).float().cpu())
        return out

    @staticmethod
    def _greedy(logits: torch.Tensor) -> torch.Tensor:
        """The greedy pick of one step's logits, still on their device (a 0-d index tensor)."""
        return torch.argmax(logits.reshape(-1).float())

    @staticmethod
    def _pick(logits: torch.Tensor, greedy: bool, temperature: float, top_k: int, gen) -> int:
        if greedy:
            return int(DecoderPipeline._greedy(logits).item())
        row = logits.reshape(-1).float() / max(temperature, 1e-6)
        if top_k > 0:
            v, i = torch.topk(row, min(top_k, row.numel()))
            choice = torch.multinomial(torch.softmax(v, -1), 1, generator=gen)
            return int(i[choice].item())
        return int(torch.multinomial(torch.softmax(row, -1), 1, generator=gen).item())


class EncoderPipeline(Pipeline):
    KIND = "encoder"

    def __init__(self, *a: Any, **kw: Any):
        super().__init__(*a, **kw)
        self.seq = self.gargs.seq_length
        self.pad_id = int(self.special.get("pad_token_id") or 0)
        ids = torch.zeros(self.seq, dtype=torch.int32, device=self.device)
        self._ready({"encoder": ((ids, torch.ones_like(ids)), True)})

    def inputs(self, prompt: str) -> tuple[torch.Tensor, torch.Tensor, int]:
        ids = self.encode(prompt)
        if len(ids) > self.seq:
            raise UserError(
                f"the prompt is {len(ids)} tokens but this bundle's --max-seq-length is {self.seq}; "
                "shorten it or rebuild with a larger --max-seq-length"
            )
        n = len(ids)
        padded = ids + [self.pad_id] * (self.seq - n)
        mask = [1] * n + [0] * (self.seq - n)
        return (
            torch.tensor(padded, dtype=torch.int32, device=self.device),
            torch.tensor(mask, dtype=torch.int32, device=self.device),
            n,
        )

    def device_call_seconds(self, prompt: str, reps: int = 200) -> float | None:
        """Device time of one encoder call on `prompt`'s inputs (calls enqueued back to back). None off CUDA."""
        ids, mask, _ = self.inputs(prompt)
        return device_seconds(lambda: self.runners["encoder"](ids, mask), self.device, reps)

    def hidden_states(self, prompt: str) -> tuple[torch.Tensor, int]:
        ids, mask, n = self.inputs(prompt)
        (hidden,) = self.runners["encoder"](ids, mask)
        return hidden, n

    def pooling(self, pooling: str | None = None, normalize: bool | None = None) -> tuple[str, bool, str]:
        """(pooling, normalize, why): explicit choices win, else the checkpoint's declared default."""
        from ..model.pooling import choose

        return choose(pooling, normalize, self.manifest.sentence_embedding)

    def embed(self, prompt: str, pooling: str | None = None, normalize: bool | None = None) -> list[float]:
        from ..model.pooling import pool

        mode, norm, _ = self.pooling(pooling, normalize)
        hidden, n = self.hidden_states(prompt)
        return pool(hidden, n, mode, norm).cpu().tolist()


def percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return 0.0
    s = sorted(values)
    k = (len(s) - 1) * q
    lo, hi = int(k), min(int(k) + 1, len(s) - 1)
    return s[lo] + (s[hi] - s[lo]) * (k - lo)
