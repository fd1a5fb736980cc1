"""Running kernel exporters (`mcore kernel export`, the workbench's export_kernel step): the shipped
CuTe DSL decode attention for a real recipe receipt, stub scripts, refusals, and trust on replay."""

from __future__ import annotations

import hashlib
import json
import time
from pathlib import Path

import pytest

from mcore.common.errors import Cancelled, UserError
from mcore.common.progress import CancelToken, Progress
from mcore.kernels.exporters import run_exporter
from workbench.actions import ActionContext
from workbench.session import Session

from .conftest import assert_user_error, needs_cute

ATTN_ARGS = [
    "demo:qwen3-tiny-hd64",
    "--precision",
    "bf16",
    "--max-cache-length",
    "256",
    "--decoder-engine-layout",
    "split",
]
RECIPE = "qwen.decode_attention_region@2"


@pytest.fixture(scope="module")
def attention_receipts(tmp_path_factory):
    """Slot-ready bundle of every decode-attention instance of the head-dim-64 demo, and its receipts."""
    from mcore.cli.main import main

    d = tmp_path_factory.mktemp("attn")
    assert main(["build", *ATTN_ARGS, "--recipe", RECIPE, "all-instances", "-o", str(d / "attn.bundle")]) == 0
    main(["graph", "inspect", "--engine-role", "decode", "--snapshot", str(d / "decode.graph.json"), *ATTN_ARGS])
    return d


def _script(tmp_path: Path, body: str) -> Path:
    p = tmp_path / "export_fake.py"
    p.write_text(
        "import argparse, sys\n"
        "a = argparse.ArgumentParser(); a.add_argument('--selection'); a.add_argument('--output')\n"
        "a.add_argument('--snapshot'); ns = a.parse_args()\n" + body
    )
    return p


def test_a_script_runs_streamed_and_its_fields_are_read(tmp_path):
    (tmp_path / "r.selection.json").write_text("{}")
    script = _script(
        tmp_path,
        "open(ns.output, 'wb').write(b'x')\n"
        "print('compiling'); print('binding_id=k@1'); print('abi_sha256=' + 'ab' * 32)\n"
        "print('arch=sm_90a'); print('dso=' + ns.output)\n",
    )
    seen: list[str] = []
    r = run_exporter(script, tmp_path / "r.selection.json", tmp_path / "k.so", log=seen.append)
    assert seen[0] == "compiling" and r.library == tmp_path / "k.so" and r.library.read_bytes() == b"x"
    assert (r.binding_id, r.abi_sha256, r.arch) == ("k@1", "ab" * 32, "sm_90a")


def test_refusals_are_one_line_and_write_nothing(tmp_path, mcore):
    (tmp_path / "r.selection.json").write_text("{}")
    refuses = _script(
        tmp_path, "print('export_fake.py: error: head_dim 16 is not supported', file=sys.stderr)\nsys.exit(2)\n"
    )
    res = mcore("kernel", "export", refuses, "--selection", tmp_path / "r.selection.json", "-o", tmp_path / "k.so")
    assert_user_error(res, "exporter export_fake.py failed (exit 2)", "head_dim 16 is not supported")
    assert not (tmp_path / "k.so").exists()
    assert_user_error(
        mcore(
            "kernel",
            "export",
            "no-such-exporter",
            "--selection",
            tmp_path / "r.selection.json",
            "-o",
            tmp_path / "k.so",
        ),
        "cutedsl-decode-attention",
        "exporter script (.py)",
    )
    assert_user_error(
        mcore(
            "kernel",
            "export",
            tmp_path / "missing.py",
            "--selection",
            tmp_path / "r.selection.json",
            "-o",
            tmp_path / "k.so",
        ),
        "missing.py: no such file",
    )
    assert_user_error(
        mcore("kernel", "export", refuses, "--selection", tmp_path / "none.json", "-o", tmp_path / "k.so"),
        "none.json: selection receipt not found",
    )
    (tmp_path / "taken.so").write_bytes(b"keep")
    assert_user_error(
        mcore("kernel", "export", refuses, "--selection", tmp_path / "r.selection.json", "-o", tmp_path / "taken.so"),
        "already exists",
    )
    assert (tmp_path / "taken.so").read_bytes() == b"keep"
    silent = _script(tmp_path, "pass\n")
    assert_user_error(
        mcore("kernel", "export", silent, "--selection", tmp_path / "r.selection.json", "-o", tmp_path / "k.so"),
        "exited 0 but wrote no DSO",
    )


@pytest.mark.timing
def test_cancel_stops_the_exporter(tmp_path):
    (tmp_path / "r.selection.json").write_text("{}")
    script = _script(tmp_path, "import time\nprint('started', flush=True)\ntime.sleep(60)\n")
    token = CancelToken()
    t0 = time.monotonic()
    with pytest.raises(Cancelled):
        run_exporter(
            script,
            tmp_path / "r.selection.json",
            tmp_path / "k.so",
            progress=Progress(None, token),
            log=lambda line: token.cancel(),
        )
    assert time.monotonic() - t0 < 30 and not (tmp_path / "k.so").exists()


def test_the_attention_exporter_refuses_the_head_dim_16_demo(tmp_path, mcore):
    assert (
        mcore(
            "build",
            "demo:qwen3-tiny",
            "--precision",
            "bf16",
            "--max-cache-length",
            "256",
            "--recipe",
            RECIPE,
            "decoder.layers.0.decode_attention",
            "-o",
            tmp_path / "a.bundle",
        ).code
        == 0
    )
    res = mcore(
        "kernel",
        "export",
        "cutedsl-decode-attention",
        "--selection",
        tmp_path / "a.selection.json",
        "-o",
        tmp_path / "a.so",
    )
    assert_user_error(res, "head_dim 16 is not supported")


@needs_cute
def test_shipped_attention_exporter_for_a_recipe_receipt(attention_receipts, tmp_path, mcore):
    d = attention_receipts
    sel = d / "attn.selection.decoder.layers.0.decode_attention.json"
    res = mcore(
        "kernel",
        "export",
        "cutedsl-decode-attention",
        "--selection",
        sel,
        "--snapshot",
        d / "decode.graph.json",
        "-o",
        tmp_path / "attn.so",
    )
    assert res.code == 0, res.err
    abi = json.loads(sel.read_text())["abi_sha256"]
    assert f"abi_sha256={abi}" in res.out and f"binding_id={RECIPE}" in res.out
    assert (tmp_path / "attn.so").stat().st_size > 0


def _export_session(tmp_path: Path, exporter: str) -> Path:
    s = Session.new("export", device="cpu")
    s.record(
        "export_kernel",
        {"exporter": exporter, "receipt": "r.selection.json", "output": "k.so"},
        {"binding_id": "k@1", "abi_sha256": "ab" * 32},
    )
    return s.save(tmp_path / "s.json")


def test_replay_runs_a_session_script_only_when_trusted(tmp_path, workbench):
    path = _export_session(tmp_path, "export_fake.py")
    res = workbench("replay", path, "--headless", "--workdir", tmp_path / "wd")
    assert_user_error(res, "step 1 (export_kernel)", "runs a script", "export_fake.py", "--trust-libraries")
    # a shipped exporter is mcore's own code: no flag needed (this one then fails on the missing receipt)
    res = workbench(
        "replay", _export_session(tmp_path, "cutedsl-decode-attention"), "--headless", "--workdir", tmp_path / "wd2"
    )
    assert "--trust-libraries" not in res.out + res.err and "r.selection.json" in res.out + res.err
    wd = tmp_path / "wd3"
    (wd / "trusted").mkdir(parents=True)
    (wd / "export_fake.py").write_text("")
    ctx = ActionContext(workdir=wd, confined=True, where="step 1 (export_kernel): ", trusted_libraries=wd / "trusted")
    with pytest.raises(UserError, match="export_fake.py is outside the trusted folder trusted"):
        ctx.check_code(wd / "export_fake.py", "exporter")


def test_export_action_records_what_the_exporter_printed(tmp_path):
    from workbench.dispatch import run_action

    (tmp_path / "r.selection.json").write_text("{}")
    _script(
        tmp_path,
        "open(ns.output, 'wb').write(b'x')\nprint('binding_id=k@1')\nprint('abi_sha256=' + 'cd' * 32)\n"
        "print('arch=sm_90a')\nprint('dso=' + ns.output)\n",
    )
    lines: list[str] = []
    results, error = run_action(
        ActionContext(workdir=tmp_path, log=lines.append),
        "export_kernel",
        {"exporter": "export_fake.py", "receipt": "r.selection.json", "output": "k.so"},
    )
    assert error is None and results == {
        "library": "k.so",
        "binding_id": "k@1",
        "abi_sha256": "cd" * 32,
        "arch": "sm_90a",
        "library_sha256": hashlib.sha256(b"x").hexdigest(),  # of the file written, as mcore read it
    }
    assert "binding_id=k@1" in lines
