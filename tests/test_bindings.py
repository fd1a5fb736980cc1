"""Kernel bindings manifest and load-time binding (DESIGN.md §5, §7; tutorial step 3),
with tiny real TVM-FFI DSOs built from C++ for the test session."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest
import torch

from mcore.common.errors import UserError
from mcore.runtime import bindings as bindings_mod
from mcore.runtime.bindings import Binding, BoundKernel, bind_slots, load_bindings_manifest

ABI_A = "a" * 64
ABI_B = "0123456789abcdef" * 4

COMMON = r"""
#include <tvm/ffi/container/tensor.h>
#include <tvm/ffi/function.h>
#include <tvm/ffi/error.h>
#include <cstring>
#include <cstdint>
namespace {
size_t Bytes(const tvm::ffi::TensorView& t) {
  return static_cast<size_t>(t.numel()) * ((t.dtype().bits * t.dtype().lanes + 7) / 8);
}
}
"""

COPY_SRC = (
    COMMON
    + r"""
namespace {
// run(input, output): output = input (a CPU identity copy)
void Run(tvm::ffi::TensorView in, tvm::ffi::TensorView out) {
  TVM_FFI_ICHECK(Bytes(in) == Bytes(out)) << "size mismatch";
  std::memcpy(static_cast<char*>(out.data_ptr()) + out.byte_offset(),
              static_cast<const char*>(in.data_ptr()) + in.byte_offset(), Bytes(in));
}
}
TVM_FFI_DLL_EXPORT_TYPED_FUNC(run, Run);
"""
)

FILL_SRC = (
    COMMON
    + r"""
namespace {
// run(input, output): output = 7 (float32), ignoring the input
void Run(tvm::ffi::TensorView in, tvm::ffi::TensorView out) {
  TVM_FFI_ICHECK(out.dtype().code == kDLFloat && out.dtype().bits == 32) << "float32 only";
  float* p = reinterpret_cast<float*>(static_cast<char*>(out.data_ptr()) + out.byte_offset());
  for (int64_t i = 0; i < out.numel(); ++i) p[i] = 7.0f;
}
}
TVM_FFI_DLL_EXPORT_TYPED_FUNC(run, Run);
TVM_FFI_DLL_EXPORT_TYPED_FUNC(fill, Run);
"""
)


@pytest.fixture(scope="session")
def dsos(tmp_path_factory) -> dict[str, Path]:
    """Two real TVM-FFI DSOs, both exporting `run`: a copy and a fill-with-7."""
    from tvm_ffi import cpp

    root = tmp_path_factory.mktemp("dsos")
    out = {}
    for name, src in (("copy_kernel", COPY_SRC), ("fill_kernel", FILL_SRC)):
        cc = root / f"{name}.cc"
        cc.write_text(src)
        out[name] = Path(cpp.build(name, cpp_files=[str(cc)], build_directory=str(root / f"build_{name}")))
    return out


def slot(bid="demo.copy@1", abi=ABI_A, role="decode"):
    return {"binding_id": bid, "abi_sha256": abi, "engine_role": role, "abi": {"inputs": [], "outputs": []}}


def entry(bid="demo.copy@1", abi=ABI_A, library="./kernel.so", function="run"):
    return {"id": bid, "abi_sha256": abi, "library": library, "function": function}


def write_manifest(folder: Path, entries, name="kernel-bindings.json", **top) -> Path:
    data = {"schema_version": 1, "bindings": entries}
    data.update(top)
    p = folder / name
    p.write_text(json.dumps(data, indent=2))
    return p


@pytest.fixture
def work(tmp_path, dsos) -> Path:
    """A work folder with the copy DSO as ./kernel.so and the fill DSO as ./fill.so."""
    shutil.copy(dsos["copy_kernel"], tmp_path / "kernel.so")
    shutil.copy(dsos["fill_kernel"], tmp_path / "fill.so")
    return tmp_path


class Lines:
    def __init__(self):
        self.lines: list[str] = []

    def __call__(self, line: str) -> None:
        self.lines.append(line)


# ---------------------------------------------------------------- success


def test_bind_and_run_on_cpu_tensors(work):
    m = write_manifest(work, [entry()])
    said = Lines()
    bound = bind_slots(str(m), [slot()], announce=said)
    assert set(bound) == {"demo.copy@1"}
    k = bound["demo.copy@1"]
    assert isinstance(k, BoundKernel)
    assert k.binding_id == "demo.copy@1" and k.abi_sha256 == ABI_A
    assert k.library == (work / "kernel.so").resolve() and k.function_name == "run"
    x = torch.arange(12, dtype=torch.float32).reshape(3, 4)
    y = torch.zeros_like(x)
    k.function(x, y)
    assert torch.equal(x, y)
    y2 = torch.zeros_like(x)
    k(x, y2)  # BoundKernel is callable too
    assert torch.equal(x, y2)
    assert said.lines == [
        f"loading native code from {(work / 'kernel.so').resolve()} (demo.copy@1): load only DSOs you trust"
    ]


def test_two_slots_two_libraries_other_function_name(work):
    m = write_manifest(work, [entry(), entry("demo.fill@1", ABI_B, "./fill.so", "fill")])
    said = Lines()
    bound = bind_slots(m, [slot(), slot("demo.fill@1", ABI_B, "prefill")], announce=said)
    x = torch.ones(5)
    y = torch.zeros(5)
    bound["demo.fill@1"].function(x, y)
    assert torch.equal(y, torch.full((5,), 7.0))
    assert len(said.lines) == 2


def test_library_in_subfolder_and_symlink_inside(work):
    (work / "libs").mkdir()
    shutil.copy(work / "kernel.so", work / "libs" / "k.so")
    os.symlink(work / "fill.so", work / "link.so")
    m = write_manifest(work, [entry(library="libs/k.so"), entry("f@1", ABI_B, library="./link.so")])
    bound = bind_slots(m, [slot(), slot("f@1", ABI_B)], announce=Lines())
    assert bound["demo.copy@1"].library == (work / "libs" / "k.so").resolve()
    assert bound["f@1"].library == (work / "fill.so").resolve()


def test_load_manifest_returns_bindings(work):
    m = write_manifest(work, [entry()])
    [b] = load_bindings_manifest(m)
    assert isinstance(b, Binding)
    assert (b.id, b.abi_sha256, b.library, b.function) == ("demo.copy@1", ABI_A, "./kernel.so", "run")
    assert b.manifest_dir == work.resolve()
    assert b.library_path == (work / "kernel.so").resolve()


def test_editing_manifest_after_bind_does_not_affect_bound_kernel(work):
    m = write_manifest(work, [entry()])
    bound = bind_slots(m, [slot()], announce=Lines())
    # Point the same binding at the fill DSO, as if switching kernels for the next pipeline.
    write_manifest(work, [entry(library="./fill.so")])
    x = torch.arange(6, dtype=torch.float32)
    y = torch.zeros(6)
    bound["demo.copy@1"].function(x, y)
    assert torch.equal(x, y), "an existing binding must not be rebound"
    # A new pipeline binds the new manifest: two bindings from one bundle coexist in one process.
    bound2 = bind_slots(m, [slot()], announce=Lines())
    y2 = torch.zeros(6)
    bound2["demo.copy@1"].function(x, y2)
    assert torch.equal(y2, torch.full((6,), 7.0))
    y3 = torch.zeros(6)
    bound["demo.copy@1"].function(x, y3)
    assert torch.equal(x, y3)


def test_trust_line_once_per_library_per_process(work):
    m = write_manifest(work, [entry(), entry("second@1", ABI_B, "./kernel.so")])
    said = Lines()
    bind_slots(m, [slot(), slot("second@1", ABI_B)], announce=said)
    bind_slots(m, [slot(), slot("second@1", ABI_B)], announce=said)
    assert len(said.lines) == 1
    assert said.lines[0].startswith(f"loading native code from {(work / 'kernel.so').resolve()} (")
    assert said.lines[0].endswith("load only DSOs you trust")


def test_trust_line_goes_to_stderr_by_default(work, capsys):
    m = write_manifest(work, [entry()])
    bind_slots(m, [slot()])
    cap = capsys.readouterr()
    assert cap.out == ""
    assert cap.err.count("load only DSOs you trust") == 1


def test_zero_slots():
    assert bind_slots(None, []) == {}


def test_zero_slots_with_empty_manifest(tmp_path):
    m = write_manifest(tmp_path, [])
    assert bind_slots(m, [], announce=Lines()) == {}


# ---------------------------------------------------------------- failures


def test_unbound_slot_without_manifest():
    with pytest.raises(
        UserError,
        match=r"slot demo.copy@1 \(engine role decode\) is not bound; pass "
        r"--kernel-bindings with an entry for it",
    ):
        bind_slots(None, [slot()])


def test_unbound_slot_missing_entry(work):
    m = write_manifest(work, [entry()])
    said = Lines()
    with pytest.raises(UserError, match=r"slot other@1 .*is not bound; pass --kernel-bindings"):
        bind_slots(m, [slot(), slot("other@1", ABI_B)], announce=said)
    assert said.lines == [], "nothing is loaded when binding fails"


def test_unknown_binding(work):
    m = write_manifest(work, [entry(), entry("extra@1", ABI_B)])
    with pytest.raises(UserError, match="unknown binding extra@1"):
        bind_slots(m, [slot()], announce=Lines())


def test_zero_slots_with_entries_is_unknown_binding(work):
    m = write_manifest(work, [entry()])
    with pytest.raises(UserError, match="unknown binding demo.copy@1"):
        bind_slots(m, [], announce=Lines())


def test_duplicate_binding(work):
    m = write_manifest(work, [entry(), entry(library="./fill.so")])
    with pytest.raises(UserError, match=r"bindings\[1\]: binding 'demo.copy@1' is listed twice"):
        bind_slots(m, [slot()], announce=Lines())


def test_wrong_abi_hash(work):
    m = write_manifest(work, [entry(abi=ABI_B)])
    said = Lines()
    with pytest.raises(UserError) as e:
        bind_slots(m, [slot()], announce=said)
    msg = str(e.value)
    assert "slot demo.copy@1" in msg and ABI_A in msg and ABI_B in msg
    assert "use the abi_sha256 from the selection receipt" in msg
    assert said.lines == []


def test_absolute_library(work):
    m = write_manifest(work, [entry(library=str(work / "kernel.so"))])
    with pytest.raises(UserError, match=r"bindings\[0\].*is an absolute path"):
        load_bindings_manifest(m)


@pytest.mark.parametrize("lib", ["../kernel.so", "./../x.so", "sub/../../kernel.so", ".."])
def test_library_leaving_folder(work, lib):
    sub = work / "sub"
    sub.mkdir()
    m = write_manifest(sub, [entry(library=lib)])
    with pytest.raises(UserError, match="leaves the manifest's folder"):
        bind_slots(m, [slot()], announce=Lines())


def test_symlink_escaping(work, tmp_path_factory):
    outside = tmp_path_factory.mktemp("outside")
    shutil.copy(work / "kernel.so", outside / "evil.so")
    sub = work / "sub"
    sub.mkdir()
    os.symlink(outside / "evil.so", sub / "kernel.so")
    os.symlink(outside, sub / "dir")
    for lib in ("./kernel.so", "dir/evil.so"):
        m = write_manifest(sub, [entry(library=lib)])
        said = Lines()
        with pytest.raises(UserError, match="through a symlink.*outside the manifest's folder"):
            bind_slots(m, [slot()], announce=said)
        assert said.lines == []


def test_missing_dso(work):
    m = write_manifest(work, [entry(library="./absent.so")])
    with pytest.raises(UserError, match=f"{work.resolve() / 'absent.so'}: DSO for slot demo.copy@1 not found"):
        bind_slots(m, [slot()], announce=Lines())


def test_not_a_dso(work):
    (work / "junk.so").write_bytes(b"not an ELF file")
    m = write_manifest(work, [entry(library="./junk.so")])
    with pytest.raises(UserError, match=r"junk.so: not an ELF shared library .*binding demo.copy@1"):
        bind_slots(m, [slot()], announce=Lines())


def test_missing_function(work):
    m = write_manifest(work, [entry(function="launch")])
    with pytest.raises(UserError) as e:
        bind_slots(m, [slot()], announce=Lines())
    msg = str(e.value)
    assert "function 'launch' not found" in msg and str((work / "kernel.so").resolve()) in msg


@pytest.mark.parametrize(
    "mutate,match",
    [
        (lambda d: d.pop("schema_version"), r"missing field\(s\) schema_version"),
        (lambda d: d.pop("bindings"), r"missing field\(s\) bindings"),
        (lambda d: d.update(extra=1), r"unknown field\(s\) extra"),
        (lambda d: d.update(schema_version=2), "schema_version 2 is not supported; use 1"),
        (lambda d: d.update(schema_version=True), "schema_version True is not supported"),
        (lambda d: d.update(bindings={}), "bindings must be a list"),
    ],
)
def test_top_level_fields(work, mutate, match):
    data = {"schema_version": 1, "bindings": [entry()]}
    mutate(data)
    m = work / "kb.json"
    m.write_text(json.dumps(data))
    with pytest.raises(UserError, match=match):
        load_bindings_manifest(m)


@pytest.mark.parametrize("field", ["id", "abi_sha256", "library", "function"])
def test_entry_missing_field(work, field):
    e = entry()
    del e[field]
    m = write_manifest(work, [entry("ok@1", ABI_B), e])
    with pytest.raises(UserError, match=rf"bindings\[1\]: missing field\(s\) {field}"):
        load_bindings_manifest(m)


def test_entry_unknown_field(work):
    e = entry()
    e["sha256"] = "x"
    m = write_manifest(work, [e])
    with pytest.raises(UserError, match=r"bindings\[0\]: unknown field\(s\) sha256"):
        load_bindings_manifest(m)


def test_entry_not_an_object(work):
    m = write_manifest(work, ["kernel.so"])
    with pytest.raises(UserError, match=r"bindings\[0\]: expected a JSON object"):
        load_bindings_manifest(m)


@pytest.mark.parametrize("bid", ["bad id", "", "x/y", 5, None, "a" * 201])
def test_bad_binding_id(work, bid):
    m = write_manifest(work, [entry(bid=bid)])
    with pytest.raises(UserError, match=r"bindings\[0\]: field id: binding ID .* is invalid"):
        load_bindings_manifest(m)


@pytest.mark.parametrize("abi", ["A" * 64, "a" * 63, "g" * 64, 5, None])
def test_bad_abi_hash_format(work, abi):
    m = write_manifest(work, [entry(abi=abi)])
    with pytest.raises(UserError, match=r"bindings\[0\]: field abi_sha256 must be 64 lowercase hex"):
        load_bindings_manifest(m)


@pytest.mark.parametrize("fn", ["", "1run", "run()", "a b", 3, None])
def test_bad_function(work, fn):
    m = write_manifest(work, [entry(function=fn)])
    with pytest.raises(UserError, match=r"bindings\[0\]: field function .* must be a non-empty identifier"):
        load_bindings_manifest(m)


@pytest.mark.parametrize("lib", ["", "  ", 7, None])
def test_bad_library_type(work, lib):
    m = write_manifest(work, [entry(library=lib)])
    with pytest.raises(UserError, match=r"bindings\[0\]: field library"):
        load_bindings_manifest(m)


def test_manifest_file_errors(tmp_path):
    with pytest.raises(UserError, match="kernel bindings manifest not found"):
        bind_slots(tmp_path / "nope.json", [slot()], announce=Lines())
    bad = tmp_path / "bad.json"
    bad.write_text("{")
    with pytest.raises(UserError, match="malformed JSON"):
        load_bindings_manifest(bad)


def test_malformed_slots():
    with pytest.raises(UserError, match=r"kernel_slots\[0\] is malformed"):
        bind_slots(None, [{"binding_id": "x"}])
    with pytest.raises(UserError, match=r"share binding ID x but not the ABI hash; one entry cannot bind both"):
        bind_slots(None, [slot("x"), slot("x", ABI_B)])


# ---------------------------------------------------------------- one entry, several slots (one per layer)


def layer_slot(i: int, bid="qwen.decode_attention_region@2", abi=ABI_A):
    s = slot(bid, abi)
    s["recipe"] = {"id": bid, "instance": f"decoder.layers.{i}.decode_attention"}
    return s


def test_one_entry_binds_every_slot_of_its_binding_id(work):
    bid = "qwen.decode_attention_region@2"
    m = write_manifest(work, [entry(bid)])
    said = Lines()
    bound = bind_slots(str(m), [layer_slot(0), layer_slot(1)], announce=said)
    assert list(bound) == [bid]  # one loaded kernel, looked up by every slot of the binding
    assert len(said.lines) == 1


def test_unbound_slots_are_all_named(work):
    m = write_manifest(work, [entry()])  # binds demo.copy@1, not the attention slots
    with pytest.raises(
        UserError,
        match=r"^slot qwen.decode_attention_region@2 \(2 slots: "
        r"qwen.decode_attention_region@2 \[decoder.layers.0.decode_attention\], "
        r"qwen.decode_attention_region@2 \[decoder.layers.1.decode_attention\]\) "
        r"\(engine role decode\) is not bound",
    ):
        bind_slots(str(m), [slot(), layer_slot(0), layer_slot(1)], announce=Lines())
    with pytest.raises(UserError, match=r"2 slots: .* is not bound"):
        bind_slots(None, [layer_slot(0), layer_slot(1)])


def test_abi_mismatch_names_every_slot_of_the_binding(work):
    m = write_manifest(work, [entry("qwen.decode_attention_region@2", ABI_B)])
    with pytest.raises(
        UserError,
        match=r"layers.0.decode_attention\], .*layers.1.decode_attention\]\): ABI hash "
        r"mismatch",
    ):
        bind_slots(str(m), [layer_slot(0), layer_slot(1)], announce=Lines())


def test_slots_of_one_binding_id_with_two_abis_fail_closed(work):
    m = write_manifest(work, [entry("qwen.decode_attention_region@2")])
    with pytest.raises(
        UserError,
        match=r"slots qwen.decode_attention_region@2 \[decoder.layers.0.decode_attention\] "
        r"and qwen.decode_attention_region@2 \[decoder.layers.1.decode_attention\] "
        r"share binding ID",
    ):
        bind_slots(str(m), [layer_slot(0), layer_slot(1, abi=ABI_B)], announce=Lines())


def test_only_named_libraries_are_loaded(work, monkeypatch):
    """A failing later check loads nothing; a success loads exactly the named libraries."""
    loaded = []
    real = bindings_mod._load_function
    monkeypatch.setattr(
        bindings_mod, "_load_function", lambda lib, fn, bid: (loaded.append(lib), real(lib, fn, bid))[1]
    )
    m = write_manifest(work, [entry(), entry("f@1", ABI_B, "./fill.so")])
    with pytest.raises(UserError, match="ABI hash mismatch"):
        bind_slots(m, [slot(), slot("f@1", ABI_A)], announce=Lines())
    assert loaded == []
    bind_slots(m, [slot(), slot("f@1", ABI_B)], announce=Lines())
    assert loaded == [(work / "kernel.so").resolve(), (work / "fill.so").resolve()]


def test_messages_are_one_line(work):
    m = write_manifest(work, [entry(abi=ABI_B)])
    with pytest.raises(UserError) as e:
        bind_slots(m, [slot()], announce=Lines())
    assert "\n" not in str(e.value)


# ---------------------------------------------------------------- library_sha256 and path text


def test_library_sha256_pins_the_dso_bytes_before_dlopen(work, monkeypatch):
    """An entry with library_sha256 binds only that DSO: the copy kernel's hash on the fill kernel's
    file is refused before anything is loaded; the right hash binds; without it any DSO binds."""
    from mcore.kernels.dso import library_sha256

    good = library_sha256(work / "kernel.so")
    m = write_manifest(work, [{**entry(), "library_sha256": good}])
    assert load_bindings_manifest(m).bindings[0].to_dict()["library_sha256"] == good
    bound = bind_slots(str(m), [slot()], announce=Lines())
    x = torch.arange(4, dtype=torch.float32)
    y = torch.zeros_like(x)
    bound["demo.copy@1"](x, y)
    assert torch.equal(x, y)
    loaded = []
    monkeypatch.setattr(bindings_mod, "_load_function", lambda *a: loaded.append(a))
    m = write_manifest(work, [{**entry(library="./fill.so"), "library_sha256": good}])
    with pytest.raises(UserError, match=r"fill.so: the DSO's sha256 is not the library_sha256 .*binding demo.copy@1"):
        bind_slots(str(m), [slot()], announce=Lines())
    assert loaded == []


@pytest.mark.parametrize("bad", ["A" * 64, "ab", 7, None, "g" * 64])
def test_a_malformed_library_sha256_is_refused(work, bad):
    m = write_manifest(work, [{**entry(), "library_sha256": bad}])
    with pytest.raises(UserError, match=r"bindings\[0\]: field library_sha256 must be 64 lowercase hex"):
        load_bindings_manifest(m)


@pytest.mark.parametrize(
    "lib, says",
    [("./ker\0nel.so", "NUL byte"), ("./" + "k" * 300 + ".so", "too long"), ("./a/" * 1100 + "k.so", "too long")],
    ids=["nul", "long-part", "long-path"],
)
def test_nul_bytes_and_over_long_library_paths_are_one_line_errors(work, mcore, lib, says):
    m = write_manifest(work, [entry(library=lib)])
    with pytest.raises(UserError, match=says):
        load_bindings_manifest(m)


def test_kernel_build_prints_the_library_sha256(tmp_path, mcore):
    from mcore.kernels.dso import library_sha256

    res = mcore("kernel", "build", "identity-copy", "--cuda", "off", "-o", tmp_path / "k.so")
    assert res.code == 0, res
    assert f"library_sha256={library_sha256(tmp_path / 'k.so')}" in res.out
