"""Reading the golden store: the tree as one command reads it (``Snapshot``: one descriptor of the folder, each file
read at most once, when first needed, and shared by everyone in the command: the gate, the report, golden update's
comparison of what it would write), read again whole when a ``golden update`` swapped it meanwhile
(``read_snapshot``); where goldens are (``summary_path``, ``hlo_path``) and what a staging folder of a killed update
is. Which files are goldens is the records' business (``record.record_problem``: the marker inside each summary);
nothing else in the folder (``README.json``, ``notes/config.json``, a ``data.json`` with its ``data.hlo.txt``) is
ever pruned or reported stale.
"""

from __future__ import annotations

import errno
import hashlib
import os
import stat
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TypeVar

from hlo_audit.golden.record import (
    HLO_SUFFIX,
    SUMMARY_SUFFIX,
    DuplicateKey,
    Golden,
    GoldenRecord,
    NonFinite,
    is_marked,
    loads,
    loads_lenient,
    summary_problem,
)
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

    def digest(self) -> str:
        """A digest of the whole tree as this snapshot reads it: every entry's path, kind and content (a link's
        target), hidden ones included; "" when there is no tree. What a check was judged against: shards of one
        run judged against the same goldens agree on it, whatever cells each read (``plan.Judge``)."""
        self._open_tree()
        if self.fd is None:
            return ""
        whole = hashlib.sha256()
        try:
            for dirpath, dirnames, filenames, dir_fd in os.fwalk(".", dir_fd=self.fd):
                links = [d for d in dirnames if stat.S_ISLNK(os.stat(d, dir_fd=dir_fd, follow_symlinks=False).st_mode)]
                dirnames[:] = sorted(d for d in dirnames if d not in links)
                for name in sorted([*filenames, *links]):
                    rel = os.path.normpath(os.path.join(dirpath, name))
                    whole.update(f"{len(rel)}:{rel}:".encode())
                    whole.update(_entry_digest(name, dir_fd))
        except OSError as exc:  # a file gone under the walk (the tree swapped: ``read_snapshot`` reads again)
            return f"unreadable ({exc.strerror or exc})"
        return whole.hexdigest()[:16]

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

    def _record(self, path: Path, cell_id: str) -> tuple[dict | None, str | None, bool]:
        """(record, None, True) for hlo-audit's golden summary at ``path``, else (None, why, whether it carries the
        marker: its keys are what is wrong, ``Golden.invalid``)."""
        try:
            text = _decode(self._bytes(path))
            record = loads(text)
        except OSError as exc:
            return None, f"{path}: unreadable golden: {exc.strerror or exc}", False
        except RecursionError:
            return None, f"{path}: unreadable golden: nested too deep to be a golden summary", False
        except (DuplicateKey, NonFinite) as exc:  # the marker read as json reads it says whose it is
            return None, f"{path}: not a golden summary: {exc}", is_marked(loads_lenient(text), cell_id)
        except ValueError as exc:  # not UTF-8, not JSON, NaN or Infinity
            return None, f"{path}: unreadable golden: {exc}", False
        problem, marked = summary_problem(record, cell_id)
        return (record, None, True) if problem is None else (None, f"{path}: {problem}", marked)

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
        record, problem, marked = self._record(path, cell_id)
        if record is None:
            return Golden(cell_id, None, None, damaged=problem, invalid=marked)
        typed = GoldenRecord.from_json(record)
        if typed.hlo is None:
            return Golden(cell_id, typed, None, summary=path)
        text_path = hlo_path(self.root, cell_id)
        try:
            return Golden(cell_id, typed, _decode(self._bytes(text_path)), summary=path)
        except FileNotFoundError:
            why = f"{text_path}: missing (its summary names it)"
        except OSError as exc:
            why = f"{text_path}: unreadable: {exc.strerror or exc}"
        except ValueError as exc:
            why = f"{text_path}: {exc}"
        return Golden(cell_id, typed, None, text_problem=why, summary=path)

    def stored_ids(self) -> list[str]:
        """Every cell id with one of hlo-audit's golden summaries in the tree (the marker: ``record_problem``)."""
        return sorted(cid for cid, path in self.summary_files() if self._record(path, cid)[2])

    def owned_files(self, cell_id: str) -> list[Path]:
        """The files hlo-audit wrote for ``cell_id``: its summary when the marker says so, and the text it names."""
        path = summary_path(self.root, cell_id)
        record, _, marked = self._record(path, cell_id) if self.lexists(path) else (None, None, False)
        if not marked:
            return []
        names_text = record.get("hlo") is not None if record is not None else True  # an invalid one: its text too
        return [path, *([hlo_path(self.root, cell_id)] if names_text else [])]

    def differs(self, path: Path, content: str | None) -> bool:
        """Whether writing ``content`` (None: deleting) at ``path`` changes the store."""
        if content is None:
            return self.lexists(path)
        try:
            return self._bytes(path) != content.encode("utf-8")
        except OSError:
            return True


def _entry_digest(name: str, dir_fd: int) -> bytes:
    """One entry of a tree: a file's content digest, a link's target, or what else it is."""
    info = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    if stat.S_ISLNK(info.st_mode):
        return b"link:" + os.fsencode(os.readlink(name, dir_fd=dir_fd))
    if not stat.S_ISREG(info.st_mode):
        return f"kind {stat.S_IFMT(info.st_mode)}".encode()
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=dir_fd)
    try:
        content = hashlib.sha256()
        while chunk := os.read(fd, 1 << 20):
            content.update(chunk)
    finally:
        os.close(fd)
    return b"file:" + content.digest()


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


def _stagings(real: Path) -> list[Path]:
    """The staging folders of ``real`` that hlo-audit made: its name's prefix and its marker (``_is_staging``)."""
    parent, prefix = real.parent, staging_prefix(real)
    if not parent.is_dir():
        return []
    return sorted(parent / name for name in os.listdir(parent)
                  if name.startswith(prefix) and _is_staging(parent / name))


def _is_staging(folder: Path) -> bool:
    """A real folder (not a link to one) holding the marker hlo-audit writes first in each staging folder."""
    if folder.is_symlink() or not folder.is_dir():
        return False
    try:
        return _read_bytes(folder / STAGING_MARKER) == _STAGING_MARKER_TEXT.encode()
    except OSError:
        return False


def check_published(root: Path) -> None:
    """A reader meeting a publish half done (the two-rename fallback, killed between its renames) says so."""
    real = Path(root).resolve()
    if os.path.lexists(real):
        return
    for staging in _stagings(real):
        if (staging / STAGED_FALLBACK).exists():
            raise GoldenError(f"{root}: a `hlo-audit golden update` was killed while publishing ({staging}); run "
                              "`hlo-audit golden update` to finish it")
