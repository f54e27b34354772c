"""Shared fixtures: real HLO produced by jax from the small NNX models in nnx_models.py."""

from __future__ import annotations

import importlib.util
import inspect

import click.testing
import pytest

from hlo_audit import host

# As the CLI does, before jax starts: on a host without accelerators jax starts no TPU runtime (libtpu is
# installed for compiling to TPU topologies, which needs none), and libtpu is compile-only.
host.setup_own_process()

# The tests read a CLI run's stderr apart from its stdout, and `output` as both, as click 8.2 always keeps them.
# click 8.1 (typer 0.15's, the low end `make compat` runs) mixes them unless asked, and then its `output` is stdout
# alone: ask, and give `output` both (stdout, then stderr), so the same tests hold under both.
if "mix_stderr" in inspect.signature(click.testing.CliRunner.__init__).parameters:
    _runner_init = click.testing.CliRunner.__init__

    def _separate_stderr(self, *args, mix_stderr: bool = False, **kwargs):
        _runner_init(self, *args, mix_stderr=mix_stderr, **kwargs)

    click.testing.CliRunner.__init__ = _separate_stderr
    click.testing.Result.output = property(
        lambda self: self.stdout + (self.stderr if self.stderr_bytes is not None else ""))
    # click 8.1 flushes only the captured stdout before reading it back: what was printed to stderr stays in the
    # wrapper's buffer and the result's stderr reads empty. Write through instead.
    _wrapper_init = click.testing._NamedTextIOWrapper.__init__

    def _write_through(self, *args, **kwargs):
        _wrapper_init(self, *args, **{"write_through": True, **kwargs})

    click.testing._NamedTextIOWrapper.__init__ = _write_through

import nnx_models  # noqa: E402 (jax starts here)
from nnx_models import ModelSpec  # noqa: E402


@pytest.fixture(scope="session")
def dump_folder(tmp_path_factory):
    """A real --xla_dump_to folder of a 2-layer model with dropout 0.5 (it draws random bits)."""
    return nnx_models.write_dump(ModelSpec(dropout_rate=0.5), tmp_path_factory.mktemp("dump"))


@pytest.fixture
def write_hlo(tmp_path):
    """Write a spec's pre-optimization HLO text to a file and return its path."""

    def write(spec: ModelSpec, name: str | None = None):
        path = tmp_path / f"{name or nnx_models.spec_name(spec)}.hlo.txt"
        path.write_text(nnx_models.hlo_text(spec))
        return path

    return write


def pytest_addoption(parser):
    parser.addoption("--hlo-corpus", default=None, metavar="DIR",
                     help="Real-HLO corpus (INDEX.tsv, gzip modules) that test_corpus.py holds the parser to "
                          "XLA's with; default $HLO_AUDIT_CORPUS, else those tests are skipped.")


# Optional installs a test needs, by its marker: without them (`make setup TE=0`, a user's environment in
# `make compat`) those tests are skipped, saying so.
_OPTIONAL = {"maxtext": ("maxtext", "MaxText is not installed (the maxtext extra)"),
             "te": ("transformer_engine", "Transformer Engine is not installed (make setup TE=0)"),
             "tpu": ("libtpu", "libtpu is not installed (the tpu extra)"),
             "tunix": ("tunix", "google-tunix is not installed (make setup installs it, --no-deps)")}


def pytest_collection_modifyitems(config, items):
    for marker, (module, reason) in _OPTIONAL.items():
        if importlib.util.find_spec(module) is not None:
            continue
        skip = pytest.mark.skip(reason=reason)
        for item in items:
            if marker in item.keywords:
                item.add_marker(skip)
