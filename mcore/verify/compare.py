"""The promotion gates (tutorial steps 4 and 7): exact tokens, embedding numerics, and
measured no-regression performance (mcore/verify/perf.py). The CLI (`mcore verify ...`) and the TUI
share these.

Every gate returns a `GateResult` (mcore/verify/verdicts.py): `verdict` (PASS/FAIL; the perf gate says
PROMOTE/REJECT/INCONCLUSIVE), `passed`, `line` (the final verdict line), `details` (numbers, typed: details.py), and
`info` (lines to show before the verdict, e.g. per-pair measurements).
Bad input (missing file, malformed JSON, missing fields; token records of other prompts) raises
`UserError` (exit 2). Embeddings empty or of unequal lengths FAIL (exit 1), as the tutorial's own gate does.
"""

from __future__ import annotations

import math
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from ..common.errors import UserError
from ..common.fileio import check_fields, parse_json, read_input_text
from .details import EmbeddingsDetails, TokensDetails
from .perf import METRICS, BenchmarkReading, parse_benchmark, perf_gate, run_shell  # noqa: F401 - the gates' home
from .verdicts import GateResult, check_threshold  # noqa: F401 - imported from here by the other gates

# ---------------------------------------------------------------- tokens


TOKEN_RECORD_FIELDS = frozenset({"prompt", "text"})  # beside the required tokens


def load_token_records(path: str | os.PathLike) -> list[dict]:
    """Records written by `mcore run --output` (JSONL; each with a `tokens` list of ints)."""
    text = read_input_text(path, "token records", "write them with `mcore run --output`")
    records = []
    for n, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        rec = parse_json(line, f"{path}: line {n}", "token records (one JSON object a line)")
        if not isinstance(rec, dict):
            raise UserError(f"{path}: line {n}: expected a JSON object, got {type(rec).__name__}")
        if "tokens" not in rec:
            raise UserError(f"{path}: line {n}: missing field tokens; write records with `mcore run --output`")
        check_fields(rec, f"{path}: line {n}", {"tokens"}, TOKEN_RECORD_FIELDS)  # as `mcore run --output` writes
        for k in ("prompt", "text"):
            if k in rec and not isinstance(rec[k], str):
                raise UserError(f"{path}: line {n}: field {k} must be a string")
        toks = rec["tokens"]
        if not isinstance(toks, list) or any(isinstance(t, bool) or not isinstance(t, int) for t in toks):
            raise UserError(f"{path}: line {n}: field tokens must be a list of integers")
        rec = dict(rec)
        rec["_line"] = n
        records.append(rec)
    if not records:
        raise UserError(f"{path}: no token records; write them with `mcore run --output`")
    return records


def _records(src: Any) -> list[dict]:
    if isinstance(src, (str, os.PathLike)):
        return load_token_records(src)
    out = []
    for i, rec in enumerate(src):
        if not isinstance(rec, dict) or not isinstance(rec.get("tokens"), list):
            raise UserError(f"token record {i + 1}: expected an object with a tokens list")
        out.append({**rec, "_line": rec.get("_line", i + 1)})
    return out


def _named(label: str, src: Any) -> str:
    """`native` or, for a file, `native FILE`: what a usage error names."""
    return f"{label} {src}" if isinstance(src, (str, os.PathLike)) else label


def _check_same_prompts(ra: list[dict], rb: list[dict], a: Any, b: Any, labels: Sequence[str]) -> None:
    """Unequal counts or prompts are two different runs, not a kernel defect: a usage error (exit 2).
    Prompts are compared only where both records carry one (records passed from Python may not)."""
    la, lb = _named(labels[0], a), _named(labels[1], b)
    if len(ra) != len(rb):
        raise UserError(f"{la} has {len(ra)} records but {lb} has {len(rb)}; run both with the same prompts")
    for i, (x, y) in enumerate(zip(ra, rb, strict=True)):
        pa, pb = x.get("prompt"), y.get("prompt")
        if pa is not None and pb is not None and pa != pb:
            raise UserError(
                f"record {i + 1} has different prompts in {la} ({_clip(pa)}) and {lb} ({_clip(pb)}); "
                "run both with the same prompts"
            )


def _clip(prompt: Any) -> str:
    text = str(prompt)
    return f"{text[:40]!r}{'...' if len(text) > 40 else ''}"


def compare_tokens(a: Any, b: Any, labels: Sequence[str] = ("native", "external")) -> GateResult[TokensDetails]:
    """PASS when every record's tokens are identical. `a`/`b`: JSONL paths or lists of records.
    Different record counts or prompts raise UserError: the gate compares two runs of the same prompts."""
    ra, rb = _records(a), _records(b)
    _check_same_prompts(ra, rb, a, b, labels)
    la, lb = labels
    names = (la, lb)
    total = 0
    for i, (x, y) in enumerate(zip(ra, rb, strict=True)):
        ta, tb = x["tokens"], y["tokens"]
        if ta != tb:
            pos = next((k for k, (p, q) in enumerate(zip(ta, tb, strict=False)) if p != q), min(len(ta), len(tb)))
            va = ta[pos] if pos < len(ta) else "<end>"
            vb = tb[pos] if pos < len(tb) else "<end>"
            prompt = x.get("prompt")
            about = f" (prompt {_clip(prompt)})" if isinstance(prompt, str) else ""
            line = (
                f"FAIL: record {i + 1}{about} differs at token position {pos}: {la}={va} {lb}={vb} "
                f"({la} {len(ta)} tokens, {lb} {len(tb)} tokens)"
            )
            details = TokensDetails(len(ra), first_record=i + 1, first_position=pos, differing=(va, vb), labels=names)
            return GateResult(False, line, details)
        total += len(ta)
    return GateResult(
        True,
        f"PASS: tokens identical ({len(ra)} records, {total} tokens)",
        TokensDetails(len(ra), tokens=total, labels=names),
    )


# ---------------------------------------------------------------- embeddings


def load_embedding(path: str | os.PathLike) -> list[float]:
    """`{"embedding": [floats]}` as `mcore embed` writes to stdout."""
    path = Path(path)
    text = read_input_text(path, "embedding", "write it with `mcore embed ... > FILE`")
    data = parse_json(text, str(path), "embedding (the stdout of `mcore embed`)", constants=True)  # as json.load
    return _embedding(data, str(path))


def _embedding(data: Any, where: str) -> list[float]:
    if isinstance(data, dict):
        if "embedding" not in data:
            raise UserError(f"{where}: missing field embedding; expected the stdout of `mcore embed`")
        data = data["embedding"]
    if not isinstance(data, list) or any(isinstance(v, bool) or not isinstance(v, (int, float)) for v in data):
        raise UserError(f"{where}: field embedding must be a flat list of numbers")
    return data


def _embedding_src(src: Any, where: str) -> list[float]:
    if isinstance(src, (str, os.PathLike)):
        return load_embedding(src)
    return _embedding(src if isinstance(src, (dict, list)) else list(src), where)


def check_limits(min_cosine: Any, max_abs: Any) -> None:
    """--min-cosine in [-1, 1] and --max-abs >= 0 (None: not gated)."""
    check_threshold("--min-cosine", min_cosine, -1.0, 1.0)
    if max_abs is not None:
        check_threshold("--max-abs", max_abs, 0.0)


def compare_embeddings(
    a: Any, b: Any, max_abs: float = 0.02, min_cosine: float = 0.999, labels: Sequence[str] = ("native", "byok")
) -> GateResult[EmbeddingsDetails]:
    """The tutorial's step-7 numerical gate, computed exactly like its snippet.

    `a`/`b`: JSON paths, `{"embedding": [...]}` dicts or lists of numbers. The stats line
    `values=N max_abs=X cosine=Y` is in `info`; `line` is `PASS: numerical gate` or
    `FAIL: numerical gate` (or `FAIL: embedding lengths differ ...`, where the tutorial's snippet
    exits with `FAIL: embedding lengths differ`: the two agree on every input).
    """
    check_limits(min_cosine, max_abs)
    la, lb = labels
    names = (la, lb)
    native = _embedding_src(a, la)
    byok = _embedding_src(b, lb)
    if not native or len(native) != len(byok):
        return GateResult(
            False,
            f"FAIL: embedding lengths differ ({la} {len(native)} values, {lb} {len(byok)} values)",
            EmbeddingsDetails(len(native), counts=(len(native), len(byok)), labels=names),
        )
    if not all(math.isfinite(v) for v in native) or not all(math.isfinite(v) for v in byok):
        return GateResult(
            False,
            "FAIL: numerical gate",
            EmbeddingsDetails(len(native), reason="non-finite values", labels=names),
            [f"values={len(native)} embedding contains NaN or infinite values"],
        )
    # Same expressions, same order as the tutorial's snippet, so the numbers agree to the bit.
    max_abs_value = max(abs(x - y) for x, y in zip(native, byok, strict=True))
    denominator = math.sqrt(sum(value * value for value in native) * sum(value * value for value in byok))
    if denominator == 0:
        return GateResult(
            False,
            "FAIL: numerical gate",
            EmbeddingsDetails(len(native), max_abs=max_abs_value, reason="zero-norm embedding", labels=names),
            [f"values={len(native)} max_abs={max_abs_value:.6g} cosine=undefined (an embedding is all zeros)"],
        )
    cosine = sum(x * y for x, y in zip(native, byok, strict=True)) / denominator
    stats = f"values={len(native)} max_abs={max_abs_value:.6g} cosine={cosine:.9f}"
    reasons = []
    if max_abs_value > max_abs:
        reasons.append(f"max_abs {max_abs_value:.6g} > {max_abs:g}")
    if cosine < min_cosine:
        reasons.append(f"cosine {cosine:.9f} < {min_cosine:g}")
    details = EmbeddingsDetails(
        len(native), None, max_abs_value, cosine, max_abs, min_cosine, "; ".join(reasons) or None, names
    )
    return GateResult(not reasons, f"{'FAIL' if reasons else 'PASS'}: numerical gate", details, [stats])
