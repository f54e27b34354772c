"""``routing``: the step selects by another op (an MoE router's experts by ``argmax`` now ``top_k`` with k=2, a
sampler's ``sort``): which values flow on changes, a change to judge either way (``hlo.change_terms.routing``)."""

from __future__ import annotations

from hlo_audit.hlo.changes import ChangeKind
from hlo_audit.rules.spec import change_spec

NAME = "routing"
SPEC = change_spec(NAME, ChangeKind.ROUTING, "a selection by another op (argmax, top_k of another k, sort)")
