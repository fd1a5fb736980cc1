# Set-up is part of every target: a fresh machine needs only `make demo` or `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
# torch 2.13.0 is a CPU wheel on this project's machines (a looser pin would pull a multi-GB CUDA build).
TORCH ?= torch==2.13.0
# pytest-xdist workers for `make test` (auto: one per core)
TEST_WORKERS ?= auto

.PHONY: setup demo demo-cli test test-gpu bench clean

setup: $(VENV)/.installed

# pip installs without byte-compiling and compileall does it on every core (pip compiles one file at a
# time: 85 s -> 61 s of set-up on a 2-core machine). A few files are for another Python (torch ships
# one in 3.12 syntax); they fail to compile here as they do silently under pip, hence `|| true`.
$(VENV)/.installed: pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q --no-compile "$(TORCH)"
	$(PY) -m pip install -q --no-compile -e '.[test]'
	$(PY) -m compileall -q -q -j 0 "$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" || true
	touch $@

demo: setup
	$(VENV)/bin/workbench tutorial qwen-recipe

demo-cli: setup
	PATH="$(abspath $(VENV))/bin:$$PATH" bash bench/tutorial_cli.sh artifacts/demo-cli

# The untimed tests on every core (on a 2-core CI machine 11 min instead of 17), then the ones that time
# something alone: a test marked `timing` must not share the machine with other tests. The long tests
# start first (tests/conftest.py) and an idle worker takes half of another's queue (worksteal).
test: setup
	$(VENV)/bin/ruff check mcore workbench tests bench kernels sessions
	$(VENV)/bin/ruff format --check mcore workbench tests bench kernels sessions
	$(VENV)/bin/mypy  # [tool.mypy] in pyproject.toml names the packages (mcore, workbench)
	$(PY) -m pytest -q -n $(TEST_WORKERS) --dist worksteal -m "not gpu and not timing"
	$(PY) -m pytest -q -m "timing and not gpu"

test-gpu: setup
	$(PY) -m pytest -q -m gpu

clean:
	rm -rf artifacts .pytest_cache .mypy_cache
