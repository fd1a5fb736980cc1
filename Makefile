# Set-up is part of every target: a fresh machine needs only `make demo` or `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
# torch 2.13.0 is a CPU wheel on this project's machines (a looser pin would pull a multi-GB CUDA build).
TORCH ?= torch==2.13.0

.PHONY: setup demo demo-cli test test-gpu bench clean

setup: $(VENV)/.installed

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH)"
	$(PY) -m pip install -q -e '.[test]'
	touch $@

demo: setup
	$(VENV)/bin/workbench tutorial qwen-recipe

demo-cli: setup
	PATH="$(abspath $(VENV))/bin:$$PATH" bash bench/tutorial_cli.sh artifacts/demo-cli

test: setup
	$(VENV)/bin/ruff check mcore workbench tests bench kernels sessions
	$(VENV)/bin/ruff format --check mcore workbench tests bench kernels sessions
	$(VENV)/bin/mypy  # [tool.mypy] in pyproject.toml names the packages (mcore, workbench)
	$(PY) -m pytest -q

test-gpu: setup
	$(PY) -m pytest -q -m gpu

clean:
	rm -rf artifacts .pytest_cache .mypy_cache
