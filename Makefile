# Two commands do all set-up on a fresh machine: `make audit` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
# TE=1 (the default) installs Transformer Engine, so the TE cells cross-lower for CUDA on this host; `make setup
# TE=0` leaves it out (6 GB less: 2 GB instead of 8) and those cells report `unavailable`.
TE ?= 1
STAMP := $(VENV)/.installed-te$(TE)
TE_WHEELS := scripts/wheels
TE_WHEEL_SUMS := $(wildcard $(TE_WHEELS)/*.whl.sha256)
# A real NNX model library from PyPI for the nnx target's tests (tunix's Qwen3 and Llama3), pinned in constraints.txt.
# --no-deps: its declared dependencies (tensorflow_datasets, ...) are a training stack; its models import with these.
NNX_LIBRARY := google-tunix google-metrax clu wrapt perfetto
# libcuda.so.1 from Debian's libcuda1, where hlo_audit/targets/te.py looks for it.
DRIVER_DIR := $(VENV)/lib/nvidia-driver

.PHONY: setup browser audit audit-gpu test test-long compat compat-py313 bench clean

setup: $(STAMP)

# Reinstall only when the dependency declaration, the pinned set (or the TE wheel) changes. pyproject.toml declares
# the ranges users get; constraints.txt pins what this repository's goldens depend on.
$(STAMP): pyproject.toml constraints.txt $(TE_WHEEL_SUMS)
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 12), f"hlo-audit needs Python >= 3.12, found {sys.version.split()[0]} (.python-version says 3.12)"'
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
ifeq ($(TE),1)
	cd $(TE_WHEELS) && sha256sum --check --quiet *.whl.sha256
	$(PY) -m pip install --quiet -e '.[flax,maxtext,tpu,dev,te]' -c constraints.txt --find-links $(TE_WHEELS) --only-binary transformer-engine-jax
	bash scripts/fetch_libcuda.sh $(DRIVER_DIR)
else
	$(PY) -m pip install --quiet -e '.[flax,maxtext,tpu,dev]' -c constraints.txt
endif
	$(PY) -m pip install --quiet --no-deps -c constraints.txt $(NNX_LIBRARY)
	rm -f $(VENV)/.installed*
	touch $(STAMP)

audit: setup
	$(VENV)/bin/hlo-audit check --jobs 2

# The GPU profile (docs/gpu.md): MaxText compiled by XLA's GPU compiler for named GPUs on this host.
audit-gpu: setup
	$(VENV)/bin/hlo-audit check --config hlo-audit.gpu.toml --jobs 2

# The HTML report's test renders it in headless Chromium; install Debian's package when it is missing.
browser:
	test -x /usr/bin/chromium || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium)

# The linter first (seconds; pyproject.toml's [tool.ruff]), then the suite, whose tests/test_layers.py holds the
# import layers. Its end says what the budget needs (docs/development.md): the 25 slowest tests, and the cells it
# lowered (each MaxText cell once: tests/conftest.py).
test: setup browser
	$(VENV)/bin/ruff check hlo_audit tests scripts
	$(PY) -m pytest -n 2 -q -m "not long" --durations=25

# The suite's long acceptance runs (pytest marker `long`: the GPU profile's MaxText compiles, a full TPU compile
# beside MaxText's own train_compile, seed 001 at 32 layers), ~10 minutes of their own: .ci/run runs them after `make test`.
test-long: setup
	$(PY) -m pytest -n 2 -q -m long --durations=25

# hlo-audit installed as a user installs it (pip install ., no editable link, no extras) into an environment that
# already holds an older stack: the low end of pyproject.toml's ranges (.ci/compat-stack.txt), on the lowest Python
# it supports (3.11: jax 0.10.2 and flax 0.12.8 are the newest there). The install must change none of the stack's
# versions; then the suite runs there, less what needs MaxText, Transformer Engine or libtpu (MaxText needs 3.12).
PYTHON311 ?= $(shell PYENV_VERSION=3.11 pyenv which python 2>/dev/null || command -v python3.11)
COMPAT := .venv-compat
compat:
	@$(PYTHON311) -c 'import sys; assert sys.version_info[:2] == (3, 11), f"make compat runs on Python 3.11, PYTHON311={sys.executable} is {sys.version.split()[0]}"'
	test -x $(COMPAT)/bin/python || $(PYTHON311) -m venv $(COMPAT)
	$(COMPAT)/bin/python -m pip install --quiet --upgrade pip
	$(COMPAT)/bin/python -m pip install --quiet -r .ci/compat-stack.txt
	$(COMPAT)/bin/python -m pip freeze --exclude hlo-audit > $(COMPAT)/stack-before.txt
	$(COMPAT)/bin/python -m pip uninstall --quiet --yes hlo-audit 2>/dev/null || true
	$(COMPAT)/bin/python -m pip install --quiet .
	$(COMPAT)/bin/python -m pip freeze --exclude hlo-audit > $(COMPAT)/stack-after.txt
	diff $(COMPAT)/stack-before.txt $(COMPAT)/stack-after.txt || (echo "installing hlo-audit changed the stack above"; false)
	test ! -e build || (echo "pip install . wrote build/ into the checkout"; false)
	$(COMPAT)/bin/pytest -q -n 2 -p no:cacheprovider -m "not maxtext and not te and not tpu"

# The highest Python hlo-audit supports, with the newest of everything pip resolves there (pip install . alone): the
# parser, normalizer, differ, gate, named rules and CLI files of the suite (a few minutes; the whole suite runs on
# 3.12 in `make test` and on 3.11 in `make compat`).
PYTHON313 ?= $(shell PYENV_VERSION=3.13 pyenv which python 2>/dev/null || command -v python3.13)
COMPAT313 := .venv-py313
COMPAT313_TESTS := tests/test_text.py tests/test_normalize.py tests/test_diff.py tests/test_gate.py \
	tests/test_named_rules.py tests/test_cli.py tests/test_init_imports.py tests/test_lowering_warnings.py
compat-py313:
	@$(PYTHON313) -c 'import sys; assert sys.version_info[:2] == (3, 13), f"PYTHON313={sys.executable} is {sys.version.split()[0]}"'
	test -x $(COMPAT313)/bin/python || $(PYTHON313) -m venv $(COMPAT313)
	$(COMPAT313)/bin/python -m pip install --quiet --upgrade pip
	$(COMPAT313)/bin/python -m pip uninstall --quiet --yes hlo-audit 2>/dev/null || true
	$(COMPAT313)/bin/python -m pip install --quiet ".[flax]" "pytest>=8.4.2,<9" "pytest-xdist>=3.8.0" "hypothesis>=6.170.17"
	$(COMPAT313)/bin/pytest -q -n 2 -p no:cacheprovider -m "not maxtext and not te and not tpu and not long" \
		$(COMPAT313_TESTS)

bench: setup
	$(PY) scripts/bench_hlo.py
	$(PY) scripts/bench_diff.py
	$(PY) scripts/bench_diff_large.py
	$(PY) scripts/bench_matrix.py
	$(PY) scripts/bench_cache_digest.py
	$(PY) scripts/bench_recorder.py --maxtext
	$(PY) scripts/bench_tpu.py
	$(PY) scripts/bench_gpu.py

clean:
	rm -rf $(VENV) $(COMPAT) $(COMPAT313) .pytest_cache
