"""The golden store: the folder of golden records on disk, read once per command and written all-or-nothing.

Reading. A command reads the store through one ``Snapshot``: each file is read at most once, when first needed (a
check of one cell reads that cell's golden; ``golden update --prune`` reads every summary once), and everyone in
the command (the gate, the report, golden update's comparison of what it would write) shares what was read. Which
files are goldens is the records' business (``record.record_problem``: the marker inside each summary); nothing
else in the folder (``README.json``, ``notes/config.json``, a ``data.json`` with its ``data.hlo.txt``) is ever
pruned or reported stale.

Writing is all-or-nothing. Every lowering happens first; then, holding a lock on the folder's parent (a flock on
the directory: no lock file is left behind), the new tree is built complete in a staging folder beside the store
(``.golden-staging-*``, marked as hlo-audit's by a file in it: hard links for what does not change, new files for
what does) and swapped with the old
one in a single ``renameat2(RENAME_EXCHANGE)``: a reader, a ``git status`` or a kill sees the old tree or the new
one, never a mix, at every instant (and after a power loss: the new tree's files and folders are synced before
the swap, the swap after it). The old tree is then deleted with the staging folder. A kill before the
swap leaves the old tree; after it, the new one; either way at most a staging folder, which the next
``golden update`` removes before it reads anything. Where the filesystem cannot exchange two entries the swap is
two renames (old tree into the staging folder, new tree into place) and the next run finishes or undoes them
before reading anything; a reader that meets that half-done state says so instead of reading an empty store.
Readers that read many goldens (``check``, ``report``) read them through one descriptor of the tree (``Snapshot``,
``read_snapshot``), so an update swapping trees meanwhile is never half seen.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import json
import os
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

from hlo_audit.files import sync, sync_tree
from hlo_audit.golden.record import HLO_SUFFIX, SUMMARY_SUFFIX, GoldenRecord, record_problem
from hlo_audit.hlo.text import HloParseError, parse_module
from hlo_audit.matrix import text_problem

# The largest golden read: a 32-layer unrolled llama3-8b module is 8.9 MB; a summary is a few kilobytes.
MAX_GOLDEN_BYTES = 256 << 20
# Inside a staging folder: the new tree, the marker that it is complete, and for the two-rename fallback its marker
# (written before the first rename: only then may the next run move a tree into place) and the old tree.
STAGED_TREE, STAGED_READY, STAGED_FALLBACK, STAGED_OLD = "tree", "ready", "two-renames", "old"
T = TypeVar("T")
# The first file of every staging folder: what says it is hlo-audit's, so that only hlo-audit's own leftovers are
# ever removed (a user's `.golden-staging-notes/` beside the store matches the name pattern, not this).
STAGING_MARKER = ".hlo-audit-staging"
_STAGING_MARKER_TEXT = "a staging folder of `hlo-audit golden update`: the next one removes it\n"


class GoldenError(ValueError):
    """A golden store that cannot be used as it is; names the file or folder."""


def staging_prefix(root: Path) -> str:
    return f".{root.name}-staging-"


def cell_path(root: Path, cell_id: str, suffix: str) -> Path:
    """``root/<cell id><suffix>``, checked to stay inside ``root`` (the config validates ids; this is defence in
    depth for ids from anywhere else)."""
    parts = cell_id.split("/")
    bad = next((p for p in parts if p in ("", ".", "..") or "\\" in p or text_problem(p)), None)
    if bad is not None or os.path.isabs(cell_id):
        raise GoldenError(f"{root}: cell id {cell_id!r} does not name a file inside the golden folder")
    path = Path(root).joinpath(*parts[:-1], parts[-1] + suffix)
    top = os.path.abspath(root)
    if os.path.commonpath([top, os.path.abspath(path)]) != top:
        raise GoldenError(f"{root}: cell id {cell_id!r} does not name a file inside the golden folder")
    return path


def summary_path(root: Path, cell_id: str) -> Path:
    return cell_path(root, cell_id, SUMMARY_SUFFIX)


def hlo_path(root: Path, cell_id: str) -> Path:
    return cell_path(root, cell_id, HLO_SUFFIX)


# --------------------------------------------------------------------------------------------------------------
# Reading
# --------------------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Golden:
    cell_id: str
    record: GoldenRecord | None  # None when damaged
    hlo: str | None
    # The summary cannot be used (not UTF-8, not JSON, not a golden summary, another cell's): why, naming the
    # file. Nothing else is compared; the gate reports it as a missing golden, and `golden update` rewrites it.
    damaged: str | None = None
    # The summary names a text that is missing or unreadable: why. The counts still gate.
    text_problem: str | None = None

    @property
    def environment(self) -> Mapping[str, str | None]:
        return self.record.environment if self.record is not None else {}

    @property
    def names_text(self) -> bool:
        return self.record is not None and self.record.hlo is not None

    def text_parse_problem(self) -> str | None:
        """Why the golden text is not an HLO module hlo-audit reads, or None (parsed only when asked: the gate asks
        when the text differs from the cell's, to tell a damaged golden from a changed program)."""
        if self.hlo is None:
            return None
        try:
            parse_module(self.hlo, str(self.cell_id) + HLO_SUFFIX)
        except (HloParseError, RecursionError) as exc:
            return f"golden text {self.cell_id}{HLO_SUFFIX} is not a module hlo-audit reads: {exc}"
        return None


def _read_bytes(path: Path, opener: Callable[[str, int], int] | None = None) -> bytes:
    """A golden's bytes (opened through ``opener``: a snapshot's descriptor of its tree); a folder, FIFO or device
    at its path, or a file too large to be one, is an OSError."""
    def nonblocking(name, flags):
        return (opener or os.open)(name, flags | os.O_NONBLOCK)

    with open(path, "rb", opener=nonblocking) as handle:
        info = os.fstat(handle.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        if info.st_size > MAX_GOLDEN_BYTES:
            raise OSError(errno.EFBIG, f"larger than {MAX_GOLDEN_BYTES >> 20} MiB")
        return handle.read()


def _decode(data: bytes) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"not UTF-8 (byte {exc.start})") from None


class Snapshot:
    """The store as one command reads it: one tree, every file read at most once, when first asked for, and
    shared by everyone in the command.

    The tree is the one at the path when the first read happens: one descriptor of its folder, every read relative
    to it. ``golden update`` swaps a whole new tree in and then deletes the old one, so a reader that opened files
    one by one by path read part of one tree and part of the other (issue 27: 3 of 4 cells, then 22 of 72 of the
    new tree). Reads through the descriptor stay in the tree it was opened on; ``changed()`` says whether the path
    now names another tree, in which case the old one may have lost files under the reads (``read_snapshot`` reads
    again). A folder's inode and ctime tell: every swap puts another folder at the path, and renaming a folder
    changes its ctime."""

    def __init__(self, root: Path):
        self.root = Path(root)
        self.fd: int | None = None
        self._opened = False
        self._identity: tuple[int, int, int] | None = None
        self._files: dict[Path, bytes | OSError] = {}
        self._goldens: dict[str, Golden | None] = {}

    # -- the tree -----------------------------------------------------------------------------------------------

    def _open_tree(self) -> None:
        if self._opened:
            return
        check_published(self.root)
        self._opened = True
        try:
            self.fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY)
        except (FileNotFoundError, NotADirectoryError):
            pass  # no tree: nothing stored
        except OSError as exc:
            raise GoldenError(f"{self.root}: cannot read the golden folder: {exc.strerror or exc}") from None
        self._identity = self._identify(os.fstat(self.fd)) if self.fd is not None else None

    @staticmethod
    def _identify(info: os.stat_result) -> tuple[int, int, int]:
        return info.st_dev, info.st_ino, info.st_ctime_ns

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None

    def changed(self) -> bool:
        """Whether the path names another tree than the one these reads went to (or one appeared or went); False
        when nothing was read."""
        if not self._opened:
            return False
        try:
            now = self._identify(os.stat(self.root))
        except OSError:
            now = None
        return now != self._identity

    def _relative(self, path: Path) -> str:
        return os.fspath(Path(path).relative_to(self.root))

    def open(self, path: Path, flags: int) -> int:
        self._open_tree()
        if self.fd is None:
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), str(path))
        return os.open(self._relative(path), flags, dir_fd=self.fd)

    def lexists(self, path: Path) -> bool:
        self._open_tree()
        if self.fd is None:
            return False
        try:
            os.stat(self._relative(path), dir_fd=self.fd, follow_symlinks=False)
        except OSError:
            return False
        return True

    def summary_files(self) -> Iterator[tuple[str, Path]]:
        """(cell id its path spells, path) of every ``*.json`` of the tree outside hidden folders."""
        self._open_tree()
        if self.fd is None:
            return
        for dirpath, dirnames, filenames, _ in os.fwalk(".", dir_fd=self.fd):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            for name in sorted(filenames):
                if name.endswith(SUMMARY_SUFFIX) and not name.startswith("."):
                    rel = os.path.normpath(os.path.join(dirpath, name))
                    yield rel[: -len(SUMMARY_SUFFIX)], self.root / rel

    # -- reading ------------------------------------------------------------------------------------------------

    def _bytes(self, path: Path) -> bytes:
        if path not in self._files:
            try:
                self._files[path] = _read_bytes(path, lambda name, flags: self.open(Path(name), flags))
            except OSError as exc:
                self._files[path] = exc
        found = self._files[path]
        if isinstance(found, OSError):
            raise found
        return found

    def _record(self, path: Path, cell_id: str) -> tuple[dict | None, str | None]:
        """(record, None) for hlo-audit's golden summary at ``path``, else (None, why)."""
        try:
            record = json.loads(_decode(self._bytes(path)))
        except OSError as exc:
            return None, f"{path}: unreadable golden: {exc.strerror or exc}"
        except RecursionError:
            return None, f"{path}: unreadable golden: nested too deep to be a golden summary"
        except ValueError as exc:  # not UTF-8, not JSON
            return None, f"{path}: unreadable golden: {exc}"
        problem = record_problem(record, cell_id)
        return (record, None) if problem is None else (None, f"{path}: {problem}")

    def golden(self, cell_id: str) -> Golden | None:
        """The cell's golden, None when it has none; a damaged one is a ``Golden`` that says why (``damaged``)."""
        if cell_id not in self._goldens:
            self._goldens[cell_id] = self._load(cell_id)
        return self._goldens[cell_id]

    load = golden

    def _load(self, cell_id: str) -> Golden | None:
        path = summary_path(self.root, cell_id)
        if not self.lexists(path):
            return None
        record, problem = self._record(path, cell_id)
        if record is None:
            return Golden(cell_id, None, None, damaged=problem)
        typed = GoldenRecord.from_json(record)
        if typed.hlo is None:
            return Golden(cell_id, typed, None)
        text_path = hlo_path(self.root, cell_id)
        try:
            return Golden(cell_id, typed, _decode(self._bytes(text_path)))
        except FileNotFoundError:
            why = f"{text_path}: missing (its summary names it)"
        except OSError as exc:
            why = f"{text_path}: unreadable: {exc.strerror or exc}"
        except ValueError as exc:
            why = f"{text_path}: {exc}"
        return Golden(cell_id, typed, None, text_problem=why)

    def stored_ids(self) -> list[str]:
        """Every cell id with one of hlo-audit's golden summaries in the tree (the marker: ``record_problem``)."""
        return sorted(cid for cid, path in self.summary_files() if self._record(path, cid)[0] is not None)

    def owned_files(self, cell_id: str) -> list[Path]:
        """The files hlo-audit wrote for ``cell_id``: its summary when the marker says so, and the text it names."""
        path = summary_path(self.root, cell_id)
        record, _ = self._record(path, cell_id) if self.lexists(path) else (None, None)
        if record is None:
            return []
        return [path, *([hlo_path(self.root, cell_id)] if record.get("hlo") is not None else [])]

    def differs(self, path: Path, content: str | None) -> bool:
        """Whether writing ``content`` (None: deleting) at ``path`` changes the store."""
        if content is None:
            return self.lexists(path)
        try:
            return self._bytes(path) != content.encode("utf-8")
        except OSError:
            return True


SNAPSHOT_ATTEMPTS = 20


def read_snapshot(root: Path, read: Callable[[Snapshot], T]) -> T:
    """``read(snapshot)`` of one golden tree, whole: read again when a ``golden update`` swapped the tree during
    the reads (each swap ends a commit that takes longer than these reads, so a few attempts always end)."""
    for _ in range(SNAPSHOT_ATTEMPTS):
        snapshot = Snapshot(root)
        try:
            value = read(snapshot)
        finally:
            snapshot.close()
        if not snapshot.changed():
            return value
    raise GoldenError(f"{root}: the golden folder was replaced {SNAPSHOT_ATTEMPTS} times while it was read (a "
                      "`golden update` running?); run again when it is done")


def load(root: Path, cell_id: str) -> Golden | None:
    """One cell's golden, read now (a command reads through its ``Snapshot``)."""
    return read_snapshot(root, lambda tree: tree.golden(cell_id))


def stored_ids(root: Path) -> list[str]:
    return read_snapshot(root, lambda tree: tree.stored_ids())


def owned_files(root: Path, cell_id: str) -> list[Path]:
    return read_snapshot(root, lambda tree: tree.owned_files(cell_id))


# --------------------------------------------------------------------------------------------------------------
# Writing
# --------------------------------------------------------------------------------------------------------------


@contextlib.contextmanager
def transaction(root: Path) -> Iterator[tuple[Snapshot, list[Path]]]:
    """Holding the commit lock, after ``recover``: the store as it is now (read through the snapshot yielded, with
    the stale staging folders removed). ``commit`` within it writes."""
    root = Path(root)
    with _commit_lock(root):
        cleaned = recover(root)
        snapshot = Snapshot(root)
        try:
            yield snapshot, cleaned
        finally:
            snapshot.close()


def commit(snapshot: Snapshot, wanted: Mapping[Path, str | None]) -> set[Path]:
    """Within a ``transaction``: swap in the tree with ``wanted`` (path -> text, None: delete) where it differs from
    the snapshot; the paths changed."""
    changes = {path: content for path, content in wanted.items() if snapshot.differs(path, content)}
    if changes:
        root = snapshot.root
        _commit(root, {path.relative_to(root): content for path, content in changes.items()})
    return set(changes)


def publish(root: Path, files: Mapping[str, str | None]) -> list[Path]:
    """Swap in the tree with ``files`` changed (paths relative to ``root`` -> new text, None: delete), as
    ``update`` does once it knows what changed: under the commit lock, after ``recover``. Returns the stale
    staging folders removed."""
    root = Path(root)
    for rel in files:
        if Path(rel).is_absolute() or any(part in ("", ".", "..") for part in Path(rel).parts) or not str(rel):
            raise GoldenError(f"{root}: {rel!r} does not name a file inside the golden folder")
    with _commit_lock(root):
        cleaned = recover(root)
        if files:
            _commit(root, {Path(rel): content for rel, content in files.items()})
    return cleaned


def _after_step(step: str) -> None:
    """Called after each filesystem change of a commit (``step`` says which). Does nothing: the kill tests replace
    it to stop the process after each step in turn, with each signal (tests/test_golden_store.py)."""


@contextlib.contextmanager
def _commit_lock(root: Path):
    """One commit at a time beside ``root``: an exclusive flock on the parent folder (its inode outlives every swap
    of ``root``). Where the filesystem has no flock for folders, commits are not serialized."""
    parent = root.resolve().parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(parent, os.O_RDONLY)
    except OSError as exc:
        raise GoldenError(f"{root}: cannot use the folder that holds it: {exc.strerror or exc}") from None
    try:
        try:
            import fcntl  # noqa: PLC0415 -- POSIX only: elsewhere publishing goes on without the lock
            fcntl.flock(fd, fcntl.LOCK_EX)
        except (ImportError, OSError):
            pass
        yield
    finally:
        os.close(fd)


def _stagings(real: Path) -> list[Path]:
    """The staging folders of ``real`` that hlo-audit made: its name's prefix and its marker (``_is_staging``)."""
    parent, prefix = real.parent, staging_prefix(real)
    if not parent.is_dir():
        return []
    return sorted(parent / name for name in os.listdir(parent)
                  if name.startswith(prefix) and _is_staging(parent / name))


def _mark_staging(staging: Path) -> None:
    _write_new(staging / STAGING_MARKER, _STAGING_MARKER_TEXT)


def _is_staging(folder: Path) -> bool:
    """A real folder (not a link to one) holding the marker hlo-audit writes first in each staging folder."""
    if folder.is_symlink() or not folder.is_dir():
        return False
    try:
        return _read_bytes(folder / STAGING_MARKER) == _STAGING_MARKER_TEXT.encode()
    except OSError:
        return False


def recover(root: Path) -> list[Path]:
    """Before anything is read: finish or undo a publish that a kill interrupted, then remove every staging folder
    (called holding the commit lock, so none of them belongs to a running commit). Returns the folders removed."""
    real = Path(root).resolve()
    removed = []
    for staging in _stagings(real):
        _settle(staging, real)
        removed.append(staging)
    return removed


def _settle(staging: Path, real: Path) -> None:
    """Remove a staging folder; first, if the two-rename fallback stopped between its renames (``real`` absent),
    put the new tree in place when it was complete, else the old one back."""
    if not os.path.lexists(real) and (staging / STAGED_FALLBACK).exists():
        tree, old = staging / STAGED_TREE, staging / STAGED_OLD
        if (staging / STAGED_READY).exists() and tree.is_dir():
            os.rename(tree, real)
        elif old.is_dir():
            os.rename(old, real)
    shutil.rmtree(staging, ignore_errors=True)


def check_published(root: Path) -> None:
    """A reader meeting a publish half done (the two-rename fallback, killed between its renames) says so."""
    real = Path(root).resolve()
    if os.path.lexists(real):
        return
    for staging in _stagings(real):
        if (staging / STAGED_FALLBACK).exists():
            raise GoldenError(f"{root}: a `hlo-audit golden update` was killed while publishing ({staging}); run "
                              "`hlo-audit golden update` to finish it")


def _commit(root: Path, changes: dict[Path, str | None]) -> None:
    """Build the new tree beside ``root`` with ``changes`` (paths relative to ``root``; None: delete) and swap it
    in whole. Called holding the commit lock, after ``recover``."""
    real = root.resolve()
    if os.path.lexists(real) and not real.is_dir():
        raise GoldenError(f"{root}: golden_dir is not a folder")
    try:
        staging = Path(tempfile.mkdtemp(prefix=staging_prefix(real), dir=real.parent))
    except OSError as exc:
        raise GoldenError(f"{root}: cannot stage the new goldens beside it: {exc.strerror or exc}") from None
    try:
        _mark_staging(staging)  # a kill before this leaves an empty folder nobody removes: never a user's file
        _after_step("staging folder created")
        tree = staging / STAGED_TREE
        _build(real, tree, changes, root)
        # On disk before anything points at it: after a power loss the swapped-in tree must not hold empty files
        # (a kill needs none of this; the files written are synced by _write_new, carried ones are old inodes).
        sync_tree(tree)
        (staging / STAGED_READY).touch()
        sync(staging)
        _after_step("new tree complete")
        _publish(tree, real, staging)
        # From here the new tree is in place; what is left in the staging folder is the old one.
    except OSError as exc:  # before the swap: the old tree stands untouched
        raise GoldenError(f"{root}: golden update wrote nothing: {exc.strerror or exc}"
                          + (f" ({exc.filename})" if exc.filename else "")) from None
    finally:
        _settle(staging, real)  # Ctrl-C between the fallback's renames: finished here, not deleted
    _after_step("staging folder removed")
    # The swap and the staging folder's removal on disk: entries of the folder that holds golden_dir. The new tree
    # is in place whatever this says, so a failing sync (EIO) is no reason to report the update as not written.
    with contextlib.suppress(OSError):
        sync(real.parent)


def _publish(tree: Path, real: Path, staging: Path) -> None:
    if not os.path.lexists(real):
        os.rename(tree, real)  # the first update: nothing to swap with
        _after_step("new tree renamed into place")
    elif _exchange(tree, real):
        _after_step("trees exchanged")
    else:
        (staging / STAGED_FALLBACK).touch()
        _after_step("two-rename fallback marked")
        os.rename(real, staging / STAGED_OLD)
        _after_step("old tree moved aside")
        try:
            os.rename(tree, real)
        except OSError:
            os.rename(staging / STAGED_OLD, real)
            raise
        _after_step("new tree renamed into place")


_RENAME_EXCHANGE, _AT_FDCWD = 2, -100


def _exchange(a: Path, b: Path) -> bool:
    """Swap two directory entries in one step (Linux ``renameat2(RENAME_EXCHANGE)``, glibc >= 2.28); False where
    the C library or the filesystem cannot, so the caller falls back to two renames."""
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (AttributeError, OSError):
        return False
    renameat2.argtypes = (ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint)
    if renameat2(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.ENOSYS, errno.EINVAL, errno.EOPNOTSUPP, errno.ENOTSUP):
        return False
    raise OSError(err, os.strerror(err), str(b))


def _build(old: Path, new: Path, changes: dict[Path, str | None], root: Path) -> None:
    """The new tree at ``new``: the old tree's entries (hard links; copies where a link is refused; symbolic links
    as links), ``changes`` applied. Folders that the changes empty are left out, as pruning leaves no empty
    folder; folders that were empty stay."""
    os.mkdir(new)
    if old.is_dir():
        shutil.copymode(old, new)
    pending = dict(changes)

    made: set[Path] = {Path(".")}  # folders of the new tree made so far, relative

    def folder(rel_dir: Path) -> Path:
        """``new/rel_dir``, made with the old folders' modes; never through a symbolic link."""
        if rel_dir in made:
            return new / rel_dir
        rel = Path()
        for part in rel_dir.parts:
            rel = rel / part
            if rel in made:
                continue
            path = new / rel
            if path.is_symlink():
                raise GoldenError(f"{root / rel_dir}: goes through a symbolic link ({root / rel}); "
                                  "goldens are written only inside the golden folder")
            path.mkdir()
            if (old / rel).is_dir():
                shutil.copymode(old / rel, path)
            made.add(rel)
        return new / rel_dir

    def place(rel: Path) -> Path:
        return folder(rel.parent) / rel.name

    if old.is_dir():
        for dirpath, dirnames, filenames in os.walk(old):
            here = Path(dirpath)
            rel_dir = here.relative_to(old)
            if not dirnames and not filenames and rel_dir != Path("."):
                folder(rel_dir)  # an empty folder of the old tree stays
                _after_step(f"folder {rel_dir}")
            links = [d for d in dirnames if (here / d).is_symlink()]
            dirnames[:] = sorted(d for d in dirnames if d not in links)
            for name in sorted([*filenames, *links]):
                rel, src = rel_dir / name, here / name
                if rel in pending:
                    content = pending.pop(rel)
                    if content is not None:
                        _write_new(place(rel), content)
                        _after_step(f"wrote {rel}")
                    continue
                _carry(src, place(rel), root / rel)
                _after_step(f"carried {rel}")
    for rel, content in sorted(pending.items(), key=lambda kv: str(kv[0])):
        if content is not None:
            _write_new(place(rel), content)
            _after_step(f"wrote {rel}")


def _write_new(path: Path, content: str) -> None:
    with open(path, "x", encoding="utf-8", newline="") as handle:  # the umask's mode, as any new file
        handle.write(content)
        handle.flush()
        os.fsync(handle.fileno())


def _carry(src: Path, dst: Path, shown: Path) -> None:
    info = src.lstat()
    if stat.S_ISLNK(info.st_mode):
        os.symlink(os.readlink(src), dst)
    elif stat.S_ISREG(info.st_mode):
        try:
            os.link(src, dst, follow_symlinks=False)
        except OSError:  # a filesystem without hard links, or protected_hardlinks on a file of another user
            shutil.copy2(src, dst)
            sync(dst)  # a new inode, unlike a link: on disk before the swap, as written files are
    else:
        raise GoldenError(f"{shown}: not a regular file, folder or symbolic link; golden update rebuilds the golden "
                          "folder and cannot carry it over (move it out of golden_dir)")

