"""What one lowering used besides the environment: the modules its import statements asked for (newly loaded or
already loaded by an earlier cell of the same process) and the files it opened, so that a cell's manifest names what
that cell read and not everything the process had loaded by then (``hlo_audit.cache``'s doc).

Modules loaded before any lowering (building the target, jax, hlo-audit itself) or between lowerings are every
cell's. A module an earlier cell's lowering loaded is this cell's if this cell asked for it (an ``import`` statement,
``builtins.__import__`` wrapped while a lowering runs, or ``importlib.import_module``) or ran any of its code (the
``PY_START`` event of ``sys.monitoring``, each code object once per lowering: a memoized ``load_maxtext()`` imports
nothing in the second cell, but the second cell runs MaxText's code), and so is every module such a module's own
loading asked for (``_LOAD_DEPS``, followed to the end: the constants it took at import). A module loaded in a
lowering some other way (a reference to ``import_module`` taken before the wrapper, C) keeps everything its lowering
loaded and asked for as its dependencies: coarser, never less. Where no ``sys.monitoring`` tool id is free, every
module loaded counts for every cell. Files come from the ``open`` audit event (``builtins.open``,
``io.open_code``, ``os.open``): those opened for reading, less those the lowering wrote or created itself.

The lines a lowering ran are heard too, of the files a pull request can change (``hears_lines_of``: not an installed
distribution's, not Python's own library): once a code object of such a file starts, its ``LINE`` events, each
location once per window. They key nothing (what ran keys the cell, by code object); they say which changed lines a
cell reached (``check --changes``: ``analysed.CodeReach``).
"""

from __future__ import annotations

import builtins
import importlib
import importlib.util
import os
import sys
import threading
import time

_ORIGINAL_IMPORT = builtins.__import__
_ORIGINAL_IMPORT_MODULE = importlib.import_module
# Not inputs: the kernel's views (a /proc file reads differently every time) and Python's bytecode (the source is).
_NOT_FILES = ("/proc/", "/sys/", "/dev/")
_OWN = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_OWN_EXAMPLES = _OWN + "examples" + os.sep
_STDLIB = os.path.dirname(os.__file__) + os.sep


class Used:
    """One window's record: files opened for reading and for writing, module names asked for, modules loaded, paths
    probed (a ``stat``: existence is a read, absence too), folders listed, and what makes it unservable."""

    def __init__(self, lowering: bool) -> None:
        self.lowering = lowering  # a cell's lowering (imports tracked), or building a target (files only)
        self.opened: set[str] = set()
        self.written: set[str] = set()  # files that existed, opened for writing: read too, they cannot be keyed
        self.created: set[str] = set()  # files and folders the window made (its outputs, read back or not)
        self.touched: set[str] = set()  # files whose times or mode the window set (their ctime says nothing)
        self.probed: set[str] = set()
        self.listed: dict[str, str] = {}  # folder -> which of its names were read (ALL_NAMES, DISTRIBUTIONS)
        self.unservable: list[str] = []
        self.imported: set[str] = set()
        self.ran: set[str] = set()  # files whose code ran (co_filename)
        self.code: set = set()  # the code objects that ran (``cache.code``: a file keyed by what of it ran)
        # file -> the lines of it that ran, for the files outside installed distributions and Python's own library
        # (``hears_lines_of``): which of a pull request's changed lines a cell reached (``check --changes``).
        self.lines: dict[str, set[int]] = {}
        self.before: frozenset[str] = frozenset()
        self.loaded: frozenset[str] = frozenset()
        self.started_ns = time.time_ns()


_windows: list[Used] = []
_lock = threading.Lock()
_hooked = False
_stack = threading.local()  # per thread: the name sets of the import calls that are loading something
# Modules first loaded inside some cell's lowering, and for each, the names its loading asked for and loaded.
_LOADED_IN_LOWERINGS: set[str] = set()
_LOAD_DEPS: dict[str, frozenset[str]] = {}


_MONITORING = getattr(sys, "monitoring", None)
_tool: int | None = None  # this module's sys.monitoring tool id, once taken; None: none free (every module counts)


def _started(code, offset) -> object:
    """PY_START: note the code in every open window, then stop hearing about this code until the next window begins
    (``restart_events``). Code of a file whose lines are wanted (``hears_lines_of``) is heard line by line from
    now on: its LINE events, each location once per window (coverage.py's way with ``sys.monitoring``)."""
    for window in list(_windows):
        window.code.add(code)
        if window.lowering:
            window.ran.add(code.co_filename)
    if hears_lines_of(code.co_filename):
        _MONITORING.set_local_events(_tool, code, _MONITORING.events.LINE)
    return _MONITORING.DISABLE


def _line(code, line: int) -> object:
    """LINE: note the line in every open window, then stop hearing about it until the next window begins."""
    for window in list(_windows):
        window.lines.setdefault(code.co_filename, set()).add(line)
    return _MONITORING.DISABLE


_LINES_WANTED: dict[str, bool] = {}


def hears_lines_of(filename: str) -> bool:
    """Whether the lines a lowering runs of ``filename`` are recorded: the code a pull request can change (the
    user's project, an editable install, a folder on PYTHONPATH), not an installed distribution's, Python's own
    library, hlo-audit's (its examples aside: they are targets) or code compiled from a string. Decided once per
    file."""
    wanted = _LINES_WANTED.get(filename)
    if wanted is None:
        installed = any(f"{os.sep}{folder}{os.sep}" in filename for folder in ("site-packages", "dist-packages"))
        own = filename.startswith(_OWN) and not filename.startswith(_OWN_EXAMPLES)
        wanted = _LINES_WANTED[filename] = not (filename.startswith("<") or installed or own
                                                or filename.startswith(_STDLIB))
    return wanted


def _take_tool() -> int | None:
    for tool in (4, 3):  # the ids sys.monitoring leaves unnamed (0-2 and 5: debugger, coverage, profiler, optimizer)
        try:
            _MONITORING.use_tool_id(tool, "hlo-audit cache")
        except ValueError:
            continue
        _MONITORING.register_callback(tool, _MONITORING.events.PY_START, _started)
        _MONITORING.register_callback(tool, _MONITORING.events.LINE, _line)
        return tool
    return None


def hears_code() -> bool:
    """Whether the code objects run are heard (``sys.monitoring``, Python 3.12+, with a tool id of its own)."""
    return _tool is not None


def _hear_code(on: bool) -> None:
    if _tool is None:
        return
    _MONITORING.set_events(_tool, _MONITORING.events.PY_START if on else 0)
    if on:
        _MONITORING.restart_events()


# Audit events (PEP 578) whose effect no record of files can key: the cell is lowered again every run.
_UNKEYABLE = {"subprocess.Popen": "runs a subprocess", "os.system": "runs a shell command",
              "os.exec": "execs a program", "os.posix_spawn": "spawns a process", "os.spawn": "spawns a process",
              "os.fork": "forks", "os.forkpty": "forks", "socket.connect": "opens a network connection",
              "socket.sendto": "sends on a socket"}
_TOUCHING = ("os.utime", "os.chmod", "os.chown", "os.truncate")
# Who reads a module's source to show a line of it (a warning, a traceback): what runs is the module's code.
_SOURCE_DISPLAY = (os.path.join("", "linecache.py"), os.path.join("", "tokenize.py"))
ALL_NAMES, DISTRIBUTIONS = "names", "distributions"
_METADATA_FILE = os.path.join("importlib", "metadata", "__init__.py")


def _path_of(path) -> str | None:
    if isinstance(path, int) or path is None:
        return None
    try:
        return os.path.abspath(os.fsdecode(path))
    except (TypeError, ValueError, OSError):
        return None


def _audit(event: str, args: tuple) -> None:
    # First, and cheapest: an event no branch below reads (jax's tracing raises ``builtins.id`` ~135,000 times a
    # MaxText lowering) returns at one set lookup.
    if event not in _HEARD or not _windows:
        return
    if event == "open":
        caller = sys._getframe(1).f_code.co_filename  # noqa: SLF001 -- who opened it (no public equivalent)
        if caller.startswith("<frozen importlib") or caller.endswith(_SOURCE_DISPLAY):
            return  # a module's source loaded (recorded as the module), or shown in a warning: not a file read
        _opened(*args[:3])
    elif event in _UNKEYABLE:
        if _started_by_hlo_audit():
            return  # hlo-audit's own child (stage optimized runs XLA in one): its inputs are the lowering's, keyed
        reason = f"{_UNKEYABLE[event]} at {_user_place()}"
        for window in list(_windows):
            window.unservable.append(reason)
    elif event in ("os.listdir", "os.scandir"):
        caller = sys._getframe(1).f_code.co_filename  # noqa: SLF001 -- who listed (no public equivalent)
        if caller.startswith("<frozen importlib"):
            return  # the import system's own listing: what it found is recorded as modules, present or absent
        if (path := _path_of(args[0] if args and args[0] is not None else ".")) is not None:
            # importlib.metadata lists a folder for the distributions in it (jax's plugin discovery): only those
            # names are what it read there.
            kind = DISTRIBUTIONS if caller.endswith(_METADATA_FILE) else ALL_NAMES
            for window in list(_windows):
                window.listed[path] = ALL_NAMES if window.listed.get(path) == ALL_NAMES else kind
    elif event == "os.mkdir" and (path := _path_of(args[0])) is not None:
        for window in list(_windows):
            window.created.add(path)
    elif event in ("os.rename", "os.replace") and (path := _path_of(args[1])) is not None:
        for window in list(_windows):
            window.created.add(path)  # renamed into place: the window's output
    elif event in _TOUCHING and args and (path := _path_of(args[0])) is not None:
        for window in list(_windows):
            window.touched.add(path)
    elif event == "ctypes.dlopen" and args and isinstance(args[0], str) and os.sep in args[0]:
        _opened(args[0], "r", 0)  # a library loaded by path is a file read; by name, the system's (not keyed)


# Every event ``_audit`` reads.
_HEARD = frozenset({"open", *_UNKEYABLE, "os.listdir", "os.scandir", "os.mkdir", "os.rename", "os.replace", *_TOUCHING,
                    "ctypes.dlopen"})


def _opened(path, mode, flags) -> None:
    path = _path_of(path)
    if path is None or (isinstance(flags, int) and flags & getattr(os, "O_TMPFILE", 0) == getattr(os, "O_TMPFILE", -1)):
        return  # O_TMPFILE: an unnamed file of the window's own in that folder (tempfile.TemporaryFile)
    writing = any(c in mode for c in "wax+") if isinstance(mode, str) else (flags or 0) & os.O_ACCMODE != os.O_RDONLY
    reading = "+" in mode or "r" in mode if isinstance(mode, str) else (flags or 0) & os.O_ACCMODE != os.O_WRONLY
    existed = _exists(path) if writing else True
    for window in list(_windows):
        if writing:
            (window.written if existed else window.created).add(path)
        if reading:
            window.opened.add(path)



def _started_by_hlo_audit() -> bool:
    """Whether the innermost caller outside Python's own library is hlo-audit's code (not its examples: targets)."""
    stdlib = os.path.dirname(os.__file__) + os.sep
    frame = sys._getframe(2)  # noqa: SLF001 -- the frames above the audit hook (no public equivalent)
    while frame is not None and (frame.f_code.co_filename.startswith((stdlib, "<"))):
        frame = frame.f_back
    name = frame.f_code.co_filename if frame is not None else ""
    return name.startswith(_OWN) and not name.startswith(_OWN_EXAMPLES)


def _user_place() -> str:
    """The innermost frame outside hlo-audit, jax and Python's own library: where the user's code did it."""
    skip = (os.path.dirname(os.path.dirname(os.path.abspath(__file__))), os.path.dirname(os.__file__))
    frame = sys._getframe(1)  # noqa: SLF001 -- the caller's frames (no public equivalent)
    while frame is not None:
        name = frame.f_code.co_filename
        if not name.startswith(skip) and not name.startswith("<") and "/jax/" not in name:
            return f"{os.path.basename(name)}:{frame.f_lineno}"
        frame = frame.f_back
    return "an unknown place"


# os.stat and its friends raise no audit event: wrapped while a window is open, so a file's existence (or absence)
# asked for is recorded. The import system's own stats (posix.stat, bound in importlib) are not these.
_STATS = {name: getattr(os, name) for name in ("stat", "lstat", "access")}


def _probing(name: str):
    original = _STATS[name]

    def probe(path, *args, **kwargs):
        if _windows and "dir_fd" not in kwargs and (found := _path_of(path)) is not None:
            for window in list(_windows):
                window.probed.add(found)
        return original(path, *args, **kwargs)

    probe.__wrapped__ = original
    return probe


_PROBES = {name: _probing(name) for name in _STATS}


def _exists(path: str) -> bool:
    """Whether ``path`` exists, asked through the unwrapped ``lstat``: the recorder's own question is no probe."""
    try:
        _STATS["lstat"](path)
    except OSError:
        return False
    return True


def _probe_stats(on: bool) -> None:
    for name, function in (_PROBES if on else _STATS).items():
        setattr(os, name, function)


def _absolute(name: str, globals_: dict | None, level: int) -> str | None:
    if level == 0:
        return name
    try:
        package = (globals_ or {}).get("__package__") or ""
        return importlib.util.resolve_name("." * level + name, package)
    except (ImportError, ValueError, TypeError, AttributeError):
        return None


def _namespace(module) -> dict:
    return getattr(module, "__dict__", None) or {}  # not getattr(module, name): a lazy module's __getattr__ imports


def _asked(names: set[str]) -> None:
    for window in list(_windows):
        if window.lowering:
            window.imported |= names
    for outer in getattr(_stack, "calls", ()):
        outer |= names


def _tracked(load, absolute: str | None, fromlist, settled_as: tuple = ()) -> object:
    """Run ``load`` (the real import), recording the names it asked for; if it loads anything, what its loading
    asked for and loaded is each new name's dependencies. ``settled_as``: the import statement's key in
    ``_SETTLED``, where one that loads nothing is kept."""
    wanted = {absolute} if absolute else set()
    items = [item for item in fromlist or () if absolute and isinstance(item, str) and item != "*"]
    subs = [f"{absolute}.{item}" for item in items]
    parent = sys.modules.get(absolute) if absolute else None
    # Loading: the module is new, or a package's name in the fromlist is not yet its attribute (a submodule to load).
    loading = absolute is not None and (parent is None or (
        items and "__path__" in _namespace(parent) and any(item not in _namespace(parent) for item in items)))
    if not loading:
        asked = frozenset(wanted | {s for s in subs if s in sys.modules})
        if settled_as and absolute is not None and not getattr(_stack, "calls", None):
            _SETTLED[settled_as] = (absolute, asked)
        _asked(asked)
        return load()
    try:
        return _loading(load, wanted, subs)
    except ImportError as exc:
        if absolute is not None and absolute not in sys.modules:
            if isinstance(exc, ModuleNotFoundError) and exc.name == absolute:
                ABSENT_MODULES.setdefault(absolute, _search_path(absolute))
            else:  # found, and its own code failed (a module it imports is missing): its file is what was read
                _failed_module_read(absolute)
        raise


def _failed_module_read(name: str) -> None:
    from importlib.machinery import PathFinder  # noqa: PLC0415

    parent, _, last = name.rpartition(".")
    path = getattr(sys.modules.get(parent), "__path__", None) if parent else None
    try:
        spec = PathFinder.find_spec(last if parent else name, path)
    except (ImportError, ValueError, OSError):
        spec = None
    origin = getattr(spec, "origin", None)
    if isinstance(origin, str) and os.path.isfile(origin):
        for window in list(_windows):
            window.opened.add(origin)


def _search_path(name: str) -> tuple[str, ...]:
    """Where an import of ``name`` looked: its parent package's path, or sys.path (absence is a read)."""
    parent, _, _ = name.rpartition(".")
    if parent:
        return tuple(str(p) for p in getattr(sys.modules.get(parent), "__path__", None) or ())
    return tuple(os.path.abspath(p or ".") for p in sys.path if isinstance(p, str))


# Modules an import in a window asked for and did not find (``try: import fastknobs``), with where it looked: for
# every cell this process lowers after (a module that appears must re-lower them).
ABSENT_MODULES: dict[str, tuple[str, ...]] = {}


def _loading(load, wanted: set[str], subs: list[str]) -> object:
    before = set(sys.modules)
    calls = _stack.__dict__.setdefault("calls", [])
    inner: set[str] = set()
    calls.append(inner)
    try:
        return load()
    finally:
        calls.pop()
        new = set(sys.modules) - before
        wanted |= {s for s in subs if s in sys.modules}
        deps = frozenset(inner | new)
        for name in wanted | new:
            _LOAD_DEPS.setdefault(name, deps)
        _asked(wanted)


# An import statement that loaded nothing (its module and the names it takes were there), by (name, level, the
# importing package, fromlist) -> (its module's absolute name, the names it asked for): the same statement run again
# (jax's tracing runs function-level imports ~100,000 times a MaxText lowering) is recorded at a dict lookup, while
# its module is still loaded and no enclosing import is loading one.
_SETTLED: dict[tuple, tuple[str, frozenset[str]]] = {}


def _import(name, globals=None, locals=None, fromlist=(), level=0):  # builtins.__import__'s own signature
    if not _windows:
        return _ORIGINAL_IMPORT(name, globals, locals, fromlist, level)
    key = (name, level, (globals or {}).get("__package__") if level else None,
           tuple(fromlist) if fromlist else ())
    try:
        settled = _SETTLED.get(key)
    except TypeError:  # a fromlist of something unhashable: recorded the long way, never kept
        settled, key = None, ()
    if settled is not None and settled[0] in sys.modules and not getattr(_stack, "calls", None):
        for window in _windows:
            if window.lowering and not settled[1] <= window.imported:
                window.imported |= settled[1]
        return _ORIGINAL_IMPORT(name, globals, locals, fromlist, level)
    return _tracked(lambda: _ORIGINAL_IMPORT(name, globals, locals, fromlist, level),
                    _absolute(name, globals, level), fromlist, key)


def _import_module(name, package=None):
    if not _windows:
        return _ORIGINAL_IMPORT_MODULE(name, package)
    try:
        absolute = importlib.util.resolve_name(name, package) if name.startswith(".") else name
    except (ImportError, ValueError, TypeError, AttributeError):
        absolute = None
    return _tracked(lambda: _ORIGINAL_IMPORT_MODULE(name, package), absolute, ())


def open_window(lowering: bool) -> Used:
    """Start recording (``close_window`` ends it); the audit hook is added once per process and stays."""
    global _hooked, _tool  # one hook per process: audit hooks cannot be removed
    window = Used(lowering)
    with _lock:
        if not _hooked:
            sys.addaudithook(_audit)
            _tool = _take_tool() if _MONITORING is not None else None
            _hooked = True
        if not _windows:  # imports (a failed one is a read), stats and the code run, in every window
            builtins.__import__, importlib.import_module = _import, _import_module
            _probe_stats(True)
        _hear_code(True)  # each window hears each code object once
        window.before = frozenset(sys.modules)
        _windows.append(window)
    return window


def close_window(window: Used) -> None:
    with _lock:
        _windows.remove(window)
        if not _windows:
            builtins.__import__, importlib.import_module = _ORIGINAL_IMPORT, _ORIGINAL_IMPORT_MODULE
            _probe_stats(False)
            _hear_code(False)
        if window.lowering:
            window.loaded = frozenset(sys.modules) - window.before
            coarse = frozenset(window.loaded | window.imported)
            for name in window.loaded:  # loaded other than through the wrappers: all its lowering touched
                _LOAD_DEPS.setdefault(name, coarse)
            _LOADED_IN_LOWERINGS.update(window.loaded)


def modules_used(window: Used) -> set[str]:
    """The module names a cell's lowering used: every module loaded now, less those other cells' lowerings loaded
    that this one neither asked for nor ran code of, directly or through what loading such a module asked for."""
    if _tool is None:
        return set(sys.modules)
    others = _LOADED_IN_LOWERINGS - window.loaded
    names = set(sys.modules) - others
    pending = [*window.imported, *(name for name in others if _file_of(name) in window.ran)]
    while pending:
        name = pending.pop()
        parts = name.split(".")
        for candidate in (*(".".join(parts[:n]) for n in range(1, len(parts) + 1)), *_LOAD_DEPS.get(name, ())):
            if candidate in others and candidate not in names:
                names.add(candidate)
                pending.append(candidate)
    return {name for name in names if name in sys.modules}


def _file_of(name: str) -> str | None:
    module = sys.modules.get(name)
    file = _namespace(module).get("__file__") if module is not None else None
    return file if isinstance(file, str) else None


def _made_by(window: Used, path: str) -> bool:
    """Whether ``path`` is the window's own output: a file it created (or renamed into place), one inside a folder
    it made, or one whose ctime is newer than the window's start and whose times or mode it did not set itself
    (a file a library wrote from C: XLA's dump read back)."""
    if path in window.created or any(path.startswith(folder + os.sep) for folder in window.created):
        return True
    if path in window.touched:
        return False  # os.utime on an input makes its ctime new: still an input
    try:
        return os.stat(path).st_ctime_ns >= window.started_ns
    except OSError:
        return False


def files_opened(window: Used) -> set[str]:
    """Regular files the window opened for reading and did not make itself (a dump the lowering wrote and read back
    is its output, not an input), Python's bytecode and the kernel's views aside."""
    found = set()
    for path in window.opened:
        if path.startswith(_NOT_FILES) or path.endswith((".pyc", ".pyo")) or _made_by(window, path):
            continue
        if os.path.isfile(path):
            found.add(path)
    return found


def unservable(window: Used) -> list[str]:
    """Why what the window read cannot be keyed (each once): a file it read and wrote, a subprocess, a socket."""
    reasons = list(window.unservable)
    reasons += [f"reads and writes {path}" for path in sorted(window.opened & window.written)
                if not path.startswith(_NOT_FILES) and os.path.isfile(path)]
    return list(dict.fromkeys(reasons))


def probed(window: Used) -> set[str]:
    """Paths the window asked about (a stat, a listing) that it did not make: their existence is an input."""
    return {path for path in window.probed | set(window.listed)
            if not path.startswith(_NOT_FILES) and not _made_by(window, path)}
