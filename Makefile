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
# libcuda.so.1 from Debian's libcuda1, where hlo_audit/targets/te.py looks for it.
DRIVER_DIR := $(VENV)/lib/nvidia-driver

.PHONY: setup browser audit audit-gpu test bench clean

setup: $(STAMP)

# Reinstall only when the dependency declaration (or the TE wheel) changes.
$(STAMP): pyproject.toml $(TE_WHEEL_SUMS)
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 12), f"hlo-audit needs Python >= 3.12, found {sys.version.split()[0]} (.python-version says 3.12)"'
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
ifeq ($(TE),1)
	cd $(TE_WHEELS) && sha256sum --check --quiet *.whl.sha256
	$(PY) -m pip install --quiet -e '.[maxtext,tpu,dev,te]' --find-links $(TE_WHEELS) --only-binary transformer-engine-jax
	bash scripts/fetch_libcuda.sh $(DRIVER_DIR)
else
	$(PY) -m pip install --quiet -e '.[maxtext,tpu,dev]'
endif
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

test: setup browser
	$(PY) -m pytest -n 2 -q

bench: setup
	$(PY) scripts/bench_hlo.py
	$(PY) scripts/bench_matrix.py
	$(PY) scripts/bench_tpu.py
	$(PY) scripts/bench_gpu.py

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
