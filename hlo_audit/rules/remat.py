"""``remat``: rematerialization removed or added, or its policy changed: memory against recomputation, a change to
judge either way."""

from __future__ import annotations

from hlo_audit.hlo.changes import ChangeKind
from hlo_audit.rules.spec import change_spec

NAME = "remat"
SPEC = change_spec(NAME, ChangeKind.REMAT, "rematerialization removed or added, or its policy changed")
