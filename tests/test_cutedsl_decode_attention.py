"""kernels/cutedsl_decode_attention.py: the CuTe DSL decode attention of tutorial step 5 (issue 13).

CPU (CI): the contract check accepts this recipe's ABI and refuses everything else with one line
and exit 2; compile + export + link for sm_90a and load the DSO (no GPU needed).
GPU (marked `gpu`, run on the device): numerics against mcore.ops.attention.decode_attention_reference.
They passed on the H200 (docs/gpu-results.md, 2026-12-01: the whole suite with the CuTe DSL carried).
"""

from __future__ import annotations

import copy
import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from mcore.selection.region import select_region
from tests.test_stubgen import Graph, node_of

from .conftest import needs_cute, repo_env, require_cute

REPO = Path(__file__).resolve().parents[1]
SCRIPT = REPO / "kernels" / "cutedsl_decode_attention.py"
BINDING = "qwen.decode_attention_region@2"


def attention_pair(
    dtype="BF16", heads=32, kv_heads=8, capacity=4096, head_dim=128, binding=BINDING, **select: Any
) -> tuple[dict, dict]:
    """A stand-in decode graph around one mcore.decode_attention node, and its receipt."""
    g = Graph(role="decode", family="qwen3", model="stand-in")
    q = g.input(dtype, [1, heads, -1, head_dim], "query")
    k = g.input(dtype, [1, kv_heads, capacity, head_dim], "key_cache")
    v = g.input(dtype, [1, kv_heads, capacity, head_dim], "value_cache")
    n = g.input("INT32", [1], "kv_lengths")
    a = g.op(
        "mcore.decode_attention.default",
        [q, k, v, n],
        dtype,
        [1, heads, -1, head_dim],
        module_path="decoder.layers.0.self_attn.decode_attention",
    )
    g.output(g.op("aten.relu.default", [a], dtype, [1, heads, -1, head_dim]))
    snap = g.snapshot()
    return snap, select_region(snap, [node_of(snap, a)], binding, output_shape_input=0, **select).to_dict()


def write_pair(folder: Path, snap: dict, receipt: Any, name: str = "attn") -> tuple[Path, Path]:
    rp, sp = folder / f"{name}.selection.json", folder / f"{name}.graph.json"
    rp.write_text(json.dumps(receipt if isinstance(receipt, dict) else receipt.to_dict()))
    sp.write_text(json.dumps(snap))
    return rp, sp


@pytest.fixture(scope="module")
def exporter():
    spec = importlib.util.spec_from_file_location("cutedsl_decode_attention", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod  # as an import would (its dataclass looks its module up there)
    spec.loader.exec_module(mod)
    return mod


def run_script(*args: str, **extra_env: str) -> subprocess.CompletedProcess:
    """The exporter as a script, with this checkout's mcore (its exporter kit) importable."""
    env = {k: v for k, v in repo_env().items() if k != "CUTE_DSL_ARCH"} | extra_env
    return subprocess.run(
        [sys.executable, str(SCRIPT), *map(str, args)], capture_output=True, text=True, env=env, timeout=600
    )


# ---------------------------------------------------------------- contract (no CuTe DSL needed)


# The attention shapes of published models (query heads, KV heads, head_dim) with their family's recipe:
# head_dim 64 and 128, 1 to 8 query heads a KV head.
PUBLISHED_SHAPES = {
    "qwen3-8b": ("BF16", 32, 8, 128, BINDING),
    "llama-3.1-8b": ("BF16", 32, 8, 128, "llama.decode_attention_region@1"),
    "llama-3.2-1b": ("BF16", 32, 8, 64, "llama.decode_attention_region@1"),
    "llama-3.2-3b": ("BF16", 24, 8, 128, "llama.decode_attention_region@1"),  # GQA 3
    "llama-3.3-70b": ("BF16", 64, 8, 128, "llama.decode_attention_region@1"),  # GQA 8
    "llama-2-7b": ("FP16", 32, 32, 128, "llama.decode_attention_region@1"),  # GQA 1
    "mistral-7b": ("BF16", 32, 8, 128, "mistral.decode_attention_region@1"),
    "qwen2.5-0.5b": ("BF16", 14, 2, 64, "qwen2.decode_attention_region@1"),  # GQA 7
    "qwen2.5-7b": ("BF16", 28, 4, 128, "qwen2.decode_attention_region@1"),  # GQA 7
    "fp16-gqa-8x8-64": ("FP16", 8, 8, 64, BINDING),
}


@pytest.mark.parametrize("model", list(PUBLISHED_SHAPES))
def test_check_only_accepts_every_fitting_shape(exporter, tmp_path, capsys, model):
    dtype, heads, kv_heads, head_dim, binding = PUBLISHED_SHAPES[model]
    snap, receipt = attention_pair(dtype, heads, kv_heads, 1024, head_dim, binding=binding)
    rp, sp = write_pair(tmp_path, snap, receipt)
    assert exporter.main(["--selection", str(rp), "--snapshot", str(sp), "--check-only"]) == 0
    out = capsys.readouterr().out
    assert f"({dtype} heads={heads} kv_heads={kv_heads} capacity=1024 head_dim={head_dim})" in out
    assert f"abi_sha256={receipt['abi_sha256']}" in out and f"binding_id={binding}" in out


def _edited(receipt: dict, mutate) -> dict:
    r = copy.deepcopy(receipt)
    mutate(r)
    return r


def refusals() -> list[tuple[str, Any, str]]:
    """(name, receipt or (snapshot, receipt), the message fragment)."""
    _, base = attention_pair()
    other_snap, _ = attention_pair(capacity=2048)
    return [
        ("fp32", attention_pair("FP32")[1], "dtypes FP32, FP32, FP32, INT32, FP32 are not supported"),
        ("head_dim", attention_pair(head_dim=96)[1], "head_dim 96 is not supported"),
        ("gqa", attention_pair(heads=12, kv_heads=8)[1], "12 query heads are not a multiple of 8 KV heads"),
        ("workspace", attention_pair(workspace_bytes=1024)[1], "holds fewer than 2 partial results a head"),
        ("binding", attention_pair(binding="my.attn@1")[1], "binding ID 'my.attn@1' is not"),
        ("edited", _edited(base, lambda r: r["abi"]["inputs"][1]["shape"].__setitem__(2, 8)), "the file was edited"),
        ("not a receipt", {"kind": "something"}, "not a selection receipt"),
        ("snapshot", (other_snap, base), "this is another graph"),
    ]


@pytest.mark.parametrize("name, case, fragment", refusals(), ids=[c[0] for c in refusals()])
def test_each_mismatch_is_one_line_exit_2(exporter, tmp_path, capsys, name, case, fragment):
    snap, receipt = case if isinstance(case, tuple) else (attention_pair()[0], case)
    rp, sp = write_pair(tmp_path, snap, receipt)
    assert exporter.main(["--selection", str(rp), "--snapshot", str(sp), "--check-only"]) == 2
    err = capsys.readouterr().err
    assert fragment in err and len(err.strip().splitlines()) == 1, err


def test_boundary_that_is_not_attention_is_refused(exporter, tmp_path, capsys):
    g = Graph(role="decode")
    x = g.input("BF16", [4, 128], "x")
    y = g.op("aten.relu.default", [x], "BF16", [4, 128])
    g.output(g.op("aten.relu.default", [y], "BF16", [4, 128]))
    snap = g.snapshot()
    rp, _ = write_pair(tmp_path, snap, select_region(snap, [node_of(snap, y)], BINDING))
    assert exporter.main(["--selection", str(rp), "--check-only"]) == 2
    assert "(BF16 [4, 128], BF16 [4, 128]) is not decode attention" in capsys.readouterr().err


def test_command_line_exit_codes(tmp_path):
    snap, receipt = attention_pair("FP32")
    rp, _ = write_pair(tmp_path, snap, receipt)
    r = run_script("--selection", rp, "--check-only")
    assert r.returncode == 2 and "Traceback" not in r.stderr and "are not supported" in r.stderr
    r = run_script("--selection", tmp_path / "missing.json", "--check-only")
    assert r.returncode == 2 and "selection receipt not found" in r.stderr


# ---------------------------------------------------------------- compile + export + link (no GPU needed)


@needs_cute
def test_export_links_a_loadable_tvm_ffi_dso(tmp_path):
    import torch
    import tvm_ffi

    snap, receipt = attention_pair("BF16", 32, 8, 4096, 128)
    rp, sp = write_pair(tmp_path, snap, receipt)
    out = tmp_path / "dso" / "attention.so"
    out.parent.mkdir()
    r = run_script("--selection", rp, "--snapshot", sp, "--output", out)
    assert r.returncode == 0, r.stderr[-3000:]
    # no GPU: sm_90a, the default target; with one, the DSL compiles for the GPU it sees
    arch = "arch=the visible GPU" if torch.cuda.is_available() else "arch=sm_90a"
    assert f"abi_sha256={receipt['abi_sha256']}" in r.stdout and arch in r.stdout
    assert f"dso={out.resolve()}" in r.stdout and [p.name for p in out.parent.iterdir()] == [out.name]
    assert "schedule=cluster 8, 8 warps, 4 heads a block, tensor cores\n" in r.stdout  # the default for GQA 4
    # what to declare for the split schedule: 32 splits of 32 heads' fp32 (context row, max, sum)
    assert "split_workspace_bytes=532480 (`mcore build ... --workspace-bytes 532480`: 32 splits a row)" in r.stdout
    fn = tvm_ffi.load_module(str(out))["run"]
    q = torch.zeros(1, 32, 3, 128, dtype=torch.bfloat16)
    cache = torch.zeros(1, 8, 4096, 128, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="cuda"):  # the wrapper checks every argument before any launch
        fn(q, cache, cache.clone(), torch.full((1,), 3, dtype=torch.int32), q.clone())
    with pytest.raises(TypeError, match="Expects 5 parameters"):
        fn(q, cache, cache, q)
    r = run_script("--selection", rp, "--output", out)  # never overwritten
    assert r.returncode == 2 and "never overwrites" in r.stderr


@needs_cute
@pytest.mark.parametrize(
    "shape, env, walk",
    [
        (("BF16", 32, 8, 4096, 128), {"CUTEDSL_ATTENTION_MMA": "0"}, "8 warps, 4 heads a block, scalar"),
        (("FP16", 32, 2, 512, 64), {"CUTEDSL_ATTENTION_MMA": "1"}, "8 warps, 16 heads a block, scalar"),
        (
            ("FP16", 16, 2, 512, 64),
            {"CUTEDSL_ATTENTION_PREFETCH": "1", "CUTEDSL_ATTENTION_WARPS": "12"},
            "12 warps, 8 heads a block, tensor cores, prefetch",
        ),
    ],
    ids=["scalar-asked", "group-of-16", "prefetch"],
)
def test_other_walks_export_and_say_which_they_are(tmp_path, shape, env, walk):
    """The scalar walk (CUTEDSL_ATTENTION_MMA=0, and what a GQA group of more than 8 heads gets even
    with tensor cores asked) and the tensor-core walk with its loads a step ahead
    (CUTEDSL_ATTENTION_PREFETCH=1) compile, export and link for sm_90a here; the default is the test
    above; the numbers of every walk are checked on the GPU (SCHEDULES below)."""
    import tvm_ffi

    rp, sp = write_pair(tmp_path, *attention_pair(*shape))
    out = tmp_path / "walk.so"
    r = run_script("--selection", rp, "--snapshot", sp, "--output", out, **env)
    assert r.returncode == 0, r.stderr[-3000:]
    assert f"schedule=cluster 8, {walk}\n" in r.stdout
    assert callable(tvm_ffi.load_module(str(out))["run"])


@needs_cute
def test_a_qwen2_group_of_seven_exports_on_tensor_cores(tmp_path):
    """Qwen2.5-7B's 28 query heads over 4 KV heads (7 a group, padded to the 16 rows of the tensor-core
    tile) through `mcore kernel export`, the receipt's own binding id printed back."""
    rp, sp = write_pair(tmp_path, *attention_pair("BF16", 28, 4, 4096, 128, binding="qwen2.decode_attention_region@1"))
    out = tmp_path / "qwen2.so"
    r = subprocess.run(
        [
            sys.executable,
            "-m",
            "mcore",
            "kernel",
            "export",
            "cutedsl-decode-attention",
            "--selection",
            str(rp),
            "--snapshot",
            str(sp),
            "-o",
            str(out),
        ],
        capture_output=True,
        text=True,
        timeout=900,
        env=repo_env(),
    )
    assert r.returncode == 0, r.stderr[-3000:]
    assert "binding_id=qwen2.decode_attention_region@1" in r.stdout
    assert "schedule=cluster 8, 8 warps, 7 heads a block, tensor cores\n" in r.stdout and out.is_file()


@needs_cute
def test_a_receipt_with_a_workspace_exports_the_split_schedule(tmp_path):
    """A workspace in the receipt (its ABI hash covers it) selects the schedule split over blocks:
    run(query, key_cache, value_cache, kv_lengths, workspace, context) launches the walk and a merge
    kernel, which waits for the walk's records (griddepcontrol.wait) before reading them."""
    import tvm_ffi

    ws = 32 * 40 * 130 * 4  # 32 heads, 40 records each, head_dim 128 + max and sum, fp32
    rp, sp = write_pair(tmp_path, *attention_pair("BF16", 32, 8, 4096, 128, workspace_bytes=ws))
    dump = tmp_path / "dump"
    dump.mkdir()
    out = tmp_path / "split.so"
    r = run_script(
        "--selection", rp, "--snapshot", sp, "--output", out, CUTE_DSL_KEEP="ptx", CUTE_DSL_DUMP_DIR=str(dump)
    )
    assert r.returncode == 0, r.stderr[-3000:]
    # 32 splits of 4 warps (the defaults) of the 40 the workspace holds
    assert f"schedule=split 32 ways over blocks at 1 new token (workspace {ws} bytes), 4 warps" in r.stdout
    assert callable(tvm_ffi.load_module(str(out))["run"])
    (text,) = [p.read_text() for p in dump.rglob("*.ptx")]
    entries = [i for i, t in enumerate(text.splitlines()) if t.startswith(".visible .entry")]
    assert len(entries) == 2 and "merge_kernel" in text.splitlines()[entries[1]]
    merge = text.splitlines()[entries[1] :]
    wait = next(i for i, t in enumerate(merge) if "griddepcontrol.wait" in t)
    assert wait < min(i for i, t in enumerate(merge) if "ld.global" in t)


@needs_cute
def test_the_tma_walk_copies_a_tile_of_keys_with_one_bulk_copy(tmp_path):
    """CUTEDSL_ATTENTION_TMA=1: a producer warp fills each ring stage with one bulk copy of the tile's
    K rows and one of its V rows (a runtime byte count: only keys below the block's stop), counted on
    the stage's mbarrier; the walking warps wait on it and release the stage; the merge kernel asks
    for the walk's shared memory (one carveout for both)."""
    ws = 32 * 32 * 130 * 4
    rp, _ = write_pair(tmp_path, *attention_pair("BF16", 32, 8, 40960, 128, workspace_bytes=ws))
    out, text = _ptx(tmp_path, "tma", rp, CUTEDSL_ATTENTION_TMA="1")
    assert "tensor cores, bulk copies through a ring of 2 tiles of 64 keys" in out
    lines = text.splitlines()
    entries = [i for i, t in enumerate(lines) if t.startswith(".visible .entry")]
    walk = lines[entries[0] : entries[1]]
    copies = [t for t in walk if "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes" in t]
    # one K and one V copy a tile; the loop over tiles is unrolled a few times, never a copy a row
    assert copies and len(copies) % 2 == 0 and len(copies) <= 16
    assert all(c.split(",")[2].strip().startswith("%r") for c in copies)  # the byte count is a register
    assert any("mbarrier.arrive.expect_tx" in t for t in walk) and any("mbarrier.try_wait" in t for t in walk)
    assert sum("mbarrier.init" in t for t in walk) == 4  # full and empty, 2 stages
    # in bank order: each lane reads a pair of chunks in its order, then one selp a word puts them back
    # (K: 16 words a row, 2 rows; V: 8 words a row, 4 rows)
    _, banks = _ptx(tmp_path, "banks", rp, CUTEDSL_ATTENTION_TMA="1", CUTEDSL_ATTENTION_TMA_BANKS="1")
    assert banks.count("selp.b32") - text.count("selp.b32") == 2 * 16 + 4 * 8
    assert banks.count("ld.shared.v4") == text.count("ld.shared.v4") == 2 * 4 + 4 * 2
    # a plain split export has no ring
    plain_out, plain = _ptx(tmp_path, "plain", rp)
    assert "cp.async.bulk" not in plain and "bulk copies" not in plain_out


@needs_cute
def test_the_tma_walk_refuses_what_it_cannot_run(tmp_path):
    """No workspace (the cluster schedule), a bad stage count, or a ring over an sm_90 block's shared
    memory: one line naming the knob, exit 2, no DSO."""
    plain_rp, _ = write_pair(tmp_path, *attention_pair("BF16", 32, 8, 4096, 128), "plain")
    ws_rp, _ = write_pair(tmp_path, *attention_pair("BF16", 32, 4, 4096, 128, workspace_bytes=32 * 16 * 130 * 4), "ws")
    for rp, env, says in (
        (plain_rp, {"CUTEDSL_ATTENTION_TMA": "1"}, "CUTEDSL_ATTENTION_TMA=1 needs the split schedule"),
        (ws_rp, {"CUTEDSL_ATTENTION_TMA": "1", "CUTEDSL_ATTENTION_TMA_STAGES": "9"}, "TMA_STAGES 2 to 6"),
        (ws_rp, {"CUTEDSL_ATTENTION_TMA_BANKS": "1"}, "it needs CUTEDSL_ATTENTION_TMA=1"),
        (
            ws_rp,
            {"CUTEDSL_ATTENTION_TMA": "1", "CUTEDSL_ATTENTION_TMA_STAGES": "4", "CUTEDSL_ATTENTION_WARPS": "8"},
            "KB of shared memory a block (at most 227 KB)",
        ),
    ):
        out = tmp_path / "x.so"
        r = run_script("--selection", rp, "--output", out, **env)
        assert r.returncode == 2 and says in r.stderr, (env, r.stderr[-2000:])
        assert len(r.stderr.strip().splitlines()) == 1 and not out.exists()


@needs_cute
@pytest.mark.parametrize(
    ("knob", "value", "says"),
    [
        ("CUTEDSL_ATTENTION_SPLITS", "1", "CUTEDSL_ATTENTION_SPLITS must be 2 to 64"),
        ("CUTEDSL_ATTENTION_PDL", "late", "CUTEDSL_ATTENTION_PDL must be 0, 1 or early (or unset)"),
    ],
)
def test_a_bad_knob_is_named(tmp_path, knob, value, says):
    rp, sp = write_pair(tmp_path, *attention_pair(workspace_bytes=32 * 16 * 130 * 4))
    r = run_script("--selection", rp, "--output", tmp_path / "x.so", **{knob: value})
    assert r.returncode != 0 and says in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not (tmp_path / "x.so").exists()


def _ptx(tmp_path: Path, name: str, rp: Path, **env: str) -> tuple[str, str]:
    """(stdout, the PTX) of an export of `rp` with `env`."""
    dump = tmp_path / name
    dump.mkdir()  # the DSL writes its PTX only into a folder that exists
    r = run_script(
        "--selection", rp, "--output", tmp_path / f"{name}.so", CUTE_DSL_KEEP="ptx", CUTE_DSL_DUMP_DIR=str(dump), **env
    )
    assert r.returncode == 0, r.stderr[-3000:]
    (text,) = [p.read_text() for p in dump.rglob("*.ptx")]
    return r.stdout, text


@needs_cute
def test_the_kernel_waits_for_its_producer_before_it_touches_memory(tmp_path):
    """Launched with programmatic dependent launch (it may start while the kernel before it drains),
    the kernel's first global read or write must come after griddepcontrol.wait, and it lets the next
    kernel launch only once its walk has read the caches (the next kernel's blocks would otherwise
    wait on the SMs while this one streams): checked in the PTX the exporter compiled.
    CUTEDSL_ATTENTION_PDL=0 builds a plain launch, with neither."""
    rp, _ = write_pair(tmp_path, *attention_pair("BF16", 32, 8, 4096, 128))

    def places(text: str) -> dict[str, list[int]]:
        lines = text.splitlines()
        kinds = ("griddepcontrol.wait", "griddepcontrol.launch_dependents", "ld.global", "st.global")
        return {kind: [i for i, t in enumerate(lines) if kind in t] for kind in kinds}

    at = places(_ptx(tmp_path, "pdl", rp)[1])
    (wait,), (launch,) = at["griddepcontrol.wait"], at["griddepcontrol.launch_dependents"]
    assert wait < min(at["ld.global"]) and wait < min(at["st.global"])
    assert max(at["ld.global"]) < launch < min(at["st.global"])
    assert "griddepcontrol" not in _ptx(tmp_path, "plain", rp, CUTEDSL_ATTENTION_PDL="0")[1]
    # =early: the next kernel may launch once the wait returned, before any global access (as the
    # engine's Triton kernels do); with a workspace the merge kernel does the same
    out, text = _ptx(tmp_path, "early", rp, CUTEDSL_ATTENTION_PDL="early")
    at = places(text)
    assert "dependents launched early" in out
    (wait,), (launch,) = at["griddepcontrol.wait"], at["griddepcontrol.launch_dependents"]
    assert wait < launch < min(at["ld.global"] + at["st.global"])
    # the split schedule launches both kernels early by default (the walk and the merge: each lets its
    # successor launch as soon as its wait returned)
    ws_rp, _ = write_pair(tmp_path, *attention_pair("BF16", 32, 8, 4096, 128, workspace_bytes=32 * 32 * 130 * 4), "ws")
    out, text = _ptx(tmp_path, "split", ws_rp)
    assert "tiles dealt round the blocks, dependents launched early" in out
    at = places(text)
    assert len(at["griddepcontrol.wait"]) == len(at["griddepcontrol.launch_dependents"]) == 2  # walk and merge
    for wait, launch in zip(at["griddepcontrol.wait"], at["griddepcontrol.launch_dependents"], strict=True):
        assert wait < launch and not any(wait < i < launch for i in at["ld.global"] + at["st.global"])
    # =1 with a workspace: the walk lets the merge launch once it has read the caches; the merge lets its
    # successor launch right after its wait
    out, text = _ptx(tmp_path, "split-late", ws_rp, CUTEDSL_ATTENTION_PDL="1")
    assert "dependents launched early" not in out
    lines = text.splitlines()
    merge_at = next(i for i, t in enumerate(lines) if t.startswith(".visible .entry") and "merge_kernel" in t)
    assert merge_at > next(
        i for i, t in enumerate(lines) if t.startswith(".visible .entry") and "attention_kernel" in t
    )
    at = places(text)
    walk = {k: [i for i in v if i < merge_at] for k, v in at.items()}
    merge = {k: [i for i in v if i > merge_at] for k, v in at.items()}
    (wait,), (launch,) = walk["griddepcontrol.wait"], walk["griddepcontrol.launch_dependents"]
    assert wait < min(walk["ld.global"]) and max(walk["ld.global"]) < launch < min(walk["st.global"])
    (wait,), (launch,) = merge["griddepcontrol.wait"], merge["griddepcontrol.launch_dependents"]
    assert wait < launch < min(merge["ld.global"] + merge["st.global"])


@needs_cute
def test_the_split_walk_deals_tiles_round_the_blocks(tmp_path):
    """The split schedule's register walk deals 16-key tiles a warp round the blocks (block r: tiles r,
    r + splits, ...), so its loop steps by splits x 64 keys (the run-time split count, a register), where
    a warp's contiguous share (CUTEDSL_ATTENTION_INTERLEAVE=0) steps by the constant 16. The numbers of both are
    checked on the GPU (schedules `split` and `split-shares` below)."""
    rp, _ = write_pair(tmp_path, *attention_pair("BF16", 32, 8, 4096, 128, workspace_bytes=32 * 32 * 130 * 4))
    out, dealt = _ptx(tmp_path, "dealt", rp)
    shares_out, shares = _ptx(tmp_path, "shares", rp, CUTEDSL_ATTENTION_INTERLEAVE="0")
    assert "tiles dealt round the blocks" in out and "tiles dealt" not in shares_out

    def walk(text: str) -> list[str]:
        lines = text.splitlines()
        entries = [i for i, t in enumerate(lines) if t.startswith(".visible .entry")] + [len(lines)]
        first = next(n for n, i in enumerate(entries[:-1]) if "attention_kernel" in lines[i])
        return [t.strip() for t in lines[entries[first] : entries[first + 1]]]

    def steps_by_16(text: str) -> bool:  # a loop variable advanced by the constant 16
        return any(t.startswith("add.s32") and t.endswith(", 16;") for t in walk(text))

    assert steps_by_16(shares) and not steps_by_16(dealt)


@needs_cute
def test_the_walk_places_its_block_before_its_wait(tmp_path, monkeypatch):
    """The walk's row, split, token and heads come from its block index and two run-time counts
    (integer divisions): their sum is stored to shared memory before griddepcontrol.wait, so ptxas
    computes them while the kernel before drains. Without the store the PTX had them before the wait
    too, but ptxas moved both after it: about 85 instructions on the path of every call (0.05-0.12 us
    a call on an H100). Checked in the SASS ptxas made (bench/kernel_sass.py), not only the PTX."""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parent.parent / "bench"))
    import kernel_sass

    rp, _ = write_pair(tmp_path, *attention_pair("BF16", 32, 8, 4096, 128, workspace_bytes=32 * 32 * 130 * 4))
    cubin = kernel_sass.export_cubin(rp, {"CUTE_DSL_KEEP": "ptx,cubin"}, tmp_path / "pin")  # one export, both files
    (ptx,) = cubin.parent.rglob("*.ptx")
    lines = [t.strip() for t in ptx.read_text().splitlines()]
    lines = lines[next(i for i, t in enumerate(lines) if t.startswith(".visible .entry") and "attention_kernel" in t) :]
    wait = lines.index("griddepcontrol.wait;")
    stores = [i for i, t in enumerate(lines[:wait]) if t.startswith("st.shared")]
    divisions = [i for i, t in enumerate(lines[:wait]) if t.startswith(("div.s32", "div.u32"))]
    assert len(stores) == 1 and len(divisions) == 2 and max(divisions) < stores[0]
    (walk,) = [ins for name, ins in kernel_sass.sass_of(cubin).items() if "attention_kernel" in name]
    summary = kernel_sass.summarize(walk)
    assert summary["wait_to_first_load"] is not None and summary["wait_to_first_load"] <= 12, summary


def test_the_sass_reader_names_a_missing_receipt(tmp_path):
    r = subprocess.run(
        [sys.executable, str(Path(__file__).resolve().parent.parent / "bench" / "kernel_sass.py"),
         "--selection", str(tmp_path / "none.json")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert r.returncode == 2 and r.stderr.strip().splitlines()[-1].endswith("none.json: no such receipt")


@needs_cute
def test_a_small_cache_splits_only_as_far_as_its_tiles_reach(tmp_path):
    """The demo's 256-key cache holds four 64-key tiles: a fifth split could never hold a key, so the
    split schedule of a 32-split workspace runs 4 splits there and its merge loads 4 records (two loads
    each: the column, and the max and sum side by side), where a 4096-key cache keeps all 32 (the PTX)."""
    ws = 8 * 32 * 66 * 4  # 8 heads, 32 splits, head_dim 64 + max and sum, fp32

    def merge_loads(capacity: int) -> tuple[str, int]:
        rp, _ = write_pair(tmp_path, *attention_pair("BF16", 8, 2, capacity, 64, workspace_bytes=ws), f"c{capacity}")
        out, text = _ptx(tmp_path, f"c{capacity}", rp)
        lines = text.splitlines()
        first = next(i for i, t in enumerate(lines) if t.startswith(".visible .entry") and "merge_kernel" in t)
        return out, sum("ld.global" in t for t in lines[first:])

    small, small_loads = merge_loads(256)
    large, large_loads = merge_loads(4096)
    assert "schedule=split 4 ways over blocks" in small and "schedule=split 32 ways over blocks" in large
    # the workspace the exporter asks for is 4 splits' there (it sizes the build's --workspace-bytes),
    # whichever schedule the receipt exported (the cluster's 8 warps a block do not change it)
    ask = "split_workspace_bytes=8448 (`mcore build ... --workspace-bytes 8448`: 4 splits a row)"
    rp, _ = write_pair(tmp_path, *attention_pair("BF16", 8, 2, 256, 64), "cluster")
    cluster = run_script("--selection", rp, "--output", tmp_path / "cluster.so").stdout
    assert ask in small and ask in cluster and "schedule=cluster 8" in cluster
    assert (small_loads, large_loads) == (2 * 4, 2 * 32)


# ---------------------------------------------------------------- GPU numerics (run on the device: pytest -m gpu)

GPU_SHAPES = [  # (dtype, heads, kv_heads, capacity, head_dim): GQA 1, 4 and 8; both head dims and dtypes
    ("BF16", 8, 8, 256, 128),
    ("FP16", 8, 8, 256, 64),
    ("BF16", 16, 4, 256, 64),
    ("FP16", 16, 4, 256, 128),
    ("BF16", 32, 4, 256, 128),
    ("FP16", 32, 4, 256, 64),
]
GPU_LENGTHS = [1, 2, 127, 128, 129, 255, 256]  # ..., capacity - 1, capacity
SCHEDULES = {  # a cluster per KV head (the default) or per query head; tensor-core (the default) or scalar arithmetic
    "per-group": {"CUTEDSL_ATTENTION_HEADS_PER_BLOCK": "0", "CUTEDSL_ATTENTION_MMA": "0"},
    "per-head": {"CUTEDSL_ATTENTION_HEADS_PER_BLOCK": "1", "CUTEDSL_ATTENTION_MMA": "0"},
    "mma": {"CUTEDSL_ATTENTION_HEADS_PER_BLOCK": "0", "CUTEDSL_ATTENTION_MMA": "1"},
    "mma-prefetch": {"CUTEDSL_ATTENTION_MMA": "1", "CUTEDSL_ATTENTION_PREFETCH": "1"},
    "mma-prefetch-12-warps": {"CUTEDSL_ATTENTION_PREFETCH": "1", "CUTEDSL_ATTENTION_WARPS": "12"},
    "mma-2-heads": {"CUTEDSL_ATTENTION_HEADS_PER_BLOCK": "2"},
    # with a workspace in the receipt: split over blocks, merged by a second kernel
    "split": {},
    "split-7-scalar": {"CUTEDSL_ATTENTION_SPLITS": "7", "CUTEDSL_ATTENTION_MMA": "0"},
    "split-tight-8-warps": {"CUTEDSL_ATTENTION_WARPS": "8"},
    # the walk lets the merge launch once it has read the caches (the default launches both early)
    "split-late": {"CUTEDSL_ATTENTION_PDL": "1"},
    # one contiguous share a warp instead of tiles dealt round the blocks
    "split-shares": {"CUTEDSL_ATTENTION_INTERLEAVE": "0"},
    # keys through a shared-memory ring by bulk copies (a producer warp): 2 stages (the default), 3;
    # tiles of 8 warps
    "split-tma": {"CUTEDSL_ATTENTION_TMA": "1"},
    "split-tma-3-stages": {"CUTEDSL_ATTENTION_TMA": "1", "CUTEDSL_ATTENTION_TMA_STAGES": "3"},
    "split-tma-8-warps": {"CUTEDSL_ATTENTION_TMA": "1", "CUTEDSL_ATTENTION_WARPS": "8"},
    "split-tma-banks": {"CUTEDSL_ATTENTION_TMA": "1", "CUTEDSL_ATTENTION_TMA_BANKS": "1"},
}
# the partial results a head the receipt's workspace holds at one new token, by schedule: 2 leaves
# 3 new tokens one split (the blocks write the context themselves). At these shapes' 256-key capacity
# the splits stop where the tiles do (4 of 64 keys, 2 of the scalar walk's 128): 32 and 7 splits
# run in full only in the 8192-key tests below
WORKSPACE_SPLITS = {
    "split": 32,
    "split-7-scalar": 7,
    "split-tight-8-warps": 2,
    "split-late": 32,
    "split-shares": 32,
    "split-tma": 32,
    "split-tma-3-stages": 32,
    "split-tma-8-warps": 16,
    "split-tma-banks": 32,
}


def workspace_bytes(schedule: str, heads: int, head_dim: int) -> int:
    """As the exporter's split_workspace_bytes: per head and split an fp32 context row, max and sum."""
    return heads * WORKSPACE_SPLITS.get(schedule, 0) * (head_dim + 2) * 4


class _Kernels:
    """The GPU tests' kernels by (shape, schedule), each exported the first time a test asks for it.
    Under pytest -n the workers share one folder of this run, so each of the 36 DSOs is exported
    once in all (a lock per DSO), not once by every worker that runs one of these tests."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.loaded: dict = {}

    def __getitem__(self, key):
        import fcntl

        import tvm_ffi

        if key not in self.loaded:
            shape, schedule = key
            name = "_".join(map(str, shape)) + f"-{schedule}"
            out = self.folder / f"{name}.so"
            with open(self.folder / f"{name}.lock", "w") as lock:
                fcntl.flock(lock, fcntl.LOCK_EX)  # another worker exporting it: wait, then load its DSO
                if not out.exists():
                    ws = workspace_bytes(schedule, shape[1], shape[4])
                    rp, sp = write_pair(self.folder, *attention_pair(*shape, workspace_bytes=ws), name)
                    tmp = self.folder / f"{name}.partial.so"
                    r = run_script("--selection", rp, "--snapshot", sp, "--output", tmp, **SCHEDULES[schedule])
                    assert r.returncode == 0, (key, r.stderr[-3000:])
                    tmp.rename(out)
            run = tvm_ffi.load_module(str(out))["run"]
            ws = workspace_bytes(key[1], key[0][1], key[0][4])
            if ws:  # called like the others; the workspace as a slot holds it, all NaN bit patterns
                import torch

                scratch = torch.full((ws,), 255, dtype=torch.uint8, device="cuda")
                self.loaded[key] = lambda q, k, v, n, out, run=run: run(q, k, v, n, scratch, out)
            else:
                self.loaded[key] = run
        return self.loaded[key]


@pytest.fixture(scope="session")
def gpu_kernels(tmp_path_factory):
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    require_cute()
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if base.name.startswith("popen-gw") else base  # this run's, under pytest -n
    folder = shared / "cutedsl-attention"
    folder.mkdir(exist_ok=True)
    return _Kernels(folder)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", GPU_SHAPES, ids=["_".join(map(str, s)) for s in GPU_SHAPES])
@pytest.mark.parametrize("new_tokens", [1, 3])
@pytest.mark.parametrize("schedule", list(SCHEDULES))
def test_gpu_matches_the_reference(gpu_kernels, shape, new_tokens, schedule):
    import torch

    from mcore.ops.attention import decode_attention_reference

    dtype, heads, kv_heads, capacity, head_dim = shape
    tdt = {"BF16": torch.bfloat16, "FP16": torch.float16}[dtype]
    fn = gpu_kernels[shape, schedule]
    gen = torch.Generator().manual_seed(heads * 1000 + head_dim + new_tokens)
    q = (torch.randn(1, heads, new_tokens, head_dim, generator=gen) * head_dim**-0.5).to(tdt)
    k = torch.randn(1, kv_heads, capacity, head_dim, generator=gen).to(tdt)
    v = torch.randn(1, kv_heads, capacity, head_dim, generator=gen).to(tdt)
    qd, kd, vd = q.cuda(), k.cuda(), v.cuda()
    for length in GPU_LENGTHS:
        if length < new_tokens:
            continue
        n = torch.tensor([length], dtype=torch.int32)
        out = torch.full_like(qd, float("nan"))
        fn(qd, kd, vd, n.cuda(), out)
        again = torch.empty_like(qd)
        fn(qd, kd, vd, n.cuda(), again)
        torch.cuda.synchronize()
        ref = decode_attention_reference(q, k, v, n)
        tol = 2e-2 if dtype == "BF16" else 4e-3
        assert torch.allclose(out.double().cpu(), ref, atol=tol, rtol=tol), (shape, schedule, new_tokens, length)
        assert torch.equal(out, again), "not deterministic"


# The GQA groups of published models the shapes above leave out (3: Llama-3.2-3B; 7: Qwen2.5), in the
# default schedules only (tensor cores a cluster; split over blocks with a workspace).
PUBLISHED_GPU_SHAPES = [("BF16", 24, 8, 256, 128), ("BF16", 14, 2, 256, 64), ("BF16", 28, 4, 256, 128)]


@pytest.mark.gpu
@pytest.mark.parametrize("shape", PUBLISHED_GPU_SHAPES, ids=["_".join(map(str, s)) for s in PUBLISHED_GPU_SHAPES])
@pytest.mark.parametrize("schedule", ["mma", "split"])
def test_gpu_published_groups_match_the_reference(gpu_kernels, shape, schedule):
    test_gpu_matches_the_reference(gpu_kernels, shape, 1, schedule)
    test_gpu_matches_the_reference(gpu_kernels, shape, 3, schedule)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "schedule",
    [
        "mma",
        "mma-prefetch",
        "split",
        "split-late",
        "split-7-scalar",
        "split-tma",
        "split-tma-banks",
    ],
)
def test_gpu_long_shares_match_the_reference(gpu_kernels, schedule):
    """Shares of many steps a warp (8192 keys over 64 warps, or 256 with 32 splits), where the test
    above has 1 to 4: the walk that loads a step ahead carries its buffer across many steps."""
    import torch

    from mcore.ops.attention import decode_attention_reference

    shape = ("BF16", 32, 8, 8192, 128)
    fn = gpu_kernels[shape, schedule]
    gen = torch.Generator().manual_seed(8192)
    for new_tokens in (1, 2):
        q = (torch.randn(1, 32, new_tokens, 128, generator=gen) * 128**-0.5).to(torch.bfloat16)
        k = torch.randn(1, 8, 8192, 128, generator=gen).to(torch.bfloat16)
        v = torch.randn(1, 8, 8192, 128, generator=gen).to(torch.bfloat16)
        qd, kd, vd = q.cuda(), k.cuda(), v.cuda()
        for length in (1000, 4097, 8191, 8192):
            n = torch.tensor([length], dtype=torch.int32)
            out = torch.full_like(qd, float("nan"))
            fn(qd, kd, vd, n.cuda(), out)
            torch.cuda.synchronize()
            ref = decode_attention_reference(q, k, v, n)
            assert torch.allclose(out.double().cpu(), ref, atol=2e-2, rtol=2e-2), (schedule, new_tokens, length)


@pytest.mark.gpu
@pytest.mark.parametrize(
    "schedule",
    [
        "mma",
        "split",
        "split-tma",
        "split-tma-3-stages",
        "split-tma-8-warps",
        "split-tma-banks",
        "split-shares",
    ],
)
def test_gpu_cache_rows_past_the_length_never_reach_the_result(gpu_kernels, schedule):
    """An engine's cache past the active length holds anything (an uninitialised allocation, an older
    sequence): with NaN there the result still equals the reference on the clean cache. The ring
    copies whole tiles and holds older tiles, so its walk must zero what it did not copy."""
    import torch

    from mcore.ops.attention import decode_attention_reference

    shape = ("BF16", 32, 8, 8192, 128)
    fn = gpu_kernels[shape, schedule]
    gen = torch.Generator().manual_seed(77)
    q = (torch.randn(1, 32, 1, 128, generator=gen) * 128**-0.5).to(torch.bfloat16)
    k = torch.randn(1, 8, 8192, 128, generator=gen).to(torch.bfloat16)
    v = torch.randn(1, 8, 8192, 128, generator=gen).to(torch.bfloat16)
    for length in (8192, 5000, 777, 64, 3):  # longest first: the ring's stages then hold older tiles
        n = torch.tensor([length], dtype=torch.int32)
        kd, vd = k.clone(), v.clone()
        kd[:, :, length:] = float("nan")
        vd[:, :, length:] = float("nan")
        out = torch.full_like(q, float("nan")).cuda()
        fn(q.cuda(), kd.cuda(), vd.cuda(), n.cuda(), out)
        torch.cuda.synchronize()
        ref = decode_attention_reference(q, k, v, n)
        assert torch.isfinite(out).all(), (schedule, length)
        assert torch.allclose(out.double().cpu(), ref, atol=2e-2, rtol=2e-2), (schedule, length)


@pytest.mark.gpu
@pytest.mark.parametrize("schedule", ["per-group", "split", "split-late", "split-shares", "split-tma"])
def test_gpu_runs_on_the_current_stream_and_in_a_cuda_graph(gpu_kernels, schedule):
    """No host sync: the length lives on the device, so a captured graph follows later lengths
    (split: both kernels, the walk and the merge, in the graph)."""
    import torch

    from mcore.ops.attention import decode_attention_reference

    fn = gpu_kernels[("BF16", 32, 4, 256, 128), schedule]
    q = torch.randn(1, 32, 1, 128, device="cuda").to(torch.bfloat16)
    k = torch.randn(1, 4, 256, 128, device="cuda").to(torch.bfloat16)
    v = torch.randn(1, 4, 256, 128, device="cuda").to(torch.bfloat16)
    n = torch.tensor([5], dtype=torch.int32, device="cuda")
    out = torch.empty_like(q)
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        fn(q, k, v, n, out)  # warm up on the side stream
    stream.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn(q, k, v, n, out)
    for length in (7, 200):
        n.fill_(length)
        graph.replay()
        torch.cuda.synchronize()
        ref = decode_attention_reference(q.cpu(), k.cpu(), v.cpu(), n.cpu())
        assert torch.allclose(out.double().cpu(), ref, atol=2e-2, rtol=2e-2), length


# ---------------------------------------------------------------- the stub generator points here


def test_stub_on_an_attention_receipt_points_at_this_kernel(tmp_path, mcore):
    snap, receipt = attention_pair()
    rp, sp = write_pair(tmp_path, snap, receipt)
    r = mcore("kernel", "stub", str(rp), "--snapshot", str(sp), "-o", str(tmp_path / "stub.py"))
    assert r.code == 0, r
    assert "worked example: kernels/cutedsl_decode_attention.py implements this kind of region" in r.out
    text = (tmp_path / "stub.py").read_text()
    assert "Worked example for this region: kernels/cutedsl_decode_attention.py" in text
    assert "worked example for this region: kernels/cutedsl_decode_attention.py" in text  # in TODO, where export stops
    # and the example itself accepts the very receipt the stub was made from
    assert run_script("--selection", rp, "--snapshot", sp, "--check-only").returncode == 0


def test_stub_on_other_regions_names_no_example(tmp_path, mcore):
    g = Graph(role="decode")
    x = g.input("BF16", [4, 128], "x")
    y = g.op("aten.relu.default", [x], "BF16", [4, 128])
    g.output(g.op("aten.relu.default", [y], "BF16", [4, 128]))
    snap = g.snapshot()
    rp, sp = write_pair(tmp_path, snap, select_region(snap, [node_of(snap, y)], "t.relu@1"))
    r = mcore("kernel", "stub", str(rp), "--snapshot", str(sp), "-o", str(tmp_path / "stub.py"))
    assert r.code == 0 and "worked example" not in r.out.lower()
    assert "cutedsl_decode_attention" not in (tmp_path / "stub.py").read_text()


# ---------------------------------------------------------------- a real recipe receipt (Qwen3 layout, head_dim 64)

WIDE_HEADS, WIDE_KV, WIDE_D = 8, 2, 64  # GQA 4


@pytest.fixture(scope="module")
def wide_qwen(tmp_path_factory):
    """The demo Qwen3 with head_dim 64 (seeded random weights, BF16), built with every attention
    instance as a slot, plus its native twin: receipts the kernel takes, from the real recipe."""
    import shutil

    from mcore.cli.main import main
    from mcore.families.demo import materialize

    work = tmp_path_factory.mktemp("wide-qwen")
    model = work / "qwen3-wide"
    model.mkdir()
    demo = materialize("qwen3-tiny")
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copy(demo / name, model / name)
    config = json.loads((demo / "config.json").read_text())
    config.update(num_attention_heads=WIDE_HEADS, num_key_value_heads=WIDE_KV, head_dim=WIDE_D)
    (model / "config.json").write_text(json.dumps(config, indent=2))
    args = [
        str(model),
        "--precision",
        "bf16",
        "--max-cache-length",
        "256",
        "--decoder-engine-layout",
        "split",
        "--weights",
        "random",
        "--seed",
        "3",
    ]
    assert main(["build", *args, "--recipe", BINDING, "all-instances", "-o", str(work / "attn.bundle")]) == 0
    assert main(["build", *args, "-o", str(work / "native.bundle")]) == 0
    return work


def test_the_recipe_receipts_of_a_qwen3_build_pass_the_contract(wide_qwen, exporter, capsys):
    receipts = sorted(wide_qwen.glob("attn.selection.*.json"))
    assert [p.name for p in receipts] == [f"attn.selection.decoder.layers.{i}.decode_attention.json" for i in (0, 1)]
    for rp in receipts:
        assert exporter.main(["--selection", str(rp), "--check-only"]) == 0
        assert f"(BF16 heads={WIDE_HEADS} kv_heads={WIDE_KV} capacity=256 head_dim={WIDE_D})" in capsys.readouterr().out


def _wide_bindings(wide_qwen: Path) -> Path:
    """Export the kernel for the build's receipt (once) and write the one-entry manifest."""
    rp = wide_qwen / "attn.selection.decoder.layers.0.decode_attention.json"
    dso = wide_qwen / "attention.so"
    if not dso.exists():
        r = run_script("--selection", rp, "--output", dso)
        assert r.returncode == 0, r.stderr[-3000:]
    manifest = wide_qwen / "kernel-bindings.json"
    manifest.write_text(
        json.dumps(
            {
                "schema_version": 1,
                "bindings": [
                    {
                        "id": BINDING,
                        "abi_sha256": json.loads(rp.read_text())["abi_sha256"],
                        "library": "./attention.so",
                        "function": "run",
                    }
                ],
            }
        )
    )
    return manifest


@needs_cute
def test_one_exported_dso_binds_both_layers(wide_qwen):
    from mcore.runtime.pipeline import DecoderPipeline

    manifest = _wide_bindings(wide_qwen)
    pipe = DecoderPipeline(
        str(wide_qwen / "attn.bundle"),
        kernel_bindings=str(manifest),
        device="cpu",
        engine="torch",
        announce=lambda line: None,
    )
    assert len(pipe.slot_calls) == 2 and len(pipe.kernels) == 1


def _assert_bound_matches_native(build: Path, manifest: Path, engine: str) -> None:
    """Every layer bound to the CuTe kernel against native, in lockstep on the same forced tokens
    (random weights leave near-ties, so greedy tokens could flip): bf16 tolerance, cosine > 0.999."""
    import torch

    from mcore.runtime.pipeline import DecoderPipeline

    prompt = "Explain grouped-query attention, KV caching, and decode latency."
    native = DecoderPipeline(str(build / "native.bundle"), device="cuda", engine=engine)
    byok = DecoderPipeline(
        str(build / "attn.bundle"),
        kernel_bindings=str(manifest),
        device="cuda",
        engine=engine,
        announce=lambda line: None,
    )
    prompt_ids = native.encode(prompt)
    tokens = native.generate(prompt, 24, stop_at_eos=False).tokens
    want = torch.stack(native.step_logits(prompt_ids, tokens)[1:])  # decode steps only: the slots run there
    got = torch.stack(byok.step_logits(prompt_ids, tokens)[1:])
    assert torch.isfinite(got).all()
    scale = want.abs().max().item()
    assert (got - want).abs().max().item() <= 0.05 * max(scale, 1e-3), ((got - want).abs().max().item(), scale)
    cos = torch.nn.functional.cosine_similarity(got.flatten(1), want.flatten(1), dim=1)
    assert cos.min().item() > 0.999, cos


@pytest.mark.gpu
@pytest.mark.parametrize("engine", ["torch", "compiled"])
def test_gpu_pipeline_with_every_layer_bound_matches_native(wide_qwen, engine):
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    require_cute()
    _assert_bound_matches_native(wide_qwen, _wide_bindings(wide_qwen), engine)


# ---------------------------------------------------------------- a Llama build (demo:llama-tiny: head_dim 64, GQA 4)

LLAMA_BINDING = "llama.decode_attention_region@1"


@pytest.fixture(scope="module")
def llama_build(tmp_path_factory):
    """demo:llama-tiny in BF16 with every attention instance as a slot (receipts from the real recipe),
    and its native twin."""
    from mcore.cli.main import main

    work = tmp_path_factory.mktemp("llama-attn")
    args = ["demo:llama-tiny", "--precision", "bf16", "--max-cache-length", "256", "--decoder-engine-layout", "split"]
    assert main(["build", *args, "--recipe", LLAMA_BINDING, "all-instances", "-o", str(work / "attn.bundle")]) == 0
    assert main(["build", *args, "-o", str(work / "native.bundle")]) == 0
    return work


def _llama_bindings(work: Path) -> Path:
    """Export the kernel through `mcore kernel export` for the build's receipt (once); the bindings manifest."""
    from mcore.cli.main import main

    rp = work / "attn.selection.decoder.layers.0.decode_attention.json"
    if not (work / "attention.so").exists():
        assert (
            main(
                [
                    "kernel",
                    "export",
                    "cutedsl-decode-attention",
                    "--selection",
                    str(rp),
                    "-o",
                    str(work / "attention.so"),
                ]
            )
            == 0
        )
    manifest = work / "kernel-bindings.json"
    entry = {
        "id": LLAMA_BINDING,
        "abi_sha256": json.loads(rp.read_text())["abi_sha256"],
        "library": "./attention.so",
        "function": "run",
    }
    manifest.write_text(json.dumps({"schema_version": 1, "bindings": [entry]}))
    return manifest


def test_the_recipe_receipts_of_a_llama_build_pass_the_contract(llama_build, exporter, capsys):
    receipts = sorted(llama_build.glob("attn.selection.*.json"))
    assert [p.name for p in receipts] == [f"attn.selection.decoder.layers.{i}.decode_attention.json" for i in (0, 1)]
    for rp in receipts:
        assert exporter.main(["--selection", str(rp), "--check-only"]) == 0
        out = capsys.readouterr().out
        assert "(BF16 heads=8 kv_heads=2 capacity=256 head_dim=64)" in out and f"binding_id={LLAMA_BINDING}" in out


@needs_cute
def test_one_exported_dso_binds_every_llama_layer(llama_build):
    from mcore.runtime.pipeline import DecoderPipeline

    pipe = DecoderPipeline(
        str(llama_build / "attn.bundle"),
        kernel_bindings=str(_llama_bindings(llama_build)),
        device="cpu",
        engine="torch",
        announce=lambda line: None,
    )
    assert len(pipe.slot_calls) == 2 and list(pipe.kernels) == [LLAMA_BINDING]


@pytest.mark.gpu
@pytest.mark.parametrize("engine", ["torch", "compiled"])
def test_gpu_llama_with_every_layer_bound_matches_native(llama_build, engine):
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")
    require_cute()
    _assert_bound_matches_native(llama_build, _llama_bindings(llama_build), engine)


def test_stub_on_a_llama_receipt_points_at_this_kernel(llama_build, tmp_path, mcore):
    """`mcore kernel stub` on a receipt of the Llama build (its snapshot captured with the same
    arguments): a generated exporter pinned to that graph, which checks the receipt, and the pointer to
    this hand-written kernel for the region's decode attention."""
    snap = tmp_path / "decode.graph.json"
    args = ["demo:llama-tiny", "--precision", "bf16", "--max-cache-length", "256", "--decoder-engine-layout", "split"]
    assert mcore("graph", "inspect", *args, "--engine-role", "decode", "--snapshot", snap).code == 0
    rp = llama_build / "attn.selection.decoder.layers.1.decode_attention.json"
    assert json.loads(snap.read_text())["fingerprint"] == json.loads(rp.read_text())["graph_fingerprint"]
    r = mcore("kernel", "stub", rp, "--snapshot", snap, "-o", tmp_path / "llama_attention.py")
    assert r.code == 0, r
    assert f"binding_id={LLAMA_BINDING}" in r.out and "kernels/cutedsl_decode_attention.py" in r.out
    stub = tmp_path / "llama_attention.py"
    check = subprocess.run(
        [sys.executable, str(stub), "--selection", str(rp), "--snapshot", str(snap), "--check-only"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert check.returncode == 0, check.stderr
