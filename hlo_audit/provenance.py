"""What tree a check judged, by content: the digest a shard records beside its commit (``tree_digest``), which
`merge` compares (issue 48).

git's HEAD names a commit, not what was on disk when the cells were lowered: a regression left uncommitted between
two shard runs of one HEAD, or two trees without git (both "unknown"), merged into "passed". So a check also records
a digest of the project's files as they are: SHA-256 over each file's path (relative to the project) and content.

Which files: the project folder's (the config's folder, where its relative paths start: the target module, the
model's code, the config, the goldens under it). With git, the files git lists there as tracked or untracked and not
ignored (``git ls-files --cached --others --exclude-standard``), read from disk (a modified file is its content, not
HEAD's; a tracked file deleted is recorded as deleted); without git (or outside a work tree), every file under the
folder. Left out in both: ``.git``, bytecode, virtual environments (a folder holding ``pyvenv.cfg``), the cache folder
and the command's own standard output where it is a file of the tree: outputs of hlo-audit and Python, never an input
the cells read, and different in each CI job's checkout.

Why the folder and not the files the cells read: a result does not carry what its lowering read (the cache's
manifests do, only where the cache is on, and only per cell); two shards judge different cells, whose reads are
different sets, and digests of different sets cannot be compared. The folder is what every shard of a run stands on.
What lies outside it is the judge's other parts: installed distributions (``Judge.environment``, their versions), a
golden folder elsewhere (``Judge.goldens``), the config's fingerprint (``Judge.config``). A file written into the
folder between two shard runs (a shard's own report) makes their trees differ: write reports outside the project,
or into a folder git ignores.
"""

from __future__ import annotations

import hashlib
import os
import stat
import subprocess
from collections.abc import Iterator
from pathlib import Path

# Folders that hold no input of a cell, git or not: git's own and bytecode (whose files carry their source's
# mtime: two checkouts of one commit differ there); and what a virtual environment is recognised by (``pyvenv.cfg``:
# a CI job's ``.venv`` in the checkout, untracked and often not ignored).
_SKIPPED = frozenset({".git", "__pycache__"})
_VENV_MARK = "pyvenv.cfg"
_CHUNK = 1 << 20


def tree_digest(project: Path, cache_dir: Path | None = None, golden_dir: Path | None = None) -> str:
    """The digest of ``project``'s files (module doc), the cache folder, the golden folder (``Judge.goldens`` is its
    digest, from the one snapshot the check read: its files are not read twice) and this command's own standard
    output (a regular file: ``check --format json > shard-1.json`` in the checkout, as the workflow `init` writes
    does) left out: 64 hex digits."""
    project = Path(project).resolve()
    skipped = tuple(Path(folder).resolve() for folder in (cache_dir, golden_dir) if folder is not None)
    listed = _git_files(project)
    kept = _Kept(project, skipped)
    digest = hashlib.sha256(b"git\0" if listed is not None else b"walk\0")
    for rel in sorted(listed if listed is not None else _walked(project)):
        path = project / rel
        if not kept(rel, path):
            continue
        digest.update(rel.encode("utf-8", "surrogateescape") + b"\0")
        digest.update(_content_digest(path) + b"\0")
    return digest.hexdigest()


class _Kept:
    """Whether a file of the tree is one a cell may read: not under a skipped folder, the cache folder or a virtual
    environment, not bytecode, not this process's standard output."""

    def __init__(self, project: Path, skipped: tuple[Path, ...]):
        self.project, self.skipped = project, skipped
        self.venvs: dict[str, bool] = {}
        self.stdout = _stdout_file()

    def __call__(self, rel: str, path: Path) -> bool:
        parts = Path(rel).parts
        if rel.endswith(".pyc") or any(part in _SKIPPED for part in parts[:-1]):
            return False
        if any(path.is_relative_to(folder) for folder in self.skipped):
            return False
        if any(self._venv("/".join(parts[:n])) for n in range(1, len(parts))):
            return False
        if self.stdout is not None:
            try:
                info = path.lstat()
            except OSError:
                return True
            return (info.st_dev, info.st_ino) != self.stdout
        return True

    def _venv(self, folder: str) -> bool:
        if folder not in self.venvs:
            self.venvs[folder] = (self.project / folder / _VENV_MARK).is_file()
        return self.venvs[folder]


def _stdout_file() -> tuple[int, int] | None:
    """(device, inode) of this process's standard output where it is a regular file; None otherwise."""
    try:
        info = os.fstat(1)
    except OSError:
        return None
    return (info.st_dev, info.st_ino) if stat.S_ISREG(info.st_mode) else None


def _git_files(project: Path) -> list[str] | None:
    """The files git lists in ``project`` (tracked, and untracked but not ignored), relative to it; None where git
    is missing or ``project`` is in no work tree."""
    try:
        done = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=project,
                              capture_output=True, timeout=120, check=False, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.SubprocessError):
        return None
    if done.returncode != 0:
        return None
    return sorted({name for name in done.stdout.decode("utf-8", "surrogateescape").split("\0") if name})


def _walked(project: Path) -> Iterator[str]:
    """Every file under ``project`` (``_Kept`` decides which count); folders skipped whole where they hold no input
    (``_SKIPPED``, virtual environments); links to folders are not followed (a link to a file is recorded as the path
    it names)."""
    for folder, dirs, files in os.walk(project, followlinks=False):
        here = Path(folder)
        dirs[:] = sorted(d for d in dirs if d not in _SKIPPED and not (here / d / _VENV_MARK).is_file())
        for name in files:
            yield str((here / name).relative_to(project))


def _content_digest(path: Path) -> bytes:
    """What the tree holds at ``path``: a regular file's content, a link's target, or what kind of entry it is
    (never opened: a FIFO would block); "missing" for a tracked file deleted, "unreadable" for one not ours to read."""
    try:
        info = path.lstat()
    except OSError:
        return b"missing"
    if stat.S_ISLNK(info.st_mode):
        return b"link:" + os.fsencode(os.readlink(path))
    if not stat.S_ISREG(info.st_mode):
        return b"entry:" + oct(stat.S_IFMT(info.st_mode)).encode()
    digest = hashlib.sha256()
    try:
        with open(path, "rb") as file:
            while chunk := file.read(_CHUNK):
                digest.update(chunk)
    except OSError:
        return b"unreadable"
    return digest.hexdigest().encode()
