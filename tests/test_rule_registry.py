"""The registry is the one place a rule is listed (issue 38 item 1): every ``[policy]`` key a config accepts, every
default action, every judge the gate runs and every tolerance a policy's fingerprint reads comes from
``rules.registry.SPECS``, and a spec added there alone is judged, worded, detailed and configurable."""

from __future__ import annotations

import dataclasses
import importlib
import json
import pkgutil
from pathlib import Path

import pytest

from hlo_audit import rules as rules_package
from hlo_audit.config import ConfigError, load_config
from hlo_audit.findings import Finding, NamedChange
from hlo_audit.hlo.params import ParamSummary
from hlo_audit.judging.gate import Gate
from hlo_audit.judging.outcome import _folds
from hlo_audit.matrix import Cell
from hlo_audit.merge import finding_record
from hlo_audit.plan import Judge
from hlo_audit.policy import Action, Policy
from hlo_audit.report.words import message
from hlo_audit.results import LoweredCell, Severity
from hlo_audit.rules import registry
from hlo_audit.rules.spec import Context, RuleSpec, Subject, Tolerance

RESULT = LoweredCell(cell=Cell("m", False, "none", 2),
                     summary=ParamSummary(entry_params=0, by_dtype={}, by_role={}, groups={}, bytes_by_role={}))


def _specs_in_modules() -> list[RuleSpec]:
    """Every spec any module of the rules package defines."""
    found = []
    for info in pkgutil.iter_modules(rules_package.__path__):
        module = importlib.import_module(f"hlo_audit.rules.{info.name}")
        found += [value for value in vars(module).values() if isinstance(value, RuleSpec)]
    return found


def test_every_spec_is_registered_once_and_names_every_rule():
    names = [spec.name for spec in registry.SPECS]
    assert len(names) == len(set(names))
    assert {id(s) for s in _specs_in_modules()} == {id(s) for s in registry.SPECS}  # none defined and left out
    assert list(registry.default_policy()) == names
    assert {r.value for r in registry.Rule} == {*names, *registry.NOT_RULES.values()}
    assert [s.name for s in registry.judged()] == [s.name for s in registry.SPECS if s.judge is not None]


def test_every_finding_a_spec_declares_is_worded_and_detailed():
    """A rule's findings are worded and detailed by its spec, in its own module (issue 49: a rule's words lived in
    three tables besides its spec): every spec whose findings carry facts of their own has both; a named rule's are
    the frame every named rule shares (its changes' lines, ``numbers``)."""
    for spec in registry.SPECS:
        if spec.facts == (NamedChange,):
            assert spec.message is None and spec.details is None, spec.name
        else:
            assert spec.message is not None and spec.details is not None, spec.name
            owner = {m for m in (spec.message.__module__, spec.details.__module__)}
            assert len(owner) == 1 and owner.pop().startswith("hlo_audit.rules."), spec.name


def test_a_rule_with_facts_of_its_own_is_worded_and_detailed_by_its_spec_alone(monkeypatch):
    """A new kind of finding costs its facts, its rule's module (judge, words, details) and one registry line: no
    table in report/ or merge names it."""
    @dataclasses.dataclass(frozen=True)
    class Odd:
        count: int

    def odd(subject: Subject, ctx: Context) -> Finding:
        return Finding(subject.cell, Severity.REGRESSION, "odd", Odd(3))

    spec = RuleSpec("odd", Action.FAIL, odd, (Odd,), needs_golden=False, doc="a test's rule",
                    message=lambda facts: f"{facts.count} odd things", details=lambda facts: {"odd": facts.count})
    monkeypatch.setattr(registry, "SPECS", (*registry.SPECS, spec))
    [found] = [f for f in Gate(Policy(registry.default_policy()), "x").judge_cell(RESULT, None, None, None)[0]
               if f.rule == "odd"]
    assert message(found) == "3 odd things"
    assert finding_record(found)["details"] == {"odd": 3}


def test_every_policy_key_config_accepts_is_a_spec(tmp_path):
    """Each rule's action, each rule's tolerance in [policy] (and the top-level ones where the spec says so); any
    other key is one line naming it."""
    def load(text: str):
        (tmp_path / "hlo-audit.toml").write_text(text)
        return load_config(cwd=tmp_path).rules

    for spec in registry.SPECS:
        assert load(f'[policy]\n{spec.name} = "off"\n').action(spec.name, spec.action) is Action.OFF
    for key, spec in registry.tolerance_keys().items():
        assert registry.tolerances(load(f"[policy]\n{key} = 0.25\n"))[spec.name] == 0.25
        with pytest.raises(ConfigError, match=rf"^hlo-audit.toml: policy.{key}: expected a fraction in \[0, 1\)"):
            load(f'[policy]\n{key} = "5%"\n')
        at_top = f"{key} = 0.25\n"
        if spec.tolerance.top_level:
            assert registry.tolerances(load(at_top))[spec.name] == 0.25
            with pytest.raises(ConfigError, match=f"policy.{key}: set at the top level too"):
                load(f"{at_top}[policy]\n{key} = 0.1\n")
        else:
            with pytest.raises(ConfigError, match=f"unknown key '{key}'"):
                load(at_top)
    for spec in registry.SPECS:
        waiver = f'[[waive]]\nrule = "{spec.name}"\nreason = "r"\npattern = "a.*"\n'
        if spec.pattern_waivers:
            assert load(waiver).waivers[0].pattern == "a.*"
        else:
            with pytest.raises(ConfigError, match=r"waive\[0\].pattern: unknown key"):
                load(waiver)
    with pytest.raises(ConfigError, match="policy.vibes: unknown rule") as refused:
        load('[policy]\nvibes = "off"\n')
    assert "\n" not in str(refused.value)


def test_a_default_policy_fingerprints_the_tolerances_it_always_did(tmp_path):
    """memory's and program_size's tolerance are always in the policy's fingerprint (a default policy's digest is the
    one shards already wrote); host_cost's only where a config sets it otherwise than its default."""
    default = Policy(registry.default_policy())
    assert registry.fingerprinted_tolerances(default) == {"memory_tolerance": 0.02, "program_size_tolerance": 0.05}
    set_host = Policy(registry.default_policy(), tolerances={"host_cost": 0.5})
    assert registry.fingerprinted_tolerances(set_host)["host_cost_tolerance"] == 0.5
    (tmp_path / "hlo-audit.toml").write_text('[policy]\nhost_cost_tolerance = 0.5\n')
    other = Judge.of(load_config(cwd=tmp_path))
    (tmp_path / "hlo-audit.toml").write_text('[policy]\nhost_cost_tolerance = 0.0\n')
    assert Judge.of(load_config(cwd=tmp_path)).policy != other.policy


def _always(subject: Subject, ctx: Context) -> Finding | None:
    """A test rule: every cell, with its tolerance in the facts."""
    return Finding(subject.cell, Severity.REGRESSION, "always", NamedChange(
        "always", True, (), tolerance=ctx.tolerance("always"), command=ctx.command(subject.cell)))


ALWAYS = RuleSpec("always", Action.FAIL, _always, (NamedChange,), tolerance=Tolerance(0.1, "0.1 for 10%"),
                  needs_golden=False, doc="every cell (a test's rule)")


def test_a_spec_added_to_the_registry_alone_is_judged_worded_and_configurable(tmp_path, monkeypatch):
    monkeypatch.setattr(registry, "SPECS", (*registry.SPECS, ALWAYS))
    (tmp_path / "hlo-audit.toml").write_text('[policy]\nalways = "warn"\nalways_tolerance = 0.3\n')
    policy = load_config(cwd=tmp_path).rules
    assert policy.actions["always"] == "warn" and policy.tolerances == {"always": 0.3}

    [found] = [f for f in Gate(policy, "hlo-audit golden update").judge_cell(RESULT, None, None, None)[0]
               if f.rule == "always"]
    assert found.severity is Severity.ADVISORY  # warned: the policy's action applied
    assert found.facts.tolerance == 0.3
    assert message(found).endswith("If intended: hlo-audit golden update --only id=" + RESULT.cell.id)
    record = finding_record(found)
    assert json.loads(json.dumps(record))["details"]["tolerance"] == 0.3

    assert not _folds(found)  # a warned finding of its own, unless its spec folds its advisories into one line
    monkeypatch.setattr(registry, "SPECS", (*registry.SPECS[:-1], dataclasses.replace(ALWAYS, folds=True)))
    assert _folds(found)

    default = Gate(Policy(registry.default_policy()), "x").judge_cell(RESULT, None, None, None)[0]
    assert [(f.severity, f.facts.tolerance) for f in default if f.rule == "always"] == [(Severity.REGRESSION, 0.1)]
    assert not [f for f in Gate(Policy({"always": "off"}), "x").judge_cell(RESULT, None, None, None)[0] if f.rule == "always"]


_SEVERITY_BY_ACTION = {Action.FAIL: Severity.REGRESSION, Action.WARN: Severity.ADVISORY, Action.OFF: None}


@pytest.mark.parametrize("spec", registry.SPECS, ids=lambda spec: spec.name)
def test_a_policy_that_names_no_rule_judges_each_by_its_spec_s_default(spec):
    """Issue 49: ``Policy({})`` failed every rule, its fallback FAIL, while the gate's stale waivers passed their
    spec's warn: two mappings of action to severity. One function applies the policy (``registry.applied``) to every
    finding, the gate's own included, with the spec's default where the config names the rule not."""
    regression = Finding(RESULT.cell.id, Severity.REGRESSION, spec.name, NamedChange(spec.name, True, ()))
    applied = registry.applied(Policy({}), regression, RESULT.cell)
    assert (applied.severity if applied is not None else None) is _SEVERITY_BY_ACTION[spec.action]
    # The config's action wins over the default, whichever it is.
    for action, severity in _SEVERITY_BY_ACTION.items():
        set_here = registry.applied(Policy({spec.name: action.value}), regression, RESULT.cell)
        assert (set_here.severity if set_here is not None else None) is severity


def test_the_gate_s_stale_waiver_goes_through_the_same_policy():
    """A waiver that waived nothing, under a policy that names no rule: stale_waiver's default (warn), through the
    one function; set to fail it fails, off it says nothing."""
    from hlo_audit.judging.gate import stale_waivers
    from hlo_audit.policy import Waiver

    waiver = Waiver(rule="count", reason="r", match={"model": "m"}, index=0, source="hlo-audit.toml: waive[0]")
    cell = RESULT.cell
    severities = {}
    for actions in ({}, {"stale_waiver": "fail"}, {"stale_waiver": "off"}):
        found = stale_waivers(Policy(actions, (waiver,)), set(), [RESULT], [cell])
        severities[tuple(actions.values())] = [f.severity for f in found]
    assert severities == {(): [Severity.ADVISORY], ("fail",): [Severity.REGRESSION], ("off",): []}
    assert registry.spec_of("stale_waiver").action is Action.WARN


def _rule_name_lists() -> list[str]:
    """Every literal tuple, list, set or dict-key collection in hlo_audit's source that holds two or more rule names
    and nothing else: a hand-kept list of rules (``where: names``)."""
    import ast

    names = {spec.name for spec in registry.SPECS}
    found = []
    for path in sorted(Path(rules_package.__file__).parent.parent.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            elements = (node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else
                        [k for k in node.keys if k is not None] if isinstance(node, ast.Dict) else [])
            said = [e.value for e in elements if isinstance(e, ast.Constant) and isinstance(e.value, str)]
            if len(said) >= 2 and len(said) == len(elements) and set(said) <= names:
                found.append(f"{path.name}:{node.lineno}: {said}")
    return found


def test_no_module_keeps_a_list_of_rules_by_hand():
    """Issue 49: GOLDEN_PARTS named 5 rules that compare a golden's text while 17 specs read its diff. Every list of
    rules is derived from the specs (``registry.comparing``, ``registry.size_explained``...), none written out."""
    assert _rule_name_lists() == []


def _kind_lists() -> list[str]:
    """Every literal collection outside the HLO core (which detects the kinds, in its own order) that holds two or
    more ``ChangeKind`` members, and every dict keyed by two or more rules' facts types: a hand-kept table of kinds
    or of findings (the words tables change_words, report.words and merge kept, issue 49)."""
    import ast

    facts_types = {facts.__name__ for spec in registry.SPECS for facts in spec.facts}
    found = []
    for path in sorted(Path(rules_package.__file__).parent.parent.rglob("*.py")):
        if path.parent.name == "hlo":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            elements = (node.elts if isinstance(node, (ast.Tuple, ast.List, ast.Set)) else
                        [k for k in node.keys if k is not None] if isinstance(node, ast.Dict) else [])
            kinds = [e.attr for e in elements if isinstance(e, ast.Attribute) and isinstance(e.value, ast.Name)
                     and e.value.id == "ChangeKind"]
            if len(kinds) >= 2:
                found.append(f"{path.name}:{node.lineno}: {kinds}")
            # A table keyed by rules' facts types (report.words._MESSAGES and merge._DETAILS were): their words and
            # details are their specs'.
            facts = [e.id for e in elements if isinstance(e, ast.Name) and e.id in facts_types]
            if isinstance(node, ast.Dict) and len(facts) >= 2:
                found.append(f"{path.name}:{node.lineno}: {facts}")
    return found


def test_each_kind_of_change_is_worded_by_one_spec_in_its_rule_s_module(monkeypatch):
    """Issue 49 item 1: a kind's word and line are its spec's (``RuleSpec.words``), in the module of the rule that
    words it; every list of kinds is derived from the specs, none kept by hand; a spec's words are what every
    report prints for its kind."""
    from hlo_audit.hlo.changes import Action as ChangeAction
    from hlo_audit.hlo.changes import Change, ChangeKind, Place
    from hlo_audit.report.change_words import change_line
    from hlo_audit.rules import routing
    from hlo_audit.rules.spec import KindWords

    worded = [w.kind for spec in registry.SPECS for w in spec.words]
    assert sorted(worded) == sorted(ChangeKind), "each kind of change is worded by exactly one spec"
    assert all(w.kind in spec.reads or spec.name == "hlo_text" for spec in registry.SPECS for w in spec.words)
    assert _kind_lists() == []
    change = Change(ChangeKind.ROUTING, ChangeAction.CHANGED, "routing", Place(source="moe.py:89"), before="argmax x2",
                    after="top_k (k=2) x2", per_step=8, instructions=-12)
    assert change_line(change) == "routing: argmax x2 -> top_k (k=2) x2, 8 runs per step; -12 instructions; at moe.py:89"
    # The spec's words are the line: replaced there alone, every format says the new words.
    reworded = dataclasses.replace(routing.SPEC, words=(KindWords(ChangeKind.ROUTING, "selection"),))
    monkeypatch.setattr(registry, "SPECS", tuple(reworded if s is routing.SPEC else s for s in registry.SPECS))
    assert change_line(change) == "selection: 1 routing: argmax x2 -> top_k (k=2) x2 at moe.py:89"


def test_what_a_golden_lacks_names_the_rules_its_specs_say_compare_it(monkeypatch):
    """Each part of a golden is worded once and compared by the rules whose specs say so: every rule that reads the
    text's diff compares the text; a spec added with a part of its own is named where a golden lacks it."""
    from hlo_audit.findings import GoldenPart, MissingGolden
    from hlo_audit.rules.missing_golden import GOLDEN_PARTS, left_without

    assert set(GOLDEN_PARTS) == set(GoldenPart)
    assert all(registry.comparing(part) for part in GoldenPart), {p: registry.comparing(p) for p in GoldenPart}
    assert set(registry.comparing(GoldenPart.TEXT)) == {spec.name for spec in registry.SPECS if spec.reads}

    def lacking() -> Finding:  # as the judge makes it: the rules left without, from the context the registry builds
        facts = MissingGolden("g.json", "cmd", lacks=(GoldenPart.SLOPES,), golden_format=1)
        ctx = registry.context(Policy(registry.default_policy()), lambda cid: "cmd")
        facts = dataclasses.replace(facts, without=left_without(facts.lacks, ctx))
        return Finding("m/scan-off/none/L2", Severity.REGRESSION, "missing_golden", facts)

    assert "the rule count has nothing to compare" in message(lacking())
    assert finding_record(lacking())["details"]["without"] == ["count"]
    monkeypatch.setattr(registry, "SPECS", (*registry.SPECS, dataclasses.replace(
        ALWAYS, golden_parts=(GoldenPart.SLOPES,))))
    assert "the rules count and always have nothing to compare" in message(lacking())


def test_program_size_leaves_to_the_rules_whose_specs_explain_size(monkeypatch):
    """The kinds program_size leaves to other rules are those their specs mark (``explains_size``), not a list of
    its own: the loops, remat, gradient, conditional, precision and routing rules' kinds."""
    from hlo_audit.hlo.changes import ChangeKind

    assert set(registry.size_explained()) == {
        kind for spec in registry.SPECS if spec.name in ("loops", "remat", "gradient", "conditional", "precision",
                                                         "routing") for kind in spec.reads}
    assert ChangeKind.LOOPS in registry.size_explained() and ChangeKind.OPS not in registry.size_explained()
    monkeypatch.setattr(registry, "SPECS", (*registry.SPECS, dataclasses.replace(
        ALWAYS, reads=(ChangeKind.OPS,), explains_size=True)))
    assert ChangeKind.OPS in registry.size_explained()


def test_the_configuration_docs_list_every_policy_key():
    """docs/configuration.md's ``[policy]`` block names every rule's action and every tolerance [policy] takes."""
    text = (Path(__file__).resolve().parents[1] / "docs" / "configuration.md").read_text()
    block = text[text.index("[tool.hlo-audit.policy]"):]
    block = block[:block.index("\n\n")]
    keys = {line.split("=")[0].strip() for line in block.splitlines()[1:] if "=" in line and not line.startswith(" ")}
    assert keys == {*registry.default_policy(), *registry.tolerance_keys()}


def test_the_readme_rules_table_lists_every_rule():
    """README's table of rules (its first column) is the registry's rules, each once."""
    text = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    table = text[text.index("| rule | fails when |"):]
    table = table[:table.index("\n\n")]
    named = [line.split("|")[1].strip().strip("`") for line in table.splitlines()[2:]]
    assert sorted(named) == sorted(registry.default_policy()), set(named) ^ set(registry.default_policy())
