"""The cache's entries on disk: each with a header (kind, key, cell, checksum) and its content, the manifests naming
them, and ``Cache``, one run's view of the folder (``hlo_audit.cache``'s doc)."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import hmac
import json
import os
import secrets
import stat
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from hlo_audit.cache.key import LAYOUT_VERSION, analysis_fingerprint, canonical_json, material_digest
from hlo_audit.cache.moved import moved_lowering, moved_reads, names_as_recorded, text_has_lines
from hlo_audit.cache.reads import Now, Reads, identity, portable, project_roots, stamp
from hlo_audit.files import write_atomic
from hlo_audit.lowering import Lowering
from hlo_audit.results import CellResult

# Variants kept per cell: enough for a few switches flipped back and forth, few enough to read at every lookup.
_VARIANTS_KEPT = 8
_HEADER_TAG = "hlo-audit-cache"


@dataclass(frozen=True)
class RecordedInputs:
    """What one lowering of a cell read, as its manifest keeps it: the project's files (by content, or by what of them
    ran: ``cache.code``), the distributions by version, the variables with their values, the paths asked about, the
    folders listed, the modules not found, and why it cannot be served (none: it can)."""

    cell: str
    files: tuple[tuple[str, str], ...]  # (path, how it is keyed)
    distributions: tuple[tuple[str, str], ...]
    environment: tuple[tuple[str, str | None], ...]
    probed: tuple[tuple[str, str], ...]
    listed: tuple[str, ...]
    absent_modules: tuple[str, ...]
    unservable: tuple[str, ...]

    @classmethod
    def of(cls, cell: str, reads: dict) -> RecordedInputs:
        code = reads.get("code", {})
        files = tuple((path, f"what ran of it ({len(code[path]['each']) - 1} of its code objects)" if path in code else
                       "content" if state else "absent") for path, state in sorted(reads["files"].items()))
        return cls(cell=cell, files=files, distributions=tuple(sorted(reads["distributions"].items())),
                   environment=tuple(sorted({**reads["imported_environment"], **reads["environment"]}.items())),
                   probed=tuple(sorted(reads.get("probed", {}).items())), listed=tuple(sorted(reads.get("listed", {}))),
                   absent_modules=tuple(sorted(reads.get("absent_modules", {}))),
                   unservable=tuple(reads.get("unservable", ())))


class CacheError(Exception):
    """The cache folder cannot be used (a file, not readable, not writable); one line naming it."""


class _Damaged(Exception):
    """An entry that does not verify; its message says how."""


class _Untrusted(_Damaged):
    """An entry without this user's mark: made elsewhere (committed, copied, another user's), never taken on its
    word, whatever its checksums say."""


# The per-user key that marks every entry this user writes (an HMAC of its header, checksum included). It lives
# outside every working tree, readable by its owner only, so a cache entry in a pull request, a copied or restored
# cache folder, or another user's shared cache_dir carries no mark this machine accepts.
KEY_VARIABLE = "XDG_CACHE_HOME"
_KEY_FILE = ("hlo-audit", "cache-key")


def key_path() -> Path:
    base = os.environ.get(KEY_VARIABLE) or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base, *_KEY_FILE)


@functools.cache
def _key_at(path: Path) -> bytes:
    """The key at ``path``, made (0600, in a 0700 folder) if there is none; CacheError if it cannot be made or read,
    or if others than its owner could read or replace it."""
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            pass
        else:
            with os.fdopen(fd, "w") as handle:
                handle.write(secrets.token_hex(32) + "\n")
        info = os.stat(path)
        if not stat.S_ISREG(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
            raise CacheError(f"the cache's key {path} is not a file only you can read (mode "
                             f"{stat.S_IMODE(info.st_mode):o}): remove it (a new one is made), or run with --no-cache")
        key = path.read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise CacheError(f"the cache's key {path} cannot be made or read: {getattr(exc, 'strerror', None) or exc} "
                         f"(set ${KEY_VARIABLE} to a folder of yours, or run with --no-cache)") from None
    if len(key) < 32:
        raise CacheError(f"the cache's key {path} is not one hlo-audit made: remove it (a new one is made), or run "
                         "with --no-cache")
    return key.encode()


def _mark(header: dict) -> str:
    """This user's mark on an entry's header (the header holds its content's checksum)."""
    unmarked = {k: v for k, v in header.items() if k != "mark"}
    return hmac.new(_key_at(key_path()), canonical_json(unmarked).encode(), hashlib.sha256).hexdigest()


def _marked(header: dict, content: str) -> dict:
    header = {k: v for k, v in header.items() if k not in ("mark", "sha256")}
    header["sha256"] = _sha256(content)
    return {**header, "mark": _mark(header)}


def _text_entry(header: dict, text: str) -> str:
    return f"{_HEADER_TAG} {canonical_json(_marked(header, text))}\n{text}"


def _json_entry(header: dict, body: object) -> str:
    return canonical_json({_HEADER_TAG: _marked(header, canonical_json(body)), "body": body})


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
    # Whole and made for this cell: whether this user made it is asked before its content is believed.
    mark = header.get("mark")
    if not isinstance(mark, str) or not hmac.compare_digest(mark, _mark(header)):
        raise _Untrusted("no mark of this user's")
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
    if _checked_header(doc[_HEADER_TAG], expected) != _sha256(canonical_json(doc["body"])):
        raise _Damaged("checksum does not match its content")
    return doc["body"]


def tracked_by_git(folder: Path) -> bool:
    """Whether git tracks any file under ``folder`` (False outside a repository, or without git)."""
    try:
        listed = subprocess.run(["git", "-C", str(folder), "ls-files", "-z", "--", "."], capture_output=True,
                                timeout=60, check=False)
    except (OSError, subprocess.SubprocessError):
        return False
    return listed.returncode == 0 and bool(listed.stdout)


def _warn_on_stderr(message: str) -> None:
    print(f"hlo-audit: warning: {message}", file=sys.stderr)


# A file that gets one JSON line per cell lowered (stored here, or computed under --no-cache; a hit writes none): how
# a test session counts its lowerings in every process and finds a cell lowered twice (tests/conftest.py).
LOG_VARIABLE = "HLO_AUDIT_CACHE_LOG"


def _log_lowering(result: CellResult, key: str, reads: dict) -> None:
    path = os.environ.get(LOG_VARIABLE)
    if not path:
        return
    # The variables the lowering found set: an injected change ($HLO_AUDIT_INJECT in the tests) makes another
    # lowering of the same primary key.
    found = {name: value for name, value in reads.get("environment", {}).items() if value is not None}
    line = canonical_json({"cell": result.cell.id, "target": result.cell.target, "key": key, "entry": result.key,
                           "environment": found, "seconds": result.lower_seconds, "pid": os.getpid()})
    try:
        with open(path, "a", encoding="utf-8") as log:  # one short line per append: whole lines, any process
            log.write(line + "\n")
    except OSError as exc:
        _warn_on_stderr(f"${LOG_VARIABLE} {path} cannot be written ({exc.strerror or exc}); this cell is not logged")


class Cache:
    """One run's view of the cache folder. ``enabled=False`` (``--no-cache``): nothing is read or written;
    ``refresh`` (``--refresh``): nothing is read, everything computed is written. ``warn`` says, in one line, each
    entry that did not verify (default: stderr). ``project``: the folder the project's files are named relative to
    in manifests (``reads.portable``; None: every file by its absolute path)."""

    def __init__(self, root: Path, enabled: bool = True, refresh: bool = False,
                 warn: Callable[[str], None] | None = None, project: Path | None = None):
        self.folder = Path(root)
        self.root = self.folder / LAYOUT_VERSION
        self.enabled = enabled
        self.refresh = refresh
        self._warn = warn or _warn_on_stderr
        self._analysis = analysis_fingerprint()
        self._roots = project_roots(project)
        self._now = Now(project)
        self._write_failed = False
        self._untrusted_said = False
        self.missed: dict[str, str] = {}  # cell id -> why its last lookup found no variant (the first one's reason)
        if enabled:
            self._check_usable()
            _key_at(key_path())
            if tracked_by_git(self.folder):  # a committed cache: never read, and its files never rewritten
                self._warn(f"cache_dir {self.folder} holds files git tracks: a committed cache is never used (untrack "
                           f"it: git rm -r --cached {self.folder}); this run lowers without it")
                self.enabled = False

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
        except _Untrusted:
            return self._untrusted()
        except _Damaged as exc:
            return self._damaged(path, cell, str(exc))

    def _damaged(self, path: Path, cell: str | None, why: str) -> None:
        """Say, in one line, an entry that does not verify (its callers return this None: a miss)."""
        self._warn(f"cache entry {path} does not verify ({why}); {cell or 'its cell'} is computed again")

    def _untrusted(self) -> None:
        """Say once a run that entries here carry no mark of this user's, and are lowered again (a miss)."""
        if not self._untrusted_said:
            self._warn(f"cache entries in {self.folder} were not written by this user on this machine (no valid mark: "
                       f"a committed, copied or shared cache); not trusted, their cells are lowered again")
        self._untrusted_said = True

    def lookup(self, key: str, cell: str | None = None) -> str | None:
        """The entry of the manifest's first variant whose reads all still hold, or None."""
        if not self.enabled or self.refresh:
            return None
        manifest = self._read(key, "manifest", cell, _parse_json_entry)
        if manifest is None:
            return None
        first = None
        try:
            variants = [(v["entry"], v["reads"]) for v in manifest["variants"]]
            for entry, reads in variants:
                if not isinstance(entry, str):
                    raise TypeError(entry)
                why, retouched, moves = self._now.verify(reads)
                if why is None and moves:
                    served = self._moved(key, cell, entry, reads, moves) if cell is not None else None
                    if served is not None:
                        return served
                    recorded = next(iter(moves))
                    why = (f"{self._now.code_changed(self._now.locate(recorded) or recorded, reads['code'][recorded])}"
                           f", and its cached lowering's lines could not be moved with it")
                if why is None:
                    if retouched and cell is not None:
                        self._retouch(key, cell, manifest, entry)
                    return entry
                first = first or why
        except (KeyError, TypeError, ValueError, AttributeError, IndexError):
            return self._damaged(self._path(key, "manifest"), cell, "not a manifest (JSON of another shape)")
        if cell is not None and first:
            self.missed[cell] = self._now.shown(first)
        return None

    def _retouch(self, key: str, cell: str, manifest: dict, entry: str) -> None:
        """The files held by their hashes (a fresh checkout): store their stamps now, so the next run only stats."""
        for variant in manifest["variants"]:
            if variant["entry"] == entry:
                self._restamp(variant["reads"]["files"])
        self._write(self._path(key, "manifest"), _json_entry({"kind": "manifest", "key": key, "cell": cell},
                                                             manifest))

    def _restamp(self, files: dict) -> None:
        """Recorded files' states as the files are now: their stamps, and their hashes (a module whose text changed
        but not what ran of it: ``cache.code``)."""
        for recorded, state in files.items():
            path = self._now.locate(recorded)
            info = self._now.stat(path) if path is not None else None
            if state is not None and info is not None:
                stamped = stamp(info)
                state[:] = [*stamped[:2], self._now.sha256(path) or state[2], *stamped[2:]]

    def _moved(self, key: str, cell: str, entry: str, reads: dict, moves: dict) -> str | None:
        """The entry of a lowering whose code only moved, its lines moved (``cache.moved``): written beside the
        recorded one with a variant of the files as they are now, its result left to be analysed again. None where
        it cannot be (the text carries lines itself, the entry does not verify, a file is unreadable now)."""
        hit = self.get_lowering(entry, cell)
        if hit is None or text_has_lines(hit[0]):
            return None
        text, meta = hit
        locate = self._now.locate
        try:
            lowering = moved_lowering(meta, moves, names_as_recorded(meta, moves, locate))
            now = moved_reads(reads, moves, locate)
        except (KeyError, TypeError, ValueError, AttributeError):
            return None
        self._restamp(now["files"])  # every file as it is now, those that held by their hash too
        served = material_digest({"primary": key, "reads": identity(now)})
        lowering["hlo_sha256"] = _sha256(text)
        self._write(self._path(served, "hlo"), _text_entry({"kind": "hlo", "key": served, "cell": cell}, text))
        self._write(self._path(served, "lowering"),
                    _json_entry({"kind": "lowering", "key": served, "cell": cell}, lowering))
        self._add_variant(key, cell, served, now)
        return served

    def recorded(self, key: str, cell: str) -> RecordedInputs | None:
        """What the lowering that made the cell's newest variant read (``check --explain-cache``), or None: never
        lowered with this key (another version of jax, of hlo-audit, other flags), or not verifying."""
        manifest = self._read(key, "manifest", cell, _parse_json_entry)
        try:
            return RecordedInputs.of(cell, manifest["variants"][0]["reads"]) if isinstance(manifest, dict) else None
        except (KeyError, TypeError, IndexError, AttributeError):
            return None

    @property
    def roots(self) -> tuple[str, ...]:
        """The project's folder, as given and resolved (``reads.project_roots``): its files are named from it."""
        return self._roots

    def variant_reads(self, key: str, entry: str, cell: str) -> Reads | None:
        """What the lowering that made ``entry`` read, as the manifest of primary key ``key`` keeps it (the project's
        files relative to the project: ``reads.portable``), or None."""
        manifest = self._read(key, "manifest", cell, _parse_json_entry)
        try:
            found = next((v["reads"] for v in manifest["variants"] if v["entry"] == entry), None)
            return Reads.from_record(found) if found is not None else None
        except (KeyError, TypeError, AttributeError, ValueError):
            return None

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

    def put(self, key: str, result: CellResult, lowering: Lowering, read: Reads,
            versions: list[str] | tuple[str, ...] = ()) -> CellResult:
        """Store a cell just lowered: its entry (text, lowering record, result, canonical text), then the manifest
        variant naming it. Returns the result keyed by its entry (``key``). ``versions``: the distributions the
        target said its text depends on (``run.environment``'s names, kept for re-analysing the entry)."""
        reads = portable(read.to_record(), self._roots)  # the manifest variant's record
        entry = material_digest({"primary": key, "reads": identity(reads)})
        result = replace(result, key=entry)
        _log_lowering(result, key, reads)
        if not self.enabled:
            return result
        cell = result.cell.id
        meta = {"cell": cell, "seconds": result.lower_seconds, **lowering.meta(), "hlo_sha256": _sha256(lowering.text),
                "versions": list(versions)}
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

