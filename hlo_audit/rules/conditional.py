"""``conditional``: a ``conditional`` removed or added with its branches' sizes, replaced by computing both branches
and selecting (``jnp.where``): a change to judge, either way."""

from __future__ import annotations

from hlo_audit.hlo.changes import ChangeKind
from hlo_audit.rules.spec import change_spec

NAME = "conditional"
SPEC = change_spec(NAME, ChangeKind.CONDITIONAL, "a lax.cond removed or added (both branches computed)")
