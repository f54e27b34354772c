"""Fresh environments made from the one running the tests, without an index: a virtual environment whose
site-packages reaches a chosen few of this environment's distributions through a view (a folder of symbolic links
to each chosen distribution's files, named by a ``.pth`` line), so a test installs into it, or runs in it, as a
user whose environment holds only those would, and nothing is downloaded.

A ``.pth`` line adds the view to ``sys.path`` without processing the view's own ``.pth`` files, and the view holds
only the chosen distributions' files and metadata: pip and ``importlib.metadata`` there see those and nothing else
(hlo-audit's own editable install of this environment included, when it is not chosen).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterable
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement


def normalized(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def requirement_closure(names: Iterable[str]) -> set[str]:
    """``names`` and every distribution their installed metadata requires, at any depth, for this Python and no
    extra: what ``pip install`` of them alone brings (normalized names)."""
    seen: set[str] = set()
    todo = list(names)
    while todo:
        name = todo.pop()
        key = normalized(Requirement(name).name)
        if key in seen:
            continue
        seen.add(key)
        try:
            requires = metadata.requires(key) or []
        except metadata.PackageNotFoundError:
            continue
        for text in requires:
            requirement = Requirement(text)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                todo.append(requirement.name)
    return seen


def site_view(dest: Path, keep: Callable[[str], bool]) -> Path:
    """A folder of links to the files of every installed distribution whose normalized name ``keep`` accepts (each
    top-level entry its RECORD names: packages, modules, ``*.libs`` folders, the ``.dist-info``), ``.pth`` files
    and scripts left out."""
    dest.mkdir(parents=True)
    for dist in metadata.distributions():
        if not keep(normalized(dist.metadata["Name"])):
            continue
        base = Path(str(dist.locate_file("")))
        entries = {Path(str(f)).parts[0] for f in dist.files or () if ".." not in Path(str(f)).parts}
        assert entries, f"{dist.metadata['Name']} lists no files (no RECORD): the view cannot hold it"
        for entry in entries - {"__pycache__"}:
            if not entry.endswith(".pth") and (base / entry).exists() and not (dest / entry).exists():
                os.symlink(base / entry, dest / entry)
    return dest


def venv_over(dest: Path, view: Path) -> Path:
    """A virtual environment (no pip of its own: the view's, when it holds pip) that sees ``view``; its python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(dest)], check=True, timeout=120)
    site = next((dest / "lib").glob("python3*/site-packages"))
    (site / "view.pth").write_text(f"{view}\n")
    return dest / "bin" / "python"


def clean_env(**extra: str) -> dict[str, str]:
    """This process's environment less what would point a child at this environment's packages."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    return {**env, **extra}
