"""How the running hlo-audit was installed, so the workflow ``init`` writes installs the same one on a runner
(issue 40: a pin to a version no index the runner reaches serves fails the first push). pip records where a
distribution came from in its ``direct_url.json`` (PEP 610) for every install not resolved from an index:

* none: an index (or a ``--find-links`` folder): ``"hlo-audit==0.1.0"``;
* a VCS (``pip install "hlo-audit @ git+URL@REV"``): the URL and the commit pip resolved (``git+URL@COMMIT``, its
  subdirectory kept), so every runner builds the very commit the goldens were made with;
* an archive at a URL (a wheel or sdist on a web server): that URL, with the hash pip recorded;
* a folder (``pip install .``, ``pip install -e .``), an archive on this machine, a ``file://`` repository, or no
  installation at all (the source on ``sys.path``): no runner reaches it. The workflow still names it as best it
  can (the version for an index; the ``file://`` repository as given), and a comment above that line says where
  it came from and what to put there instead: the checkout's git remote at its commit when it has one.
"""

from __future__ import annotations

import functools
import json
import subprocess
import textwrap
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from urllib.parse import unquote, urlparse

_DISTRIBUTION = "hlo-audit"
_GENERIC = "git+https://HOST/OWNER/hlo-audit@COMMIT"


@dataclass(frozen=True)
class Installed:
    """Where this hlo-audit came from, as a runner's pip can or cannot install it."""

    version: str
    url: str | None = None  # a direct reference pip installs (git+https://...@commit, https://.../x.whl#sha256=...)
    unreachable: str | None = None  # where it came from, when that is on this machine only ("the folder /x")
    instead: str | None = None  # a direct reference a runner reaches (a local checkout's remote at its commit)

    def requirement(self, extra: str = "") -> str:
        """hlo-audit (with ``extra``) as a quoted pip requirement."""
        name = f"{_DISTRIBUTION}{extra}"
        return f'"{name} @ {self.url}"' if self.url else f'"{name}=={self.version}"'

    def advice(self) -> str | None:
        """What the workflow's install line cannot do and what to put there instead, or None where it works."""
        if self.unreachable is None:
            return None
        asks = "clones it there" if self.url else f"asks an index for hlo-audit {self.version}"
        replacement = f'"{_DISTRIBUTION} @ {self.instead or _GENERIC}"'
        whose = ("this checkout's remote at its commit, once pushed" if self.instead
                 else "the git URL and commit of the hlo-audit you use, or a version an index serves")
        return (f"hlo-audit came from {self.unreachable}, which a runner cannot reach: hlo-audit's install line "
                f"{asks}. Replace {self.requirement()} there and in the merge job with {replacement} ({whose}).")

    def comment(self) -> list[str]:
        """``advice`` as the workflow's comment lines (none when the install line works on a runner)."""
        advice = self.advice()
        if not advice:
            return []
        return [f"# {line}" for line in textwrap.wrap(advice, 106, break_long_words=False, break_on_hyphens=False)]


@functools.cache
def installed() -> Installed:
    """The running hlo-audit's installation, read once per process."""
    from hlo_audit import __version__  # noqa: PLC0415 (the code running init: the version a runner must match)

    try:
        text = metadata.distribution(_DISTRIBUTION).read_text("direct_url.json")
    except metadata.PackageNotFoundError:
        source = Path(__file__).resolve().parents[2]
        return Installed(__version__, unreachable=f"its source in {source}, not installed", instead=remote_at(source))
    return from_direct_url(text, __version__)


def from_direct_url(text: str | None, version: str) -> Installed:
    """An installation from its ``direct_url.json`` text (None: from an index). A record pip would not write (not
    JSON, no URL) is read as the index's: the version is all there is to go on."""
    try:
        record = json.loads(text) if text else {}
        url = str(record["url"]) if isinstance(record, dict) and record.get("url") else None
    except ValueError:
        url = None
    if url is None:
        return Installed(version)
    parsed = urlparse(url)
    local = parsed.scheme == "file"
    path = unquote(parsed.path) if local else url
    subdirectory = record.get("subdirectory")
    fragment = f"#subdirectory={subdirectory}" if subdirectory else ""
    vcs = record.get("vcs_info")
    if isinstance(vcs, dict) and vcs.get("vcs") and (vcs.get("commit_id") or vcs.get("requested_revision")):
        reference = f"{vcs['vcs']}+{url}@{vcs.get('commit_id') or vcs['requested_revision']}{fragment}"
        if not local:
            return Installed(version, url=reference)
        return Installed(version, url=reference, unreachable=f"the {vcs['vcs']} repository {path} on this machine",
                         instead=remote_at(Path(path), vcs.get("commit_id")))
    if isinstance(record.get("dir_info"), dict):
        editable = " (editable)" if record["dir_info"].get("editable") else ""
        return Installed(version, unreachable=f"the folder {path}{editable}", instead=remote_at(Path(path)))
    if local:
        return Installed(version, unreachable=f"the file {path}")
    return Installed(version, url=url + _hash_fragment(record.get("archive_info")))


def _hash_fragment(archive) -> str:
    """``#sha256=...`` of an archive's recorded hash (PEP 610's ``hashes``, or the older ``hash``), else ''."""
    if not isinstance(archive, dict):
        return ""
    hashes = archive.get("hashes")
    if isinstance(hashes, dict) and hashes:
        name = "sha256" if "sha256" in hashes else next(iter(hashes))
        return f"#{name}={hashes[name]}"
    return f"#{archive['hash']}" if isinstance(archive.get("hash"), str) and "=" in archive["hash"] else ""


def remote_at(folder: Path, commit: str | None = None) -> str | None:
    """``git+REMOTE@COMMIT`` for a git checkout at ``folder`` whose ``origin`` is on a server (https, ssh), at
    ``commit`` or its HEAD (with ``#subdirectory=`` when ``folder`` is inside the checkout), else None."""
    def git(*args: str) -> str | None:
        try:
            ran = subprocess.run(["git", "-C", str(folder), *args], capture_output=True, text=True, timeout=10)
        except (OSError, subprocess.SubprocessError):
            return None
        return ran.stdout.strip() if ran.returncode == 0 else None

    origin = git("remote", "get-url", "origin")
    head = commit or git("rev-parse", "HEAD")
    if not origin or not head:
        return None
    if origin.startswith(("https://", "http://", "ssh://")):
        remote = origin
    elif "@" in origin and ":" in origin and "://" not in origin:  # scp-like: git@github.com:owner/repo.git
        user_host, _, path = origin.partition(":")
        remote = f"ssh://{user_host}/{path}"
    else:
        return None  # a path on this machine: no better than the folder
    prefix = (git("rev-parse", "--show-prefix") or "").rstrip("/")
    return f"git+{remote}@{head}" + (f"#subdirectory={prefix}" if prefix else "")
