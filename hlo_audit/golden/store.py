"""Writing the golden store, all-or-nothing (reading it is ``golden.snapshot``'s).

Every lowering happens first; then, holding a lock on the folder's parent (a flock on the directory: no lock file
is left behind), the new tree is built complete in a staging folder beside the store (``.golden-staging-*``, marked
as hlo-audit's by a file in it: hard links for what does not change, new files for what does) and swapped with the
old one in a single ``renameat2(RENAME_EXCHANGE)``: a reader, a ``git status`` or a kill sees the old tree or the
new one, never a mix, at every instant (and after a power loss: the new tree's files and folders are synced before
the swap, the swap after it). The old tree is then deleted with the staging folder. A kill before the swap leaves
the old tree; after it, the new one; either way at most a staging folder, which the next ``golden update`` removes
before it reads anything. Where the filesystem cannot exchange two entries the swap is two renames (old tree into
the staging folder, new tree into place) and the next run finishes or undoes them before reading anything; a
reader that meets that half-done state says so instead of reading an empty store. Readers that read many goldens
(``check``, ``report``) read them through one descriptor of the tree (``Snapshot``, ``read_snapshot``), so an
update swapping trees meanwhile is never half seen.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator, Mapping
from pathlib import Path

from hlo_audit.files import LinkedOut, confined, sync, sync_tree
from hlo_audit.golden.record import HLO_SUFFIX, SUMMARY_SUFFIX
from hlo_audit.golden.snapshot import (
    _STAGING_MARKER_TEXT,
    MAX_GOLDEN_BYTES,
    SNAPSHOT_ATTEMPTS,
    STAGED_FALLBACK,
    STAGED_OLD,
    STAGED_READY,
    STAGED_TREE,
    STAGING_MARKER,
    Golden,
    GoldenError,
    Snapshot,
    _stagings,
    cell_path,
    check_published,
    hlo_path,
    load,
    owned_files,
    read_snapshot,
    staging_prefix,
    stored_ids,
    summary_path,
)

# What this module hands on of the reading side: callers and tests name the store's layout and reads through it.
__all__ = ["HLO_SUFFIX", "MAX_GOLDEN_BYTES", "SNAPSHOT_ATTEMPTS", "STAGED_FALLBACK", "STAGED_OLD", "STAGED_READY",
           "STAGED_TREE", "STAGING_MARKER", "SUMMARY_SUFFIX", "Golden", "GoldenError", "Snapshot", "cell_path",
           "check_published", "commit", "hlo_path", "inside", "load", "owned_files", "publish", "read_snapshot",
           "recover", "staging_prefix", "stored_ids", "summary_path", "transaction"]


@contextlib.contextmanager
def transaction(root: Path, within: Path | None = None) -> Iterator[tuple[Snapshot, list[Path]]]:
    """Holding the commit lock, after ``recover``: the store as it is now (read through the snapshot yielded, with
    the stale staging folders removed). ``commit`` within it writes. ``within``: the project folder the golden folder
    must lie in, links followed (``inside``), checked before anything is made, locked or removed."""
    root = Path(root)
    inside(root, within)
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


def publish(root: Path, files: Mapping[str, str | None], within: Path | None = None) -> list[Path]:
    """Swap in the tree with ``files`` changed (paths relative to ``root`` -> new text, None: delete), as
    ``update`` does once it knows what changed: under the commit lock, after ``recover``. Returns the stale
    staging folders removed. ``within``: as ``transaction``'s."""
    root = Path(root)
    inside(root, within)
    for rel in files:
        if Path(rel).is_absolute() or any(part in ("", ".", "..") for part in Path(rel).parts) or not str(rel):
            raise GoldenError(f"{root}: {rel!r} does not name a file inside the golden folder")
    with _commit_lock(root):
        cleaned = recover(root)
        if files:
            _commit(root, {Path(rel): content for rel, content in files.items()})
    return cleaned


def inside(root: Path, project: Path | None) -> None:
    """Refuse, before anything is written, a golden folder that is not inside ``project`` once links are followed
    (``golden_dir`` itself or a folder above it a symbolic link out of the project, or a path that leads out:
    ``files.confined``, the one check of every writer): a commit stages, swaps and deletes beside the folder it
    resolves to, which would then be someone else's files; the project folder itself is refused for the same
    reason. None: no project to hold it to (a caller outside a config)."""
    if project is None:
        return
    try:
        real = confined(root, project, "the golden folder")
    except LinkedOut as exc:
        raise GoldenError(str(exc)) from None
    if real == Path(project).resolve():
        raise GoldenError(f"{root}: the golden folder resolves to the project folder {real} itself; goldens are "
                          "written only in a folder inside it: nothing written")


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


def _mark_staging(staging: Path) -> None:
    _write_new(staging / STAGING_MARKER, _STAGING_MARKER_TEXT)


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
                    if content is not None:  # a rewritten golden keeps its mode (a link becomes a new file)
                        info = src.lstat()
                        _write_new(place(rel), content, stat.S_IMODE(info.st_mode) if stat.S_ISREG(info.st_mode)
                                   else None)
                        _after_step(f"wrote {rel}")
                    continue
                _carry(src, place(rel), root / rel)
                _after_step(f"carried {rel}")
    for rel, content in sorted(pending.items(), key=lambda kv: str(kv[0])):
        if content is not None:
            _write_new(place(rel), content)
            _after_step(f"wrote {rel}")


def _write_new(path: Path, content: str, mode: int | None = None) -> None:
    """A new file: ``mode`` (the file it replaces had it), else the umask's, as any new file."""
    with open(path, "x", encoding="utf-8", newline="") as handle:
        handle.write(content)
        handle.flush()
        if mode is not None:
            os.fchmod(handle.fileno(), mode)
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
