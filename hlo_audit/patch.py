"""Which lines of which files a pull request changed, read from a unified diff: for ``check --changes PATCH``, which
names the changed lines of model code that no lowered cell executed.

The input is what ``git diff BASE...HEAD`` prints (with or without ``--no-prefix``, ``--binary``, renames and copies),
what ``git format-patch`` writes, or ``diff -u`` / ``diff -ru`` of two files or folders. Decisions:

- A file's lines are the new side's: each added line, and for a pure deletion (lines removed, none added at that
  spot) the new line just after the removed block, or the one just before it where nothing follows it in the hunk.
  With context (git's default of 3 lines) nothing follows only at the end of the file; under ``-U0`` a removal is
  then placed on the line before it, still next to it. A removal that leaves nothing before or after (an emptied file)
  has no line.
- Paths are the new side's, relative to the repository: a/ and b/ are stripped where git's header shows a prefix
  (``diff --git a/x b/x``: both names are one name behind one folder each), else where both ``---`` and ``+++``
  carry them (or one is /dev/null and the other carries its own); a removed file is named by its old path. Quoted
  names are decoded as git writes them (C escapes of UTF-8 bytes); an unquoted name ends at a TAB (``diff -u``'s
  timestamp, git's mark of a name with a space).
- Free text is ignored where git apply ignores it: before the first file header (a format-patch email, a commit
  message) and between files (``diff -r``'s ``Only in`` lines, a format-patch signature). A hunk is read by its
  header's counts, so a removed line that reads ``--- x`` stays a removed line; counts the body does not meet (a
  truncated diff), a line the counts have no room for, a hunk with no file, or a header that does not parse, is an
  ``InputError``. So is a combined diff (a merge's ``diff --cc``: its lines are against several parents) and a diff
  in colour (``color.ui=always``: its headers behind escape codes would read as free text).
- Two sections for one path (a format-patch series) are one file: the union of their lines, and the last section
  says whether the file is deleted.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import PurePosixPath

from hlo_audit.usage import InputError


@dataclass(frozen=True)
class ChangedFile:
    """One file a diff changes."""

    path: str  # the new side's path relative to the repository (posix, a/ b/ stripped); a deleted file's old path
    lines: tuple[int, ...]  # new-side lines the change added or replaced (module doc for deletions), sorted, unique
    deleted: bool = False  # removed by the change: no lines
    old_path: str | None = None  # where a rename or copy came from
    binary: bool = False  # git or diff said "binary": no lines known


@dataclass(frozen=True)
class Patch:
    """Every file a diff changes, in the diff's order."""

    files: tuple[ChangedFile, ...]

    def file(self, path: str) -> ChangedFile | None:
        return next((changed for changed in self.files if changed.path == path), None)


_DEV_NULL = "/dev/null"
# Digits bounded so that a hostile header is a header that does not parse, not int()'s limit on long numbers.
_HUNK = re.compile(r"@@ -([0-9]{1,18})(?:,([0-9]{1,18}))? \+([0-9]{1,18})(?:,([0-9]{1,18}))? @@.*")
_C_ESCAPES = {"a": 7, "b": 8, "t": 9, "n": 10, "v": 11, "f": 12, "r": 13, '"': 34, "\\": 92}
_COMBINED = "a combined diff (of a merge): pass the output of `git diff BASE...HEAD`"
_SHOWN = 80
# `git diff > pr.diff` under color.ui=always: each header behind a terminal's colour code, read as free text.
_COLOURED_HEADER = re.compile(r"\x1b\[[0-9;]*m(?:diff --git |--- |@@ )")


def read_patch(text: str, source: str) -> Patch:
    """The files and lines ``text`` (a unified diff) changes; ``source`` names it in an ``InputError``: not a diff,
    a truncated one, a combined one (module doc). An empty text, or only whitespace, changes nothing."""
    lines = [line.removesuffix("\r") for line in text.removeprefix("\ufeff").split("\n")]
    if text.endswith("\n"):
        lines.pop()
    reader = _Reader(lines, source)
    sections = list(reader.sections())
    if not sections:
        blank = next((n for n, line in enumerate(lines, 1) if line.strip()), None)
        if blank is not None:
            raise _not_a_diff(source, blank, lines[blank - 1], "no file header (diff --git, or --- and +++)")
        return Patch(())
    merged: dict[str, ChangedFile] = {}
    for section in sections:
        changed = reader.changed_file(section)
        earlier = merged.get(changed.path)
        if earlier is not None:
            lines_of_both = () if changed.deleted else tuple(sorted({*earlier.lines, *changed.lines}))
            changed = ChangedFile(changed.path, lines_of_both, changed.deleted, earlier.old_path or changed.old_path,
                                  earlier.binary or changed.binary)
        merged[changed.path] = changed
    return Patch(tuple(merged.values()))


def code_lines(path: str, lines: Iterable[int], source_text: str | None) -> tuple[int, ...]:
    """The lines among ``lines`` that are code in the file's new text ``source_text`` (None: unknown, all kept).
    Python: not blank, not only a comment, not in a docstring (the first statement string of a module, class or
    function), read by Python's own tokenizer, so each line of a multi-line statement or string is code; a file that
    does not parse keeps every line but blank and ``#`` ones. YAML, TOML, setup.cfg and INI files: not blank, not a
    comment. Anything else: not blank. Lines past the end of the text are dropped."""
    wanted = sorted(set(lines))
    if source_text is None:
        return tuple(wanted)
    # git counts lines by newline alone; str.splitlines would also split at form feeds and other separators.
    text_lines = source_text.split("\n")
    if source_text.endswith("\n"):
        text_lines.pop()
    text_lines = [line.removesuffix("\r") for line in text_lines]
    suffix = PurePosixPath(path).suffix.lower()
    if suffix == ".py":
        python_code = _python_code_lines(source_text)
        if python_code is not None:
            return tuple(n for n in wanted if n in python_code)
        comment_marks: tuple[str, ...] = ("#",)
    elif suffix in (".yml", ".yaml", ".toml"):
        comment_marks = ("#",)
    elif suffix in (".cfg", ".ini"):
        comment_marks = ("#", ";")  # configparser's two comment prefixes
    else:
        comment_marks = ()
    kept = []
    for n in wanted:
        if 1 <= n <= len(text_lines):
            stripped = text_lines[n - 1].strip()
            if stripped and not stripped.startswith(comment_marks):
                kept.append(n)
    return tuple(kept)


# The config files a lowering reads that a pull request's lines count as model code in (MaxText's configs/*.yml).
CONFIG_SUFFIXES = (".yml", ".yaml")


def is_model_code(path: str) -> bool:
    """Whether ``path`` can be code a lowering loads, so that its changed lines no cell reached are worth naming: a
    Python file or a YAML config, not a test (a folder ``tests``, ``test`` or ``testing``, a name ``test_*.py``,
    ``*_test.py``, ``conftest.py``), not ``setup.py``, not under ``docs/`` or a dot-folder (``.github/``), and not
    a dot-file (``.pre-commit-config.yaml``). Everything else (markdown, text, requirements, TOML, lock files,
    images) is not."""
    pure = PurePosixPath(path)
    suffix = pure.suffix.lower()
    if suffix not in (".py", *CONFIG_SUFFIXES):
        return False
    if any(part.startswith(".") for part in pure.parts) or any(part in ("docs", "tests", "test", "testing")
                                                                for part in pure.parts[:-1]):
        return False
    name = pure.name
    return not (name.startswith("test_") or name.endswith("_test.py") or name in ("conftest.py", "setup.py"))


def ranges(lines: Iterable[int]) -> tuple[tuple[int, int], ...]:
    """``lines`` as sorted runs of consecutive numbers: 3, 4, 5, 9 -> (3, 5), (9, 9)."""
    runs: list[tuple[int, int]] = []
    for n in sorted(set(lines)):
        if runs and runs[-1][1] == n - 1:
            runs[-1] = (runs[-1][0], n)
        else:
            runs.append((n, n))
    return tuple(runs)


def range_text(path: str, lines: Iterable[int]) -> list[str]:
    """``model.py:3-5``, ``model.py:9``: each run of ``lines`` in ``path``."""
    return [f"{path}:{first}" if first == last else f"{path}:{first}-{last}" for first, last in ranges(lines)]


# --------------------------------------------------------------------------------------------------------------
# Reading the diff
# --------------------------------------------------------------------------------------------------------------


@dataclass
class _Section:
    """One file's part of the diff as it is read: what its header lines named, and the new lines its hunks touched."""

    line: int  # where it starts, for an error naming it
    git: bool  # begun by `diff --git`, whose extended header lines follow
    header_path: str | None = None  # the one path `diff --git` names where both its names are one (no rename)
    header_prefixed: bool | None = None  # whether that header's names carry a/ b/ (None: the header cannot tell)
    minus: str | None = None  # the `---` and `+++` names as written (unquoted, before any prefix is stripped)
    plus: str | None = None
    renamed_from: str | None = None  # `rename from` / `copy from`
    renamed_to: str | None = None
    removed: bool = False  # `deleted file mode`
    binary: bool = False
    lines: set[int] = field(default_factory=set)


class _Reader:
    """The diff's lines, read once from the top into sections (module doc says what is ignored and what refused)."""

    def __init__(self, lines: list[str], source: str) -> None:
        self.lines = lines
        self.source = source

    def sections(self) -> Iterator[_Section]:
        section: _Section | None = None
        # Whether the line before ended a hunk: a body line there is one the header's counts have no room for.
        after_hunk = False
        n = 0
        while n < len(self.lines):
            line = self.lines[n]
            number = n + 1
            n += 1
            if line.startswith(("diff --cc ", "diff --combined ", "@@@")):
                raise self.error(number, _COMBINED)
            if _COLOURED_HEADER.match(line):
                raise self.error(number, "colour codes: write it with git diff --no-color")
            if line.startswith("diff --git "):
                if section is not None:
                    yield section
                section = _Section(number, git=True)
                self.read_git_header(section, line)
            elif self.file_header_at(n - 1):
                # git's ---/+++ follow its extended header; any other pair begins a file of its own.
                if section is None or not section.git or section.minus is not None:
                    if section is not None:
                        yield section
                    section = _Section(number, git=False)
                section.minus = self.name(line[4:], number, cut_at_tab=True)
                section.plus = self.name(self.lines[n][4:], n + 1, cut_at_tab=True)
                n += 1
            elif line.startswith("@@"):
                if section is None or section.minus is None:
                    raise self.error(number, "a hunk before any file header")
                n = self.read_hunk(section, n - 1)
                after_hunk = True
                continue
            # A format-patch signature ("-- ", or "--" where a mailer stripped the space) may follow the last hunk.
            elif after_hunk and line.startswith(("+", "-", " ")) and not line.startswith("-- ") and line != "--":
                raise self.error(number, "a line past its hunk's counts")
            elif section is not None and section.git and section.minus is None:
                self.read_git_extended(section, line, number)
            elif line.startswith("Binary files ") and line.endswith(" differ"):
                if section is not None:
                    yield section
                section = self.binary_section(line, number)
            after_hunk = after_hunk and line.startswith("\\")
        if section is not None:
            yield section

    def read_git_header(self, section: _Section, line: str) -> None:
        """The one path of ``diff --git A B`` where A and B name one file: equal (``--no-prefix``), or equal past
        their first folder (a/ b/, or any prefix git was given). Unquoted names may hold spaces: the split that makes
        them one is the one git takes. A rename's names differ: its ``rename to`` line names it instead."""
        names = line[len("diff --git "):]
        if names.startswith('"') or names.endswith('"'):
            pair = self.quoted_pair(names, section.line)
            splits = [pair] if pair else []
        else:
            splits = [(names[:i], names[i + 1:]) for i, char in enumerate(names) if char == " "]
        for old, new in splits:
            if old == new:
                section.header_path, section.header_prefixed = new, False
                return
            unprefixed = _past_first_folder(new)
            if unprefixed is not None and unprefixed == _past_first_folder(old):
                section.header_path, section.header_prefixed = unprefixed, True
                return

    def quoted_pair(self, names: str, number: int) -> tuple[str, str] | None:
        """The two names of a ``diff --git`` line where one is quoted: git quotes a name with a TAB, a quote, a
        backslash or (by default) a byte past ASCII."""
        if names.startswith('"'):
            old, end = _unquote(names, 0)
            if old is None or names[end:end + 1] != " ":
                raise self.error(number, "a quoted name that does not end")
            rest = names[end + 1:]
            new = self.name(rest, number, cut_at_tab=False)
            return old, new
        start = names.rfind(' "')
        if start < 0:
            return None
        new, end = _unquote(names, start + 1)
        return (names[:start], new) if new is not None and end == len(names) else None

    def read_git_extended(self, section: _Section, line: str, number: int) -> None:
        """git's extended header lines between ``diff --git`` and ``---``; others (index, modes) say nothing here."""
        for word in ("rename from ", "copy from "):
            if line.startswith(word):
                section.renamed_from = self.name(line[len(word):], number, cut_at_tab=False)
        for word in ("rename to ", "copy to "):
            if line.startswith(word):
                section.renamed_to = self.name(line[len(word):], number, cut_at_tab=False)
        if line.startswith("deleted file mode"):
            section.removed = True
        if line == "GIT binary patch" or (line.startswith("Binary files ") and line.endswith(" differ")):
            section.binary = True

    def binary_section(self, line: str, number: int) -> _Section:
        """``diff -r``'s line for a binary file, which has no header of its own: ``Binary files A and B differ``.
        A name may hold " and ": the split whose names match (module doc's prefix rule) is taken, else the first."""
        body = line[len("Binary files "):-len(" differ")]
        splits = []
        if body.startswith('"'):
            old, end = _unquote(body, 0)
            if old is not None and body[end:end + 5] == " and ":
                splits.append((old, self.name(body[end + 5:], number, cut_at_tab=False)))
        else:
            at = body.find(" and ")
            while at >= 0:
                splits.append((body[:at], self.name(body[at + 5:], number, cut_at_tab=False)))
                at = body.find(" and ", at + 1)
        if not splits:
            raise self.error(number, "a binary file line that names no files")
        matching = [pair for pair in splits if len(set(_strip_prefixes(*pair, None)) - {None}) == 1]
        section = _Section(number, git=False, binary=True)
        section.minus, section.plus = (matching or splits)[0]
        return section

    def read_hunk(self, section: _Section, start: int) -> int:
        """The hunk whose header is ``self.lines[start]``: its changed new lines go into ``section``. Returns the
        index of the line after its body."""
        header = self.lines[start]
        match = _HUNK.fullmatch(header)
        if match is None:
            raise self.error(start + 1, "a hunk header that does not parse")
        _, old_count, new_start, new_count = (int(g) if g is not None else 1 for g in match.groups())
        old_left, new_left = old_count, new_count
        kinds: list[str] = []  # ' ', '+' or '-' per body line, markers (\ No newline at end of file) left out
        n = start + 1
        while old_left or new_left:
            line = self.lines[n] if n < len(self.lines) else None
            # git apply reads an empty line in a hunk as an empty context line (an editor stripped its space).
            kind = " " if line == "" else line[:1] if line is not None else None
            fits = {" ": old_left and new_left, "-": old_left, "+": new_left, "\\": True}.get(kind or "", False)
            if not fits:
                found = f"found {old_count - old_left} old / {new_count - new_left} new"
                expects = f"hunk at line {start + 1} expects {old_count} old / {new_count} new lines"
                # Not a body line, or the next file's ---/+++ where the body should go on: the diff was cut there.
                if line is None or kind not in (" ", "-", "+") or self.file_header_at(n):
                    raise InputError(f"{self.source}: not a unified diff (truncated: {expects}, {found})")
                raise self.error(n + 1, f"{expects}, {found} before this line")
            if kind != "\\":
                kinds.append(kind)
                old_left -= kind != "+"
                new_left -= kind != "-"
            n += 1
        section.lines.update(_changed_new_lines(kinds, new_start if new_count else new_start + 1))
        return n

    def file_header_at(self, index: int) -> bool:
        """Whether ``self.lines[index]`` begins a ``---`` / ``+++`` pair."""
        return (index + 1 < len(self.lines) and self.lines[index].startswith("--- ")
                and self.lines[index + 1].startswith("+++ "))

    def name(self, text: str, number: int, cut_at_tab: bool) -> str:
        """A path as a header line writes it: quoted (C escapes of UTF-8 bytes) or as is, up to a TAB where the
        line may go on (``diff -u``'s timestamp, git's mark of a name with a space)."""
        if text.startswith('"'):
            name, _ = _unquote(text, 0)
            if name is None:
                raise self.error(number, "a quoted name that does not end")
            return name
        return text.partition("\t")[0] if cut_at_tab else text

    def changed_file(self, section: _Section) -> ChangedFile:
        old = new = None
        if section.minus is not None and section.plus is not None:
            old, new = _strip_prefixes(section.minus, section.plus, section.header_prefixed)
        deleted = section.removed or section.plus == _DEV_NULL
        path = (old if deleted else section.renamed_to or new) or section.header_path
        if not path:
            raise self.error(section.line, "a file header that names no file")
        return ChangedFile(path, () if deleted or section.binary else tuple(sorted(section.lines)), deleted,
                           section.renamed_from if section.renamed_to else None, section.binary)

    def error(self, number: int, why: str) -> InputError:
        return _not_a_diff(self.source, number, self.lines[number - 1], why)


def _changed_new_lines(kinds: list[str], first_new: int) -> Iterator[int]:
    """The new lines a hunk's body touches, numbered from ``first_new``: each added line, and for a run of removed
    lines with no added line beside it, the new line after it (a context line) or, with none, the one before."""
    new_line = first_new
    for at, kind in enumerate(kinds):
        if kind == "+":
            yield new_line
        elif kind == "-" and (at + 1 == len(kinds) or kinds[at + 1] != "-"):
            run_start = at
            while run_start and kinds[run_start - 1] == "-":
                run_start -= 1
            before = kinds[run_start - 1] if run_start else None
            after = kinds[at + 1] if at + 1 < len(kinds) else None
            if after == " " and before != "+":
                yield new_line
            elif after is None and before != "+" and new_line > 1:
                yield new_line - 1
        if kind != "-":
            new_line += 1


def _strip_prefixes(old: str, new: str, prefixed: bool | None) -> tuple[str | None, str | None]:
    """The ``---`` and ``+++`` names as repository paths (None for /dev/null). ``prefixed``: what git's header said
    (strip the first folder, or nothing); None: strip a/ and b/ only where both carry theirs, or one is /dev/null
    and the other carries its own."""
    if prefixed is None:
        old_prefixed, new_prefixed = old.startswith("a/"), new.startswith("b/")
        prefixed = ((old_prefixed and new_prefixed) or (old == _DEV_NULL and new_prefixed)
                    or (old_prefixed and new == _DEV_NULL))

    def path(name: str) -> str | None:
        if name == _DEV_NULL:
            return None
        return (_past_first_folder(name) or name) if prefixed else name

    return path(old), path(new)


def _past_first_folder(name: str) -> str | None:
    folder, slash, rest = name.partition("/")
    return rest if slash and folder else None


def _unquote(text: str, start: int) -> tuple[str | None, int]:
    """The C-quoted name at ``text[start]`` (a '"') decoded as git does (escapes name bytes, read as UTF-8), and the
    index past its closing quote; (None, start) where it does not end."""
    raw = bytearray()
    n = start + 1
    while n < len(text):
        char = text[n]
        if char == '"':
            return raw.decode("utf-8", errors="replace"), n + 1
        if char == "\\":
            escape = text[n + 1:n + 2]
            octal = text[n + 1:n + 4]
            if len(octal) == 3 and all(c in "01234567" for c in octal):
                raw.append(int(octal, 8) & 0xFF)
                n += 4
                continue
            if escape not in _C_ESCAPES:
                return None, start
            raw.append(_C_ESCAPES[escape])
            n += 2
            continue
        raw += char.encode("utf-8", errors="surrogatepass")
        n += 1
    return None, start


def _not_a_diff(source: str, number: int, line: str, why: str) -> InputError:
    shown = line if len(line) <= _SHOWN else line[:_SHOWN - 3] + "..."
    return InputError(f"{source}: not a unified diff (line {number}: {shown!r}): {why}")


def _python_code_lines(source_text: str) -> set[int] | None:
    """The lines of Python source that hold a token other than a comment or a docstring (a multi-line token, a
    string, counts on each of its lines); None where the source does not parse."""
    try:
        # The user's file's own SyntaxWarnings (an invalid escape) are not hlo-audit's to print.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tree = ast.parse(source_text)
        tokens = list(tokenize.generate_tokens(io.StringIO(source_text).readline))
    # Null bytes (a ValueError before Python 3.12), nesting deeper than the parser's stack (a MemoryError) or the
    # compiler's recursion takes, an unclosed bracket tokenize meets first: each a file that does not parse.
    except (SyntaxError, ValueError, RecursionError, MemoryError, tokenize.TokenError):
        return None
    docstring_rows: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
                    and isinstance(first.value.value, str)):
                docstring_rows.update(range(first.lineno, (first.end_lineno or first.lineno) + 1))
    silent = {tokenize.COMMENT, tokenize.NL, tokenize.NEWLINE, tokenize.INDENT, tokenize.DEDENT, tokenize.ENDMARKER}
    code: set[int] = set()
    for token in tokens:
        rows = range(token.start[0], token.end[0] + 1)
        # A docstring's string tokens are no code; what shares its line (`def f(): "doc"`) is.
        if token.type in silent or (token.type == tokenize.STRING and set(rows) <= docstring_rows):
            continue
        code.update(rows)
    return code
