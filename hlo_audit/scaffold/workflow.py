"""The GitHub Actions workflow ``hlo-audit init`` writes: ``check --shard K/N --format json`` on N runners, each
with its own lowering cache, and a merge job whose verdict (``hlo-audit merge``) is the gate's."""

from __future__ import annotations

from collections.abc import Sequence

from hlo_audit.scaffold.base import tool_pin
from hlo_audit.scaffold.provenance import installed


def workflow(install: Sequence[str], shards: int, python: str) -> str:
    """GitHub Actions: ``shards`` check jobs, each its own cache, then the merge job that gives the verdict.

    The cache is restored from any earlier run of the same shard (``restore-keys``): each entry verifies itself
    (a damaged or stale one is a miss, never a wrong answer), so a cache from another commit only saves time; the
    key names the commit, so every run saves what it lowered and the cache follows the branch.

    hlo-audit is installed as this one was (``tool_pin``); where that was from a place no runner reaches (a local
    folder or file), a comment above its install line says so and what to put there instead.
    """
    steps = "\n".join(f"          {line}" for line in [*installed().comment(), *install])
    return _check_job(shards, steps, python) + _merge_job(python)


def _check_job(shards: int, steps: str, python: str) -> str:
    shard_list = ", ".join(str(k) for k in range(1, shards + 1))
    jobs = f"{shards} shard{'s' if shards != 1 else ''}"
    return f"""\
# hlo-audit's gate, written by `hlo-audit init`: `hlo-audit check` in {jobs}, merged into one verdict.
name: hlo-audit
on:
  pull_request:
  push:
    branches: [main]
jobs:
  check:
    runs-on: ubuntu-latest
    strategy:
      fail-fast: false  # every shard reports, so the merge sees the whole matrix
      matrix:
        shard: [{shard_list}]
    steps:
      - uses: actions/checkout@v4
        with:
          fetch-depth: 0  # the pull request's base too: `check --changes` reads the diff against it
      - uses: actions/setup-python@v5
        with:
          python-version: "{python}"
      - name: Install
        run: |
          python -m pip install --upgrade pip
{steps}
      # Entries verify themselves (a damaged or stale one is a miss, never a wrong answer), so any earlier cache of
      # this shard is safe to start from; the key names the commit, so each run saves what it lowered. The runner's
      # cache key (~/.cache/hlo-audit) marks the entries it wrote: kept with them, or a fresh runner trusts none.
      - uses: actions/cache@v4
        with:
          path: |
            .hlo-audit-cache
            ~/.cache/hlo-audit
          key: hlo-audit-${{{{ runner.os }}}}-py{python}-shard${{{{ matrix.shard }}}}-${{{{ github.sha }}}}
          restore-keys: |
            hlo-audit-${{{{ runner.os }}}}-py{python}-shard${{{{ matrix.shard }}}}-
      # A pull request's diff: each shard says which changed lines its cells reached, the merge which none did.
      - name: The pull request's changes
        if: github.event_name == 'pull_request'
        run: git diff "origin/${{{{ github.base_ref }}}}...HEAD" > "$RUNNER_TEMP/changes.diff"
      - name: hlo-audit check, shard ${{{{ matrix.shard }}}} of {shards}
        run: >-
          hlo-audit check --shard ${{{{ matrix.shard }}}}/{shards} --format json
          --junit junit-${{{{ matrix.shard }}}}.xml
          $([ -f "$RUNNER_TEMP/changes.diff" ] && echo --changes "$RUNNER_TEMP/changes.diff")
          > shard-${{{{ matrix.shard }}}}.json
      - uses: actions/upload-artifact@v4
        if: always()
        with:
          name: hlo-audit-shard-${{{{ matrix.shard }}}}
          path: |
            shard-${{{{ matrix.shard }}}}.json
            junit-${{{{ matrix.shard }}}}.xml
"""


def _merge_job(python: str) -> str:
    return f"""\
  merge:
    needs: check
    if: always()  # a failing shard still reports: the merge says what failed, and fails the same way
    runs-on: ubuntu-latest
    steps:
      - uses: actions/setup-python@v5
        with:
          python-version: "{python}"
{_merge_comment()}      - run: python -m pip install {tool_pin()}
      - uses: actions/download-artifact@v4
        with:
          pattern: hlo-audit-shard-*
          merge-multiple: true
      # Every shard's report must be there (a runner that died before uploading is an error, exit 2); the summary
      # goes to the job summary.
      - run: hlo-audit merge shard-*.json --junit hlo-audit.xml
"""


def _merge_comment() -> str:
    """Where hlo-audit's install line needs the user's hand (``installed().comment``), a pointer to it."""
    if not installed().comment():
        return ""
    return "      # hlo-audit as in the check job's Install step: replace it here as the comment there says\n"
