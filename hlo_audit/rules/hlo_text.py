"""``hlo_text``: the normalized module must equal the golden's when the compiler stack the golden records (jax,
jaxlib, libtpu, CUDA, TE, platform, stage: ``stack.is_compiler``) equals this run's; otherwise, on a local run, the
difference is advisory and the counts and the named rules still gate. On a pinned run (CI, ``stack.stack_mode``) a
golden of another stack is a ``missing_golden`` regression (the gate's) and nothing is relaxed. The code under
test's versions (maxtext, flax, a user's library) never relax anything. A difference carries `diff`'s verdict and
kinds: one that is RNG state only, dropped, is an improvement to accept (a fix like seed 001's), not a regression;
one that only renames entry parameters (``renamed-only``) is an advisory listing the renames."""

from __future__ import annotations

from hlo_audit.findings import Finding, TextChange, TextKind, TextVerdict
from hlo_audit.hlo.changes import Action as ChangeAction
from hlo_audit.hlo.changes import Change, ChangeKind
from hlo_audit.policy import Action
from hlo_audit.results import Severity
from hlo_audit.rules.spec import Context, KindWords, RuleSpec, Subject
from hlo_audit.rules.wording import (
    LOCAL_STACK,
    Json,
    counted,
    environment_text,
    groups_text,
    param_groups_text,
    per_layer,
    place_text,
    plural,
)

NAME = "hlo_text"


def hlo_text(subject: Subject, ctx: Context) -> Finding | None:
    """A text that differs only by RNG state it dropped is an improvement to accept, not a regression; one whose entry
    parameters are renamed and whose program is the same (renamed-only) an advisory listing the renames; under another
    environment than the golden's, advisory (the counts and the named rules still gate). A golden text that is
    missing, not UTF-8 or (where it differs) not a module is a missing golden: a deleted or damaged text never turns
    the text rule off."""
    d = subject.delta
    if d.text_problem is not None:  # the golden's text is unusable: a missing golden's (``golden.health``)
        return None
    verdict = d.text
    if verdict in (TextVerdict.NOT_COMPARED, TextVerdict.SAME):
        return None
    structural = d.structural
    kind = (TextKind.MOVED if d.environment else TextKind.RNG_DROPPED if verdict is TextVerdict.RNG_DROPPED
            else TextKind.RENAMED if verdict is TextVerdict.RENAMED else TextKind.CHANGED)
    severity = {TextKind.MOVED: Severity.ADVISORY, TextKind.RNG_DROPPED: Severity.IMPROVEMENT,
                TextKind.RENAMED: Severity.ADVISORY, TextKind.CHANGED: Severity.REGRESSION}[kind]
    changed, diff = d.text_lines
    renames = structural.named(ChangeKind.RENAME) if verdict is TextVerdict.RENAMED else ()
    return Finding(subject.cell, severity, NAME, TextChange(
        kind=kind, changed_lines=changed, diff=diff, verdict=structural.diff.verdict,
        changes=tuple(structural.diff.changes), rng_params=structural.rng_params, environment=d.environment,
        command=ctx.command(subject.cell), renames=renames,
        params=(*structural.diff.params_added, *structural.diff.params_removed), match=structural.diff.match))


def _rename_line(c: Change, kind: str, where: str) -> str:
    return f"{kind}: {c.before} -> {c.after}, {counted(c.count, 'parameter')}: {groups_text(c.groups)}"


RENAME = KindWords(ChangeKind.RENAME, "rename", _rename_line)


def _parameters_line(c: Change, kind: str, where: str) -> str:
    if c.action is ChangeAction.CHANGED:
        return f"{kind}: {counted(c.count, 'parameter')} {c.subject}: {c.before} -> {c.after} " \
               f"({c.bytes:+,} bytes)"
    sign = "+" if c.action is ChangeAction.ADDED else "-"
    dtype = c.after or c.before
    text = f"{kind}: {sign}{counted(c.count, 'parameter')} {c.subject}{per_layer(c)} ({dtype}, {c.bytes:,} bytes)"
    if len(c.groups) > 1:
        text += f": {groups_text(c.groups)}"
    return text


def _header_line(c: Change, kind: str, where: str) -> str:
    return f"{kind}: {c.subject} {c.before} -> {c.after}"


def _message(facts: TextChange) -> str:
    if facts.verdict == "rng-state-only":
        rng = facts.rng_params
        amount = (f"{abs(rng)} {'fewer' if rng < 0 else 'more'} RNG {plural(rng, 'parameter')}" if rng
                  else "RNG bookkeeping")
        what = f"normalized HLO differs from the golden by RNG state only ({amount}; rng-state-only)"
    else:
        kinds = f" ({', '.join(facts.changes)})" if facts.changes else ""
        what = f"normalized HLO differs from the golden in {_program_change(facts)}: {facts.verdict}{kinds}"
    if facts.params:
        what += f"; entry parameters {param_groups_text(facts.params)}"
    if facts.kind is TextKind.MOVED:
        return (f"{what}, but the environment differs from the golden's ({environment_text(facts.environment)}): "
                f"{LOCAL_STACK}; counts still gate")
    if facts.kind is TextKind.RNG_DROPPED:
        return f"{what}; accept it: {facts.command}"
    if facts.kind is TextKind.RENAMED:
        renames = "; ".join(_rename_line(c, RENAME.word, place_text(c.place)) for c in facts.renames)
        return (f"normalized HLO differs from the golden only by renamed entry parameters (renamed-only: the same "
                f"program): {renames}; record it: {facts.command}")
    return f"{what}. If intended: {facts.command}"


def _program_change(facts: TextChange) -> str:
    """What differs, in the program's terms: ``44 instructions (44 removed; 9,038 text lines)``, the instructions the
    structural match added, removed and changed (renumbering, which moves every later line of the text, is none);
    the text's lines beside. Where the match says no instruction differs (a kernel's content), the lines."""
    lines = f"{facts.changed_lines:,} {plural(facts.changed_lines, 'line')}"
    m = facts.match
    counts = ((m.inserted, "added"), (m.deleted, "removed"), (m.changed, "changed")) if m is not None else ()
    parts = [f"{n:,} {word}" for n, word in counts if n]
    if not parts:
        return lines
    total = sum(n for n, _ in counts)
    return f"{total:,} {plural(total, 'instruction')} ({', '.join(parts)}; {facts.changed_lines:,} text " \
           f"{plural(facts.changed_lines, 'line')})"


def _details(facts: TextChange) -> Json:
    return {"changed_lines": facts.changed_lines, "diff": list(facts.diff), "regenerate": facts.command,
            "verdict": facts.verdict, "changes": list(facts.changes), "rng_params": facts.rng_params,
            "params": [{"pattern": g.pattern, "dtype": g.dtype, "role": g.role, "delta": g.count}
                       for g in facts.params],
            **({"renames": [c.to_record() for c in facts.renames]} if facts.renames else {})}


SPEC = RuleSpec(NAME, Action.FAIL, hlo_text, (TextChange,), (ChangeKind.RENAME,),
                doc="the canonical text against the golden's (advisory under another environment)",
                words=(RENAME,
                       KindWords(ChangeKind.PARAMETERS, "parameters", _parameters_line),
                       KindWords(ChangeKind.HEADER, "header", _header_line),
                       KindWords(ChangeKind.INSTRUCTIONS, "instructions")),
                message=_message, details=_details)
