"""A pass from the cache is a pass the project's own files earn (issue 37, item 1).

A copy of a project with its cache (``cp -a``: a second worktree, a CI workspace restored at another path), two
projects sharing one cache_dir, and a cache entry committed with a pull request (the regressed code's key, the clean
lowering's content, checksums and a mark recomputed by someone else's key) each change the model in a way ``check``
must fail on, and each must fail from the cache as it does with ``--no-cache``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from hlo_audit.cache import store as cache_store
from test_cache import CONFIG, MODEL_WITH_DROPOUT, _project, cells_of, hlo_audit

CELL = "mlp/scan-off/none/L2"


def _run(project: Path, home: Path, *args: str):
    """A command with this user's cache key under ``home`` (XDG_CACHE_HOME), not the real one."""
    return hlo_audit(project, *args, env={"XDG_CACHE_HOME": str(home)})


@pytest.mark.long  # make test's budget (stop 46): each lowers in processes of its own now
def test_a_copy_with_its_cache_checks_its_own_files(tmp_path):
    home = tmp_path / "home"
    original = _project(tmp_path / "a")
    assert _run(original, home, "golden", "update").returncode == 0
    assert all(c["cached"] for c in cells_of(_run(original, home, "check", "--format", "json")).values())
    copy = tmp_path / "b"
    shutil.copytree(original, copy, symlinks=True)  # cp -a: contents, mtimes and the cache folder
    # The copy untouched is served from the cache: its files are named relative to it, held by their content.
    same = _run(copy, home, "check", "--format", "json")
    assert same.returncode == 0 and all(c["cached"] for c in cells_of(same).values()), same.stderr
    # The copy's model edited: check fails from the cache, as it does without it; the original still passes.
    (copy / "stack/model.py").write_text(MODEL_WITH_DROPOUT)
    edited = _run(copy, home, "check")
    assert edited.returncode == 1, edited.stdout + edited.stderr
    assert "state.layers.*.dropout.rngs.*" in " ".join(edited.stdout.split())
    assert _run(copy, home, "check", "--no-cache").returncode == 1
    assert _run(original, home, "check").returncode == 0


def test_two_projects_sharing_a_cache_dir_each_check_their_own_files(tmp_path):
    home, shared = tmp_path / "home", tmp_path / "shared-cache"
    clean, edited = _project(tmp_path / "clean"), _project(tmp_path / "edited")
    for project in (clean, edited):
        (project / "hlo-audit.toml").write_text(CONFIG + f'cache_dir = "{shared}"\n')
    assert _run(clean, home, "golden", "update").returncode == 0
    shutil.copytree(clean / "golden", edited / "golden")  # both blessed the clean model
    (edited / "stack/model.py").write_text(MODEL_WITH_DROPOUT)
    result = _run(edited, home, "check", "--format", "json")
    assert result.returncode == 1 and not any(c["cached"] for c in cells_of(result).values())
    assert cells_of(result)[CELL]["entry_params"] == 9
    # Both served from the shared folder afterwards, each its own lowering.
    assert _run(clean, home, "check").returncode == 0
    again = _run(edited, home, "check", "--format", "json")
    assert again.returncode == 1 and all(c["cached"] for c in cells_of(again).values())


def _forge(cache: Path, evil: Path, monkeypatch) -> int:
    """What a pull request can commit: every regressed variant's entry rewritten to the clean lowering's content,
    its key, cell, checksums and mark recomputed (the mark with the forger's own key). Returns entries forged."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(evil))
    forged = 0
    for manifest_path in cache.rglob("*.manifest.json"):
        variants = json.loads(manifest_path.read_text())["body"]["variants"]
        regressed, clean = variants[0]["entry"], variants[1]["entry"]
        for source in sorted(cache.rglob(clean + ".*")):
            target = manifest_path.parent.parent / regressed[:2] / (regressed + source.name[len(clean):])
            target.parent.mkdir(exist_ok=True)
            raw = source.read_text()
            if raw.startswith("hlo-audit-cache "):
                first, _, text = raw.partition("\n")
                header = json.loads(first.partition(" ")[2])
                target.write_text(cache_store._text_entry({**header, "key": regressed}, text))
            else:
                doc = json.loads(raw)
                body = doc["body"]
                if doc["hlo-audit-cache"]["kind"] == "result":
                    body = {**body, "key": regressed}
                target.write_text(cache_store._json_entry({**doc["hlo-audit-cache"], "key": regressed}, body))
            forged += 1
    return forged


@pytest.mark.long  # make test's budget (stop 46): each lowers in processes of its own now
def test_a_committed_cache_entry_is_not_trusted(tmp_path, monkeypatch):
    """The forger lowers the clean and the regressed model on their own machine, then swaps the content in; the
    victim (a CI runner, another user) checks out the regressed model with that cache folder."""
    evil, victim = tmp_path / "forger-home", tmp_path / "victim-home"
    project = _project(tmp_path / "project")
    assert _run(project, evil, "golden", "update").returncode == 0
    (project / "stack/model.py").write_text(MODEL_WITH_DROPOUT)
    assert _run(project, evil, "run").returncode == 0
    manifests = len(list((project / ".hlo-audit-cache").rglob("*.manifest.json")))
    assert manifests == 2 and _forge(project / ".hlo-audit-cache", evil, monkeypatch) == 2 * 4  # hlo, record, ...
    # On the forger's machine the forgery is served (its marks are theirs): the check passes, the lie the cache
    # must not tell anyone else.
    assert _run(project, evil, "check").returncode == 0
    result = _run(project, victim, "check", "--format", "json")
    assert result.returncode == 1, result.stdout
    assert not any(c["cached"] for c in cells_of(result).values())
    said = [line for line in result.stderr.splitlines() if "not trusted" in line]
    assert len(said) == 1 and "not written by this user on this machine" in said[0], result.stderr
    # The victim's own entries are trusted afterwards: the next check is served from the cache, and still fails.
    again = _run(project, victim, "check", "--format", "json")
    assert again.returncode == 1 and all(c["cached"] for c in cells_of(again).values())
    assert "not trusted" not in again.stderr


def test_a_cache_key_others_can_read_is_refused_in_one_line(tmp_path):
    home = tmp_path / "home"
    project = _project(tmp_path / "project")
    assert _run(project, home, "list").returncode == 0
    key = home / "hlo-audit/cache-key"
    key.parent.mkdir(parents=True, exist_ok=True)
    key.write_text("0" * 64 + "\n")
    key.chmod(0o644)
    result = _run(project, home, "run")
    assert result.returncode == 2 and len(result.stderr.strip().splitlines()) == 1, result.stderr
    assert str(key) in result.stderr and "--no-cache" in result.stderr
    assert _run(project, home, "run", "--no-cache").returncode == 0


@pytest.mark.long  # make test's budget (stop 46): each lowers in processes of its own now
def test_a_committed_cache_is_not_used_even_with_a_leaked_key(tmp_path, monkeypatch):
    """A CI runner may keep its key between runs (docs/ci.md): if a forger learned it, their entries carry valid
    marks. A cache folder git tracks is never used all the same, nor rewritten."""
    home = tmp_path / "home"
    project = _project(tmp_path / "project")
    assert _run(project, home, "golden", "update").returncode == 0
    (project / "stack/model.py").write_text(MODEL_WITH_DROPOUT)
    assert _run(project, home, "run").returncode == 0
    _forge(project / ".hlo-audit-cache", home, monkeypatch)  # marked with the victim's own key
    assert _run(project, home, "check").returncode == 0  # untracked, the forgery would pass: what the test guards
    git = {"GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t",
           "PATH": "/usr/bin:/bin"}
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "a pull request with its cache"]):
        subprocess.run(["git", *args], cwd=project, env=git, check=True, capture_output=True)
    tracked = sorted(p for p in (project / ".hlo-audit-cache").rglob("*") if p.is_file())
    before = {p: p.read_bytes() for p in tracked}
    result = _run(project, home, "check", "--format", "json")
    assert result.returncode == 1 and not any(c["cached"] for c in cells_of(result).values())
    said = [line for line in result.stderr.splitlines() if "git tracks" in line]
    assert len(said) == 1 and "never used" in said[0], result.stderr
    assert {p: p.read_bytes() for p in tracked} == before
    # Nor is the last check's report read back from it: `golden update --failing` names why, exit 2, nothing written.
    refused = _run(project, home, "golden", "update", "--failing")
    assert refused.returncode == 2 and len(refused.stderr.splitlines()) == 1 and "git tracks" in refused.stderr
    assert {p: p.read_bytes() for p in tracked} == before
