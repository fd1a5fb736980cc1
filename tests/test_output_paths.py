"""Outputs fail closed: never write over a non-regular file; a failed write is one line, exit 2,
and leaves nothing behind (DESIGN.md qualities)."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys

import pytest

from .conftest import CliResult, assert_user_error, repo_env
from .graphs import dag_snapshot


@pytest.fixture
def snap(tmp_path):
    path = tmp_path / "g.graph.json"
    path.write_text(json.dumps(dag_snapshot(3, [(0, 1), (1, 2)])), encoding="utf-8")
    return path


def select(mcore, snap, out):
    return mcore(
        "graph", "select", snap, "--nodes", "node:0", "--binding-id", "k@1", "--workspace-bytes", "0", "-o", out
    )


def test_a_regular_file_is_replaced_only_with_force(mcore, snap, tmp_path):
    out = tmp_path / "r.json"
    out.write_text("old")
    assert_user_error(select(mcore, snap, out), "r.json already exists", "--force")
    assert out.read_text() == "old"
    res = mcore(
        "graph",
        "select",
        snap,
        "--nodes",
        "node:0",
        "--binding-id",
        "k@1",
        "--workspace-bytes",
        "0",
        "-o",
        out,
        "--force",
    )
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
    assert_user_error(mcore("run", tmp_path / "missing.bundle", "--prompt", "x", "--output", fifo), "named pipe (FIFO)")


def test_disk_full_is_one_line_and_leaves_nothing(mcore, snap, tmp_path, monkeypatch):
    import mcore.common.fileio as fileio

    def full(fd):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(fileio.os, "fsync", full)
    out = tmp_path / "r.json"
    assert_user_error(select(mcore, snap, out), "r.json", "No space left on device", "choose another path")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["g.graph.json"]  # no output, no temp file


def test_stdout_on_a_full_disk_is_one_line(snap):
    with open("/dev/full", "w") as full:
        r = subprocess.run(
            [sys.executable, "-m", "mcore", "graph", "list", str(snap)],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            env=repo_env(),
        )
    assert_user_error(CliResult(r.returncode, "", r.stderr), "cannot write the output", "No space left")


def test_files_follow_the_umask(tmp_path):
    import stat

    from mcore.common.fileio import install_file, write_json

    old = os.umask(0o027)
    try:
        p = write_json(tmp_path / "a.json", {"x": 1})
        k = install_file(tmp_path / "k.so", b"\x7fELF", mode=0o755)
    finally:
        os.umask(old)
    assert stat.S_IMODE(p.stat().st_mode) == 0o640  # 0666 & ~027, as open() would give (not mkstemp's 0600)
    assert stat.S_IMODE(k.stat().st_mode) == 0o750


KILLED_WRITER = r"""
import sys, time
from mcore.common.fileio import atomic_write

def write(f):
    f.write("partial " * 1000)
    f.flush()
    print("writing", flush=True)
    time.sleep(60)

atomic_write(sys.argv[1], write)
"""


def test_kill_9_mid_write_leaves_the_old_file_and_the_next_write_cleans_up(tmp_path):
    import signal

    from mcore.common.fileio import write_json

    out = tmp_path / "r.json"
    out.write_text('{"old": true}\n')
    other = tmp_path / ".r.json.5.999999999.abcd.tmp"  # a temp of output r.json.5: not ours to remove
    other.write_text("x")
    proc = subprocess.Popen(
        [sys.executable, "-c", KILLED_WRITER, str(out)],
        stdout=subprocess.PIPE,
        text=True,
        env=repo_env(),
    )
    assert proc.stdout.readline().strip() == "writing"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    stale = [p for p in tmp_path.iterdir() if p.name.startswith(f".r.json.{proc.pid}.")]
    assert len(stale) == 1 and stale[0].stat().st_size > 0  # the dead writer's temp file
    assert json.loads(out.read_text()) == {"old": True}  # never half-written
    write_json(out, {"new": True})
    assert json.loads(out.read_text()) == {"new": True}
    assert not stale[0].exists()  # its writer is dead: removed by the next write
    assert sorted(p.name for p in tmp_path.iterdir()) == [other.name, "r.json"]


def test_workbench_stdout_on_a_full_disk_is_one_line(tmp_path):
    with open("/dev/full", "w") as full:
        r = subprocess.run(
            [sys.executable, "-m", "workbench.cli", "tutorial", "--list"],
            stdout=full,
            stderr=subprocess.PIPE,
            text=True,
            env=repo_env(),
        )
    assert_user_error(CliResult(r.returncode, "", r.stderr), "workbench: error: cannot write the output")
