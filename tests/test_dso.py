"""DSOs are checked before dlopen: a truncated or foreign file is a clear error (not SIGBUS), and a
library that changed on disk after this process loaded it is named instead of running old code."""

from __future__ import annotations

import os
import shutil

import pytest

from mcore.common.errors import UserError
from mcore.kernels.dso import check_elf
from mcore.runtime.bindings import bind_slots

from .test_bindings import ABI_A, dsos, entry, slot, work, write_manifest  # noqa: F401 - fixtures


def _bind(work, name="kernel.so"):
    return bind_slots(write_manifest(work, [entry(library=f"./{name}")]), [slot()], announce=lambda line: None)


@pytest.mark.parametrize("keep", [0.5, 0.95])
def test_a_truncated_library_is_refused_before_dlopen(work, keep):
    so = work / "kernel.so"
    data = so.read_bytes()
    (work / "cut.so").write_bytes(data[: int(len(data) * keep)])
    with pytest.raises(UserError, match=r"cut.so: truncated: .* but the file has \d+ bytes; binding demo.copy@1"):
        _bind(work, "cut.so")


@pytest.mark.parametrize(
    "content,fragment",
    [
        (b"#!/bin/sh\necho hi\n", "not an ELF shared library"),
        (b"\x7fELF\x02", "truncated or malformed ELF header"),
        (b"", "not an ELF shared library"),
    ],
)
def test_a_file_that_is_not_a_library_is_refused(work, content, fragment):
    (work / "bad.so").write_bytes(content)
    with pytest.raises(UserError, match=fragment):
        _bind(work, "bad.so")


def test_a_sound_library_passes(work):
    check_elf(work / "kernel.so", "binding demo.copy@1")
    assert _bind(work)["demo.copy@1"].function_name == "run"


def test_a_library_changed_after_loading_is_named(work):
    _bind(work)
    # a rebuild puts a new file at the path (never overwrite a mapped library in place: that
    # corrupts the running code); dlopen would still hand back the old one
    shutil.copy(work / "fill.so", work / "new.so")
    os.replace(work / "new.so", work / "kernel.so")
    with pytest.raises(UserError, match="changed on disk after this process loaded it; .* restart the process"):
        _bind(work)
    # the same, unchanged file binds again in the same process
    _bind(work, "fill.so")
    _bind(work, "fill.so")
