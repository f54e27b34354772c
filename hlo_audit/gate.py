"""Policies -> findings: what `hlo-audit check` decides about each cell against its golden.

Rules (each ``fail``, ``warn`` or ``off`` in the config's ``[policy]``; a waiver must carry a reason):

* ``count``: a ratchet. More entry parameters of any dtype or role than the golden is a regression; fewer
  is an improvement that asks to tighten the golden. State captured as constants counts the same way, in
  arrays and bytes per dtype: a step that starts baking state into its program fails like one that grows
  its entry parameters (``hlo_audit.hlo.constants``). So do RNG counter increments per step (dead, drawn or
  unknown, from the RNG analysis): each is a kernel on a GPU, and seed 000's 672 dead ones came with no new
  parameter where streams were shared. A finding lists the path patterns that grew, shrank or were renamed
  (with their roles), the streams whose increments grew, and the series' per-layer slopes against the golden's.
  A GPU cell's launches per step count the same way:
  more kernels (in all, or scalar ones) or collectives per step than the golden is a regression, and the
  finding says which launches came, and what they read (``+42 scalar kernels loop_add_fusion, each reading
  state.model.decoder.layers_*.*.to_nnx__rngs.*.count``).
* ``rng_scaling``: in an unrolled (scan off) series, RNG parameters must not grow with depth. That growth
  is the seed-000 bug: per-layer RNG state the host marshals every step.
* ``launch_scaling``: in an unrolled series of GPU cells, the kernels that read RNG state must not grow with
  depth either: each is a launch in the step's dependency chain (seed 000 measured 673 such counter kernels per
  step on 8xH100 as 8% of step time), and a stream shared across layers adds them without a parameter.
* ``hlo_text``: the normalized module must equal the golden's when the environment fingerprint (jax, jaxlib,
  flax, maxtext, platform, stage) equals the golden's; otherwise the difference is advisory and the counts
  still gate. A difference carries `diff`'s verdict and kinds: one that is RNG state only, dropped, is an
  improvement to accept (a fix like seed 001's), not a regression.
* ``missing_golden``: a cell without a golden fails; a golden without a cell is reported as stale.
* ``dead_rng`` (default ``warn``): RNG streams the step carries but never draws from (``hlo-audit rng``): each
  costs two entry parameters per step and a counter increment per call. A ``dead_rng`` waiver may name a
  ``pattern`` (a glob over stream patterns) to accept known dead state and still catch new dead streams.
* ``stale_waiver`` (default ``warn``): a waiver that waived nothing although every cell it covers was judged: the
  fix landed, and a waiver left behind would hide the regression coming back.
* ``memory`` (default ``warn``): a ratchet on a compiled cell's memory analysis, as ``count`` is on entry
  parameters: argument, output, temp or generated-code bytes above the golden's by more than
  ``memory_tolerance`` (a fraction, default 2%) is a regression; below it by as much, an improvement that asks
  to tighten the golden. Alias bytes are not gated: more of them means less memory.
"""

from __future__ import annotations

import difflib
import fnmatch
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from hlo_audit.golden import Golden, environment_change, increments_summary
from hlo_audit.hlo.analysis import analyze
from hlo_audit.hlo.constants import golden_summary
from hlo_audit.hlo.diff import captured_change, captured_delta, count_delta, diff_modules, signed_counts
from hlo_audit.hlo.thunks import change_text, group_delta
from hlo_audit.lowering import MEMORY_KINDS
from hlo_audit.matrix import Cell, matches_rule
from hlo_audit.results import SEVERITIES, CellResult, Finding, worst
from hlo_audit.scaling import Series, rng_launch_slope, rng_slope

GATED_MEMORY = tuple(kind.key for kind in MEMORY_KINDS if kind.gated)
# The verdicts of RNG streams whose counter increments per step the count ratchet fails on (gate._count).
GATED_INCREMENTS = ("carried", "unknown")
TEXT_DIFF_LINES = 40


@dataclass(frozen=True)
class Waiver:
    rule: str
    reason: str
    match: Mapping[str, str]  # cell attribute -> value (model, scan, quant, layers, platform)
    pattern: str | None = None  # dead_rng only: a glob over stream patterns; None waives the whole finding
    index: int = -1  # its position in the config's waive list
    source: str = ""  # where it is written: ``hlo-audit.toml: waive[3]``
    built_in: bool = False  # one of the defaults for MaxText's known leaks, not written in the user's config

    def covers(self, rule: str, result: CellResult) -> bool:
        return rule == self.rule and matches_rule(result.cell, self.match)

    def covers_pattern(self, pattern: str) -> bool:
        return self.pattern is not None and fnmatch.fnmatchcase(pattern, self.pattern)


@dataclass(frozen=True)
class Policy:
    actions: Mapping[str, str]
    waivers: Sequence[Waiver] = ()
    memory_tolerance: float = 0.02  # the memory rule's allowance over the golden, as a fraction

    def waiver(self, rule: str, result: CellResult) -> Waiver | None:
        return next((w for w in self.waivers if w.covers(rule, result) and w.pattern is None), None)

    def pattern_waiver(self, rule: str, result: CellResult, pattern: str) -> Waiver | None:
        return next((w for w in self.waivers if w.covers(rule, result) and w.covers_pattern(pattern)), None)


def _byte_changes(changes: Mapping[str, tuple[int, int]]) -> str:
    """``temp_bytes 2,671,656,960 -> 2,800,000,000 (+4.8%)``, one per kind."""
    return ", ".join(f"{k} {a:,} -> {b:,} ({(b - a) / a:+.1%})" if a else f"{k} {a:,} -> {b:,}"
                     for k, (a, b) in changes.items())


class Gate:
    def __init__(self, policy: Policy, regenerate: str):
        self.policy = policy
        self.regenerate = regenerate  # "hlo-audit golden update" (+ --config when not the default)
        self.used: set[int] = set()  # the waivers that waived something (``stale_waivers`` reports the others)

    def _command(self, cell_id: str) -> str:
        return f"{self.regenerate} --only id={cell_id}"

    def _apply(self, rule: str, result: CellResult, finding: Finding | None) -> Finding | None:
        """Policy and waivers turn a would-be regression into a warning, a waiver, or nothing."""
        action = self.policy.actions.get(rule, "fail")
        if action == "off" or finding is None:
            return None
        if finding.severity == "regression":
            waiver = self.policy.waiver(rule, result)
            if waiver is not None:
                self.used.add(waiver.index)
                finding.severity = "waived"
                finding.message += f" [waived: {waiver.reason}]"
            elif action == "warn":
                finding.severity = "advisory"
        return finding

    def check(self, result: CellResult, golden: Golden | None, series: Series | None,
              normalized: str | None) -> list[Finding]:
        cid = result.cell.id
        if result.status == "unavailable":
            return [Finding(cid, "unavailable", "lowering", result.message)]
        if result.status == "error":
            return [Finding(cid, "error", "lowering", result.message)]
        findings: list[Finding | None] = []
        if golden is None:
            findings.append(self._apply("missing_golden", result, Finding(
                cid, "regression", "missing_golden", f"no golden for this cell; create it with: {self._command(cid)}")))
        elif golden.damaged:  # a golden that cannot be read gates nothing: as if missing, and said why
            findings.append(self._apply("missing_golden", result, Finding(
                cid, "regression", "missing_golden", f"{golden.damaged}; regenerate it with: {self._command(cid)}",
                {"regenerate": self._command(cid)})))
        else:
            findings.append(self._apply("count", result, self._count(result, golden, series)))
            text_problem = self._text_problem(result, golden, normalized)
            findings.append(self._apply("missing_golden", result, text_problem) if text_problem else
                            self._apply("hlo_text", result, self._text(result, golden, normalized)))
            findings.append(self._apply("memory", result, self._memory(result, golden)))
        findings.append(self._apply("rng_scaling", result, self._rng_scaling(result, series)))
        findings.append(self._apply("launch_scaling", result, self._launch_scaling(result, series)))
        findings.append(self._apply("dead_rng", result, self._dead_rng(result)))
        kept = [f for f in findings if f is not None]
        return kept or [Finding(cid, "ok", "all", "matches its golden")]

    def _count(self, result: CellResult, golden: Golden, series: Series | None) -> Finding | None:
        """The ratchet: entry parameters by dtype and role, state captured as constants, and the counter
        increments per step of RNG streams never drawn from (carried, or unknown): each a kernel launch on a GPU,
        seed 000's 672 with no parameter added where streams were shared. A drawn stream's increments are
        reported, not gated. A finding says which path patterns grew, shrank or were renamed (with their roles),
        and how the series' per-layer slope moved."""
        cid, old, new = result.cell.id, golden.record, result.summary
        by_dtype = count_delta(old["by_dtype"], new["by_dtype"])
        by_role = count_delta(old["by_role"], new["by_role"])
        patterns = pattern_changes(old["groups"], new["groups"], old.get("groups_by_role", {}),
                                   result.groups_by_role())
        # A golden written before captured state was recorded ratchets entry parameters only.
        captured = (captured_delta(old["constants"], golden_summary(result.constants))
                    if "constants" in old and result.constants is not None else None)
        increments = increment_changes(old.get("rng_increments"), result.rng)
        launches = launch_changes(old.get("launches"), result.launches)
        slopes = slope_changes(old.get("slopes"), series if series is not None and series.cell == result.cell else None)
        details = {"entry_params": {"golden": old["entry_params"], "now": new["entry_params"]},
                   "by_dtype": by_dtype, "by_role": by_role, "groups": count_delta(old["groups"], new["groups"]),
                   "patterns": patterns, "captured": captured, "rng_increments": increments, "launches": launches,
                   "slopes": slopes,
                   "regenerate": self._command(cid)}
        grew = any(v > 0 for v in (*by_dtype.values(), *by_role.values()))
        baked = captured is not None and (any(v > 0 for v in (*captured["by_dtype"].values(),
                                                               *captured["bytes_by_dtype"].values()))
                                           or captured["literal_keys"][1] > captured["literal_keys"][0])
        # Dead increments are the waste seed 000 shipped (672 scalar kernels per step, no parameter added); an
        # increment of a stream the step draws from is the cost of its random bits: it moves with the draws (seed
        # 001's one shared stream is advanced per draw, 42 -> 54 at L2, while its GPU kernels fall 663 -> 600), and
        # the text rule and a GPU cell's launches judge that change, not this proxy.
        more_increments = increments is not None and any(increments["by_verdict"].get(verdict, 0) > 0
                                                         for verdict in GATED_INCREMENTS)
        more_launches = launches is not None and any(v > 0 for v in launches["delta"].values())
        changes = []
        if by_dtype or by_role:
            changes.append(f"entry parameters {old['entry_params']} -> {new['entry_params']}: "
                           f"{signed_counts(by_dtype) or 'dtypes unchanged'}"
                           + (f" ({signed_counts(by_role)})" if by_role else ""))
        changes += [patterns_text(patterns)] if any(patterns.values()) else []
        changes += [captured_change(captured)] if captured else []
        changes += [increments_text(increments)] if increments else []
        changes += [launches_text(launches)] if launches else []
        changes += [slopes_text(slopes)] if slopes else []
        if grew or baked or more_increments or more_launches:
            return Finding(cid, "regression", "count", f"{'; '.join(changes)}. If intended: {self._command(cid)}",
                           details)
        fewer_increments = increments is not None and any(v < 0 for v in increments["by_verdict"].values())
        if changes and not (by_dtype or by_role or captured or fewer_increments or launches or slopes):
            # Renamed patterns, or more increments of drawn streams: nothing gated grew, nothing shrank, but the
            # golden should record it.
            return Finding(cid, "advisory", "count", f"{'; '.join(changes)}; record it: {self._command(cid)}", details)
        if changes:
            return Finding(cid, "improvement", "count",
                           f"{'; '.join(changes)}; tighten the golden: {self._command(cid)}", details)
        return None

    def _text_problem(self, result: CellResult, golden: Golden, normalized: str | None) -> Finding | None:
        """A cell whose text is compared (``normalized`` given) and whose golden text is missing, not UTF-8 or, when
        it differs, not a module: a finding, so a deleted or damaged text never turns the text rule off."""
        if normalized is None:
            return None
        why = golden.text_problem or (golden.text_parse_problem() if golden.hlo != normalized else None)
        if why is None:
            return None
        cid = result.cell.id
        return Finding(cid, "regression", "missing_golden", f"{why}; regenerate it with: {self._command(cid)}",
                       {"regenerate": self._command(cid)})

    def _text(self, result: CellResult, golden: Golden, normalized: str | None) -> Finding | None:
        """The canonical text against the golden's, judged by `diff`'s verdict: a text that differs only by RNG
        state it dropped is an improvement to accept, not a regression."""
        if golden.hlo is None or normalized is None or golden.hlo == normalized:
            return None
        cid = result.cell.id
        diff = list(difflib.unified_diff(golden.hlo.splitlines(), normalized.splitlines(), "golden", "now",
                                         lineterm="", n=0))
        changed = sum(1 for line in diff if line[:1] in "+-" and line[:3] not in ("+++", "---"))
        verdict = text_verdict(golden.hlo, normalized)
        details = {"changed_lines": changed, "diff": diff[:TEXT_DIFF_LINES], "regenerate": self._command(cid),
                   **verdict}
        what = _verdict_words(verdict, changed)
        moved = environment_change(golden.environment, result.environment)
        if moved:
            return Finding(cid, "advisory", "hlo_text",
                           f"{what}, but the environment differs from the golden's ({moved}): advisory; counts still "
                           "gate", details)
        if verdict["verdict"] == "rng-state-only" and verdict["rng_params"] < 0:
            return Finding(cid, "improvement", "hlo_text", f"{what}; accept it: {self._command(cid)}", details)
        return Finding(cid, "regression", "hlo_text", f"{what}. If intended: {self._command(cid)}", details)

    def _memory(self, result: CellResult, golden: Golden) -> Finding | None:
        old, new = golden.record.get("memory"), result.memory
        if old is None or new is None:
            return None
        cid, tolerance = result.cell.id, self.policy.memory_tolerance
        changed = {k: (old[k], new[k]) for k in GATED_MEMORY
                   if k in old and k in new and abs(new[k] - old[k]) > tolerance * old[k]}
        if not changed:
            return None
        details = {"memory": {k: {"golden": a, "now": b} for k, (a, b) in changed.items()},
                   "tolerance": tolerance, "regenerate": self._command(cid)}
        grown = {k: v for k, v in changed.items() if v[1] > v[0]}
        if grown:
            return Finding(cid, "regression", "memory",
                           f"compiled memory grew beyond {tolerance:.0%} of the golden: {_byte_changes(grown)}."
                           f" If intended: {self._command(cid)}", details)
        return Finding(cid, "improvement", "memory",
                       f"compiled memory shrank: {_byte_changes(changed)}; tighten the golden: {self._command(cid)}",
                       details)

    def _rng_scaling(self, result: CellResult, series: Series | None) -> Finding | None:
        """Reported once per series, on its shallowest cell."""
        if result.cell.scan or series is None or series.cell != result.cell:
            return None
        slope = rng_slope(series)
        if slope <= 0:
            return None
        by_role = {k: series.by_role[k].slope for k in ("rng_key", "rng_count") if k in series.by_role}
        return Finding(result.cell.id, "regression", "rng_scaling",
                       f"RNG parameters grow by {slope:g} per layer in an unrolled model "
                       f"({', '.join(f'{k} {v:+g}' for k, v in by_role.items())}; "
                       f"depths {', '.join(map(str, series.depths))})",
                       {"rng_per_layer": slope, "depths": list(series.depths)})

    def _launch_scaling(self, result: CellResult, series: Series | None) -> Finding | None:
        """Kernels that read RNG state, per layer of an unrolled GPU series; reported once, on its shallowest cell."""
        if result.cell.scan or series is None or series.cell != result.cell:
            return None
        slope = rng_launch_slope(series)
        if slope <= 0:
            return None
        lines = {k: series.launches[k].slope for k in ("total", "scalar") if series.launches[k].slope}
        depths = series.depths
        grown = [g.describe(signed=True) for g in series.launch_groups if g.count > 0][:3]
        return Finding(result.cell.id, "regression", "launch_scaling",
                       f"kernels that read RNG state grow by {slope:g} per layer in an unrolled model "
                       f"({', '.join(f'{k} {v:+g}' for k, v in lines.items())} per layer; depths "
                       f"{', '.join(map(str, depths))})"
                       + (f"; L{depths[0]} -> L{depths[-1]}: {'; '.join(grown)}" if grown else ""),
                       {"rng_launches_per_layer": slope, "launches_per_layer": lines, "depths": list(depths),
                        "groups": [g.to_record() for g in series.launch_groups]})

    def _dead_rng(self, result: CellResult) -> Finding | None:
        """Carried streams, by pattern; patterns a waiver names are set apart, and alone they make a waived finding."""
        record = result.rng
        if not record or not record["carried"]:
            return None
        dead = [p for p in record["patterns"] if p["carried"]]
        waived = {p["pattern"]: w for p in dead if (w := self.policy.pattern_waiver("dead_rng", result, p["pattern"]))}
        self.used.update(w.index for w in waived.values())
        open_ = [p for p in dead if p["pattern"] not in waived]
        shown = open_ or dead
        params = sum(p["dead_params"] for p in shown)
        increments = sum(p["dead_increments"] for p in shown)
        top = shown[0]
        more = f" and {len(shown) - 1} more patterns" if len(shown) > 1 else ""
        message = (f"{sum(p['carried'] for p in shown)} RNG streams never drawn: {params} entry parameters and "
                   f"{increments:g} counter increments per step of dead state (largest: {top['pattern']} "
                   f"x{top['carried']}{more}); see `hlo-audit rng {result.cell.id}`")
        details = {"dead_params": params, "dead_increments": increments, "patterns": [p["pattern"] for p in shown],
                   "waived_patterns": {k: w.reason for k, w in waived.items()}}
        if not open_:
            reasons = "; ".join(sorted({w.reason for w in waived.values()}))
            return Finding(result.cell.id, "waived", "dead_rng", f"{message} [waived: {reasons}]", details)
        return Finding(result.cell.id, "regression", "dead_rng", message, details)


# --------------------------------------------------------------------------------------------------------------
# What changed, in words a reviewer can act on
# --------------------------------------------------------------------------------------------------------------


def pattern_changes(old: Mapping[str, int], new: Mapping[str, int], old_roles: Mapping[str, Mapping[str, int]],
                    new_roles: Mapping[str, Mapping[str, int]]) -> dict[str, list[dict]]:
    """Path patterns that grew, shrank, or were renamed (one gone and one new with the same count and roles:
    ``self_attention.rngs.*`` -> ``attention_op.rngs.*``), each with the roles of its change."""
    delta = count_delta(old, new)

    def roles(pattern: str) -> dict[str, int]:
        return count_delta(old_roles.get(pattern, {}), new_roles.get(pattern, {}))

    gone = [p for p, d in delta.items() if d < 0 and p not in new]
    arrived = [p for p, d in delta.items() if d > 0 and p not in old]
    renamed = []
    for before in gone:
        signature = {r: -n for r, n in roles(before).items()}
        after = next((p for p in arrived if delta[p] == -delta[before] and (not signature or roles(p) == signature)),
                     None)
        if after is not None:
            arrived.remove(after)
            renamed.append({"from": before, "to": after, "params": delta[after], "roles": roles(after)})
    moved = {r["from"] for r in renamed} | {r["to"] for r in renamed}
    return {
        "grown": [{"pattern": p, "delta": d, "roles": roles(p)} for p, d in delta.items() if d > 0 and p not in moved],
        "shrunk": [{"pattern": p, "delta": d, "roles": roles(p)} for p, d in delta.items() if d < 0 and p not in moved],
        "renamed": renamed,
    }


def patterns_text(patterns: Mapping[str, list[dict]]) -> str:
    """``grown: +84 ...to_nnx__rngs.* (rng_count +42, rng_key +42); renamed: a -> b (6 params)``"""
    def entry(change: dict) -> str:
        roles = f" ({signed_counts(change['roles'])})" if change["roles"] else ""
        return f"{change['delta']:+d} {change['pattern']}{roles}"

    parts = [f"{kind}: {', '.join(entry(c) for c in patterns[kind])}" for kind in ("grown", "shrunk") if patterns[kind]]
    if patterns["renamed"]:
        parts.append("renamed: " + ", ".join(f"{r['from']} -> {r['to']} ({r['params']} params)"
                                             for r in patterns["renamed"]))
    return "; ".join(parts)


def increment_changes(old: Mapping | None, rng: Mapping | None) -> dict | None:
    """RNG counter increments per step against the golden's, by verdict and by stream pattern (with the paths of the
    streams whose increments grew); None when the golden predates the record or nothing changed."""
    if old is None or rng is None:
        return None
    new = increments_summary(rng)
    by_verdict = count_delta(old["by_verdict"], new["by_verdict"])
    if not by_verdict:
        return None
    by_pattern = count_delta(old["by_pattern"], new["by_pattern"])
    paths = {p["pattern"]: sorted({path for paths in p.get("paths", {}).values() for path in paths})
             for p in rng["patterns"] if by_pattern.get(p["pattern"], 0) > 0}
    return {"golden": sum(old["by_verdict"].values()), "now": sum(new["by_verdict"].values()),
            "by_verdict": by_verdict, "by_pattern": by_pattern, "paths": paths}


def increments_text(increments: Mapping) -> str:
    """``RNG counter increments per step 7 -> 679 (carried +672), in state.model...rngs (x3 streams: a, b, c)``"""
    text = (f"RNG counter increments per step {increments['golden']:g} -> {increments['now']:g} "
            f"({signed_counts(increments['by_verdict'])})")
    grown = [f"{pattern} {delta:+g} ({', '.join(increments['paths'].get(pattern, []))})"
             for pattern, delta in increments["by_pattern"].items() if delta > 0]
    return text + (f" in {'; '.join(grown)}" if grown else "")


# The launch counts the ratchet holds a GPU cell to (keys of its launches record).
GATED_LAUNCHES = ("total", "scalar", "collectives")


def launch_changes(old: Mapping | None, new: Mapping | None) -> dict | None:
    """A GPU cell's launches per step against the golden's: kernels in all, scalar ones and collectives, with the
    launch groups that came and went (``hlo.thunks.group_delta``); None when either side has no launches record
    (a golden written before they were kept, a cell that is not a GPU's) or no gated count moved."""
    if old is None or new is None:
        return None
    counts = {k: (old.get(k, 0), new.get(k, 0)) for k in GATED_LAUNCHES}
    delta = {k: b - a for k, (a, b) in counts.items() if a != b}
    if not delta:
        return None
    groups = group_delta(old.get("groups", {}), new.get("groups", {}))
    return {"golden": {k: a for k, (a, _) in counts.items()}, "now": {k: b for k, (_, b) in counts.items()},
            "delta": delta, "groups": [g.to_record() for g in groups],
            "lines": [g.describe(signed=True) for g in groups]}


def launches_text(launches: Mapping) -> str:
    """``kernels per step 580 -> 622 (+42, scalar +42): +42 scalar kernels loop_add_fusion, each reading ...``"""
    shown = launches["lines"][:3]
    more = f"; and {len(launches['lines']) - 3} more launch groups" if len(launches["lines"]) > 3 else ""
    return (change_text(launches["golden"], launches["now"], launches["delta"])
            + (f": {'; '.join(shown)}{more}" if shown else ""))


def slope_changes(old: Mapping | None, series: Series | None) -> dict | None:
    """The series' entry parameters and RNG parameters per layer against the golden's (reported on the series'
    shallowest cell, where the golden keeps its slopes); None when either side has no slopes or nothing moved."""
    if old is None or series is None:
        return None
    rng_before = sum(old["by_role"].get(k, 0) for k in ("rng_key", "rng_count"))
    changes = {}
    if old["total"] != series.total.slope:
        changes["params_per_layer"] = [old["total"], series.total.slope]
    if rng_before != rng_slope(series):
        changes["rng_per_layer"] = [rng_before, rng_slope(series)]
    if "launches" in old and series.launches:
        for key, word in (("total", "kernels_per_layer"), ("reading_rng", "rng_kernels_per_layer")):
            if old["launches"].get(key, 0) != series.launches[key].slope:
                changes[word] = [old["launches"].get(key, 0), series.launches[key].slope]
    return changes or None


def slopes_text(slopes: Mapping) -> str:
    words = {"params_per_layer": "entry parameters per layer", "rng_per_layer": "RNG parameters per layer",
             "kernels_per_layer": "kernels per layer", "rng_kernels_per_layer": "kernels reading RNG state per layer"}
    return "; ".join(f"{words[k]} {a:+g} -> {b:+g}" for k, (a, b) in slopes.items())


def text_verdict(golden_text: str, text: str) -> dict:
    """`diff`'s verdict between the golden's canonical text and the cell's, with the kinds of change and the RNG
    parameters gained (negative: dropped)."""
    before, after = analyze(golden_text, "golden"), analyze(text, "now")
    result = diff_modules(before, after, max_text_lines=0)
    rng = sum(p.is_rng for p in after.params) - sum(p.is_rng for p in before.params)
    return {"verdict": result.verdict, "changes": result.changes, "rng_params": rng}


def _verdict_words(verdict: Mapping, changed_lines: int) -> str:
    if verdict["verdict"] == "rng-state-only":
        rng = verdict["rng_params"]
        amount = f"{abs(rng)} {'fewer' if rng < 0 else 'more'} RNG parameters" if rng else "RNG bookkeeping"
        return f"normalized HLO differs from the golden by RNG state only ({amount}; rng-state-only)"
    kinds = f" ({', '.join(verdict['changes'])})" if verdict["changes"] else ""
    return f"normalized HLO differs from the golden in {changed_lines} lines: {verdict['verdict']}{kinds}"


def stale_waivers(gate: Gate, judged: Sequence[CellResult], matrix: Sequence[Cell]) -> list[Finding]:
    """Waivers that waived nothing, although every cell of the matrix they cover was judged here: a fix landed (or
    the waiver never matched), and a waiver left behind would hide the regression coming back. Policy
    ``stale_waiver`` (default warn) says what that is."""
    action = gate.policy.actions.get("stale_waiver", "warn")
    if action == "off":
        return []
    judged_ids = {r.cell.id for r in judged if r.status == "ok"}
    findings = []
    for waiver in gate.policy.waivers:
        covered = [c.id for c in matrix if matches_rule(c, waiver.match)]
        if waiver.index in gate.used or not set(covered) <= judged_ids or (waiver.built_in and not covered):
            continue  # a built-in waiver for cells this config's matrix leaves out is no one's to drop
        what = (f"covers {len(covered)} cells, none of which has a {waiver.rule} finding to waive" if covered
                else "matches no cell of the matrix")
        findings.append(Finding(waiver.source, "regression" if action == "fail" else "advisory", "stale_waiver",
                                f"waiver for {waiver.rule} {dict(waiver.match)} {what}: drop it, or it will hide "
                                f"that regression coming back (reason given: {waiver.reason})",
                                {"rule": waiver.rule, "match": dict(waiver.match), "covered": len(covered)}))
    return findings


def stale(golden_ids: Sequence[str], matrix_ids: set[str]) -> list[Finding]:
    return [Finding(cid, "stale", "missing_golden", "golden without a cell in the matrix (remove with "
                    "`hlo-audit golden update --prune`)") for cid in golden_ids if cid not in matrix_ids]


# Advisories that hold for most cells of a real model (MaxText carries dead RNG state in every cell today):
# reports fold them into one line unless asked for every finding.
FOLDED_ADVISORIES = frozenset({"dead_rng"})
# What a human need not read one by one in the summary view: a cell that matches its golden (the "ok"
# placeholder), one this host cannot lower (listed in a line per reason), a waived finding (its waiver says why).
QUIET_SEVERITIES = frozenset({"ok", "unavailable", "waived"})


def fold_advisories(findings: Sequence[Finding]) -> tuple[list[Finding], list[Finding]]:
    """(findings to list one by one, folded advisories)."""
    folded = [f for f in findings if f.severity == "advisory" and f.rule in FOLDED_ADVISORIES]
    return [f for f in findings if f not in folded], folded


def folded_line(folded: Sequence[Finding]) -> str:
    rules = sorted({f.rule for f in folded})
    params = sum(f.details.get("dead_params", 0) for f in folded)
    return (f"{len({f.cell for f in folded})} cells carry never-drawn RNG streams ({', '.join(rules)}: warn, "
            f"{params} dead params); see `hlo-audit rng CELL`")


def severity_counts(findings: Sequence[Finding]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for f in findings:
        counts[f.severity] = counts.get(f.severity, 0) + 1
    return dict(sorted(counts.items()))


def _in_severity_order(counts: Mapping[str, int]) -> dict[str, int]:
    """Least severe first (``ok`` before ``regression``), as every format prints them; zero counts left out."""
    return {k: counts[k] for k in sorted(counts, key=SEVERITIES.index) if counts[k]}


@dataclass(frozen=True)
class CheckSummary:
    """The numbers every format of a check prints, decided once (``CheckReport.summary``).

    ``cells``: the cells checked (stale goldens are not cells: they are counted apart). Each cell has one verdict,
    its worst finding once advisories are folded (``FOLDED_ADVISORIES``: dead RNG state, which has its own column
    and line); ``cells_by_verdict`` counts cells and sums to ``cells``. ``findings_by_severity`` counts findings
    (what the gate said, several per cell at most), the "matches its golden" placeholders left out; ``folded``
    of the advisories among them are folded into one line.
    """

    passed: bool
    exit_code: int
    cells: int
    cells_by_verdict: Mapping[str, int]
    findings_by_severity: Mapping[str, int]
    folded: int
    stale_goldens: int

    def to_record(self) -> dict:
        return {"cells": self.cells, "cells_by_verdict": dict(self.cells_by_verdict),
                "findings_by_severity": dict(self.findings_by_severity), "folded_advisories": self.folded,
                "stale_goldens": self.stale_goldens}


@dataclass(frozen=True)
class CheckReport:
    """A check's findings and cells, with what every format prints about them decided here, once: which
    advisories fold, each cell's verdict, the counts, which findings a human must read."""

    findings: list[Finding]
    results: list[CellResult]
    # Which shard of which selection this is (`merge` checks them): index, count, matrix fingerprint, cells.
    shard: Mapping | None = None

    @property
    def failing(self) -> list[Finding]:
        return [f for f in self.findings if f.failing]

    @property
    def exit_code(self) -> int:
        return 1 if self.failing else 0

    @property
    def passed(self) -> bool:
        return not self.exit_code

    def listed_and_folded(self, verbose: bool = False) -> tuple[list[Finding], list[Finding]]:
        """(findings to list one by one, folded advisories); ``verbose`` folds nothing."""
        return (list(self.findings), []) if verbose else fold_advisories(self.findings)

    @property
    def folded(self) -> list[Finding]:
        return fold_advisories(self.findings)[1]

    @property
    def folded_line(self) -> str:
        return folded_line(self.folded)

    @property
    def cell_ids(self) -> list[str]:
        """The cells checked, in the order they ran (a merged report: shard by shard)."""
        return list(dict.fromkeys(r.cell.id for r in self.results))

    @property
    def verdicts(self) -> dict[str, str]:
        """Each checked cell's verdict: its worst finding once advisories are folded (a cell whose only findings
        were folded is ok). The same with or without ``--verbose``, which lists more and decides nothing."""
        listed = fold_advisories(self.findings)[0]
        by_cell: dict[str, list[Finding]] = {cid: [] for cid in self.cell_ids}
        for f in listed:
            if f.cell in by_cell:
                by_cell[f.cell].append(f)
        return {cid: worst(fs) for cid, fs in by_cell.items()}

    @property
    def stale_goldens(self) -> list[str]:
        """Goldens without a cell in the matrix (not cells: no verdict, counted apart)."""
        checked = set(self.cell_ids)
        return sorted({f.cell for f in self.findings if f.severity == "stale" and f.cell not in checked})

    @property
    def summary(self) -> CheckSummary:
        cells_by_verdict: dict[str, int] = {}
        for verdict in self.verdicts.values():
            cells_by_verdict[verdict] = cells_by_verdict.get(verdict, 0) + 1
        return CheckSummary(
            passed=self.passed, exit_code=self.exit_code, cells=len(self.cell_ids),
            cells_by_verdict=_in_severity_order(cells_by_verdict),
            findings_by_severity=_in_severity_order(severity_counts([f for f in self.findings if f.severity != "ok"])),
            folded=len(self.folded), stale_goldens=len(self.stale_goldens))

    def attention(self, verbose: bool = False) -> list[Finding]:
        """The findings a human must read, one by one: every finding that is not quiet (``QUIET_SEVERITIES``) and
        not folded; ``verbose``: every finding."""
        if verbose:
            return list(self.findings)
        return [f for f in fold_advisories(self.findings)[0] if f.severity not in QUIET_SEVERITIES]

    def of_severity(self, severity: str) -> list[Finding]:
        return [f for f in self.findings if f.severity == severity]

    @property
    def finding_counts(self) -> dict[str, int]:
        """Every finding by severity, the placeholders included: JSON's ``summary`` (schema v1)."""
        return severity_counts(self.findings)

    def series_verdict(self, cell_ids: Sequence[str]) -> str:
        """The worst verdict of some cells (a depth series' row)."""
        verdicts = self.verdicts
        return max((verdicts.get(c, "ok") for c in cell_ids), key=SEVERITIES.index, default="ok")
