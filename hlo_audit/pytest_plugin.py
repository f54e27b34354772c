"""pytest plugin: ``pytest --hlo-audit`` runs `hlo-audit check` with one test item per matrix cell.

Items are named by cell id (``hlo-audit::llama3-8b/scan-off/int8/L2``), collected in a stable order so
pytest-xdist (``-n N``) can distribute them, and share the content-addressed cache, so two workers never
corrupt each other and a depth series lowered by one is reused by another.
"""

from __future__ import annotations

import pytest

from hlo_audit import audit, stack
from hlo_audit.report.words import message


def pytest_addoption(parser):
    group = parser.getgroup("hlo-audit")
    group.addoption("--hlo-audit", action="store_true", help="check every hlo-audit matrix cell against its golden")
    group.addoption("--hlo-audit-config", default=None, help="hlo-audit config file (default: as the CLI finds it)")
    group.addoption("--hlo-audit-only", default=None, help="hlo-audit --only filter, e.g. model=llama3-8b,quant=int8")


def pytest_configure(config):
    # Pinned or local is read before any target (or test module) is imported: code under test cannot switch a CI
    # run's pinned mode off by setting HLO_AUDIT_STACK when imported (``stack.read_at_start``, issue 48).
    if config.getoption("--hlo-audit"):
        stack.read_at_start()


def pytest_collection_modifyitems(session, config, items):
    if not config.getoption("--hlo-audit"):
        return
    plan = audit.plan(config.getoption("--hlo-audit-config"), config.getoption("--hlo-audit-only"))
    collector = HloAuditCollector.from_parent(session, name="hlo-audit", nodeid="hlo-audit")
    collector.plan = plan
    items.extend(collector.collect())


class HloAuditCollector(pytest.Collector):
    plan: audit.Plan

    def collect(self):
        for cell in self.plan.cells:
            yield HloAuditItem.from_parent(self, name=cell.id, cell=cell, plan=self.plan)


class CellFailure(Exception):
    """A regression or error finding for one cell."""


class HloAuditItem(pytest.Item):
    def __init__(self, *, cell, plan, **kwargs):
        super().__init__(**kwargs)
        self.cell, self.plan = cell, plan

    def runtest(self):
        # The cell and the rest of its depth series (the RNG-scaling rule needs every depth).
        subset = self.plan.of_cells(self.plan.series_cells(self.cell))
        outcome = audit.check(subset, list(audit.execute(subset)), report_stale=False)
        mine = [f for f in outcome.findings if f.cell == self.cell.id]
        if any(f.severity == "unavailable" for f in mine):
            pytest.skip(message(mine[0]))
        failing = [f for f in mine if f.failing]
        if failing:
            raise CellFailure("\n".join(f"{f.rule}: {message(f)}" for f in failing))

    def repr_failure(self, excinfo):
        if isinstance(excinfo.value, CellFailure):
            return f"{self.cell.id}\n{excinfo.value}"
        return super().repr_failure(excinfo)

    def reportinfo(self):
        return self.plan.config.source, None, f"hlo-audit cell {self.cell.id}"
