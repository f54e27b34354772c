"""The results cache: a cell served from it is what lowering it now would give, or it is lowered again.

A cell's lowering is looked up in two steps, as ccache's direct mode or a build system's depfile does:

* its **primary key**: what is known before lowering: the cell (every axis, overrides, batch, seq, the target's
  spec), the target's own fingerprint (MaxText's installed sources and configs; a callable's module), the versions of
  jax/jaxlib/flax/maxtext/TE, the cell's compiler (libtpu for a TPU topology), every ``XLA_*``/``JAX_*``/``LIBTPU_*``
  variable, the Python, hlo-audit's lowering side (every module of the layers up to ``targets``, by
  ``hlo_audit.layers``: no list) and this file (it decides what a manifest records). It names a **manifest**;
* the manifest's **variants**: what each earlier lowering of the cell read, recorded in the process that lowered it
  (``recording_environment`` around building the target and lowering; ``reads_after``): every Python module in
  ``sys.modules`` afterwards, not only the ones it imported (a model module imported by an earlier cell of the same
  worker is used all the same): files of an installed distribution by the distribution's name and version, stdlib
  by the Python's version, every other file (the user's project, an editable install, a folder on PYTHONPATH) by
  size, mtime and SHA-256; and the environment variables it read, with their values. A variant is reused only if
  all of it still holds: environment and versions first, then a ``stat`` per file, a hash only where size or mtime
  differ (a fresh checkout: then the mtimes are refreshed in the manifest). Several variants per cell, so switching
  a variable back and forth is a hit both ways.

Each variant's **entry** (``<entry>.hlo.txt``, ``.lowering.json``, ``.<analysis>.result.json``,
``.<analysis>.normalized.txt``; ``<analysis>`` is hlo-audit's own source) carries a header: what kind of entry it
is, the entry key and cell it was made for, and the SHA-256 of its content. Anything that does not verify on read
(a changed digit, a truncated text, two cells' files swapped or copied over each other, JSON of another shape) is a
miss, said in one line on stderr, and the cell is computed again: the cache is a miss or right, never wrong. A
manifest is written last, so it only ever names whole entries; every write goes to a temporary file in the same
folder and is renamed into place, so concurrent runs (or one killed midway) never leave a torn entry.

What it does not see: edits made in place inside an installed distribution (pip never makes one; MaxText's are in
its target fingerprint), code loaded other than as a module (``exec`` of a file), files a lowering opens, and
environment read as a whole (iterating ``os.environ``, as wsgiref's and tqdm's imports do: not a dependency on
every variable) or read in C (hence the prefixes in the primary key). ``--refresh`` lowers again and rewrites.

JSON and text only, never pickle.
"""

from __future__ import annotations

import contextlib
import csv
import functools
import hashlib
import json
import os
import re
import stat
import sys
import sysconfig
import tempfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import replace
from importlib import metadata
from pathlib import Path

from hlo_audit import host, layers, platforms
from hlo_audit.files import write_atomic
from hlo_audit.lowering import Lowering
from hlo_audit.matrix import Cell
from hlo_audit.results import CellResult

# v3: manifests of what each lowering read; every entry carries its key, cell and checksum.
LAYOUT_VERSION = "v3"
_VERSIONED_PACKAGES = ("jax", "jaxlib", "flax", "maxtext", "transformer-engine-jax")
_FLAG_PREFIXES = ("XLA_", "JAX_", "LIBTPU_")
_HLO_AUDIT_ROOT = Path(__file__).resolve().parent
# Variants kept per cell: enough for a few switches flipped back and forth, few enough to read at every lookup.
_VARIANTS_KEPT = 8
_HEADER_TAG = "hlo-audit-cache"


class CacheError(Exception):
    """The cache folder cannot be used (a file, not readable, not writable); one line naming it."""


def package_versions() -> dict[str, str]:
    return {name: host.installed_version(name) for name in _VERSIONED_PACKAGES}


# Which backends jax starts on this host, not what a lowering for the cell's named platform produces
# (hlo-audit itself sets it where the host has no accelerator: host.setup_own_process).
_NOT_FLAGS = frozenset({"JAX_PLATFORMS"})


def _flags() -> dict[str, str]:
    return {k: v for k, v in sorted(os.environ.items()) if k.startswith(_FLAG_PREFIXES) and k not in _NOT_FLAGS}


def lowering_key(cell: Cell, target_fingerprint: str) -> str:
    """The primary key: what is known about a cell's lowering before it runs (the module doc)."""
    material = {"layout": LAYOUT_VERSION, "cell": cell.key_material(), "versions": package_versions(),
                "target": target_fingerprint, "flags": _flags(), "lowering": lowering_fingerprint(),
                "python": sys.version, "recorder": _recorder_fingerprint()}
    toolchain = platforms.of(cell).toolchain(cell)
    if toolchain:  # only where the cell depends on it: a libtpu upgrade re-lowers TPU cells, not CPU ones
        material["toolchain"] = toolchain
    return _digest(material)


def _digest(material: object) -> str:
    return hashlib.sha256(_canonical(material).encode()).hexdigest()


def _canonical(material: object) -> str:
    return json.dumps(material, sort_keys=True, separators=(",", ":"))


def _module_name(path: Path, root: Path = _HLO_AUDIT_ROOT) -> str:
    """``platforms/tpu.py`` -> ``platforms.tpu``; a package's ``__init__.py`` is the package."""
    return layers.module_name(path.relative_to(root).as_posix())


def lowering_sources(root: Path = _HLO_AUDIT_ROOT) -> list[Path]:
    """hlo-audit's lowering side under ``root``: every module the layer table puts at or below ``targets``."""
    return [path for path in sorted(root.rglob("*.py")) if layers.is_lowering_side(_module_name(path, root))]


def source_fingerprint(paths: list[Path], root: Path) -> str:
    digest = hashlib.sha256()
    for path in paths:
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        digest.update(path.read_bytes() + b"\0")
    return digest.hexdigest()[:16]


@functools.cache
def lowering_fingerprint() -> str:
    """The source of hlo_audit's lowering side: a change to what a cell lowers for must not serve stale text."""
    return source_fingerprint(lowering_sources(), _HLO_AUDIT_ROOT)


@functools.cache
def _recorder_fingerprint() -> str:
    """This file: it decides what a manifest records and how entries verify, so entries of another version of it
    are not trusted to have recorded enough."""
    return hashlib.sha256(Path(__file__).read_bytes()).hexdigest()[:16]


def analysis_fingerprint() -> str:
    """hlo_audit's own source: a change to the analysis must not serve stale summaries."""
    return source_fingerprint(sorted(_HLO_AUDIT_ROOT.rglob("*.py")), _HLO_AUDIT_ROOT)


# --------------------------------------------------------------------------------------------------------------
# What a lowering read: environment variables (recorded while it runs) and modules (sys.modules afterwards)
# --------------------------------------------------------------------------------------------------------------


class _EnvironmentReads:
    """The variables one window read, with the value first read (None: absent), and those it wrote itself (a read
    after the window's own write is not an input)."""

    def __init__(self) -> None:
        self.read: dict[str, str | None] = {}
        self.written: set[str] = set()


_ENVIRON = type(os.environ)
_ORIGINAL = {name: getattr(_ENVIRON, name) for name in ("__getitem__", "__setitem__", "__delitem__", "copy")}
_recorders: list[_EnvironmentReads] = []
_recorders_lock = threading.Lock()
_bulk = threading.local()
# Reads made while building targets in this process (imports: jax's config, a user's module-level os.environ.get):
# the values a module keeps from its import hold for every cell lowered after it.
_PROCESS_READS = _EnvironmentReads()


def _note(environ, key, value) -> None:
    if environ is not os.environ or not isinstance(key, str) or getattr(_bulk, "depth", 0):
        return
    try:
        caller = sys._getframe(2).f_code  # noqa: SLF001 -- the frame that asked os.environ (no public equivalent)
    except ValueError:  # asked from C with no Python frame above
        caller = None
    if caller is not None and caller.co_name == "__iter__" and "_collections_abc" in caller.co_filename:
        return  # items()/values() of the whole environment: wsgiref's import, tqdm's TQDM_* scan
    for reads in _recorders:
        if key not in reads.written:
            reads.read.setdefault(key, value)


def _getitem(self, key):
    try:
        value = _ORIGINAL["__getitem__"](self, key)
    except KeyError:
        _note(self, key, None)
        raise
    _note(self, key, value)
    return value


def _setitem(self, key, value):
    if self is os.environ:
        for reads in _recorders:
            reads.written.add(key)
    _ORIGINAL["__setitem__"](self, key, value)


def _delitem(self, key):
    if self is os.environ:
        for reads in _recorders:
            reads.written.add(key)
    _ORIGINAL["__delitem__"](self, key)


def _copy(self):
    _bulk.depth = getattr(_bulk, "depth", 0) + 1  # a copy of the whole environment (subprocess env=...)
    try:
        return _ORIGINAL["copy"](self)
    finally:
        _bulk.depth -= 1


_PATCHED = {"__getitem__": _getitem, "__setitem__": _setitem, "__delitem__": _delitem, "copy": _copy}


@contextlib.contextmanager
def recording_environment(process_wide: bool = False) -> Iterator[_EnvironmentReads]:
    """Record every ``os.environ`` / ``os.getenv`` read in the block (any module, any thread).

    ``process_wide``: the block builds a target, and what its imports read is part of every later cell's manifest
    too. A variable the block read and then set itself (jax's import finds libtpu and sets TPU_LIBRARY_PATH when
    it is unset) is recorded with the value it holds afterwards: what everything after the import sees, and what a
    later lookup, made after building the same target (or after importing jax some other way), compares with. A
    value set from outside is kept all the same, so it still keys the cell."""
    reads = _PROCESS_READS if process_wide else _EnvironmentReads()
    with _recorders_lock:
        if not _recorders:
            for name, function in _PATCHED.items():
                setattr(_ENVIRON, name, function)
        _recorders.append(reads)
    try:
        yield reads
    finally:
        with _recorders_lock:
            if process_wide:
                for name in reads.written & reads.read.keys():
                    reads.read[name] = os.environ.get(name)
            _recorders.remove(reads)
            if not _recorders:
                for name, function in _ORIGINAL.items():
                    setattr(_ENVIRON, name, function)


@contextlib.contextmanager
def importing_target() -> Iterator[None]:
    """Around importing a target's code (plan time, and each worker's first cell): what the import reads from the
    environment keys every cell this process lowers after it, and what it prints goes to stderr."""
    with recording_environment(process_wide=True), host.prints_to_stderr():
        yield


def _variables(reads: _EnvironmentReads) -> dict[str, str | None]:
    # The prefixes are the primary key's; JAX_PLATFORMS is not an input of what a cell lowers to (_NOT_FLAGS).
    return {name: value for name, value in sorted(reads.read.items())
            if not name.startswith(_FLAG_PREFIXES) and name not in _NOT_FLAGS}


def reads_after(window: _EnvironmentReads) -> dict:
    """The manifest of a lowering that just ran in this process: the modules loaded now, the variables ``window``
    read (``environment``) and those read while this process built its targets (``imported_environment``: the
    values its imports saw, which later writes, libtpu's TPU_LIBRARY_PATH say, do not change for the module that
    kept them). JSON-able, so a worker can hand it to the parent."""
    files, distributions = {}, {}
    search_path = tuple(sys.path)
    kinds = _kinds(search_path)  # what a path is does not change while the process runs: classified once
    for path in sorted(_module_files()):
        if path not in kinds:
            kinds[path] = _file_kind(path, _installed_files(search_path))
        kind = kinds[path]
        if kind == "content":
            files[path] = _file_state(path)
        elif kind is not None:
            distributions[kind[0]] = kind[1]
    return {"files": files, "distributions": dict(sorted(distributions.items())),
            "environment": _variables(window), "imported_environment": _variables(_PROCESS_READS)}


def _module_files() -> set[str]:
    files = set()
    for module in list(sys.modules.values()):
        try:
            file = vars(module).get("__file__")  # vars(): a lazy module's __getattr__ would import
        except TypeError:
            continue
        if isinstance(file, str) and file:
            files.add(os.path.abspath(file))  # as imported (not realpath: 10 lstat a file, 0.3 s for MaxText's)
    return files


@functools.cache
def _kinds(search_path: tuple[str, ...]) -> dict[str, str | tuple[str, str] | None]:
    return {}


def _file_kind(path: str, installed: dict[str, tuple[str, str]]) -> str | tuple[str, str] | None:
    """``content`` (hash it), a distribution ``(name, version)`` that installed it, or None (not an input here)."""
    own = next((root for root in _own_roots() if path.startswith(root)), None)
    if own is not None:
        # The lowering side is the primary key's; the HLO core only analyses; the layers above the targets are not
        # imported by a lowering (tests/test_layers.py). The examples are targets: a user's code like any other.
        module = layers.module_name(path[len(own):].replace(os.sep, "/")) if path.endswith(".py") else ""
        return "content" if module == "examples" or module.startswith("examples.") else None
    if path in installed:
        return installed[path]
    if path.startswith(_stdlib_roots()) and not any(f"{os.sep}{d}{os.sep}" in path for d in _SITE_FOLDERS):
        return None  # the Python's own: its version is in the primary key
    return "content"


_SITE_FOLDERS = ("site-packages", "dist-packages")


@functools.cache
def _own_roots() -> tuple[str, ...]:
    """hlo_audit's folder as imported and as resolved."""
    return tuple({os.path.dirname(os.path.abspath(__file__)) + os.sep, str(_HLO_AUDIT_ROOT) + os.sep})


@functools.cache
def _stdlib_roots() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    return tuple(sorted({root + os.sep for name in ("stdlib", "platstdlib")
                         for root in (os.path.abspath(paths[name]), os.path.realpath(paths[name]))}))


def _normalized(name: str) -> str:
    """A distribution's name as PEP 503 compares them (``PyYAML``, ``pyyaml``; ``jax_cuda12_plugin``)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def _dist_info_name(folder: str) -> tuple[str, str] | None:
    """``flax-0.12.12.dist-info`` -> (``flax``, ``0.12.12``): pip and uv name the folder from the metadata
    (the wheel spec: the name's dashes are underscores, so the first dash ends it)."""
    name, dash, version = folder.removesuffix(".dist-info").partition("-")
    return (_normalized(name), version) if folder.endswith(".dist-info") and dash and version else None


@functools.cache
def _installed_files(search_path: tuple[str, ...]) -> dict[str, tuple[str, str]]:
    """Every file an installed distribution's RECORD lists -> (name, version), the first on ``sys.path`` winning
    as imports do. RECORD, not top-level names: an editable install's RECORD lists no source file, and a project's
    stray ``*.egg-info`` has none, so their code is keyed by content. Built once per process (~0.2 s, 37k files).
    The version is the dist-info folder's (what ``_Now`` reads back with one listdir per path entry) where the
    folder is named the standard way, else the metadata's."""
    index: dict[str, tuple[str, str]] = {}
    for dist in metadata.distributions(path=list(search_path)):
        try:
            record = dist.read_text("RECORD")
        except (OSError, UnicodeDecodeError):
            continue
        if not record:
            continue
        # CSV, but a path needs quotes only if it holds a comma or a quote: split the common line by hand.
        rows = [next(csv.reader([line]))[0] if line.startswith('"') else line.partition(",")[0]
                for line in record.splitlines() if line]
        identity = next((_dist_info_name(row[:-len("/RECORD")]) for row in rows
                         if row.endswith(".dist-info/RECORD") and row.count("/") == 1), None)
        if identity is None:
            try:
                identity = (_normalized(dist.metadata["Name"] or ""), dist.version)
            except (OSError, UnicodeDecodeError):
                continue
        if not identity[0]:
            continue
        root = os.path.join(os.path.abspath(dist.locate_file("")), "")  # the sys.path entry module files are named by
        for row in rows:  # pip writes ../ only at the start (scripts in bin/): only those need normalizing
            index.setdefault(os.path.normpath(root + row) if row.startswith(".") else root + row, identity)
    return index


_HASHED: dict[tuple[str, int, int], str] = {}  # (path, size, mtime_ns) -> sha256, for this process


def _file_state(path: str) -> list | None:
    """[size, mtime_ns, sha256] of a file, None when it is gone (a module loaded from a since-deleted file)."""
    try:
        info = os.stat(path)
    except OSError:
        return None
    memo = (path, info.st_size, info.st_mtime_ns)
    if memo not in _HASHED:
        try:
            _HASHED[memo] = hashlib.sha256(Path(path).read_bytes()).hexdigest()
        except OSError:
            return None
    return [info.st_size, info.st_mtime_ns, _HASHED[memo]]


def _identity(reads: dict) -> dict:
    """What a manifest's variant stands for, without the mtimes (a fresh checkout of the same files is the same)."""
    return {"files": {path: state[2] if state else None for path, state in reads["files"].items()},
            "distributions": reads["distributions"], "environment": reads["environment"],
            "imported_environment": reads["imported_environment"]}


class _Now:
    """What this machine holds now, each thing looked at once per cache (a run's lookups share it)."""

    def __init__(self) -> None:
        self._versions: dict[str, str] | None = None
        self._stats: dict[str, os.stat_result | None] = {}
        self._hashes: dict[str, str | None] = {}

    def version(self, name: str) -> str:
        """An installed distribution's version now (not host.installed_version: that one holds for the process's
        life). From the dist-info folders on ``sys.path``: one listdir per entry, where ``metadata.version`` takes
        ~3 ms a name (0.4 s for MaxText's 95)."""
        if self._versions is None:
            self._versions = {}
            for entry in sys.path:
                with contextlib.suppress(OSError):
                    for folder in sorted(os.listdir(entry or ".")):
                        if (found := _dist_info_name(folder)) and found[0] not in self._versions:
                            self._versions[found[0]] = found[1]
        if name not in self._versions:
            try:
                self._versions[name] = metadata.version(name)
            except metadata.PackageNotFoundError:
                self._versions[name] = "absent"
        return self._versions[name]

    def stat(self, path: str) -> os.stat_result | None:
        if path not in self._stats:
            try:
                self._stats[path] = os.stat(path)
            except OSError:
                self._stats[path] = None
        return self._stats[path]

    def sha256(self, path: str) -> str | None:
        if path not in self._hashes:
            try:
                self._hashes[path] = hashlib.sha256(Path(path).read_bytes()).hexdigest()
            except OSError:
                self._hashes[path] = None
        return self._hashes[path]

    def verify(self, reads: dict) -> tuple[str | None, bool]:
        """(why the variant no longer holds, or None; whether some file held by its hash only, mtime changed)."""
        for name, value in reads["environment"].items():
            if os.environ.get(name) != value:
                return f"${name} changed", False
        imported = _PROCESS_READS.read  # what this process's own imports saw, where they read it
        for name, value in reads["imported_environment"].items():
            if (imported[name] if name in imported else os.environ.get(name)) != value:
                return f"${name} changed", False
        for name, version in reads["distributions"].items():
            if self.version(name) != version:
                return f"{name} {version} -> {self.version(name)}", False
        retouched = False
        for path, state in reads["files"].items():
            info = self.stat(path)
            if state is None or info is None:
                if (state is None) != (info is None):
                    return f"{path} {'appeared' if info else 'is gone'}", False
                continue
            if [info.st_size, info.st_mtime_ns] == state[:2]:
                continue
            if self.sha256(path) != state[2]:
                return f"{path} changed", False
            retouched = True
        return None, retouched


# --------------------------------------------------------------------------------------------------------------
# Entries: a header (kind, key, cell, checksum) and the content
# --------------------------------------------------------------------------------------------------------------


class _Damaged(Exception):
    """An entry that does not verify; its message says how."""


def _text_entry(header: dict, text: str) -> str:
    return f"{_HEADER_TAG} {_canonical({**header, 'sha256': _sha256(text)})}\n{text}"


def _json_entry(header: dict, body: object) -> str:
    return _canonical({_HEADER_TAG: {**header, "sha256": _sha256(_canonical(body))}, "body": body})


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _checked_header(header: object, expected: dict) -> str:
    if not isinstance(header, dict):
        raise _Damaged("no entry header")
    for field, value in expected.items():
        if value is not None and header.get(field) != value:
            raise _Damaged(f"made for {field} {header.get(field)!r}, not {value!r}")
    digest = header.get("sha256")
    if not isinstance(digest, str):
        raise _Damaged("no checksum in its header")
    return digest


def _parse_text_entry(raw: str, expected: dict) -> str:
    first, newline, text = raw.partition("\n")
    tag, _, header = first.partition(" ")
    if tag != _HEADER_TAG or not newline:
        raise _Damaged("no entry header")
    try:
        header = json.loads(header)
    except ValueError:
        raise _Damaged("unreadable entry header") from None
    if _checked_header(header, expected) != _sha256(text):
        raise _Damaged("checksum does not match its content")
    return text


def _parse_json_entry(raw: str, expected: dict) -> object:
    try:
        doc = json.loads(raw)
    except ValueError:
        raise _Damaged("not JSON") from None
    if not isinstance(doc, dict) or set(doc) != {_HEADER_TAG, "body"}:
        raise _Damaged("not a cache entry (JSON of another shape)")
    if _checked_header(doc[_HEADER_TAG], expected) != _sha256(_canonical(doc["body"])):
        raise _Damaged("checksum does not match its content")
    return doc["body"]


def _warn_on_stderr(message: str) -> None:
    print(f"hlo-audit: warning: {message}", file=sys.stderr)


class Cache:
    """One run's view of the cache folder. ``enabled=False`` (``--no-cache``): nothing is read or written;
    ``refresh`` (``--refresh``): nothing is read, everything computed is written. ``warn`` says, in one line, each
    entry that did not verify (default: stderr)."""

    def __init__(self, root: Path, enabled: bool = True, refresh: bool = False,
                 warn: Callable[[str], None] | None = None):
        self.folder = Path(root)
        self.root = self.folder / LAYOUT_VERSION
        self.enabled = enabled
        self.refresh = refresh
        self._warn = warn or _warn_on_stderr
        self._analysis = analysis_fingerprint()
        self._now = _Now()
        self._write_failed = False
        if enabled:
            self._check_usable()

    def _check_usable(self) -> None:
        """A cache folder that is a file, or that cannot be created, read or written, is the user's to fix: one
        line, before anything runs (not a traceback at the first write, nor results silently never cached)."""
        folder = self.folder
        hint = "fix it, point cache_dir elsewhere, or run with --no-cache"
        if folder.exists() and not folder.is_dir():
            raise CacheError(f"cache_dir {folder} is not a folder ({hint})")
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise CacheError(f"cache_dir {folder}: cannot create it: {exc.strerror or exc} ({hint})") from None
        try:
            os.listdir(folder)
        except OSError as exc:
            raise CacheError(f"cache_dir {folder} is not readable: {exc.strerror or exc} ({hint})") from None
        try:
            fd, probe = tempfile.mkstemp(dir=folder, prefix=".write-probe-")
            os.close(fd)
            os.unlink(probe)
        except OSError as exc:
            raise CacheError(f"cache_dir {folder} is not writable: {exc.strerror or exc} ({hint})") from None

    # -- paths ---------------------------------------------------------------------------------------------------

    def _base(self, key: str) -> Path:
        return self.root / key[:2] / key

    def _path(self, key: str, kind: str) -> Path:
        suffix = {"manifest": ".manifest.json", "hlo": ".hlo.txt", "lowering": ".lowering.json",
                  "result": f".{self._analysis}.result.json",
                  "normalized": f".{self._analysis}.normalized.txt"}[kind]
        return self._base(key).with_name(key + suffix)

    # -- reading -------------------------------------------------------------------------------------------------

    def _read(self, key: str, kind: str, cell: str | None, parse) -> object | None:
        """An entry's content, or None: missing (a plain miss) or not verifying (a miss that is said)."""
        path = self._path(key, kind)
        expected = {"kind": kind, "key": key, "cell": cell}
        if kind in ("result", "normalized"):
            expected["analysis"] = self._analysis
        try:
            raw = path.read_bytes()
        except FileNotFoundError:
            return None
        except OSError as exc:
            return self._damaged(path, cell, f"unreadable: {exc.strerror or exc}")
        try:
            return parse(raw.decode("utf-8"), expected)
        except UnicodeDecodeError:
            return self._damaged(path, cell, "not UTF-8")
        except _Damaged as exc:
            return self._damaged(path, cell, str(exc))

    def _damaged(self, path: Path, cell: str | None, why: str) -> None:
        """Say, in one line, an entry that does not verify (its callers return this None: a miss)."""
        self._warn(f"cache entry {path} does not verify ({why}); {cell or 'its cell'} is computed again")

    def lookup(self, key: str, cell: str | None = None) -> str | None:
        """The entry of the manifest's first variant whose reads all still hold, or None."""
        if not self.enabled or self.refresh:
            return None
        manifest = self._read(key, "manifest", cell, _parse_json_entry)
        if manifest is None:
            return None
        try:
            variants = [(v["entry"], v["reads"]) for v in manifest["variants"]]
            for entry, reads in variants:
                if not isinstance(entry, str):
                    raise TypeError(entry)
                why, retouched = self._now.verify(reads)
                if why is None:
                    if retouched and cell is not None:
                        self._retouch(key, cell, manifest, entry)
                    return entry
        except (KeyError, TypeError, ValueError, AttributeError, IndexError):
            return self._damaged(self._path(key, "manifest"), cell, "not a manifest (JSON of another shape)")
        return None

    def _retouch(self, key: str, cell: str, manifest: dict, entry: str) -> None:
        """The files held by their hashes (a fresh checkout): store their mtimes now, so the next run only stats."""
        for variant in manifest["variants"]:
            if variant["entry"] == entry:
                for path, state in variant["reads"]["files"].items():
                    info = self._now.stat(path)
                    if state is not None and info is not None:
                        state[:2] = [info.st_size, info.st_mtime_ns]
        self._write(self._path(key, "manifest"), _json_entry({"kind": "manifest", "key": key, "cell": cell},
                                                             manifest))

    def get_lowering(self, key: str, cell: str | None = None) -> tuple[str, dict] | None:
        """The HLO text and its lowering record (``Lowering.meta()`` plus ``cell``, ``seconds``) of an entry key,
        or of a primary key's verified variant."""
        if not self.enabled or self.refresh:
            return None
        if self._path(key, "manifest").exists():
            key = self.lookup(key, cell) or ""
            if not key:
                return None
        meta = self._read(key, "lowering", cell, _parse_json_entry)
        if not isinstance(meta, dict):
            return None if meta is None else self._damaged(self._path(key, "lowering"), cell, "not a record")
        text = self._read(key, "hlo", cell, _parse_text_entry)
        if text is None:
            return None
        if meta.get("hlo_sha256") != _sha256(text):
            return self._damaged(self._path(key, "hlo"), cell, "not the text its lowering record names")
        try:
            Lowering.from_cache(text, meta)
        except (KeyError, TypeError, ValueError, AttributeError):
            return self._damaged(self._path(key, "lowering"), cell, "not a lowering record")
        return text, meta

    def hlo_text(self, key: str) -> str | None:
        hit = self.get_lowering(key)
        return hit[0] if hit else None

    def get_result(self, entry: str, cell: str) -> CellResult | None:
        """The analysed result of ``entry`` with its canonical text, both verified, or None."""
        if not self.enabled or self.refresh:
            return None
        record = self._read(entry, "result", cell, _parse_json_entry)
        if record is None:
            return None
        try:
            result = CellResult.from_record(record, cached=True)
            if result.cell.id != cell or result.key != entry or not result.ok:
                raise ValueError(result.cell.id)
        except (KeyError, TypeError, ValueError, AttributeError):
            return self._damaged(self._path(entry, "result"), cell, "not a result of this cell")
        normalized = self._read(entry, "normalized", cell, _parse_text_entry)
        return replace(result, normalized=normalized) if normalized is not None else None

    def normalized_text(self, entry: str, cell: str | None = None) -> str | None:
        if not self.enabled:
            return None
        return self._read(entry, "normalized", cell, _parse_text_entry)

    # -- writing -------------------------------------------------------------------------------------------------

    def _write(self, path: Path, data: str) -> None:
        try:
            write_atomic(path, data)
        except OSError as exc:
            if not self._write_failed:  # once: a full disk says so once, and the results stay right
                self._warn(f"cache entry {path} cannot be written ({exc.strerror or exc}); not caching it")
            self._write_failed = True

    def put(self, key: str, result: CellResult, lowering: Lowering, reads: dict) -> CellResult:
        """Store a cell just lowered: its entry (text, lowering record, result, canonical text), then the manifest
        variant naming it. Returns the result keyed by its entry (``key``)."""
        entry = _digest({"primary": key, "reads": _identity(reads)})
        result = replace(result, key=entry)
        if not self.enabled:
            return result
        cell = result.cell.id
        meta = {"cell": cell, "seconds": result.lower_seconds, **lowering.meta(), "hlo_sha256": _sha256(lowering.text)}
        self._write(self._path(entry, "hlo"), _text_entry({"kind": "hlo", "key": entry, "cell": cell}, lowering.text))
        self._write(self._path(entry, "lowering"), _json_entry({"kind": "lowering", "key": entry, "cell": cell}, meta))
        self.put_result(entry, result)
        self._add_variant(key, cell, entry, reads)
        return result

    def put_result(self, entry: str, result: CellResult) -> None:
        """The analysed result and its canonical text (written first: a result always has its text)."""
        if not self.enabled:
            return
        cell, header = result.cell.id, {"key": entry, "analysis": self._analysis}
        if result.normalized is not None:
            self._write(self._path(entry, "normalized"),
                        _text_entry({**header, "kind": "normalized", "cell": cell}, result.normalized))
        self._write(self._path(entry, "result"),
                    _json_entry({**header, "kind": "result", "cell": cell}, result.to_record()))

    def _add_variant(self, key: str, cell: str, entry: str, reads: dict) -> None:
        path = self._path(key, "manifest")
        expected = {"kind": "manifest", "key": key, "cell": cell}
        variants = []
        with contextlib.suppress(OSError, UnicodeDecodeError, _Damaged, KeyError, TypeError):
            variants = [v for v in _parse_json_entry(path.read_text(encoding="utf-8"), expected)["variants"]
                        if v["entry"] != entry]
        manifest = {"variants": [{"entry": entry, "reads": reads}, *variants][:_VARIANTS_KEPT]}
        self._write(path, _json_entry(expected, manifest))


def entry_files(folder: Path) -> dict[str, dict[str, Path]]:
    """cell id -> {kind: path} of every entry under a cache folder, read from their headers (tests, debugging)."""
    found: dict[str, dict[str, Path]] = {}
    for path in sorted(Path(folder).rglob("*")):
        if not path.is_file() or not stat.S_ISREG(path.stat().st_mode):
            continue
        with path.open("rb") as handle:
            head = handle.read(4096).decode("utf-8", "replace")
        header = None
        if head.startswith(_HEADER_TAG + " "):
            with contextlib.suppress(ValueError):
                header = json.loads(head[len(_HEADER_TAG) + 1:].partition("\n")[0])
        elif head.startswith("{"):
            with contextlib.suppress(ValueError, TypeError, KeyError):
                header = json.loads(path.read_text())[_HEADER_TAG]
        if isinstance(header, dict) and header.get("cell"):
            found.setdefault(header["cell"], {})[header["kind"]] = path
    return found
