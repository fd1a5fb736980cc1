"""Commands mcore runs for the user (exporters, benchmark arms) run in their own process group with a
time limit and bounded output: none of them can hang mcore or fill its memory."""

from __future__ import annotations

import os
import time

import pytest

from mcore.common.errors import UserError
from mcore.common.subproc import run_bounded
from mcore.kernels.exporters import run_exporter

from .conftest import assert_user_error

# an exporter that writes its DSO, says so, and leaves a child running that holds its stdout
LINGERING = """
import os, subprocess, sys, argparse
p = argparse.ArgumentParser(); p.add_argument('--selection'); p.add_argument('--output'); a = p.parse_args()
open(a.output, 'wb').write(b'x')
subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])
print('binding_id=my.kernel@1'); print('dso=' + a.output); sys.stdout.flush()
"""


def _exporter(tmp_path, body: str):
    script = tmp_path / "exporter.py"
    script.write_text(body)
    sel = tmp_path / "sel.json"
    sel.write_text("{}")
    return script, sel


@pytest.mark.timing
def test_an_exporter_that_leaves_a_child_holding_its_output_does_not_hang_export(tmp_path):
    script, sel = _exporter(tmp_path, LINGERING)
    t0 = time.monotonic()
    res = run_exporter(script, sel, tmp_path / "k.so")
    assert time.monotonic() - t0 < 60  # not the child's 600 s
    assert res.binding_id == "my.kernel@1" and res.library == tmp_path / "k.so"
    assert res.library_sha256 is not None and len(res.library_sha256) == 64


def test_an_exporter_past_its_time_limit_is_stopped_with_one_line(tmp_path, monkeypatch, mcore):
    script, sel = _exporter(tmp_path, "import time; print('starting', flush=True); time.sleep(600)")
    monkeypatch.setenv("MCORE_EXPORT_TIMEOUT", "2")
    res = mcore("kernel", "export", script, "--selection", sel, "-o", tmp_path / "k.so")
    assert_user_error(res, "ran past its time limit of 2 s", "MCORE_EXPORT_TIMEOUT")
    assert "starting" in res.out and not (tmp_path / "k.so").exists()
    monkeypatch.setenv("MCORE_EXPORT_TIMEOUT", "soon")
    assert_user_error(mcore("kernel", "export", script, "--selection", sel, "-o", tmp_path / "k.so"), "positive")


def test_an_exporter_that_floods_its_output_is_stopped(tmp_path, mcore):
    script, sel = _exporter(tmp_path, "import sys\nwhile True: sys.stdout.write('y' * 9999 + '\\n')")
    seen = []
    with pytest.raises(UserError, match="printed more than 16 MiB"):
        run_exporter(script, sel, tmp_path / "k.so", log=seen.append)
    assert seen and max(len(s) for s in seen) <= 9999


@pytest.mark.timing
def test_verify_perf_with_a_command_that_never_stops_printing_ends(mcore):
    t0 = time.monotonic()
    res = mcore("verify", "perf", "--native", "yes", "--external", "yes", "--pairs", "2")
    assert_user_error(res, "printed more than 16 MiB")
    assert time.monotonic() - t0 < 120


def test_a_command_past_its_time_limit_is_killed_with_its_group(tmp_path):
    marker = tmp_path / "child.pid"
    cmd = f"sh -c 'echo $$ > {marker}; sleep 600' & sleep 600"
    with pytest.raises(UserError, match="ran past its time limit of 1 s"):
        run_bounded(cmd, "the command", 1.0)
    pid = int(marker.read_text())
    for _ in range(100):  # the child left in the group is gone too
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            break
        time.sleep(0.05)
    else:
        pytest.fail("the command's child survived")
