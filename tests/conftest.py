"""Shared fixtures: real HLO produced by jax from the small NNX models in nnx_models.py; the session's lowerings
(one per cell, code and environment, shared by every test that reads the cell); the CLI run in this process."""

from __future__ import annotations

import collections
import contextlib
import fcntl
import hashlib
import importlib.util
import inspect
import json
import os
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest
import typer.testing

from hlo_audit import cache as hlo_cache
from hlo_audit import host
from hlo_audit.config import load_config
from hlo_audit.lowering import Lowering
from hlo_audit.matrix import select
from hlo_audit.run import run_cells

# As the CLI does, before jax starts: on a host without accelerators jax starts no TPU runtime (libtpu is
# installed for compiling to TPU topologies, which needs none), and libtpu is compile-only.
host.setup_own_process()

# The tests read a CLI run's stderr apart from its stdout, and `output` as both, as click 8.2 always keeps them.
# click 8.1 (typer 0.15's, the low end `make compat` runs) mixes them unless asked, and then its `output` is stdout
# alone: ask, and give `output` both (stdout, then stderr), so the same tests hold under both. typer 0.2x's runner is
# its own (click is then not installed at all): nothing to patch.
if "mix_stderr" in inspect.signature(typer.testing.CliRunner.__init__).parameters:
    import click.testing

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
def dump_folder(request):
    """A real --xla_dump_to folder of a 2-layer model with dropout 0.5 (it draws random bits): written once per
    session for every worker (a process of its own, ~5 s), read only."""
    session = request.config.stash[_SESSION]
    folder, written = session / "dump", session / "dump.written"
    with open(session / "dump.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not written.exists():
            shutil.rmtree(folder, ignore_errors=True)
            nnx_models.write_dump(ModelSpec(dropout_rate=0.5), folder)
            written.touch()
    return folder


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
    parser.addoption("--lowering-cache", default=None, metavar="DIR",
                     help="Keep the session's lowerings (hlo-audit's cache) in DIR, so a later run lowers only what "
                          "changed; default: a folder of the session's own, removed at its end.")


# Optional installs a test needs, by its marker: without them (`make setup TE=0`, a user's environment in
# `make compat`) those tests are skipped, saying so.
_OPTIONAL = {"maxtext": ("maxtext", "MaxText is not installed (the maxtext extra)"),
             "te": ("transformer_engine", "Transformer Engine is not installed (make setup TE=0)"),
             "tpu": ("libtpu", "libtpu is not installed (the tpu extra)"),
             "tunix": ("tunix", "google-tunix is not installed (make setup installs it, --no-deps)")}


# xdist (`--dist loadgroup --no-loadscope-reorder`, pyproject.toml) hands out work in the items' order: a group whole
# to one worker, every other test alone. The groups go first, heaviest first, so that no worker is left alone with a
# long group at the end; then the other tests, in file order, fill both workers. Worker-seconds per group, measured
# with `pytest -n 2 -m "not long" --durations=0` (summed per group; docs/development.md) on the shared 2-core
# machine under load: maxtext 656, nnx_oracle 220, maxtext_te 133, compiled ~60, maxengine 45, tunix 44, report
# ~35, thunks ~30, tpu 27, golden_store 20, source_dumps ~20, merge 6 (the suite: ~2450).
GROUPS_FIRST = ("maxtext", "nnx_oracle", "maxtext_te", "compiled", "maxengine", "tunix", "report", "thunks", "tpu",
                "golden_store", "source_dumps", "merge")


def xdist_group(item) -> str | None:
    """The group xdist runs ``item`` in: its xdist_group marks' names, sorted and joined (as xdist names it)."""
    names = sorted({str(m.args[0] if m.args else m.kwargs.get("name", "default"))
                    for m in item.iter_markers("xdist_group")})
    return "_".join(names) or None


# jax 0.10 (the newest on Python 3.11: `make compat`) lowers closed_calls and an unrolled loop's copies as `call`s of
# one computation, where 0.11 and later write them inline. Against goldens of another jax that is the closed-call line
# (compare.CLOSED_CALLS_AS_CALLS: program size and loops advisory, tests/test_environment_noise.py); with both sides
# lowered by jax 0.10 the kinds are still named right, but these tests' numbers are the inline writing's (6 loops
# unrolled, not 5; a body of 11 instructions, not 13; an unrolled text larger, where 0.10's calls one body 8 times).
# Said here where each test meets it (strict: a change shows).
_JAX_010_CALLS = "jax 0.10 writes closed_calls and unrolled copies as calls: these numbers are the inline writing's"
# Measured in `make compat` (jax 0.10.2 on Python 3.11), each a known difference of that stack, strict: a fix shows.
_JAX_010_MOE = ("jax 0.10.2's XLA compiles the MoE train step otherwise (loss scaling's constant folded into a scatter "
                "loop's literal, a loop state's get-tuple-elements): the compiled kinds are read from 0.12's modules")
_JAX_010_GAPS = {
    "tests/test_flow_kinds.py::test_a_trip_count_changed_and_a_loop_added_or_removed": _JAX_010_CALLS,
    "tests/test_named_rules.py::test_what_each_finding_says": _JAX_010_CALLS,
    "tests/test_structural_diff.py::test_a_loop_unrolled_8x_is_a_loops_change": _JAX_010_CALLS,
    "tests/test_model_terms.py::test_each_change_compiled_is_named_by_its_own_kind[aux_dropped]":
        "jax 0.10.2 places the compiled aux loss's removal one line off (moe_steps.py:129, the expression's second line)",
    "tests/test_model_terms.py::test_each_change_compiled_is_named_by_its_own_kind[no_loss_scale]": _JAX_010_MOE,
    "tests/test_model_terms.py::test_each_change_compiled_is_named_by_its_own_kind[router_bf16]": _JAX_010_MOE,
    "tests/test_model_terms.py::test_loss_scaling_removed_compiled_counts_each_instruction_once": _JAX_010_MOE,
    "tests/test_model_terms.py::test_the_router_in_bf16_is_a_precision_change_reading_the_router":
        "jax 0.10.2 lowers the bf16 router's dot with a bf16 result, and its operand's path to the state is not followed",
}
# The sharded step's process (8 host devices) does not run under jax 0.10's sharding API.
_JAX_010_SKIPPED = {"tests/test_structural_kinds.py": "the sharded step (tests/sharded_step.py) needs jax >= 0.11"}


def _jax_010_known(items) -> None:
    import jax

    if jax.__version_info__ >= (0, 11):
        return
    for item in items:
        node = item.nodeid.split("@")[0]
        if node in _JAX_010_GAPS:
            item.add_marker(pytest.mark.xfail(strict=True, reason=_JAX_010_GAPS[node]))
        reason = _JAX_010_SKIPPED.get(node.split("::")[0])
        if reason:
            item.add_marker(pytest.mark.skip(reason=reason))


def pytest_collection_modifyitems(config, items):
    _jax_010_known(items)
    for marker, (module, reason) in _OPTIONAL.items():
        if importlib.util.find_spec(module) is not None:
            continue
        skip = pytest.mark.skip(reason=reason)
        for item in items:
            if marker in item.keywords:
                item.add_marker(skip)
    rank = {group: n for n, group in enumerate(GROUPS_FIRST)}
    groups = [xdist_group(item) for item in items]
    order = sorted(range(len(items)), key=lambda i: (rank.get(groups[i], len(rank) if groups[i] else len(rank) + 1), i))
    items[:] = [items[i] for i in order]


# --------------------------------------------------------------------------------------------------------------
# The session's lowerings: one per (cell, code, environment)
# --------------------------------------------------------------------------------------------------------------
#
# Every test that needs a cell's HLO (MaxText's above all: 10 to 60 s a lowering on the 2-core CI machine) gets it
# through hlo-audit's own cache in one folder the session owns (`session_lowerings`: `lower(cell)` here, or its
# folder as a CLI run's `cache_dir`), so the matrix run, the seed pairs, the committed goldens and the gate tests
# lower a cell once between them. The cache keys a cell by what it is, the code that lowers it and what the
# lowering read (hlo_audit/cache.py): a revert injected through $HLO_AUDIT_INJECT (tests/injected_maxtext.py) is a
# variant of its own. Its writes are atomic, so xdist's workers share the folder; a lock per cell keeps two of them
# from lowering one cell at once (the second waits, then reads it). Tests of the cache itself keep caches of their
# own.
#
# Every cell lowered in the session, in any process, is logged ($HLO_AUDIT_CACHE_LOG): the summary at the end
# counts them and names any MaxText cell lowered twice with the same inputs.

_SESSION = pytest.StashKey[Path]()
_LOWERINGS = pytest.StashKey[Path]()
_LOG_FROM = pytest.StashKey[int]()
_WORKER_KEYS = ("hlo_audit_session", "hlo_audit_lowerings")
# The variable tests/injected_maxtext.py reads: what, besides the cell and the code, makes one lowering another.
_INJECT = "HLO_AUDIT_INJECT"


def pytest_configure(config):
    # The suite's checks run as a local run does (hlo_audit.stack): CI=true on the machine that runs the suite must
    # not turn every environment advisory a test expects into a failure; tests of a pinned run say so themselves.
    os.environ["HLO_AUDIT_STACK"] = "local"
    workerinput = getattr(config, "workerinput", None)
    if workerinput is not None and _WORKER_KEYS[0] in workerinput:  # an xdist worker: the controller's folders
        config.stash[_SESSION], config.stash[_LOWERINGS] = (Path(workerinput[key]) for key in _WORKER_KEYS)
        return
    session = Path(tempfile.mkdtemp(prefix="hlo-audit-tests-"))
    chosen = config.getoption("--lowering-cache")
    config.stash[_SESSION] = session
    config.stash[_LOWERINGS] = Path(chosen).resolve() if chosen else session / "lowerings"
    # Inherited by xdist's workers and every process a test starts: each cell lowered anywhere appends a line.
    log = Path(os.environ.setdefault(hlo_cache.LOG_VARIABLE, str(session / "lowerings.jsonl")))
    config.stash[_LOG_FROM] = log.stat().st_size if log.exists() else 0


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node):
    """xdist, in the controller: each worker is started with the session's folders."""
    for key, stash in zip(_WORKER_KEYS, (_SESSION, _LOWERINGS)):
        node.workerinput[key] = str(node.config.stash[stash])


def pytest_unconfigure(config):
    if _LOG_FROM in config.stash:  # the process that made the session's folder
        shutil.rmtree(config.stash[_SESSION], ignore_errors=True)


def _is_maxtext(record: dict) -> bool:
    return record["target"] == "maxtext" or record["target"].startswith("injected_maxtext:")


def pytest_terminal_summary(terminalreporter, config):
    """The cells this session lowered (every process), and any MaxText cell lowered twice with the same inputs: the
    same primary key (cell, code, versions, flags) and the same injected change."""
    if _LOG_FROM not in config.stash:
        return
    try:
        with open(os.environ[hlo_cache.LOG_VARIABLE], "rb") as log:
            log.seek(config.stash[_LOG_FROM])
            lines = log.read().decode("utf-8", "replace").splitlines()
    except (OSError, KeyError):
        return
    records = []
    for line in lines:
        with contextlib.suppress(ValueError):
            records.append(json.loads(line))
    if not records:
        return
    maxtext = [r for r in records if _is_maxtext(r)]
    inputs = collections.Counter((r["key"], r.get("environment", {}).get(_INJECT)) for r in maxtext)
    again = sorted({f"{r['cell']} ({r['target']}{', ' + inject if inject else ''})" for r in maxtext
                    if inputs[r["key"], (inject := r.get("environment", {}).get(_INJECT))] > 1})
    terminalreporter.write_sep("-", "lowerings")
    terminalreporter.write_line(
        f"{len(records)} cells lowered in {sum(r['seconds'] for r in records):.0f} s, of them MaxText's: "
        f"{len(maxtext)} ({len(inputs)} distinct) in {sum(r['seconds'] for r in maxtext):.0f} s; "
        + (f"lowered more than once with the same inputs: {', '.join(again)}" if again else
           "no MaxText cell lowered twice with the same inputs"))


@contextlib.contextmanager
def _variable(name: str, value: str | None) -> Iterator[None]:
    """$name set to ``value`` (None: unset) inside the block, as it was after."""
    saved = os.environ.get(name)

    def put(setting: str | None) -> None:
        if setting is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = setting

    put(value)
    try:
        yield
    finally:
        put(saved)


class SessionLowerings:
    """The session's lowering cache (hlo-audit's own, hlo_audit/cache.py), shared by every worker."""

    def __init__(self, folder: Path):
        self.folder = folder

    @property
    def cache_dir(self) -> str:
        """The line that points a config at it (a top-level key: it goes before the config's first table)."""
        return f'cache_dir = "{self.folder}"\n'

    @contextlib.contextmanager
    def locked(self, cells: Iterable, inject: str = "") -> Iterator[None]:
        """Hold the cells' locks while the block lowers them (in this process or one it starts), so another worker
        that needs one of them waits and then reads it from the cache. Taken in one order: no two workers ever wait
        on each other."""
        names = sorted({hashlib.sha256(f"{cell.key_material()}\0{inject}".encode()).hexdigest()[:24]
                        for cell in cells})
        folder = self.folder / ".locks"
        folder.mkdir(parents=True, exist_ok=True)
        with contextlib.ExitStack() as held:
            for name in names:
                handle = held.enter_context(open(folder / name, "w"))
                fcntl.flock(handle, fcntl.LOCK_EX)
            yield

    def cells_of(self, config: Path, only: str | None = None) -> list:
        """The cells a CLI run of ``config`` (with ``--only``) lowers: what it must hold locked."""
        return select(load_config(str(config)).cells(), only)

    def lower(self, cell, inject: str = ""):
        """``(CellResult, Lowering)`` of ``cell``, lowered in this process unless the session has it; ``inject``:
        $HLO_AUDIT_INJECT while it lowers (the ``injected_maxtext:lower`` target's reverts and patches)."""
        cache = hlo_cache.Cache(self.folder)
        with self.locked([cell], inject), _variable(_INJECT, inject or None):
            (result,) = run_cells([cell], cache)
        assert result.status == "ok", f"{cell.id}: {result.status}: {result.message}"
        text, meta = cache.get_lowering(result.key, cell.id)
        return result, Lowering.from_cache(text, meta)


@pytest.fixture(scope="session")
def session_lowerings(request) -> SessionLowerings:
    return SessionLowerings(request.config.stash[_LOWERINGS])
