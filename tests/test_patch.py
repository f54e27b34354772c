"""Reading a unified diff into the lines a change touched (hlo_audit.patch): real diffs git and diff print of edits
whose changed lines are known, the header and hunk forms they can take, and input that is not a diff."""

from __future__ import annotations

import os
import random
import subprocess
import warnings
from pathlib import Path

import pytest

from hlo_audit.patch import ChangedFile, Patch, code_lines, is_model_code, range_text, ranges, read_patch
from hlo_audit.usage import InputError

# git as a fresh install has it: no user's config (diff.noprefix, diff.renames, a pager) changes what it prints.
GIT_ENV = {**os.environ, "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1", "LC_ALL": "C"}
OLD_MODEL = "".join(f"line {n}\n" for n in range(1, 21))
# Line 3 replaced, three lines added after line 8, lines 14-15 removed (the middle), lines 19-20 removed (the end).
NEW_MODEL = "".join(
    ["line 1\n", "line 2\n", "line 3 changed\n"] + [f"line {n}\n" for n in range(4, 9)]
    + ["added 1\n", "added 2\n", "added 3\n"] + [f"line {n}\n" for n in range(9, 14)] + [f"line {n}\n" for n in (16, 17, 18)]
)
# New lines: 3 (replaced), 9-11 (added), 17 (line 16 now, just after the middle removal), 19 (line 18 now, just
# before the removal at the end).
MODEL_LINES = (3, 9, 10, 11, 17, 19)
SPACED = "dir with space/f\u00e9.py"


def git(repo: Path, *args: str, check: bool = True) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@example.com", *args], cwd=repo,
                          env=GIT_ENV, check=check, capture_output=True, text=True).stdout


def commit_all(repo: Path, message: str) -> None:
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", message)


@pytest.fixture
def repo(tmp_path) -> Path:
    """A repository whose second commit edits model.py (MODEL_LINES), renames one file, renames and edits another,
    deletes one, adds one, changes a binary file and edits files with a space (and é) in their names."""
    git(tmp_path, "init", "-q", ".")
    (tmp_path / "model.py").write_text(OLD_MODEL)
    (tmp_path / "old_name.py").write_text("".join(f"kept {n}\n" for n in range(10)))
    (tmp_path / "config.yml").write_text("".join(f"key{n}: {n}\n" for n in range(10)))
    (tmp_path / "gone.py").write_text("x = 1\n")
    (tmp_path / "image.bin").write_bytes(b"\x00\x01\x02" * 10)
    (tmp_path / "dir with space").mkdir()
    (tmp_path / SPACED).write_text("a = 1\nb = 2\n")
    (tmp_path / "plain space.py").write_text("a = 1\n")
    commit_all(tmp_path, "base")
    (tmp_path / "model.py").write_text(NEW_MODEL)
    (tmp_path / "old_name.py").rename(tmp_path / "new_name.py")
    (tmp_path / "configs").mkdir()
    (tmp_path / "config.yml").rename(tmp_path / "configs" / "config.yml")
    (tmp_path / "configs" / "config.yml").write_text("".join(f"key{n}: {n * (n != 5)}\n" for n in range(10)))
    (tmp_path / "gone.py").unlink()
    (tmp_path / "new.py").write_text("".join(f"n{n} = {n}\n" for n in range(5)))
    (tmp_path / "image.bin").write_bytes(b"\x00\x01\x03" * 10)
    (tmp_path / SPACED).write_text("a = 1\nb = 3\n")
    (tmp_path / "plain space.py").write_text("a = 2\n")
    commit_all(tmp_path, "change")
    return tmp_path


EXPECTED = {
    "model.py": ChangedFile("model.py", MODEL_LINES),
    "new_name.py": ChangedFile("new_name.py", (), old_path="old_name.py"),
    "configs/config.yml": ChangedFile("configs/config.yml", (6,), old_path="config.yml"),
    "gone.py": ChangedFile("gone.py", (), deleted=True),
    "new.py": ChangedFile("new.py", (1, 2, 3, 4, 5)),
    "image.bin": ChangedFile("image.bin", (), binary=True),
    SPACED: ChangedFile(SPACED, (2,)),
    "plain space.py": ChangedFile("plain space.py", (1,)),
}


@pytest.mark.parametrize("options", [[], ["--no-prefix"], ["--binary"], ["--src-prefix=i/", "--dst-prefix=w/"]],
                         ids=["prefix", "no-prefix", "binary-patch", "other-prefix"])
def test_git_diff_of_a_pull_request(repo, options):
    text = git(repo, "diff", "-M", *options, "HEAD~1...HEAD")
    patch = read_patch(text, "pr.diff")
    assert {changed.path: changed for changed in patch.files} == EXPECTED
    assert len(patch.files) == text.count("\ndiff --git ") + 1 == len(EXPECTED)  # one file per section
    assert patch.file("model.py") == EXPECTED["model.py"] and patch.file("nothing.py") is None


def test_the_model_edit_hunk_by_hunk(repo):
    """Each kind of hunk on its own (-U1 keeps them apart): a replacement, an added block, removals in the middle and
    at the end; and -U0, where a removal with nothing after it in its hunk is placed on the line before it."""
    assert read_patch(git(repo, "diff", "-U1", "HEAD~1", "--", "model.py"), "p").files == (
        ChangedFile("model.py", MODEL_LINES),)
    hunks = [line.partition(" @@")[0] + " @@" for line in git(repo, "diff", "-U0", "HEAD~1", "--", "model.py").splitlines()
             if line.startswith("@@")]
    assert hunks == ["@@ -3 +3 @@", "@@ -8,0 +9,3 @@", "@@ -14,2 +16,0 @@", "@@ -19,2 +19,0 @@"]
    assert read_patch(git(repo, "diff", "-U0", "HEAD~1", "--", "model.py"), "p").files == (
        ChangedFile("model.py", (3, 9, 10, 11, 16, 19)),)


def test_format_patch_email_and_crlf(repo):
    """git format-patch's mail (headers, message, diffstat, signature) reads as its diff; so does a diff with CRLF
    line endings."""
    mail = git(repo, "format-patch", "-1", "-M", "--stdout", "HEAD")
    assert mail.startswith("From ") and "\n-- \n" in mail
    patch = read_patch(mail, "change.patch")
    assert {changed.path: changed for changed in patch.files} == EXPECTED
    crlf = git(repo, "diff", "-M", "HEAD~1...HEAD").replace("\n", "\r\n")
    assert read_patch(crlf, "pr.diff") == read_patch(crlf.replace("\r\n", "\n"), "pr.diff")
    # A mailer that strips the signature's trailing space.
    assert read_patch(mail.replace("\n-- \n", "\n--\n"), "change.patch") == patch


def test_a_coloured_diff_says_so(repo):
    coloured = git(repo, "diff", "--color=always", "HEAD~1...HEAD")
    with pytest.raises(InputError, match=r"^pr\.diff: not a unified diff \(line 1: .*colour codes.*--no-color$"):
        read_patch(coloured, "pr.diff")


def test_mode_change_copy_and_no_newline_at_end(tmp_path):
    git(tmp_path, "init", "-q", ".")
    (tmp_path / "a.py").write_text("".join(f"a{n} = {n}\n" for n in range(10)))
    (tmp_path / "run.sh").write_text("echo hi\n")
    (tmp_path / "tail.py").write_text("x = 1\ny = 2")
    commit_all(tmp_path, "base")
    (tmp_path / "b.py").write_text((tmp_path / "a.py").read_text() + "extra = 1\n")
    (tmp_path / "run.sh").chmod(0o755)
    (tmp_path / "tail.py").write_text("x = 1\ny = 3")
    commit_all(tmp_path, "copy")
    text = git(tmp_path, "diff", "-C", "--find-copies-harder", "HEAD~1...HEAD")
    assert "copy from a.py" in text and "new mode 100755" in text and "\\ No newline at end of file" in text
    assert read_patch(text, "p").files == (
        ChangedFile("b.py", (11,), old_path="a.py"),
        ChangedFile("run.sh", ()),
        ChangedFile("tail.py", (2,)),
    )


def test_a_merge_commit_shown_as_combined_diff_is_refused(tmp_path):
    git(tmp_path, "init", "-q", "-b", "main", ".")
    (tmp_path / "m.py").write_text("a = 1\n")
    commit_all(tmp_path, "base")
    git(tmp_path, "checkout", "-q", "-b", "side")
    (tmp_path / "m.py").write_text("a = 2\n")
    commit_all(tmp_path, "side")
    git(tmp_path, "checkout", "-q", "main")
    (tmp_path / "m.py").write_text("a = 3\n")
    commit_all(tmp_path, "main")
    assert "CONFLICT" in git(tmp_path, "merge", "side", check=False)
    (tmp_path / "m.py").write_text("a = 4\n")
    commit_all(tmp_path, "merge")
    combined = git(tmp_path, "show", "--format=", "HEAD")
    assert combined.startswith("diff --cc m.py")
    with pytest.raises(InputError, match=r"git diff BASE\.\.\.HEAD"):
        read_patch(combined, "merge.diff")
    # The hunk alone, under an ordinary file header, is refused the same way.
    hunk = combined[combined.index("@@@"):]
    with pytest.raises(InputError, match=r"combined diff .*git diff BASE\.\.\.HEAD"):
        read_patch(f"--- a/m.py\n+++ b/m.py\n{hunk}", "merge.diff")


def test_diff_u_of_two_files_and_of_two_folders(tmp_path):
    (tmp_path / "old").mkdir()
    (tmp_path / "new").mkdir()
    (tmp_path / "old" / "model.py").write_text(OLD_MODEL)
    (tmp_path / "new" / "model.py").write_text(NEW_MODEL)
    (tmp_path / "old" / "blob.bin").write_bytes(b"\x00\x01")
    (tmp_path / "new" / "blob.bin").write_bytes(b"\x00\x02")
    (tmp_path / "old" / "only_old.py").write_text("x = 1\n")

    def diff(*args: str) -> str:
        return subprocess.run(["diff", *args], cwd=tmp_path, capture_output=True, text=True).stdout

    one = diff("-u", "old/model.py", "new/model.py")
    assert one.splitlines()[0].startswith("--- old/model.py\t")  # a timestamp after a TAB
    assert read_patch(one, "p").files == (ChangedFile("new/model.py", MODEL_LINES),)
    folders = diff("-ru", "old", "new")
    assert "Only in old: only_old.py" in folders and "Binary files old/blob.bin and new/blob.bin differ" in folders
    assert read_patch(folders, "p").files == (ChangedFile("new/blob.bin", (), binary=True),
                                              ChangedFile("new/model.py", MODEL_LINES))
    # diff quotes a name with a space itself (GNU diffutils 3.8 and later).
    (tmp_path / "new" / "a b.py").write_text("x = 2\n")
    (tmp_path / "old" / "a b.py").write_text("x = 1\n")
    spaced = diff("-u", "old/a b.py", "new/a b.py")
    assert read_patch(spaced, "p").files == (ChangedFile("new/a b.py", (1,)),)


def section(old: str, new: str, *hunk: str) -> str:
    return "\n".join([f"--- {old}", f"+++ {new}", *hunk]) + "\n"


@pytest.mark.parametrize(("old", "new", "path", "deleted"), [
    ("a/model.py", "b/model.py", "model.py", False),
    ("model.py", "model.py", "model.py", False),  # --no-prefix
    ("a/model.py", "c/model.py", "c/model.py", False),  # only one side carries its prefix: a folder, not a prefix
    ("/dev/null", "b/model.py", "model.py", False),
    ("/dev/null", "model.py", "model.py", False),
    ("a/model.py\t2024-01-01 10:00:00.000000000 +0000", "b/model.py\t2024-01-01", "model.py", False),
])
def test_prefix_of_plus_and_minus_names(old, new, path, deleted):
    text = section(old, new, "@@ -0,0 +1 @@" if old == "/dev/null" else "@@ -1 +1 @@",
                   *([] if old == "/dev/null" else ["-x"]), "+y")
    assert read_patch(text, "p").files == (ChangedFile(path, (1,), deleted),)


def test_deleted_file_without_git_header():
    assert read_patch(section("a/x.py", "/dev/null", "@@ -1,2 +0,0 @@", "-a", "-b"), "p").files == (
        ChangedFile("x.py", (), deleted=True),)


def test_quoted_names_decode_as_git_writes_them():
    text = ('diff --git "a/dir with space/f\\303\\251.py" "b/dir with space/f\\303\\251.py"\n'
            "index 1..2 100644\n"
            '--- "a/dir with space/f\\303\\251.py"\n'
            '+++ "b/dir with space/f\\303\\251.py"\n'
            "@@ -1 +1 @@\n-a\n+b\n"
            'diff --git a/plain.py "b/t\\303\\251\\tab.py"\n'
            "similarity index 90%\nrename from plain.py\n"
            'rename to "t\\303\\251\\tab.py"\n')
    assert read_patch(text, "p").files == (ChangedFile(SPACED, (1,)),
                                           ChangedFile("t\u00e9\tab.py", (), old_path="plain.py"))


def test_hunk_header_forms():
    """Counts default to 1; a new file's hunk starts at 0,0; text after the second @@ is the function it is in."""
    text = section("a/m.py", "b/m.py",
                   "@@ -3 +3,2 @@ def f():", "-old", "+new", "+more",
                   "@@ -10,2 +11 @@", " same", "-gone")
    assert read_patch(text, "p").files == (ChangedFile("m.py", (3, 4, 11)),)
    assert read_patch(section("/dev/null", "b/n.py", "@@ -0,0 +1,5 @@", *["+x"] * 5), "p").files == (
        ChangedFile("n.py", (1, 2, 3, 4, 5)),)


def test_removed_lines_that_read_like_headers_stay_in_their_hunk():
    """A hunk is read by its counts: a removed `-- x` line prints as `--- x`, an added `++ y` as `+++ y`."""
    text = section("a/m.py", "b/m.py", "@@ -1,3 +1,3 @@", " keep", "--- x", "+++ y", " keep")
    assert read_patch(text, "p").files == (ChangedFile("m.py", (2,)),)


def test_empty_context_line_and_removal_of_a_whole_file():
    # An editor that strips trailing spaces turns an empty context line " " into "".
    text = section("a/m.py", "b/m.py", "@@ -1,3 +1,3 @@", " a", "", "-c", "+d")
    assert read_patch(text, "p").files == (ChangedFile("m.py", (3,)),)
    # Everything removed and nothing left: no line to name.
    assert read_patch(section("a/m.py", "b/m.py", "@@ -1,2 +0,0 @@", "-a", "-b"), "p").files == (
        ChangedFile("m.py", ()),)


def test_two_sections_of_one_file_merge():
    text = section("a/m.py", "b/m.py", "@@ -1 +1 @@", "-a", "+b") + section("a/x.py", "b/x.py", "@@ -1 +1 @@", "-a",
                                                                           "+b")
    text += section("a/m.py", "b/m.py", "@@ -5 +5,2 @@", " a", "+b")
    assert read_patch(text, "p").files == (ChangedFile("m.py", (1, 6)), ChangedFile("x.py", (1,)))


@pytest.mark.parametrize("text", ["", "\n", "  \n\t\n", "\r\n"])
def test_empty_text_changes_nothing(text):
    assert read_patch(text, "p") == Patch(())


@pytest.mark.parametrize(("text", "message"), [
    ("just some words\nand more\n", r"^p: not a unified diff \(line 1: 'just some words'\): no file header"),
    ("\n\nsee: 'this'\n", r"^p: not a unified diff \(line 3: \"see: 'this'\"\)"),
    ("@@ -1 +1 @@\n-a\n+b\n", r"\(line 1: '@@ -1 \+1 @@'\): a hunk before any file header"),
    (section("a/m.py", "b/m.py", "@@ -x +y @@"), r"\(line 3: '@@ -x \+y @@'\): a hunk header that does not parse"),
    (section("a/m.py", "b/m.py", "@@ -1," + "9" * 100 + " +1 @@"), r"\(line 3: '@@ -1,9999.*\.\.\.'\)"),
    (section("a/m.py", "b/m.py", "@@ -1,3 +1,3 @@", " a", "-b"),
     r"^p: not a unified diff \(truncated: hunk at line 3 expects 3 old / 3 new lines, found 2 old / 1 new\)$"),
    (section("a/m.py", "b/m.py", "@@ -1,2 +1,2 @@", " a", "-b") + section("a/n.py", "b/n.py"),
     r"truncated: hunk at line 3 expects 2 old / 2 new lines, found 2 old / 1 new"),
    (section("a/m.py", "b/m.py", "@@ -1 +1 @@", "-a", "-b", "+c"),
     r"\(line 5: '-b'\): hunk at line 3 expects 1 old / 1 new lines, found 1 old / 0 new before this line"),
    (section("a/m.py", "b/m.py", "@@ -1 +1 @@", "-a", "+b", "+c"), r"\(line 6: '\+c'\): a line past its hunk's counts"),
    ("diff --cc m.py\nindex 1,2..3\n", r"\(line 1: 'diff --cc m.py'\): a combined diff"),
    ("diff --git \"a/m.py b/m.py\n", r"\(line 1: .*\): a quoted name that does not end"),
    ("diff --git a b\nindex 1..2\n", r"\(line 1: 'diff --git a b'\): a file header that names no file"),
    ("junk\x00\x01\x02 \udcff\n\x00", r"^p: not a unified diff \(line 1: 'junk\\x00\\x01\\x02 \\udcff'\)"),
])
def test_not_a_diff(text, message):
    with pytest.raises(InputError, match=message):
        read_patch(text, "p")


def test_a_diff_cut_in_the_middle_of_a_hunk(repo):
    text = git(repo, "diff", "-M", "HEAD~1...HEAD")
    body = text.index("\n+added 2\n")
    with pytest.raises(InputError, match=r"^pr\.diff: not a unified diff \(truncated: hunk at line \d+ expects"):
        read_patch(text[:body], "pr.diff")


def test_random_input_is_a_patch_or_an_input_error(repo):
    """200 random byte strings, and 200 real diffs with lines dropped, doubled or scrambled: a Patch or an
    InputError, never another exception."""
    rng = random.Random(20240601)
    real = git(repo, "diff", "-M", "HEAD~1...HEAD").splitlines()
    texts = [bytes(rng.randrange(256) for _ in range(rng.randrange(400))).decode("utf-8", errors="replace")
             for _ in range(200)]
    for _ in range(200):
        lines = list(real)
        for _ in range(rng.randrange(1, 4)):
            at = rng.randrange(len(lines))
            edit = rng.choice(["drop", "double", "scramble"])
            if edit == "drop":
                del lines[at]
            elif edit == "double":
                lines.insert(at, lines[at])
            else:
                lines[at] = "".join(rng.sample(lines[at], len(lines[at])))
        texts.append("\n".join(lines))
    outcomes = {"patch": 0, "input error": 0}
    for text in texts:
        try:
            assert isinstance(read_patch(text, "fuzz"), Patch)
            outcomes["patch"] += 1
        except InputError as error:
            assert "\n" not in str(error)
            outcomes["input error"] += 1
    assert outcomes["patch"] and outcomes["input error"], outcomes


PYTHON = '''"""Module docstring
over two lines."""

import os  # why it is imported
# a comment alone


def f(x):
    """Function docstring
    over three
    lines."""
    y = call(
        x,
        # a comment inside the call
        2,
    )
    return y


class C:
    "One line docstring."
    text = """a string that is code

# not a comment
"""
def g(): "docstring beside its def"
'''


def test_code_lines_of_python():
    assert code_lines("m.py", range(0, 40), PYTHON) == (4, 8, 12, 13, 15, 16, 17, 20, 22, 23, 24, 25, 26)
    # A file that does not parse keeps every line but blank and comment ones.
    assert code_lines("m.py", range(1, 6), "def (:\n\n    # c\nx = 1\n") == (1, 4)
    # Nesting deeper than Python's parser takes (a MemoryError there) is a file that does not parse too.
    assert code_lines("m.py", (1, 2), "x = " + "-" * 100_000 + "1\n\n") == (1,)
    assert code_lines("m.py", [2, 1, 2, 7], None) == (1, 2, 7)


def test_code_lines_keeps_the_files_own_warnings_quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert code_lines("m.py", (1, 2), 'pattern = "\\d+"\n\n') == (1,)


def test_code_lines_of_configs_and_other_files():
    yaml = "# a comment\nkey: 1\n\n  # an indented comment\nother: 2  # after a value\n"
    assert code_lines("configs/c.yaml", range(1, 9), yaml) == (2, 5)
    assert code_lines("c.yml", range(1, 9), yaml) == code_lines("p.toml", range(1, 9), yaml) == (2, 5)
    assert code_lines("setup.cfg", range(1, 4), "; a comment\n[x]\n# another\n") == (2,)
    assert code_lines("README.md", range(1, 5), "# Title\n\ntext\r\n") == (1, 3)
    # git's lines are split at newlines only: a form feed stays inside its line (str.splitlines would split it).
    assert code_lines("notes.txt", (1, 2, 3), "a\x0cb\n\nc\n") == (1, 3)


@pytest.mark.parametrize(("path", "expected"), [
    ("model.py", True),
    ("pkg/layers/attention.py", True),
    ("examples/train.py", True),
    ("configs/base.yml", True),
    ("configs/base.yaml", True),
    ("tests/test_model.py", False),
    ("pkg/test/helpers.py", False),
    ("pkg/testing/fakes.py", False),
    ("test_model.py", False),
    ("model_test.py", False),
    ("conftest.py", False),
    ("setup.py", False),
    ("docs/conf.py", False),
    ("docs/config.yml", False),
    (".github/workflows/ci.yml", False),
    (".github/scripts/tool.py", False),
    (".pre-commit-config.yaml", False),
    ("tests/data/config.yml", False),
    ("README.md", False),
    ("requirements.txt", False),
    ("pyproject.toml", False),
    ("setup.cfg", False),
    ("uv.lock", False),
    ("images/plot.png", False),
])
def test_is_model_code(path, expected):
    assert is_model_code(path) is expected


def test_ranges_and_their_text():
    assert ranges([9, 3, 5, 4, 4]) == ((3, 5), (9, 9))
    assert ranges([]) == ()
    assert range_text("model.py", [3, 4, 5, 9]) == ["model.py:3-5", "model.py:9"]
