# Two commands do all set-up on a fresh machine: `make audit` and `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup browser audit test bench clean

setup: $(STAMP)

# Reinstall only when the dependency declaration changes.
$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; assert sys.version_info >= (3, 12), f"hlo-audit needs Python >= 3.12, found {sys.version.split()[0]} (.python-version says 3.12)"'
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[maxtext,tpu,dev]'
	touch $(STAMP)

audit: setup
	$(VENV)/bin/hlo-audit check --jobs 2

# The HTML report's test renders it in headless Chromium; install Debian's package when it is missing.
browser:
	test -x /usr/bin/chromium || (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium)

test: setup browser
	$(PY) -m pytest -n 2 -q

bench: setup
	$(PY) scripts/bench_hlo.py
	$(PY) scripts/bench_matrix.py
	$(PY) scripts/bench_tpu.py

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info
