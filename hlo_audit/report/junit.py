"""JUnit XML: one testcase per cell, so CI test tabs show which cell regressed and why."""

from __future__ import annotations

from collections import defaultdict
from xml.etree import ElementTree as ET

from hlo_audit.results import worst


def format_junit(report) -> str:
    by_cell = defaultdict(list)
    for f in report.findings:
        by_cell[f.cell].append(f)
    suite = ET.Element("testsuite", name="hlo-audit", tests=str(len(by_cell)))
    failures = skipped = 0
    for cell_id in sorted(by_cell):
        cell_findings = by_cell[cell_id]
        model, _, rest = cell_id.partition("/")
        case = ET.SubElement(suite, "testcase", classname=f"hlo-audit.{model}", name=rest or cell_id)
        severity = worst(cell_findings)
        text = "\n".join(f"[{f.severity}] {f.rule}: {f.message}" for f in cell_findings)
        if severity in ("regression", "error"):
            failures += 1
            failing = [f for f in cell_findings if f.failing]
            ET.SubElement(case, "failure", message=failing[0].message, type=failing[0].rule).text = text
        elif severity in ("unavailable", "stale"):
            skipped += 1
            ET.SubElement(case, "skipped", message=cell_findings[0].message)
        else:
            ET.SubElement(case, "system-out").text = text
    suite.set("failures", str(failures))
    suite.set("skipped", str(skipped))
    return ET.tostring(suite, encoding="unicode", xml_declaration=True) + "\n"
