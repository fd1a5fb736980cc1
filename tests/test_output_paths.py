"""Outputs fail closed: never write over a non-regular file; a failed write is one line, exit 2,
and leaves nothing behind (DESIGN.md qualities)."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys

import pytest

from .conftest import REPO, CliResult, assert_user_error
from .graphs import dag_snapshot


@pytest.fixture
def snap(tmp_path):
    path = tmp_path / "g.graph.json"
    path.write_text(json.dumps(dag_snapshot(3, [(0, 1), (1, 2)])), encoding="utf-8")
    return path


def select(mcore, snap, out):
    return mcore("graph", "select", snap, "--nodes", "node:0", "--binding-id", "k@1", "--workspace-bytes", "0",
                 "-o", out)


def test_a_regular_file_is_replaced(mcore, snap, tmp_path):
    out = tmp_path / "r.json"
    out.write_text("old")
    res = select(mcore, snap, out)
    assert res.code == 0, res
    assert json.loads(out.read_text())["node_ids"] == ["node:0"]


def test_a_symlink_is_not_written_through(mcore, snap, tmp_path):
    target = tmp_path / "precious.txt"
    target.write_text("keep me")
    link = tmp_path / "r.json"
    os.symlink(target, link)
    assert_user_error(select(mcore, snap, link), "r.json", "symbolic link")
    assert target.read_text() == "keep me" and os.path.islink(link)
    os.symlink(tmp_path / "nowhere", tmp_path / "dangling.json")  # a dangling link too
    assert_user_error(select(mcore, snap, tmp_path / "dangling.json"), "symbolic link")
    assert not (tmp_path / "nowhere").exists()


def test_a_fifo_or_device_is_refused(mcore, snap, tmp_path):
    fifo = tmp_path / "r.json"
    os.mkfifo(fifo)
    assert_user_error(select(mcore, snap, fifo), "named pipe (FIFO)", "regular file")
    assert_user_error(select(mcore, snap, "/dev/null"), "/dev/null", "device node")
    # `mcore run --output` checks before it loads anything (the bundle here does not even exist)
    assert_user_error(mcore("run", tmp_path / "missing.bundle", "--prompt", "x", "--output", fifo),
                      "named pipe (FIFO)")


def test_disk_full_is_one_line_and_leaves_nothing(mcore, snap, tmp_path, monkeypatch):
    import mcore.fileio as fileio

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(fileio.os, "fsync", full)
    out = tmp_path / "r.json"
    assert_user_error(select(mcore, snap, out), "r.json", "No space left on device", "choose another path")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g.graph.json"]  # no output, no temp file


def test_stdout_on_a_full_disk_is_one_line(snap):
    with open("/dev/full", "w") as full:
        r = subprocess.run([sys.executable, "-m", "mcore", "graph", "list", str(snap)], stdout=full,
                           stderr=subprocess.PIPE, text=True, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert_user_error(CliResult(r.returncode, "", r.stderr), "cannot write the output", "No space left")
