"""What a lowering read, recorded in the process that lowered it (``hlo_audit.cache``'s doc): the environment
variables it read (while it runs), the modules it used and the files it opened (``cache.used``), and what this
machine holds now to check a recording against (``Now``), the project's files relative to the project
(``portable``)."""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import functools
import hashlib
import os
import re
import stat as stat_module
import sys
import sysconfig
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from hlo_audit import host, layers
from hlo_audit.analysed import CodeReach
from hlo_audit.cache import code as code_keys
from hlo_audit.cache.key import FLAG_PREFIXES, HLO_AUDIT_ROOT, NOT_FLAGS
from hlo_audit.cache.used import (
    ABSENT_MODULES,
    ALL_NAMES,
    DISTRIBUTIONS,
    Used,
    close_window,
    files_opened,
    hears_code,
    hears_lines_of,
    modules_used,
    open_window,
    probed,
    unservable,
)
from hlo_audit.files import current_directory
from hlo_audit.patch import ranges


class _EnvironmentReads:
    """The variables one window read, with the value first read (None: absent), and those it wrote itself (a read
    after the window's own write is not an input). ``set_itself``: the variables it read unset and then set, with
    the value they hold after it (filled when the window closes)."""

    def __init__(self) -> None:
        self.read: dict[str, str | None] = {}
        self.written: set[str] = set()
        self.set_itself: dict[str, str] = {}
        self.used: Used | None = None  # the modules and files the window used (``cache.used``)


_ENVIRON = type(os.environ)
_ORIGINAL = {name: getattr(_ENVIRON, name) for name in ("__getitem__", "__setitem__", "__delitem__", "copy")}
_recorders: list[_EnvironmentReads] = []
_recorders_lock = threading.Lock()
_bulk = threading.local()
# Reads made while building targets in this process (imports: jax's config, a user's module-level os.environ.get):
# the values a module keeps from its import hold for every cell lowered after it.
_PROCESS_READS = _EnvironmentReads()
# Files opened while building targets in this process (a config a user's module reads at import): every cell's; so
# are the paths it probed and why it cannot be keyed.
_PROCESS_OPENED: set[str] = set()
_PROCESS_PROBED: set[str] = set()
_PROCESS_CODE: set = set()  # code objects run while building targets (a module's import, what it called)
_PROCESS_CODE_BY_FILE: dict[str, list] = {}  # the same by file, grouped once (``warm``) and not again in each cell
_PROCESS_LINES: dict[str, set[int]] = {}  # the lines they ran, of the files whose lines are heard
_PROCESS_UNSERVABLE: list[str] = []


def _note(environ, key, value) -> None:
    if environ is os.environb and isinstance(key, bytes):  # the same variables, as bytes: the same record
        key, value = os.fsdecode(key), None if value is None else os.fsdecode(value)
    elif environ is not os.environ:
        return
    if not isinstance(key, str) or getattr(_bulk, "depth", 0):
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
    if self is os.environ or self is os.environb:
        for reads in _recorders:
            reads.written.add(os.fsdecode(key) if isinstance(key, bytes) else key)
    _ORIGINAL["__setitem__"](self, key, value)


def _delitem(self, key):
    if self is os.environ or self is os.environb:
        for reads in _recorders:
            reads.written.add(os.fsdecode(key) if isinstance(key, bytes) else key)
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
    used = open_window(lowering=not process_wide)
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
                    if reads.read[name] is None and name in os.environ:  # found unset, set by the import itself
                        reads.set_itself[name] = os.environ[name]
                    else:
                        reads.read[name] = os.environ.get(name)
            else:
                reads.set_itself = {name: os.environ[name] for name in sorted(reads.written & reads.read.keys())
                                    if reads.read[name] is None and name in os.environ}
            _recorders.remove(reads)
            if not _recorders:
                for name, function in _ORIGINAL.items():
                    setattr(_ENVIRON, name, function)
        close_window(used)
        if process_wide:
            _PROCESS_OPENED.update(files_opened(used))
            _PROCESS_PROBED.update(probed(used))
            _PROCESS_CODE.update(used.code)
            _PROCESS_CODE_BY_FILE.clear()  # grouped again when next needed
            for path, lines in used.lines.items():
                _PROCESS_LINES.setdefault(path, set()).update(lines)
            _PROCESS_UNSERVABLE.extend(unservable(used))
        else:
            reads.used = used


@contextlib.contextmanager
def importing_target() -> Iterator[None]:
    """Around importing a target's code (plan time, and each worker's first cell): what the import reads from the
    environment keys every cell this process lowers after it, and what it prints goes to stderr."""
    with recording_environment(process_wide=True), host.prints_to_stderr():
        yield


# Variables the lowering process's own start-up set (jax's import sets TPU_LIBRARY_PATH where it finds libtpu): what
# the process is, the same for every cell it lowers, not the user's environment (libtpu's version keys TPU cells).
SET_AT_STARTUP: set[str] = set()


def _variables(reads: _EnvironmentReads) -> dict[str, str | None]:
    # The prefixes are the primary key's; JAX_PLATFORMS is not an input of what a cell lowers to (NOT_FLAGS).
    return {name: value for name, value in sorted(reads.read.items())
            if not name.startswith(FLAG_PREFIXES) and name not in NOT_FLAGS and name not in reads.set_itself
            and name not in SET_AT_STARTUP}


@dataclass(frozen=True)
class Reads:
    """What one lowering read: every file of the modules it used and of the files it opened, by content
    (``[size, mtime_ns, sha256, ctime_ns, inode]``, None: gone) or by the distribution that installed it, and the
    environment variables it (and this process's imports) read.
    A manifest variant keeps its record (``to_record``)."""

    files: Mapping[str, list | None]
    distributions: Mapping[str, str]
    environment: Mapping[str, str | None]
    set_by_lowering: Mapping[str, str]  # read unset, then set by the lowering itself: holds unset or at this value
    imported_environment: Mapping[str, str | None]
    # Paths asked about and not opened: "dir", "absent" or "other" (a regular file asked about is in ``files``).
    probed: Mapping[str, str] = dataclasses.field(default_factory=dict)
    listed: Mapping[str, str | None] = dataclasses.field(default_factory=dict)  # folder -> sha256 of its names
    absent_modules: Mapping[str, list[str]] = dataclasses.field(default_factory=dict)  # name -> where it looked
    # A module's file by what of it ran (``cache.code``): {"each": {code object: its digest}, "digest": theirs}; a
    # file whose content changed still holds if this digest does; "each" names what changed (``code.first_change``).
    code: Mapping[str, dict] = dataclasses.field(default_factory=dict)
    unservable: tuple[str, ...] = ()  # why this lowering's inputs cannot be keyed: never served
    # A module's file -> the runs of its lines that executed ([first, last] each; ``cache.used.hears_lines_of``'s
    # files): what of a pull request's changed lines the cell reached (``analysed.CodeReach``). Not an input: two
    # lowerings that read the same inputs ran the same lines. Empty where lines are not heard (Python 3.11).
    lines: Mapping[str, list[list[int]]] = dataclasses.field(default_factory=dict)

    def to_record(self) -> dict:
        return {"files": dict(self.files), "distributions": dict(self.distributions),
                "environment": dict(self.environment), "set_by_lowering": dict(self.set_by_lowering),
                "imported_environment": dict(self.imported_environment), "probed": dict(self.probed),
                "listed": dict(self.listed), "absent_modules": {k: list(v) for k, v in self.absent_modules.items()},
                "code": dict(self.code), "unservable": list(self.unservable), "lines": dict(self.lines)}

    @classmethod
    def from_record(cls, record: object) -> "Reads":
        """What a lowering process sent (JSON), checked for shape: ValueError where it is not a record of reads."""
        if not isinstance(record, dict):
            raise ValueError("not a record of reads")
        maps = ("files", "distributions", "environment", "set_by_lowering", "imported_environment", "probed",
                "listed", "absent_modules", "code", "lines")
        if not all(isinstance(record.get(name, {}), dict) for name in maps) or not isinstance(
                record.get("unservable", []), list):
            raise ValueError("a record of reads of another shape")
        return cls(**{name: record.get(name, {}) for name in maps},
                   unservable=tuple(str(reason) for reason in record.get("unservable", [])))


def reads_after(window: _EnvironmentReads, by_content: frozenset[str] = frozenset()) -> Reads:
    """What a lowering that just ran in this process read: the modules it used (``used.modules_used``: those loaded
    before any cell's lowering, and those it asked for) and the files it opened, with those this process opened
    while building its targets; the variables ``window`` read (``environment``) and those read while this process
    built its targets (``imported_environment``: the values its imports saw, which later writes, libtpu's
    TPU_LIBRARY_PATH say, do not change for the module that kept them). ``by_content``: distributions whose files
    are keyed by content, not version (the code under test: MaxText installed from a wheel and edited in place).
    Picklable, so a worker can hand it to the parent."""
    files, distributions = {}, {}
    search_path = tuple(sys.path)
    kinds = _kinds(search_path)  # what a path is does not change while the process runs: classified once
    used = window.used
    opened = (files_opened(used) if used else set()) | _PROCESS_OPENED
    paths = _module_files(modules_used(used) if used else set(sys.modules)) | opened
    for path in sorted(paths):
        if path not in kinds:
            kinds[path] = _file_kind(path, _installed_files(search_path))
        kind = kinds[path]
        if kind == "content" or (isinstance(kind, tuple) and kind[0] in by_content and not _metadata(path)):
            if (state := _file_state(path)) is not None or path.endswith(".py"):
                files[path] = state  # a module's file gone since it loaded is recorded gone; an opened one is not
        elif kind is not None:
            distributions[kind[0]] = kind[1]
    set_itself = {name: value for name, value in {**_PROCESS_READS.set_itself, **window.set_itself}.items()
                  if not name.startswith(FLAG_PREFIXES) and name not in NOT_FLAGS and name not in SET_AT_STARTUP}
    probes, listed = _probes(used, kinds, search_path, by_content, files)
    # What ran is known only where sys.monitoring is (Python 3.12+) and its tool id was free: else files by content.
    ran_code = _code_keys([path for path in files if path.endswith(".py") and path not in opened and files[path]],
                          used.code if used else set()) if hears_code() else {}
    reasons = [*_PROCESS_UNSERVABLE, *(unservable(used) if used else ())]
    heard = used.lines if used else {}
    ran_lines = {path: [list(run) for run in ranges(_PROCESS_LINES.get(path, set()) | heard.get(path, set()))]
                 for path in files if path.endswith(".py") and hears_lines_of(path)} if hears_code() else {}
    return Reads(files=files, distributions=dict(sorted(distributions.items())), environment=_variables(window),
                 set_by_lowering=set_itself, imported_environment=_variables(_PROCESS_READS), probed=probes,
                 listed=listed, absent_modules={name: list(path) for name, path in sorted(ABSENT_MODULES.items())},
                 code=ran_code, unservable=tuple(dict.fromkeys(reasons)),
                 lines={path: runs for path, runs in ran_lines.items() if runs})


def _code_keys(paths: list[str], lowered: set) -> dict[str, dict]:
    """For each module file (keyed by content, not opened as a file): the code objects of it that ran (while the
    target was built, or in this lowering: ``lowered``, those with their lines), each one's digest and theirs
    together (``cache.code``)."""
    wanted = set(paths)
    by_file: dict[str, list] = {}
    for code in lowered:
        if code.co_filename in wanted:
            by_file.setdefault(code.co_filename, []).append(code)
    for path, codes in _process_code_by_file().items():
        if path in wanted:
            by_file.setdefault(path, []).extend(codes)
    keys = {}
    for path in paths:
        tree = code_keys.compiled(path)
        if tree is None:
            continue
        names, with_lines = set(), set()
        starts = code_keys.by_start(tree)
        for code in by_file.get(path, ()):
            name = starts.get((code.co_qualname, code.co_firstlineno))
            if name is None:
                break  # the file changed since it was loaded: keyed by its content alone
            names.add(name)
            if code in lowered:
                with_lines.add(name)
        else:
            if (each := code_keys.each(tree, names, with_lines)) is not None:
                keys[path] = {"each": each, "digest": code_keys.combined(each)}
    return keys


def _process_code_by_file() -> dict[str, list]:
    if not _PROCESS_CODE_BY_FILE and _PROCESS_CODE:
        for code in _PROCESS_CODE:
            _PROCESS_CODE_BY_FILE.setdefault(code.co_filename, []).append(code)
    return _PROCESS_CODE_BY_FILE


def _probes(used: Used | None, kinds: dict, search_path: tuple[str, ...], by_content: frozenset[str],
            files: dict) -> tuple[dict[str, str], dict[str, str | None]]:
    """The paths a lowering asked about (and this process's imports did) that are not already keyed by their content
    or their distribution: a regular file asked about is keyed by content (its size or time may be what was read),
    anything else by what it is ("dir", "absent", "other"); a folder listed by the names in it."""
    probes: dict[str, str] = {}
    asked = {path for path in set(_PROCESS_PROBED) | (probed(used) if used else set()) if not _keyed_elsewhere(path)}
    listed = {path: _names_digest(path, kind) for path, kind in sorted(used.listed.items()) if path in asked} \
        if used else {}
    for path in sorted(asked):
        if path in files or path in listed:
            continue
        if path not in kinds:
            kinds[path] = _file_kind(path, _installed_files(search_path))
        kind = kinds[path]
        if kind is None or (isinstance(kind, tuple) and kind[0] not in by_content):
            continue  # hlo-audit's own, the Python's, an installed distribution's: keyed by their versions
        what = _what_is(path)
        if what == "file":
            files[path] = _file_state(path)
        else:
            probes[path] = what
    return probes, listed


def _what_is(path: str) -> str:
    try:
        info = os.stat(path)
    except OSError:
        return "absent"
    return "file" if stat_module.S_ISREG(info.st_mode) else "dir" if stat_module.S_ISDIR(info.st_mode) else "other"


def _keyed_elsewhere(path: str) -> bool:
    """A path the Python's version or an installed distribution's keys (the standard library, site-packages): what
    is asked about there changes only with what is installed, which the versions say."""
    return path.startswith(_stdlib_roots()) or any(f"{os.sep}{d}" in path for d in _SITE_FOLDERS)


def _names_digest(folder: str, kind: str = ALL_NAMES) -> str | None:
    """``kind:sha256`` of the names in a folder that were read (every name; the distributions' metadata folders)."""
    try:
        names = sorted(os.listdir(folder))
    except OSError:
        return None
    if kind == DISTRIBUTIONS:
        names = [name for name in names if name.endswith((".dist-info", ".egg-info", ".egg-link"))]
    return f"{kind}:" + hashlib.sha256("\0".join(names).encode()).hexdigest()


def imported_files(modules: set[str]) -> set[str]:
    """The files of ``modules`` and those this process's imports opened (``importing_target``): what a base that
    keeps an imported stack must find unchanged before each job (``worker``)."""
    return _module_files(modules) | _PROCESS_OPENED


def imports_hold_in(environ: Mapping[str, str]) -> bool:
    """Whether every variable this process's imports read holds in ``environ`` (one they found unset and set
    themselves: unset there, or at that value), as ``Now.verify`` holds a recording."""
    if any(name not in SET_AT_STARTUP and environ.get(name) != value for name, value in _PROCESS_READS.read.items()):
        return False
    return all(environ.get(name) in (None, value) for name, value in _PROCESS_READS.set_itself.items())


def warm(by_content: frozenset[str] = frozenset()) -> None:
    """Build what keying a lowering's reads needs once, in the process cells fork from: the index of installed
    files (~0.2 s), and the code of every module loaded so far that is keyed by what of it ran (the project's, an
    editable install's, ``by_content``'s distributions': MaxText's 138 files, 0.34 s), which each cell's process
    would otherwise build again."""
    search_path = tuple(sys.path)
    kinds = _kinds(search_path)
    installed = _installed_files(search_path)
    _process_code_by_file()
    for path in _module_files(set(sys.modules)):  # the modules loaded so far: every cell's, classified once
        if path not in kinds:
            kinds[path] = _file_kind(path, installed)
        kind = kinds[path]
        if hears_code() and path.endswith(".py") and (
                kind == "content" or (isinstance(kind, tuple) and kind[0] in by_content)) and (
                tree := code_keys.compiled(path)) is not None:
            code_keys.index(tree).warm()


_MODULE_FILE: dict[str, tuple[object, str | None]] = {}  # module name -> (the module, its file): each looked at once


def _module_files(names: set[str]) -> set[str]:
    files = set()
    for name in names:
        module = sys.modules.get(name)
        kept = _MODULE_FILE.get(name)
        if kept is None or kept[0] is not module:
            try:
                file = vars(module).get("__file__")  # vars(): a lazy module's __getattr__ would import
            except TypeError:
                file = None
            # As imported (not realpath: 10 lstat a file, 0.3 s for MaxText's).
            kept = _MODULE_FILE[name] = (module, os.path.abspath(file) if isinstance(file, str) and file else None)
        if kept[1] is not None:
            files.add(kept[1])
    return files


@functools.cache
def _kinds(search_path: tuple[str, ...]) -> dict[str, str | tuple[str, str] | None]:
    return {}


def _metadata(path: str) -> bool:
    """A file of a distribution's metadata folder (its README and pins: ``pip install -e`` rewrites METADATA at every
    commit): keyed by the distribution's version, even for the code under test, whose modules count by content."""
    return _dist_info_name(os.path.basename(os.path.dirname(path))) is not None


def _file_kind(path: str, installed: dict[str, tuple[str, str]]) -> str | tuple[str, str] | None:
    """``content`` (hash it), a distribution ``(name, version)`` that installed it, or None (not an input here)."""
    own = next((root for root in _own_roots() if path.startswith(root)), None)
    if own is not None:
        # The lowering side is the primary key's; the HLO core only analyses; the layers above the targets are not
        # imported by a lowering (tests/test_layers.py). The examples are targets: a user's code like any other.
        module = layers.module_name(path[len(own):].replace(os.sep, "/")) if path.endswith(".py") else ""
        return "content" if module == "examples" or module.startswith("examples.") else None
    if _metadata(path):
        return _dist_info_name(os.path.basename(os.path.dirname(path)))
    if path in installed:
        return installed[path]
    if path.startswith(_stdlib_roots()) and not any(f"{os.sep}{d}{os.sep}" in path for d in _SITE_FOLDERS):
        return None  # the Python's own: its version is in the primary key
    return "content"


_SITE_FOLDERS = ("site-packages", "dist-packages")


@functools.cache
def _own_roots() -> tuple[str, ...]:
    """hlo_audit's folder as imported and as resolved."""
    return tuple({os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep, str(HLO_AUDIT_ROOT) + os.sep})


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


_HASHED: dict[tuple, str] = {}  # (path, *stamp) -> sha256, for this process


def stamp(info: os.stat_result) -> list[int]:
    """What a ``stat`` must find unchanged for a file to be taken as unchanged without reading it: size, mtime,
    ctime and inode. Size and mtime alone are not enough: ``cp -p``, ``rsync -a``, ``tar -x``, ``touch -r`` and CI
    cache-restore steps put a file back with its old mtime, and an edit to the same size can too (``os.utime``).
    Every write, rename or restore sets ctime to now and nothing sets it back (short of the clock), and a file
    replaced by another has another inode. Measured against hashing every file at every lookup
    (``scripts/bench_cache_digest.py``: the 3,328 module files a MaxText lowering loads, 250 MB: 16 ms of stats
    against 252 ms of hashing, warm), this is 10-16x cheaper, and a file whose stamp changed is still hashed."""
    return [info.st_size, info.st_mtime_ns, info.st_ctime_ns, info.st_ino]


def _recorded_stamp(state: list) -> list:
    """The stamp a manifest recorded: ``state`` is [size, mtime_ns, sha256, ctime_ns, inode]."""
    return [*state[:2], *state[3:5]]


def _file_state(path: str) -> list | None:
    """[size, mtime_ns, sha256, ctime_ns, inode] of a file, None when it is gone (a module loaded from a
    since-deleted file)."""
    try:
        info = os.stat(path)
    except OSError:
        return None
    stamped = stamp(info)
    memo = (path, *stamped)
    if memo not in _HASHED:
        try:
            _HASHED[memo] = hashlib.sha256(Path(path).read_bytes()).hexdigest()
        except OSError:
            return None
    return [*stamped[:2], _HASHED[memo], *stamped[2:]]


def project_roots(root: Path | str | None) -> tuple[str, ...]:
    """The project's folder as given and as resolved, each ending in a separator (none: no project)."""
    if root is None:
        return ()
    return tuple(dict.fromkeys(os.path.join(p, "") for p in (os.path.abspath(root), os.path.realpath(root))))


def relative_path(path: str, roots: tuple[str, ...]) -> str:
    """``path`` relative to the project (``project_roots``) where it is inside it, else as it is."""
    under = next((root for root in roots if path.startswith(root) or path + os.sep == root), None)
    return (path[len(under):] or ".") if under and path.startswith(under) else "." if under else path


def portable(reads: dict, roots: tuple[str, ...]) -> dict:
    """A manifest variant's reads with the project's files named relative to the project: a copy of it, a second
    worktree, a workspace restored at another path checks its own files, and two projects sharing a cache_dir each
    theirs (issue 37). Files outside it (another folder on PYTHONPATH, an editable install elsewhere) keep their
    absolute path: they are the same files wherever the project is. So do paths probed, folders listed and where an
    absent module was looked for."""

    def relative(path: str) -> str:
        return relative_path(path, roots)

    moved = {name: {relative(path): value for path, value in reads.get(name, {}).items()}
             for name in ("files", "probed", "code", "lines")}
    # A folder listed for the distributions in it (importlib.metadata, over sys.path: the working folder too) is
    # about what is installed where the lowering ran, not the project's content: named as it is.
    moved["listed"] = {path if isinstance(value, str) and value.startswith(DISTRIBUTIONS) else relative(path): value
                       for path, value in reads.get("listed", {}).items()}
    absent = {name: [relative(path) for path in where] for name, where in reads.get("absent_modules", {}).items()}
    return {**reads, **moved, "absent_modules": absent}


def code_reach(reads: Reads, named: Mapping[str, set[int]], roots: tuple[str, ...]) -> CodeReach:
    """What of the code under test a lowering reached (``analysed.CodeReach``), from what it read (the lowering
    process's record, or a manifest variant's, whose project files are already relative) and the lines its program
    names (``hlo.locations.named_lines``), the project's files relative to it. Files keyed by content are the code a
    pull request can change; an installed distribution's are keyed by version and named nowhere here."""
    files = tuple(sorted({relative_path(path, roots) for path in reads.files}))
    ran = {relative_path(path, roots): tuple((int(first), int(last)) for first, last in runs)
           for path, runs in reads.lines.items()}
    in_files = set(files)
    program = {relative_path(path, roots): ranges(lines) for path, lines in named.items()}
    return CodeReach(files, dict(sorted(ran.items())),
                     dict(sorted((path, runs) for path, runs in program.items() if path in in_files)),
                     lines_known=bool(reads.lines) or not any(path.endswith(".py") for path in files))


def identity(reads: dict) -> dict:
    """What a manifest's variant stands for, without the stamps (a fresh checkout of the same files is the same)."""
    return {"files": {path: state[2] if state else None for path, state in reads["files"].items()},
            "distributions": reads["distributions"], "environment": reads["environment"],
            "set_by_lowering": reads.get("set_by_lowering", {}), "imported_environment": reads["imported_environment"],
            **{name: reads.get(name, {}) for name in ("probed", "listed", "absent_modules")},
            "unservable": reads.get("unservable", [])}


class Now:
    """What this machine holds now, each thing looked at once per cache (a run's lookups share it)."""

    def __init__(self, root: Path | str | None = None) -> None:
        # The project relative paths are under; a caller that names none (a library's, a test's lookup) runs from it.
        here = current_directory()
        self.root = os.path.abspath(root) if root is not None else str(here) if here is not None else None
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

    def shown(self, why: str) -> str:
        """A reason as a user reads it: the project's files relative to the project."""
        root = os.path.join(self.root, "") if self.root is not None else None
        return why.replace(root, "") if root else why

    def locate(self, path: str) -> str | None:
        """A recorded path as a file here: a relative one is the project's (None: this run has no project)."""
        if os.path.isabs(path):
            return path
        return os.path.join(self.root, path) if self.root is not None else None

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

    def verify(self, reads: dict) -> tuple[str | None, bool, dict[str, list]]:
        """(why the variant no longer holds, or None; whether some file held by its hash only, stamp changed; the
        files whose code the lowering ran only moved: ``code.moves`` by recorded file, ``cache.moved``)."""
        for name, value in reads["environment"].items():
            if os.environ.get(name) != value:
                return f"${name} changed", False, {}
        for name, value in reads.get("set_by_lowering", {}).items():
            if os.environ.get(name) not in (None, value):  # unset, the lowering sets it so again
                return f"${name} changed", False, {}
        imported = _PROCESS_READS.read  # what this process's own imports saw, where they read it
        for name, value in reads["imported_environment"].items():
            if (imported[name] if name in imported else os.environ.get(name)) != value:
                return f"${name} changed", False, {}
        for name, version in reads["distributions"].items():
            if self.version(name) != version:
                return f"{name} {version} -> {self.version(name)}", False, {}
        if reads.get("unservable"):
            return f"unservable: {reads['unservable'][0]}", False, {}
        if (why := self._probes_changed(reads)) is not None:
            return why, False, {}
        retouched, moved = False, {}
        for recorded, state in reads["files"].items():
            path = self.locate(recorded)
            if path is None:
                return f"{recorded} is a project's file, and this run names no project", False, {}
            info = self.stat(path)
            if state is None or info is None:
                if (state is None) != (info is None):
                    return f"{path} {'appeared' if info else 'is gone'}", False, {}
                continue
            if stamp(info) == _recorded_stamp(state):
                continue
            ran = reads.get("code", {}).get(recorded)
            if self.sha256(path) != state[2] and not self.same_code(path, ran):
                if (spans := self.code_moved(path, ran)) is None:
                    return self.code_changed(path, ran), False, {}
                moved[recorded] = spans
            retouched = True
        return None, retouched, moved

    def same_code(self, path: str, recorded: dict | None) -> bool:
        """Whether what a lowering ran of a module's file is unchanged though its text changed (``cache.code``)."""
        if not isinstance(recorded, dict):
            return False
        try:
            now = code_keys.digest(code_keys.compiled(path), *code_keys.ran_of(recorded["each"]))
        except (KeyError, TypeError, AttributeError):
            return False
        return now is not None and now == recorded.get("digest")

    @staticmethod
    def code_moved(path: str, recorded: dict | None) -> list | None:
        """How the code a lowering ran of a module's file moved, where nothing else of it changed (``code.moves``);
        None where something did, or the record does not say code object by code object."""
        if (each := _each_of(recorded)) is None:
            return None
        try:
            return code_keys.moves(code_keys.compiled(path), each)
        except ValueError:
            return None

    @staticmethod
    def code_changed(path: str, recorded: dict | None) -> str:
        """Why a module's file no longer holds, said as what of the code a lowering ran changed first
        (``code.first_change``: ``moe.py RoutedMoE.get_topk changed``), else the file."""
        if (each := _each_of(recorded)) is None:
            return f"{path} changed"
        return f"{path} {code_keys.first_change(code_keys.compiled(path), each)}"

    def _probes_changed(self, reads: dict) -> str | None:
        """Why a path asked about, a folder listed or a module not found is no longer what the lowering saw."""
        for recorded, what in reads.get("probed", {}).items():
            path = self.locate(recorded)
            if path is None or _what_is(path) != what:
                return f"{path or recorded} {'appeared' if what == 'absent' else 'changed'}"
        for recorded, digest in reads.get("listed", {}).items():
            path = self.locate(recorded)
            kind = digest.partition(":")[0] if isinstance(digest, str) else ALL_NAMES
            if path is None or _names_digest(path, kind) != digest:
                return f"the names in {path or recorded} changed"
        for name, where in reads.get("absent_modules", {}).items():
            folders = [self.locate(p) for p in where]
            if None in folders or _findable(name, folders):
                return f"module {name} appeared"
        return None


def _each_of(recorded: object) -> dict[str, str] | None:
    """A record of what ran of a file (``Reads.code``'s), code object by code object; None where it is not one."""
    each = recorded.get("each") if isinstance(recorded, dict) else None
    return each if isinstance(each, dict) and all(isinstance(v, str) for v in each.values()) else None


def _findable(name: str, folders: list) -> bool:
    """Whether an import of ``name`` would now find it where it looked, found without importing anything."""
    from importlib.machinery import PathFinder  # noqa: PLC0415

    try:
        return PathFinder.find_spec(name.rpartition(".")[2] if "." in name else name, folders) is not None
    except (ImportError, ValueError, OSError):
        return True
