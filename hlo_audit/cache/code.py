"""A module's file keyed by what of it ran (issue 45, item 2): its own statements, and each code object a lowering
executed, not its whole text.

An edit to a function no cell executed (model B's code, for model A's cells), to a comment or a docstring of code
that did not run, serves the cell; an edit to anything that ran re-lowers it. Code objects are named by their
qualified name and their rank among the code objects of that name in the file (two lambdas of one function), not
by line: an edit above a class that ran only at import shifts its lines without changing the program. The code a
lowering ran keeps its lines (its line table and first line): jax writes them into the HLO's metadata, so a lowering
served for a moved function would not be the text a fresh one gives.

Both sides compile the file's source (``compile``: nothing runs), the lowering process to record, the judging process
to check; code objects are compared by what they execute (bytecode, constants with nested code named, names,
arguments, flags), so the same source gives the same digest in any process.
"""

from __future__ import annotations

import hashlib
import os
import types
from collections.abc import Iterable

# A code object's identity in its file: (qualified name, rank among code objects of that name).
CodeId = str


def identities(tree: types.CodeType) -> dict[CodeId, types.CodeType]:
    """Every code object a module's compiled code holds, by identity (the module's own is ``<module>#0``)."""
    found: dict[CodeId, types.CodeType] = {}
    seen: dict[str, int] = {}
    stack = [tree]
    while stack:
        code = stack.pop(0)
        rank = seen.get(code.co_qualname, 0)
        seen[code.co_qualname] = rank + 1
        found[f"{code.co_qualname}#{rank}"] = code
        stack.extend(const for const in code.co_consts if isinstance(const, types.CodeType))
    return found


def by_start(tree: types.CodeType) -> dict[tuple[str, int], CodeId]:
    """Each code object's identity by its qualified name and first line: how a live code object (one that ran) is
    found in its file's compiled code (the file is the one it was loaded from), all of a file's at once."""
    found: dict[tuple[str, int], CodeId] = {}
    for name, candidate in identities(tree).items():
        found.setdefault((candidate.co_qualname, candidate.co_firstlineno), name)
    return found


# path -> (its stat when compiled: size, mtime, ctime, inode; its code). Filled in the process cells fork from
# (``reads.warm``), so each cell's process finds its modules compiled (MaxText's 138 files: 0.34 s a cell).
_COMPILED: dict[str, tuple[tuple[int, int, int, int], types.CodeType | None]] = {}


def compiled(path: str) -> types.CodeType | None:
    """The file's code as ``compile`` makes it from its source now (nothing runs); None where it does not compile.
    Kept per file while its stat says it is the same file."""
    try:
        info = os.stat(path)
    except OSError:
        return None
    stamp = (info.st_size, info.st_mtime_ns, info.st_ctime_ns, info.st_ino)
    kept = _COMPILED.get(path)
    if kept is not None and kept[0] == stamp:
        return kept[1]
    try:
        with open(path, "rb") as handle:
            source = handle.read()
        code = compile(source, path, "exec", dont_inherit=True)
    except (OSError, SyntaxError, ValueError):
        code = None
    _COMPILED[path] = (stamp, code)
    return code


def digest(tree: types.CodeType | None, ran: Iterable[CodeId], with_lines: Iterable[CodeId]) -> str | None:
    """What a lowering executed of a file: its module's own statements and each code object in ``ran`` (those in
    ``with_lines`` with their lines). None where the file does not compile or no longer holds one of them."""
    if tree is None:
        return None
    index = identities(tree)
    lines = set(with_lines)
    hashed = hashlib.sha256(_material(tree, lines=False))
    for name in sorted(set(ran) - {"<module>#0"}):
        if name not in index:
            return None
        hashed.update(name.encode() + b"\0" + _material(index[name], lines=name in lines))
    return hashed.hexdigest()


def _material(code: types.CodeType, lines: bool) -> bytes:
    parts = (code.co_code, tuple(_const(c) for c in code.co_consts), code.co_names, code.co_varnames,
             code.co_freevars, code.co_cellvars, code.co_argcount, code.co_posonlyargcount, code.co_kwonlyargcount,
             code.co_flags, code.co_linetable if lines else b"", code.co_firstlineno if lines else 0)
    return repr(parts).encode()


def _const(value: object) -> object:
    """A constant as it compares across processes: nested code by name, sets in a fixed order."""
    if isinstance(value, types.CodeType):
        return ("<code>", value.co_qualname)
    if isinstance(value, tuple):
        return tuple(_const(v) for v in value)
    if isinstance(value, frozenset):
        return ("<frozenset>", tuple(sorted(repr(_const(v)) for v in value)))
    if isinstance(value, float):
        return ("<float>", value.hex())
    return value
