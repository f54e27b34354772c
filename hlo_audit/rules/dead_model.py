"""``dead_model``: a step that computes none of its model (issue 46). It takes weights, yet none of its contractions
reaches an output: there is none (MaxText trains DeepSeek 3.2 in dense warm-up by default, its main loss 0, and the
lowered train step holds no dot at all), or every one is cut off by a zero (a loss multiplied by 0: the dots are
all there, forward and backward, and none can move an output). Such a cell passes every comparison whatever the
model's code becomes, so a green check on it says nothing of the model: a regression of the cell alone, at `check`,
and said at `golden update` and `init` (``commands.golden_update``), which would otherwise bless it silently.

The detector is the HLO core's (``hlo.model_work``, kept as ``LoweredCell.model``); this module is the rule: its
facts, judge, words and JSON details."""

from __future__ import annotations

from dataclasses import dataclass

from hlo_audit.findings import Finding
from hlo_audit.policy import Action
from hlo_audit.results import LoweredCell, Severity
from hlo_audit.rules.spec import Context, RuleSpec, Subject
from hlo_audit.rules.wording import Json, and_list, counted

NAME = "dead_model"


@dataclass(frozen=True)
class DeadModel:
    """A step that takes ``weights`` weights and computes none of its model: of its ``contractions`` none reaches
    an output; ``zeroed_at``: where a zero cut them off (a loss multiplied by 0), placed."""

    weights: int
    contractions: int
    zeroed_at: tuple[str, ...]
    step: str


def computes_none(result: LoweredCell) -> DeadModel | None:
    """The facts where ``result``'s step takes weights and none of its contractions reaches its outputs; None where
    it computes some of its model, takes no weight (a function of its inputs alone), or was not analysed."""
    weights = result.summary.by_role.get("weight", 0)
    if result.model is None or not weights or not result.model.computes_none:
        return None
    return DeadModel(weights, result.model.contractions, result.model.zeroed_at, result.cell.step)


def dead_model(subject: Subject, ctx: Context) -> Finding | None:
    facts = computes_none(subject.result)
    return Finding(subject.cell, Severity.REGRESSION, NAME, facts) if facts is not None else None


def message(facts: DeadModel) -> str:
    if not facts.contractions:
        what = (f"its {facts.step} step takes {counted(facts.weights, 'weight')} and holds no contraction (no dot, "
                "convolution or kernel)")
        cause = ("a model whose layers are skipped in this configuration (MaxText's dense warm-up trains with the "
                 "main loss 0)")
    else:
        cut = f", cut off by a zero at {and_list(list(facts.zeroed_at))}" if facts.zeroed_at else ""
        what = (f"none of its {facts.step} step's {counted(facts.contractions, 'contraction')} reaches an output"
                f"{cut}")
        cause = "a loss multiplied by 0, or outputs that no longer read the model"
    return (f"computes none of its model: {what}; a check of this cell passes whatever the model's code becomes. "
            f"Likely {cause}: lower a configuration that computes it (another step, the warm-up off), or waive the "
            f"cell with a reason (rule \"{NAME}\")")


def details(facts: DeadModel) -> Json:
    return {"weights": facts.weights, "contractions": facts.contractions, "reaching": 0,
            "zeroed_at": list(facts.zeroed_at), "step": facts.step}


SPEC = RuleSpec(NAME, Action.FAIL, dead_model, (DeadModel,), needs_golden=False,
                doc="a step that computes none of its model (no contraction reaches an output)",
                message=message, details=details)
