"""JUnit XML: one testcase per checked cell, so CI test tabs show which cell regressed and why.

A cell's outcome is the report's verdict for it (``CheckReport.verdicts``: regression and error fail, unavailable
skips, anything else passes), so the suite's ``tests`` / ``failures`` / ``skipped`` are the counts every other
format prints. Stale goldens are not cells: the suite's ``system-out`` names them, with the summary line, and its
``properties`` carry the numbers. Every string from input goes through ``escape.junit``, so the document is
well-formed XML whatever a message holds.
"""

from __future__ import annotations

from collections import defaultdict
from xml.etree import ElementTree as ET

from hlo_audit.report.escape import junit as esc
from hlo_audit.report.words import check_line, message, stale_golden_line


def format_junit(outcome) -> str:
    by_cell = defaultdict(list)
    for f in outcome.findings:
        by_cell[f.cell].append(f)
    summary, verdicts = outcome.summary, outcome.verdicts
    suite = ET.Element("testsuite", name="hlo-audit", tests=str(summary.cells))
    properties = ET.SubElement(suite, "properties")
    for name, value in (("passed", str(summary.passed).lower()), ("exit_code", summary.exit_code),
                        *((f"cells.{k}", n) for k, n in summary.cells_by_verdict.items()),
                        *((f"findings.{k}", n) for k, n in summary.findings_by_severity.items()),
                        ("findings.folded", summary.folded), ("stale_goldens", summary.stale_goldens)):
        ET.SubElement(properties, "property", name=name, value=str(value))
    failures = skipped = 0
    for cell_id in sorted(verdicts):
        cell_findings = by_cell[cell_id]
        model, _, rest = cell_id.partition("/")
        case = ET.SubElement(suite, "testcase", classname=esc(f"hlo-audit.{model}"), name=esc(rest or cell_id))
        verdict = verdicts[cell_id]
        text = "\n".join(esc(f"[{f.severity}] {f.rule}: {message(f)}") for f in cell_findings)
        if verdict.failing:
            failures += 1
            failing = [f for f in cell_findings if f.failing]
            ET.SubElement(case, "failure", message=esc(message(failing[0])), type=esc(failing[0].rule)).text = text
        elif verdict == "unavailable":
            skipped += 1
            ET.SubElement(case, "skipped", message=esc(message(cell_findings[0])))
        else:
            ET.SubElement(case, "system-out").text = text
    suite.set("failures", str(failures))
    suite.set("skipped", str(skipped))
    out = [check_line(summary)]
    out += [esc(stale_golden_line(cid)) for cid in outcome.stale_goldens]
    ET.SubElement(suite, "system-out").text = "\n".join(out)
    return ET.tostring(suite, encoding="unicode", xml_declaration=True) + "\n"
