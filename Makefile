# Each target creates .venv on first use and reuses it after; nothing else needs installing by hand.
# The interpreter .venv is made with (PYTHON=... chooses another): the distribution's own python3 where it is the same
# Python version as the python3 on PATH and can make a venv, else that python3. Same version, so the same wheels
# apply; a different build: distributions build CPython with PGO and LTO, while with pyenv's default build (shared
# library, neither) the whole suite took 24% more CPU on a 2-core machine (docs/performance.md)
DISTRIBUTION_PYTHON := /usr/bin/python3
PYTHON_VERSION := import sys; print(sys.version_info[:2])
PYTHON ?= $(shell [ -x $(DISTRIBUTION_PYTHON) ] && $(DISTRIBUTION_PYTHON) -c 'import ensurepip' 2>/dev/null \
	&& [ "$$($(DISTRIBUTION_PYTHON) -c '$(PYTHON_VERSION)')" = "$$(python3 -c '$(PYTHON_VERSION)' 2>/dev/null)" ] \
	&& echo $(DISTRIBUTION_PYTHON) || echo python3)
VENV ?= .venv
PY := $(VENV)/bin/python
# two installs into the one .venv: the package alone (what `make demo` needs), and the package with the test and
# optional extras, the example plugin and OpenEnv (what `make test` and the other targets need; it includes the first)
DEMO_STAMP := $(VENV)/.installed-package
STAMP := $(VENV)/.installed
TORCH_VERSION ?= 2.13.0
# where torch comes from: empty (the default) means pip's own configuration; on a CPU-only machine whose pip reaches
# the public index, `make venv TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu` avoids its CUDA packages
TORCH_INDEX_URL ?=
PYTEST_ARGS ?=
# pytest-xdist workers for `make test` (0: no workers, one process). Its 2 cores stay busy through the run, so fewer
# tests at once cost less CPU: on 2 cores, the same tree and hour, 3 workers took 854 s and 1,647 CPU-s where 4 took
# 932 s and 1,840 (2026-12-07; docs/performance.md). 2 workers spent less, 1,653 CPU-s, but left the cores idle while
# tests waited (87% busy): 959 s. tests/conftest.py says how tests are handed out
PYTEST_WORKERS ?= 3

.PHONY: venv demo test security lint bench clean

# the venv, pip, then the CPU build of torch first, so that nothing later reaches for a multi-GB CUDA build ($(1): more
# pip options)
define make_venv
	@echo "make: making $(VENV) with $(PYTHON), Python $$($(PYTHON) -c 'import platform; print(platform.python_version())')"
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --progress-bar on $(1) torch==$(TORCH_VERSION) $(if $(TORCH_INDEX_URL),--index-url $(TORCH_INDEX_URL))
endef

# --no-compile: pip does not byte-compile every installed module (torch's thousands) up front; Python compiles the few
# the demo imports as it imports them (a fresh demo took 218 s with it, against 300+ s without, on a loaded 2-core box)
$(DEMO_STAMP): pyproject.toml
	@echo "make demo: installing torch and mlgym-registry (no test tools) into $(VENV); the first time only, a few minutes"
	$(call make_venv,--no-compile)
	$(PY) -m pip install --progress-bar on --no-compile -e .
	touch $(DEMO_STAMP)

$(STAMP): pyproject.toml plugins/mlgym-registry-example/pyproject.toml
	$(call make_venv)
	# the verifiers extra too, for tests/faces/test_verifiers.py and docs/verifiers.md (its console scripts, validate,
	# eval..., stay off the tests' stand-in MLGym container's PATH: tests/engine_double.py)
	$(PY) -m pip install --quiet -e '.[test,verifiers]' -e plugins/mlgym-registry-example
	# OpenEnv for tests/faces/test_serve.py without its UI and MCP-server dependencies (the test extra lists what it imports)
	$(PY) -m pip install --quiet --no-deps openenv==0.10.0
	touch $(STAMP) $(DEMO_STAMP)

venv: $(STAMP)

# each demo writes a folder of its own (runs/demo-<time>), so the target runs again and keeps earlier demos
demo: $(DEMO_STAMP)
	$(VENV)/bin/mlgym-registry run prisonersDilemma --policy scripted --seed 0 --out runs/demo-$$(date +%Y%m%d-%H%M%S)

test: $(STAMP)
	@start=$$(date +%s); $(VENV)/bin/ruff check src tests bench plugins examples || exit $$?; \
	echo "make test: ruff took $$(( $$(date +%s) - start )) s"
	# the package's bytecode, written once: pip compiles what it installs but not an editable install's source, and
	# where PYTHONDONTWRITEBYTECODE is set every fresh interpreter and forked command of the suite compiled it again
	# (0.25 s of CPU of a 4.4 s fresh make on a 2-core machine). Not the files that are copied or shown to sandboxes
	# as they are (tasks' files, the evaluation harness, the agent's tools): no __pycache__ may appear among them
	@$(PY) -m compileall -q -x '/(tasks/data|backends/local/(harness|tools))/' src
	# where the time went: the 15 slowest tests, then seconds and CPU seconds per test file, the wall time and the
	# CPU time of the tests, the background replays and the machine (tests/conftest.py, tests/cpu_accounts.py).
	# pytest exits 5 when it collects no test: report it instead of failing the target on it
	@start=$$(date +%s); $(PY) -m pytest -n $(PYTEST_WORKERS) --durations=15 $(PYTEST_ARGS); rc=$$?; \
	echo "make test: pytest took $$(( $$(date +%s) - start )) s with $(PYTEST_WORKERS) workers (exit code $$rc)"; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests"; exit 0; fi; exit $$rc

# the red-team suite alone (it also runs in `make test`)
security: $(STAMP)
	$(PY) -m pytest -m security tests/security

lint: $(STAMP)
	$(VENV)/bin/ruff check src tests bench plugins examples

bench: $(STAMP)
	for b in bench/bench_*.py; do $(PY) $$b || exit 1; done

clean:
	rm -rf $(VENV) runs .pytest_cache
