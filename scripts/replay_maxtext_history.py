"""Replay MaxText's history through `hlo-audit check`: how many commits re-lower cells with the per-cell cache key,
side by side with the key it replaced (a fingerprint of MaxText's whole package), in one run.

Run by hand (48 minutes for the 37 commits on the shared 2-core machine: not part of `make bench`), with the
hlo-audit of this checkout and a MaxText git repository (a clone, or the bare mirror the `fetch` tool gives)::

    nice -n 10 .venv/bin/python scripts/replay_maxtext_history.py /path/to/maxtext.git \\
        --range f347a2173..538fe7a3f --workdir /tmp/hlo-audit-replay

To look at one pull request's findings instead (its cells only, the failing check kept, no old key)::

    nice -n 10 .venv/bin/python scripts/replay_maxtext_history.py /path/to/maxtext.git \\
        --range 014fc4985^..014fc4985 --workdir /tmp/mtpr/014fc4985 --models gemma4-26b --keep-failing \\
        --old-key-every 0

What it does, all under ``--workdir`` (its ``maxtext/``, ``project/`` and ``failing/`` are made afresh each run):

1. ``maxtext/``: a ``git clone --shared`` of the repository, checked out sparsely: blobs the repository lacks at
   any commit of the range (a fetched mirror leaves out tokenizers and golden logits) are left out; nothing a
   lowering reads is among them. Its ``src/`` goes on ``PYTHONPATH`` ahead of the installed MaxText, so the checkout
   is the code under test (the 0.2.5 release's dependencies stay as installed; nothing is installed).
2. ``project/``: at the range's first commit, ``hlo-audit init`` writes ``hlo-audit.toml`` for 9 cells (llama3-8b,
   deepseek3-test, gpt-oss-20b, gemma4-26b, gemma4-e2b at 2 layers, scan on and off, train step, quant none;
   gemma4-e2b refuses scan on; ``--models`` names fewer) and their goldens. ``old-key.toml`` is the same config with
   a cache of its own (not written with ``--old-key-every 0``).
3. For each first-parent commit after it, in order: the checkout moves there and the real CLI runs as a subprocess,
   timed: ``hlo-audit check --format json`` (the per-cell key: each cell's ``cached`` field says whether it was
   lowered again). The old key is the digest the MaxText target's fingerprint was before the per-cell key (every
   ``.py``/``.yml``/``.yaml`` under the ``maxtext`` package, path and bytes): where it changed, all 9 cells were
   lowered again, and ``check --refresh --config old-key.toml`` measures what that costs (``--old-key-every K``
   measures every K-th such commit only; the others are given the median of those measured, marked ``~``); where it
   did not, ``check --config old-key.toml`` (served) is timed; ``--old-key-every 0`` leaves the old key out. Both
   checks are judged against the same goldens, so their verdicts must agree: a disagreement is the cache serving a
   stale lowering, and is reported. A failing commit (a program-changing pull request) is then accepted with the
   command the check printed (``golden update --only ...``), as merging it would, so the next commit is judged
   against the new goldens.
4. ``--changes``: each commit's diff (``git diff BEFORE COMMIT``, under ``changes/``) is passed to the check
   (``check --changes``): which cells ran each changed line, whose program names it, and which lines no cell
   reached, printed under the commit's row and kept in ``replay.json``.
5. ``--keep-failing``: before a failing commit is accepted, the project folder as the check left it (config, goldens,
   cache) is copied to ``failing/<commit>/``, the check's ``--format json`` output saved as ``failing/<commit>.json``
   and its terminal text (``hlo-audit check`` run again in the copy, served from the copied cache) as
   ``failing/<commit>.txt``. The command that re-runs that check is printed: with the checkout at that commit
   (where a run whose range ends there leaves it) it is served from the kept cache, so other hlo-audit code can
   judge the same lowerings again without lowering.

Prints a table per commit (commit, files changed in the repository and in the package, cells lowered again by the
new key and the old, check seconds new and old, verdict; ``-``: the old key not measured) and a summary: commits
that lower any cell again, cells lowered again, median and total check seconds, new against old, the re-check
commands. Writes the same as JSON to ``<workdir>/replay.json``. The figure this printed is in docs/commands.md (the
cache) and docs/development.md.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shlex
import shutil
import statistics
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

HLO_AUDIT_ROOT = Path(__file__).resolve().parent.parent
MODELS = ("llama3-8b", "deepseek3-test", "gpt-oss-20b", "gemma4-26b", "gemma4-e2b")
PACKAGE = "src/maxtext"  # where the maxtext package lives in MaxText's repository
OLD_KEY_SUFFIXES = (".py", ".yml", ".yaml")  # what the whole-package fingerprint hashed
OLD_KEY_CONFIG = "old-key.toml"
OLD_KEY_CACHE = ".hlo-audit-cache-old-key"


@dataclass
class Check:
    """One timed `hlo-audit check`: its exit code, the cells lowered again (not served), those not ok."""

    exit_code: int
    seconds: float
    cells: int
    lowered: int
    failing: list[str]
    accept: str | None = None  # the command that accepts the failing cells
    error: str = ""
    because: list[str] = field(default_factory=list)  # cells[].relowered_because of the cells lowered again, once each
    why: dict[str, int] = field(default_factory=dict)  # what each cell lowered again was lowered for (``why_kind``)
    lowered_ok: int = 0  # cells lowered again and judged ok: a lowering that found the program it had
    # --changes: what the cells reached of the commit's diff (the check JSON's "coverage", as printed)
    coverage: dict | None = None

    @property
    def verdict(self) -> str:
        if self.error:
            return f"error (exit {self.exit_code})"
        return "pass" if self.exit_code == 0 else f"fail ({len(self.failing)} cells)"


@dataclass
class Step:
    commit: str
    subject: str
    files_changed: int
    package_files_changed: int  # .py/.yml/.yaml under the package: what the old key hashed
    old_key_changed: bool
    new: Check
    old: Check | None  # None: the old key's check was not measured here (--old-key-every)
    old_seconds: float = 0.0  # measured, or the median of those measured (old is None)
    accepted_seconds: float | None = None  # the accept command's time, when the commit failed
    recheck: str | None = None  # --keep-failing: the command that re-runs the kept failing check
    notes: list[str] = field(default_factory=list)


# ---------------------------------------------------------------------------------------------------------------
# MaxText's checkout
# ---------------------------------------------------------------------------------------------------------------

def git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


def replayed_commits(repo: Path, span: str) -> tuple[str, list[str]]:
    """The range's first commit (the baseline goldens are made at) and the first-parent commits after it."""
    base, _, _ = span.partition("..")
    commits = git(repo, "rev-list", "--first-parent", "--reverse", span).split()
    if not commits:
        raise SystemExit(f"--range {span}: no commits")
    return git(repo, "rev-parse", base).strip(), commits


def missing_blobs(repo: Path, commits: list[str]) -> list[str]:
    """Paths whose blob the repository lacks at any of ``commits`` (a fetched mirror's large files)."""
    missing: set[str] = set()
    for commit in commits:
        rows = [line.split(None, 3) for line in git(repo, "ls-tree", "-r", commit).splitlines()]
        blobs = {row[2]: row[3] for row in rows if row[1] == "blob"}
        answer = subprocess.run(["git", "-C", str(repo), "cat-file", "--batch-check"], input="\n".join(blobs) + "\n",
                                check=True, capture_output=True, text=True).stdout
        missing |= {blobs[line.split()[0]] for line in answer.splitlines() if line.endswith(" missing")}
    return sorted(missing)


def make_checkout(repo: Path, checkout: Path, commits: list[str]) -> list[str]:
    """A shared clone of ``repo`` at ``checkout`` whose sparse checkout leaves out the blobs it lacks."""
    if checkout.exists():
        shutil.rmtree(checkout)
    subprocess.run(["git", "clone", "-q", "--shared", "--no-checkout", str(repo), str(checkout)], check=True)
    left_out = missing_blobs(checkout, commits)
    git(checkout, "sparse-checkout", "set", "--no-cone", "/*", *(f"!/{path}" for path in left_out))
    return left_out


def move_to(checkout: Path, commit: str) -> None:
    # git prints "invalid object" for the left-out blobs while it rebuilds the index's cache tree: not an error
    subprocess.run(["git", "-C", str(checkout), "checkout", "-q", "--detach", commit], check=True,
                   capture_output=True)


def old_key(checkout: Path) -> str:
    """The MaxText target's fingerprint before the per-cell key (hlo_audit/targets/maxtext.py before dfe0a85),
    less the version, which is the installed 0.2.5 at every commit: every .py/.yml/.yaml of the package."""
    root = checkout / PACKAGE
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        if path.suffix in OLD_KEY_SUFFIXES and path.is_file():
            digest.update(str(path.relative_to(root)).encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def changed_files(checkout: Path, before: str, after: str) -> tuple[int, int]:
    names = git(checkout, "diff", "--name-only", before, after).split("\n")
    names = [n for n in names if n]
    package = [n for n in names if n.startswith(PACKAGE + "/") and n.endswith(OLD_KEY_SUFFIXES)]
    return len(names), len(package)


# ---------------------------------------------------------------------------------------------------------------
# hlo-audit, the real CLI, as a subprocess
# ---------------------------------------------------------------------------------------------------------------

class Cli:
    """`python -m hlo_audit ...` in the project folder, with the checkout ahead of the installed MaxText."""

    def __init__(self, project: Path, checkout: Path, jobs: int) -> None:
        self.project = project
        self.jobs = jobs
        self.env = dict(os.environ)
        paths = [str(checkout / "src"), str(HLO_AUDIT_ROOT), *os.environ.get("PYTHONPATH", "").split(os.pathsep)]
        self.env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(filter(None, paths)))  # in order, once each
        self.env.pop("HLO_AUDIT_CACHE_LOG", None)

    def run(self, *args: str) -> tuple[int, float, str, str]:
        started = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "hlo_audit", *args], cwd=self.project, env=self.env,
                              capture_output=True, text=True)
        return done.returncode, time.perf_counter() - started, done.stdout, done.stderr

    def terminal(self, folder: Path, *args: str) -> tuple[int, float, str]:
        """Run in ``folder`` with stdout and stderr in one stream, in the order a terminal shows them."""
        started = time.perf_counter()
        done = subprocess.run([sys.executable, "-m", "hlo_audit", *args], cwd=folder, env=self.env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        return done.returncode, time.perf_counter() - started, done.stdout

    def command_in(self, folder: Path, *args: str) -> str:
        """The shell command that runs ``hlo-audit args`` in ``folder`` as ``run`` does."""
        return (f"cd {shlex.quote(str(folder))} && PYTHONPATH={shlex.quote(self.env['PYTHONPATH'])} "
                f"{shlex.quote(sys.executable)} -m hlo_audit {shlex.join(args)}")

    def imported_from(self, module: str) -> str:
        code = f"import {module}; print({module}.__file__)"
        done = subprocess.run([sys.executable, "-c", code], cwd=self.project, env=self.env, capture_output=True,
                              text=True, check=True)
        return done.stdout.strip().splitlines()[-1]

    def check(self, *extra: str) -> Check:
        return self.check_and_report(*extra)[0]

    def check_and_report(self, *extra: str) -> tuple[Check, str]:
        """The check, and its ``--format json`` output as printed."""
        code, seconds, out, err = self.run("check", "--format", "json", "-j", str(self.jobs), *extra)
        try:
            report = json.loads(out)
        except json.JSONDecodeError:
            return Check(code, seconds, 0, 0, [], error=err.strip()[-2000:]), out
        failing = [cell for cell, verdict in report["verdicts"].items() if verdict != "ok"]
        lowered = sum(not cell["cached"] for cell in report["cells"])
        accept = report["accept"]["command"] if report.get("accept") else None
        lowered_cells = [cell for cell in report["cells"] if not cell["cached"]]
        reasons = [cell.get("relowered_because") or NOT_CACHED for cell in lowered_cells]
        why: dict[str, int] = {}
        for reason in reasons:
            why[why_kind(reason)] = why.get(why_kind(reason), 0) + 1
        lowered_ok = sum(report["verdicts"].get(cell["id"]) == "ok" for cell in lowered_cells)
        return Check(code, seconds, len(report["cells"]), lowered, failing, accept,
                     because=list(dict.fromkeys(reasons)), why=why, lowered_ok=lowered_ok,
                     coverage=report.get("coverage")), out

    def accept(self, command: str) -> float:
        """Run the accept command a failing check printed (``hlo-audit golden update --only ...``)."""
        words = shlex.split(command)
        if words[:1] != ["hlo-audit"]:
            raise SystemExit(f"unexpected accept command: {command}")
        code, seconds, _, err = self.run(*words[1:])
        if code != 0:
            raise SystemExit(f"{command} exited {code}: {err.strip()[-2000:]}")
        return seconds


def make_project(cli: Cli, checkout: Path, models: list[str], with_old_key: bool) -> float:
    """``hlo-audit init`` at the baseline (config and goldens); ``with_old_key``: ``old-key.toml`` beside it with
    its own cache, that cache filled (so a first commit that leaves the old key alone is served there too)."""
    if cli.project.exists():
        shutil.rmtree(cli.project)
    cli.project.mkdir(parents=True)
    print(f"maxtext imported from {cli.imported_from('maxtext')}; hlo_audit from {cli.imported_from('hlo_audit')}",
          file=sys.stderr)
    if not cli.imported_from("maxtext").startswith(str(checkout / PACKAGE)):
        raise SystemExit("maxtext does not import from the checkout")
    args = ["init", "--maxtext", *(w for m in models for w in ("--model", m)), "--quant", "none", "--layers", "2",
            "-j", str(cli.jobs)]
    if "gemma4-e2b" in models:  # its configuration refuses scan on
        args += ["--exclude", "model=gemma4-e2b,scan=on"]
    code, seconds, out, err = cli.run(*args)
    if code != 0:
        raise SystemExit(f"hlo-audit init exited {code}:\n{out}\n{err.strip()[-3000:]}")
    if not with_old_key:
        return seconds
    config = (cli.project / "hlo-audit.toml").read_text()
    (cli.project / OLD_KEY_CONFIG).write_text(f'cache_dir = "{OLD_KEY_CACHE}"\n{config}')
    seeded = cli.check("--config", OLD_KEY_CONFIG)
    if seeded.exit_code != 0:
        raise SystemExit(f"the baseline does not pass its own goldens: {seeded}")
    return seconds


# ---------------------------------------------------------------------------------------------------------------
# The replay
# ---------------------------------------------------------------------------------------------------------------

@dataclass
class Replay:
    """What holds over a replay's commits."""

    cli: Cli
    checkout: Path
    with_old_key: bool  # False: --old-key-every 0, the old key left out
    kept: Path | None  # --keep-failing: the folder failing checks are kept in
    changes: Path | None = None  # --changes: the folder each commit's diff is written to, for `check --changes`


def replay_commit(run: Replay, before: str, commit: str, key_before: str, measure_refresh: bool) -> tuple[Step, str]:
    """One commit: move there, check with the per-cell key, the old key's check beside it (``measure_refresh``:
    the refresh it costs where the old key changed), keep and accept a failure."""
    cli = run.cli
    move_to(run.checkout, commit)
    files, package_files = changed_files(run.checkout, before, commit)
    key_now = old_key(run.checkout)
    extra: tuple[str, ...] = ()
    if run.changes is not None:  # the pull request's diff, as the workflow init writes passes it
        diff = run.changes / f"{commit[:9]}.diff"
        diff.write_text(git(run.checkout, "diff", before, commit))
        extra = ("--changes", str(diff))
    new, report = cli.check_and_report(*extra)
    old = old_key_check(cli, key_now != key_before, measure_refresh) if run.with_old_key else None
    subject = git(run.checkout, "log", "-1", "--format=%s", commit).strip()
    step = Step(commit[:9], subject, files, package_files, key_now != key_before, new, old,
                old.seconds if old else float("nan"))  # nan: filled in by fill_unmeasured, if any was measured
    if new.error:
        step.notes.append(f"new-key check failed to run: {new.error}")
    if old is not None and (old.exit_code, sorted(old.failing)) != (new.exit_code, sorted(new.failing)):
        step.notes.append(f"verdicts differ: new {new.verdict} {new.failing}, old {old.verdict} {old.failing}")
    if new.exit_code == 1 and new.accept:
        if run.kept is not None:
            keep_failing(cli, run.kept, step, report)
        step.accepted_seconds = cli.accept(new.accept)
    return step, key_now


def old_key_check(cli: Cli, key_changed: bool, measure_refresh: bool) -> Check | None:
    if key_changed:
        return cli.check("--config", OLD_KEY_CONFIG, "--refresh") if measure_refresh else None
    return cli.check("--config", OLD_KEY_CONFIG)  # the old key held: its cache served every cell, as it would have


def keep_failing(cli: Cli, kept: Path, step: Step, report: str) -> None:
    """The project folder as the failing check left it, to ``kept/<commit>/``; the check's JSON and its terminal
    text (checked again in the copy: served from the copied cache) beside it; ``step.recheck``: the command."""
    folder = kept / step.commit
    shutil.copytree(cli.project, folder, ignore=shutil.ignore_patterns(OLD_KEY_CONFIG, OLD_KEY_CACHE))
    (kept / f"{step.commit}.json").write_text(report)
    code, seconds, text = cli.terminal(folder, "check")
    (kept / f"{step.commit}.txt").write_text(text)
    step.recheck = cli.command_in(folder, "check")
    print(f"    kept at {folder} (its terminal check: exit {code}, {seconds:.1f} s); re-check: {step.recheck}",
          file=sys.stderr)
    if code != step.new.exit_code:
        step.notes.append(f"the kept copy's check exits {code}, the check {step.new.exit_code}: see {folder}.txt")


def replay(args: argparse.Namespace) -> list[Step]:
    repo, work = Path(args.maxtext).resolve(), Path(args.workdir).resolve()
    base, commits = replayed_commits(repo, args.range)
    checkout = work / "maxtext"
    left_out = make_checkout(repo, checkout, [base, *commits])
    print(f"{len(commits)} commits after {base[:9]} ({args.range}); left out of the checkout (blobs the repository "
          f"lacks): {', '.join(left_out) or 'none'}", file=sys.stderr)
    move_to(checkout, base)
    run = Replay(Cli(work / "project", checkout, args.jobs), checkout, args.old_key_every > 0,
                 work / "failing" if args.keep_failing else None, work / "changes" if args.changes else None)
    if run.changes is not None:
        run.changes.mkdir(parents=True, exist_ok=True)
    if run.kept is not None:
        shutil.rmtree(run.kept, ignore_errors=True)
        run.kept.mkdir(parents=True)
    seconds = make_project(run.cli, checkout, args.models, run.with_old_key)
    print(f"init at {base[:9]}: {seconds:.1f} s", file=sys.stderr)
    steps, before, key = [], base, old_key(checkout)
    for index, commit in enumerate(commits, 1):
        key_changes_so_far = sum(s.old_key_changed for s in steps)  # every K-th change measured (--old-key-every)
        measure_refresh = run.with_old_key and key_changes_so_far % args.old_key_every == 0
        step, key = replay_commit(run, before, commit, key, measure_refresh)
        steps.append(step)
        print(f"[{index}/{len(commits)}] {row(step)}", file=sys.stderr, flush=True)
        for why in step.new.because:
            print(f"    re-lowered: {why}", file=sys.stderr)
        for line in coverage_lines(step.new.coverage):
            print(f"    {line}", file=sys.stderr)
        for note in step.notes:
            print(f"    note: {note}", file=sys.stderr)
        before = commit
    fill_unmeasured(steps)
    (work / "replay.json").write_text(json.dumps([asdict(s) for s in steps], indent=1) + "\n")
    return steps


def fill_unmeasured(steps: list[Step]) -> None:
    measured = [s.old.seconds for s in steps if s.old_key_changed and s.old is not None]
    for step in steps:
        if step.old is None:
            step.old_seconds = statistics.median(measured) if measured else float("nan")


# ---------------------------------------------------------------------------------------------------------------
# The report
# ---------------------------------------------------------------------------------------------------------------

HEADER = (f"{'commit':<10} {'files':>5} {'pkg':>4} {'new':>4} {'old':>4} {'new s':>7} {'old s':>8}  "
          f"{'verdict':<16} subject")


def old_lowered(step: Step) -> int:
    """Cells the old key lowered again: all where it changed; where it held, what its served check lowered."""
    return step.new.cells if step.old_key_changed else (step.old.lowered if step.old else 0)


def row(step: Step) -> str:
    if step.old is not None:
        old_s = f"{step.old_seconds:.1f}"
    else:  # the median of those measured, or none measured (--old-key-every 0)
        old_s = "-" if step.old_seconds != step.old_seconds else f"~{step.old_seconds:.1f}"
    return (f"{step.commit:<10} {step.files_changed:>5} {step.package_files_changed:>4} {step.new.lowered:>4} "
            f"{old_lowered(step):>4} {step.new.seconds:>7.1f} {old_s:>8}  {step.new.verdict:<16} "
            f"{step.subject[:60]}")


NOT_CACHED = "(nothing cached under its key: hlo-audit, the stack or the config changed)"
WHY_KINDS = ("code a lowering ran changed", "module-level statements changed", "code moved", "a file it read changed",
             "an environment variable changed", "nothing cached", "other")


def why_kind(reason: str) -> str:
    """What a cell was lowered again for, as ``relowered_because`` says it (``cache.reads.Now.verify``)."""
    if reason == NOT_CACHED:
        return "nothing cached"
    if reason.startswith("$"):
        return "an environment variable changed"
    if reason.endswith("module-level statements changed"):
        return "module-level statements changed"
    if " moved (" in reason:
        return "code moved"
    path, _, what = reason.rpartition(".py ")
    if path and what.endswith((" changed", " is gone")):
        return "code a lowering ran changed"
    return "a file it read changed" if reason.endswith(" changed") else "other"


def summary(steps: list[Step]) -> list[str]:
    new_s = [s.new.seconds for s in steps]
    old_s = [s.old_seconds for s in steps]
    measured = sum(s.old is not None and s.old_key_changed for s in steps)
    lines = [
        f"commits that lower any cell again: new key {sum(s.new.lowered > 0 for s in steps)} of {len(steps)}, "
        f"old key {sum(old_lowered(s) > 0 for s in steps)} of {len(steps)}",
        f"cells lowered again: new key {sum(s.new.lowered for s in steps)}, "
        f"old key {sum(old_lowered(s) for s in steps)} (of {sum(s.new.cells for s in steps)} cell checks)",
    ]
    why = {kind: sum(s.new.why.get(kind, 0) for s in steps) for kind in WHY_KINDS}
    lowered = sum(s.new.lowered for s in steps)
    lines.append(f"why (cells): {', '.join(f'{kind} {n}' for kind, n in why.items() if n) or 'none lowered again'}; "
                 f"judged ok: {sum(s.new.lowered_ok for s in steps)} of the {lowered} (the program they had, or "
                 f"within tolerance)")
    if any(s.old is not None for s in steps):
        lines += [
            f"check seconds, median: new {statistics.median(new_s):.1f}, old {statistics.median(old_s):.1f} "
            f"(old/new {statistics.median(old_s) / statistics.median(new_s):.1f}x); total: new {sum(new_s):.0f}, "
            f"old {sum(old_s):.0f} ({sum(old_s) / sum(new_s):.1f}x)",
            f"old key's refresh measured at {measured} of the {sum(s.old_key_changed for s in steps)} commits where "
            f"it changed (the others '~': the median of those measured)"]
    else:
        lines.append(f"check seconds, median: new {statistics.median(new_s):.1f}, total {sum(new_s):.0f}; the old "
                     f"key not measured (--old-key-every 0: its cells lowered again are what it would have done)")
    lines += [
        f"verdicts: {sum(s.new.exit_code == 0 for s in steps)} pass, {sum(s.new.exit_code == 1 for s in steps)} "
        f"fail ({', '.join(s.commit for s in steps if s.new.exit_code == 1)}), "
        f"{sum(s.new.exit_code not in (0, 1) for s in steps)} other",
        f"failing commits accepted (golden update) in {sum(s.accepted_seconds or 0 for s in steps):.1f} s, not counted",
    ]
    lines += [f"{s.commit}'s failing check kept; re-check: {s.recheck}" for s in steps if s.recheck]
    notes = [f"{s.commit}: {note}" for s in steps for note in s.notes]
    if notes:
        return [*lines, "notes:", *notes]
    compared = any(s.old is not None for s in steps)
    return [*lines, "notes: none (both keys' verdicts agree at every commit)" if compared else "notes: none"]


def coverage_lines(coverage: dict | None) -> list[str]:
    """What the cells reached of a commit's diff (``--changes``): each run of changed model code, the cells that ran
    it and those whose program names it; the runs no cell reached."""
    if coverage is None:
        return []
    lines = []
    for run in coverage["runs"]:
        reached = ", ".join(run["reached_by"]) or "none"
        named = ", ".join(run["in_program_of"]) or "none"
        lines.append(f"changed {run['place']}: ran in {len(run['reached_by'])} cells ({reached}); in the program of "
                     f"{named}" + (f"; unreached {', '.join(run['unreached'])}" if run["unreached"] else ""))
    if coverage["not_model_code"]:
        lines.append(f"not model code: {', '.join(coverage['not_model_code'])}")
    return lines


def model_list(text: str) -> list[str]:
    models = [m.strip() for m in text.split(",") if m.strip()]
    if not models:
        raise argparse.ArgumentTypeError(f"{text!r} names no model")
    return models


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("maxtext", help="MaxText's git repository (a clone, or a bare mirror)")
    parser.add_argument("--range", default="f347a2173..538fe7a3f",
                        help="BASE..END: goldens made at BASE, every first-parent commit after it replayed")
    parser.add_argument("--workdir", default="/tmp/hlo-audit-replay", help="where the checkout and project go")
    parser.add_argument("--jobs", "-j", type=int, default=1, help="hlo-audit's worker processes")
    parser.add_argument("--old-key-every", type=int, default=1,
                        help="measure the old key's refresh at every K-th commit where it changed (default: all; 0: "
                             "leave the old key out)")
    parser.add_argument("--models", type=model_list, default=list(MODELS),
                        help=f"M1,M2,...: the models whose cells are lowered (default: {','.join(MODELS)})")
    parser.add_argument("--changes", action="store_true",
                        help="pass each commit's diff to the check (check --changes): which cells reached its lines")
    parser.add_argument("--keep-failing", action="store_true",
                        help="keep each failing check (project folder, JSON, terminal text) under WORKDIR/failing/")
    args = parser.parse_args()
    if args.old_key_every < 0:
        parser.error(f"--old-key-every {args.old_key_every}: K must be 0 (never) or more")
    steps = replay(args)
    print(HEADER)
    for step in steps:
        print(row(step))
        for why in step.new.because:
            print(f"{'':<10} re-lowered: {why}")
        for line in coverage_lines(step.new.coverage):
            print(f"{'':<10} {line}")
    print()
    print("\n".join(summary(steps)))


if __name__ == "__main__":
    main()
