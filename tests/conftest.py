"""Shared fixtures: an isolated demo-model cache and in-process CLI runs."""

from __future__ import annotations

import functools
import gc
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# Under pytest-xdist every worker (and every process a test starts: the perf gates' fresh-process
# pairs) would run as many CPU threads as the machine has cores: on CI's 2 cores, 2 workers with 2
# spinning OpenMP threads each ran the shipped replays 3x slower than one thread each does.
# Each worker and its children get an equal share of the cores (set before torch is imported).
if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    _share = max(1, (os.cpu_count() or 1) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"]))
    os.environ.setdefault("OMP_NUM_THREADS", str(_share))
    os.environ.setdefault("MKL_NUM_THREADS", str(_share))
    # One Inductor cache for every worker and test (tests that give mcore a cache folder of their own
    # would otherwise compile the same demo graphs' C++ again each time). mcore's own caches stay
    # where each test puts them, and the timing tests (run without xdist) compile cold as users do.
    if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
        _inductor = Path(os.environ.get("MCORE_CACHE_DIR", REPO / ".ci-cache" / "mcore")).parent / "inductor-tests"
        _inductor.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(_inductor)
    # A worker holds torch, Dynamo, Inductor, sympy, transformers and Textual (millions of objects) and
    # every test allocates more: at Python's default thresholds (700, 10, 10) a worker spent about 7% of
    # its time in the collector, most of it in some 30 full collections of ~0.3 s each. Collecting less
    # often frees the same cycles later (a worker's peak memory stayed the same) in a third of the time.
    gc.set_threshold(10_000, 20, 20)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Tests marked `long` first (stable order otherwise): under pytest-xdist each starts while the
    other workers still have the short ones to run, instead of one worker ending the run alone on a
    minutes-long test (on CI's 2 cores that tail was minutes of a 17-minute run)."""
    items.sort(key=lambda item: item.get_closest_marker("long") is None)


# The test extra (pyproject.toml) requires the CuTe DSL, Triton and transformers: where one is missing or
# broken, the tests that need it fail saying so; none of them is skipped (a skip would hide a broken
# install that the shipped qwen-attention replay, which exports with the DSL, fails on anyway).
TEST_EXTRA = "pip install -e '.[test]'"


@functools.cache
def cute_problem() -> str | None:
    """Why the CuTe DSL is not usable here, or None. It must import with a CUDA flavour of its libraries
    (a package without them is installed but raises on import). Checked once per process, in a
    subprocess: the import is heavy and sets global state."""
    if importlib.util.find_spec("cutlass") is None:
        return "nvidia-cutlass-dsl is not installed"
    r = subprocess.run([sys.executable, "-c", "import cutlass.cute"], capture_output=True, text=True, timeout=300)
    if r.returncode != 0:
        last = (r.stderr.strip().splitlines() or [f"exit status {r.returncode}"])[-1]
        return f"import cutlass.cute failed: {last[:300]}"
    return None


def require_cute() -> None:
    """Fail, not skip, where the CuTe DSL is missing or broken: it is a test dependency."""
    problem = cute_problem()
    if problem is not None:
        pytest.fail(
            f"the CuTe DSL is a test dependency and is not usable here ({problem}); "
            f"{TEST_EXTRA} (nvidia-cutlass-dsl[cu13])",
            pytrace=False,
        )


@pytest.fixture
def cute_dsl() -> None:
    require_cute()


# on a test: the CuTe DSL must be usable (a missing or broken one fails the test with the reason)
needs_cute = pytest.mark.usefixtures("cute_dsl")


def repo_env(**extra: str) -> dict[str, str]:
    """The environment for a child Python that must import this checkout first: the repository in
    front of PYTHONPATH, whatever was there kept (the device reaches the CuTe DSL through it)."""
    path = os.pathsep.join(p for p in (str(REPO), os.environ.get("PYTHONPATH", "")) if p)
    return {**os.environ, "PYTHONPATH": path, **extra}


def run_under_triton_interpreter(script: str, cases: list) -> list:
    """Run `script` (it reads JSON cases from argv[1] and prints a JSON list last) with Triton's CPU
    interpreter, in a subprocess: the interpreter is chosen when triton is imported."""
    import json

    if importlib.util.find_spec("triton") is None:
        pytest.fail(f"triton is a test dependency and is not installed; {TEST_EXTRA}", pytrace=False)
    env = repo_env(TRITON_INTERPRET="1")
    r = subprocess.run(
        [sys.executable, "-c", script, json.dumps(cases)], capture_output=True, text=True, env=env, timeout=600
    )
    assert r.returncode == 0, r.stderr[-2000:]
    return json.loads(r.stdout.strip().splitlines()[-1])


# Demo models materialize once per test session into a cache (offline, deterministic).
os.environ.setdefault("MCORE_CACHE_DIR", str(REPO / ".ci-cache" / "mcore"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
# The workbench header's device line is probed in the background: off in tests, so screens and
# snapshots do not depend on when (or on which machine) the probe finishes; one test turns it on.
os.environ["WORKBENCH_DEVICE_LINE"] = "0"


class CliResult:
    def __init__(self, code: int, out: str, err: str):
        self.code, self.out, self.err = code, out, err

    def __repr__(self) -> str:
        return f"CliResult(code={self.code}, out={self.out[-400:]!r}, err={self.err[-400:]!r})"


def in_process(main, capsys):
    """A runner for a CLI `main(argv)` in this process; unexpected exceptions fail the test."""

    def run(*args: str) -> CliResult:
        capsys.readouterr()
        try:
            code = main([str(a) for a in args])
        except SystemExit as e:  # argparse usage errors
            code = e.code if isinstance(e.code, int) else 2
        cap = capsys.readouterr()
        return CliResult(code, cap.out, cap.err)

    return run


@pytest.fixture
def mcore(capsys):
    """Run `mcore ARGS...` in-process; returns CliResult."""
    from mcore.cli.main import main

    return in_process(main, capsys)


@pytest.fixture
def workbench(capsys):
    """Run `workbench ARGS...` in-process; returns CliResult."""
    from workbench.cli import main

    return in_process(main, capsys)


def run_cli(*args: str, cwd: Path | None = None, env: dict | None = None) -> CliResult:
    """Run `python -m mcore` in a fresh process (for tests about the process boundary)."""
    r = subprocess.run(
        [sys.executable, "-m", "mcore", *map(str, args)],
        capture_output=True,
        text=True,
        cwd=cwd,
        env=repo_env(**(env or {})),
    )
    return CliResult(r.returncode, r.stdout, r.stderr)


def assert_user_error(res: CliResult, *fragments: str) -> None:
    """Exit 2, exactly one line on stderr, no traceback, naming what is wrong."""
    assert res.code == 2, res
    lines = [l for l in res.err.splitlines() if l.strip() and not l.startswith("[")]
    assert len(lines) == 1, res.err
    assert "Traceback" not in res.err
    for f in fragments:
        assert f in lines[0], (f, lines[0])


QWEN_ARGS = ["demo:qwen3-tiny", "--precision", "fp32", "--max-cache-length", "256", "--decoder-engine-layout", "split"]
DISTIL_ARGS = ["demo:distilbert-tiny", "--precision", "fp32"]
