"""Tokenizing a prompt as transformers' AutoTokenizer does, from tokenizer.json + tokenizer_config.json.

What transformers (5.x) does with a checkpoint's tokenizer files, and so what this does too:
- A tokenizer.json may enable padding (e.g. fixed to 128) and truncation; a plain
  `tokenizer(text)` call turns both off. The pipeline pads by itself, so both are turned off here;
  a prompt longer than a bundle takes is the pipeline's clear length error, never cut short.
- The tokenizer class (tokenizer_config.json's `tokenizer_class`, else the one transformers maps
  the model type to) decides the special tokens. The BERT classes rebuild normalizer,
  pre-tokenizer and post-processor from tokenizer_config.json (`do_lower_case`,
  `strip_accents`, `tokenize_chinese_chars`, CLS/SEP tokens) around a WordPiece
  tokenizer.json's vocabulary: so does this. Every other class
  (Qwen2Tokenizer, the generic TokenizersBackend) keeps tokenizer.json's pipeline, so a BOS is
  added exactly when its post-processor adds one (transformers 5 does not act on
  tokenizer_config.json's `add_bos_token` for these classes).
- `chat_template` (tokenizer_config.json, or chat_template.jinja beside it) is rendered with
  the same Jinja settings as transformers' apply_chat_template; the result is tokenized without
  adding special tokens (the template holds them).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from datetime import datetime
from pathlib import Path
from typing import Any

from ..common.errors import UserError


def check_prompt(text: Any, what: str = "--prompt") -> str:
    """A prompt must be text that UTF-8 can carry: bytes that are not UTF-8 arrive from the command
    line as lone surrogates, and the tokenizer would fail on them deep inside."""
    if not isinstance(text, str):
        raise UserError(f"{what} must be text, got {type(text).__name__}")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise UserError(
            f"{what} is not valid UTF-8 (bad byte at character {e.start}); pass the prompt as UTF-8 text"
        ) from None
    return text


TOKENIZER_JSON = "tokenizer.json"
TOKENIZER_CONFIG = "tokenizer_config.json"
CHAT_TEMPLATE_FILE = "chat_template.jinja"

# transformers' AutoTokenizer mapping for the model types mcore runs (tokenization_auto.py).
_CLASS_FOR_MODEL_TYPE = {"bert": "BertTokenizer", "distilbert": "BertTokenizer", "qwen3": "Qwen2Tokenizer"}
_BERT_CLASSES = {"BertTokenizer", "DistilBertTokenizer"}


def token_text(v: Any) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or an AddedToken object."""
    if isinstance(v, str):
        return v
    if isinstance(v, dict) and isinstance(v.get("content"), str):
        return v["content"]
    return None


def read_tokenizer_files(folder: Path) -> tuple[str, dict]:
    """(tokenizer.json text, tokenizer_config.json with chat_template.jinja folded in) of a checkpoint."""
    path = folder / TOKENIZER_JSON
    if not path.is_file():
        raise UserError(f"{path}: tokenizer.json not found; the model folder needs a fast tokenizer file")
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"{path}: cannot read tokenizer.json ({e})") from None
    config: dict = {}
    cpath = folder / TOKENIZER_CONFIG
    if cpath.is_file():
        try:
            config = json.loads(cpath.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError, RecursionError) as e:
            raise UserError(
                f"{cpath}: cannot read tokenizer_config.json ({type(e).__name__}: {e}); fix or remove it"
            ) from None
        if not isinstance(config, dict):
            raise UserError(f"{cpath}: expected a JSON object")
    jpath = folder / CHAT_TEMPLATE_FILE
    if "chat_template" not in config and jpath.is_file():  # transformers 5 saves the template here
        config = {**config, "chat_template": jpath.read_text(encoding="utf-8")}
    return text, config


class TextTokenizer:
    """A checkpoint's tokenizer, configured as AutoTokenizer configures it (see the module doc)."""

    def __init__(self, tokenizer_json: str, tokenizer_config: dict, model_type: str, where: str = "tokenizer"):
        from tokenizers import Tokenizer

        self.where = where
        self.config = dict(tokenizer_config or {})
        try:
            self.tok = Tokenizer.from_str(tokenizer_json)
        except Exception as e:  # the tokenizers library raises its own exception types
            msg = str(e).splitlines()[0] if str(e) else type(e).__name__
            raise UserError(f"{where}: cannot load tokenizer.json ({msg})") from None
        self.tok.no_padding()
        self.tok.no_truncation()
        cls = self.config.get("tokenizer_class") or _CLASS_FOR_MODEL_TYPE.get(model_type)
        self.tokenizer_class = str(cls).removesuffix("Fast") if cls else "TokenizersBackend"
        # The BERT classes rebuild a WordPiece pipeline; for any other model type in tokenizer.json
        # (a BPE vocabulary under a bert model type) the file's own pipeline is the meaningful one.
        if self.tokenizer_class in _BERT_CLASSES and type(self.tok.model).__name__ == "WordPiece":
            self._as_bert()

    # ------------------------------------------------------------ configuration
    def special(self, name: str, default: str | None = None) -> str | None:
        """The text of a special token (`bos_token`, `cls_token`, ...) from tokenizer_config.json."""
        return token_text(self.config.get(name)) if name in self.config else default

    def _id(self, text: str | None, field: str) -> int:
        if text is None:  # `"cls_token": null` or a non-string in tokenizer_config.json
            raise UserError(f"{self.where}: tokenizer_config.json field {field!r} must be a token string")
        i = self.tok.token_to_id(text)
        if i is None:
            raise UserError(
                f"{self.where}: {field} {text!r} is not in tokenizer.json's vocabulary; fix tokenizer_config.json"
            )
        return i

    def _as_bert(self) -> None:
        """transformers' BertTokenizer: BertNormalizer + BertPreTokenizer + `[CLS] $A [SEP]`."""
        from tokenizers import normalizers, pre_tokenizers, processors

        c = self.config
        for key in ("do_lower_case", "tokenize_chinese_chars"):
            if key in c and not isinstance(c[key], bool):
                raise UserError(
                    f"{self.where}: tokenizer_config.json field {key!r} must be true or false (got {c[key]!r})"
                )
        strip = c.get("strip_accents")
        if strip is not None and not isinstance(strip, bool):
            raise UserError(f"{self.where}: tokenizer_config.json field 'strip_accents' must be true, false or null")
        self.tok.normalizer = normalizers.BertNormalizer(
            clean_text=True,
            handle_chinese_chars=c.get("tokenize_chinese_chars", True),
            strip_accents=strip,
            lowercase=c.get("do_lower_case", True),
        )
        self.tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        cls, sep = self.special("cls_token", "[CLS]"), self.special("sep_token", "[SEP]")
        cls_id, sep_id = self._id(cls, "cls_token"), self._id(sep, "sep_token")
        self.tok.post_processor = processors.TemplateProcessing(
            single=f"{cls}:0 $A:0 {sep}:0",
            pair=f"{cls}:0 $A:0 {sep}:0 $B:1 {sep}:1",
            special_tokens=[(cls, cls_id), (sep, sep_id)],
        )

    # ------------------------------------------------------------ use
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return list(self.tok.encode(text, add_special_tokens=add_special_tokens).ids)

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(list(ids), skip_special_tokens=True)

    @property
    def chat_template(self) -> str | None:
        t = self.config.get("chat_template")
        if isinstance(t, list):  # named templates: transformers uses the one named "default"
            named = {d.get("name"): d.get("template") for d in t if isinstance(d, dict)}
            t = named.get("default")
        return t if isinstance(t, str) and t.strip() else None

    def render_chat(self, prompt: str) -> str:
        """The prompt as one user message in the checkpoint's chat template, with the generation
        prompt added (transformers: apply_chat_template(..., add_generation_prompt=True))."""
        template = self.chat_template
        if template is None:
            raise UserError(
                f"{self.where}: this checkpoint has no chat template (tokenizer_config.json "
                "chat_template); run without --chat"
            )
        specials = {
            k: self.special(k)
            for k in ("bos_token", "eos_token", "unk_token", "pad_token", "sep_token", "cls_token", "mask_token")
            if self.special(k) is not None
        }
        return render_template(
            template,
            {"messages": [{"role": "user", "content": prompt}], "add_generation_prompt": True, **specials},
            f"{self.where}: the chat template",
        )


# A chat template is someone's program: it runs sandboxed (no attribute access outside the safe
# set, immutable containers), with an operation budget (lines of the compiled template executed),
# a time budget, a cap on what one `*`/`**` may build, and a cap on its output.
TEMPLATE_OPS = 2_000_000
TEMPLATE_SECONDS = 5.0
TEMPLATE_OUTPUT = 1 << 20
TEMPLATE_VALUE = 1 << 20  # the largest string/list one `*` may make, the largest power `**` may compute


class TemplateBudget(Exception):
    """A chat template ran past its operation or time budget."""


def render_template(template: str, context: dict[str, Any], what: str) -> str:
    """Render a chat template with transformers' Jinja settings, bounded; any failure of the
    template (an error it raises, 1//0, recursion, memory, a loop that would run for hours) is one
    line naming `what`."""
    from jinja2 import TemplateError

    env = _template_env()
    try:
        compiled = env.from_string(template)
        text = _bounded(lambda: compiled.render(**context))
    except TemplateBudget as e:
        raise UserError(f"{what} was stopped: it {e} (a prompt template needs far less)") from None
    except RecursionError:
        raise UserError(f"{what} failed: it recurses too deeply") from None
    except MemoryError:
        raise UserError(f"{what} failed: it ran out of memory") from None
    except TemplateError as e:  # raise_exception() in the template, or jinja's own errors
        raise UserError(f"{what} failed: {e}") from None
    except Exception as e:  # noqa: BLE001 - a template can raise anything (ZeroDivisionError, TypeError...)
        first = (str(e).strip().splitlines() or [""])[0][:200]
        raise UserError(f"{what} failed: {type(e).__name__}: {first}") from None
    if len(text) > TEMPLATE_OUTPUT:
        raise UserError(f"{what} made {len(text)} characters; a prompt template makes far fewer")
    return text


def _bounded(render: Callable[[], str]) -> str:
    """Run `render` with a trace on the compiled template's lines: past TEMPLATE_OPS lines or
    TEMPLATE_SECONDS it stops with TemplateBudget."""
    import sys
    import time

    deadline = time.monotonic() + TEMPLATE_SECONDS
    count = 0

    def lines(frame: Any, event: str, arg: Any) -> Any:
        nonlocal count
        if event == "line":
            count += 1
            if count > TEMPLATE_OPS:
                raise TemplateBudget(f"ran past its budget of {TEMPLATE_OPS} operations")
            if count % 1024 == 0 and time.monotonic() > deadline:
                raise TemplateBudget(f"ran past its time budget of {TEMPLATE_SECONDS:g} s")
        return lines

    def calls(frame: Any, event: str, arg: Any) -> Any:
        return lines if frame.f_code.co_filename == "<template>" else None

    previous = sys.gettrace()
    sys.settrace(calls)
    try:
        return render()
    finally:
        sys.settrace(previous)


def _template_env() -> Any:
    from jinja2 import TemplateError
    from jinja2.ext import loopcontrols
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    class Env(ImmutableSandboxedEnvironment):
        intercepted_binops = frozenset({"*", "**"})

        def call_binop(self, context: Any, operator: str, left: Any, right: Any) -> Any:
            _check_binop(operator, left, right)
            return super().call_binop(context, operator, left, right)

    def raise_exception(message: str):
        raise TemplateError(message)

    def tojson(
        x: Any, ensure_ascii: bool = False, indent: Any = None, separators: Any = None, sort_keys: bool = False
    ) -> str:
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt: Any) -> str:
        if not isinstance(fmt, str) or len(fmt) > 200:
            raise TemplateError("strftime_now takes a format string")
        return datetime.now().strftime(fmt)

    env = Env(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def _check_binop(operator: str, left: Any, right: Any) -> None:
    """What one `*` or `**` may build: TemplateBudget past TEMPLATE_VALUE."""
    import math

    if operator == "*":
        for seq, n in ((left, right), (right, left)):
            if isinstance(seq, (str, list, tuple)) and isinstance(n, int) and len(seq) * max(n, 0) > TEMPLATE_VALUE:
                raise TemplateBudget(f"would build a value of {len(seq) * n} items")
    elif isinstance(left, int) and isinstance(right, int) and right > 0 and abs(left) > 1:
        if right * math.log2(abs(left)) > 8 * TEMPLATE_VALUE:
            raise TemplateBudget(f"would compute {left} ** {right}")


def load_tokenizer_from_folder(folder: Path, model_type: str) -> TextTokenizer:
    text, config = read_tokenizer_files(Path(folder))
    return TextTokenizer(text, config, model_type, str(Path(folder) / TOKENIZER_JSON))
