"""The words of accepting: the one command a failing check prints for every failing cell (``findings.Accept``), the
findings listed above it without their own (``without_accept``), and what `golden update --failing` and `init`
say about the cells they accept or leave out."""

from __future__ import annotations

import re

from hlo_audit.findings import Finding
from hlo_audit.report.words import message


def accept_line(accept) -> str:
    """The one command that accepts every failing cell a check listed (``findings.Accept``); the findings above it
    are listed without their own."""
    cells = len(accept.ids)
    return (f"If every change above is intended, accept {'all ' if cells != 1 else ''}{cells} "
            f"cell{'s' if cells != 1 else ''} at once: {accept.command}")


def accepting_line(accept) -> str:
    """What `golden update --failing` is about to accept."""
    cells = len(accept.ids)
    return (f"accepting the {cells} cell{'s' if cells != 1 else ''} that failed in the last check: "
            f"{', '.join(accept.ids)}")


def excluded_line(excluded) -> str:
    """A cell (or depth series) init left out of the matrix: what the target said."""
    cells = len(excluded.cells)
    what = excluded.cells[0] if cells == 1 else f"{cells} cells ({', '.join(excluded.cells)})"
    return f"excluded {what} in hlo-audit.toml ([[exclude]]): {excluded.reason}"


def nothing_failing_line() -> str:
    return "nothing to accept: no cell failed in the last check"


# The commands findings end with: a regenerate command to the end of the message, or one in backticks.
_COMMAND = re.compile(r"`(hlo-audit [^`]+)`|(hlo-audit golden update \S.*)$")


def split_command(text: str) -> tuple[str, str | None]:
    """A message and the command it ends with, with the few words that introduce it ("If intended:", "tighten the
    golden:"): (text, None) when it ends with none."""
    last = None
    for last in _COMMAND.finditer(text):
        pass
    if last is None or text[last.end():].strip(" .)") != "":
        return text, None
    command = last.group(1) or last.group(2)
    text = text[:last.start()].rstrip(" `")
    cut = max(text.rfind(". "), text.rfind("; "))
    if cut >= 0 and len(text) - cut <= 32:
        text, command = text[:cut + 1], f"{text[cut + 2:]} {command}"
    return text, command


def without_accept(finding: Finding) -> str:
    """A failing finding's message without its accept command (the check prints one for every cell: ``accept_line``);
    any other finding's as ``message`` words it."""
    text = message(finding)
    if not finding.failing or finding.accept_command is None:
        return text
    short, command = split_command(text)
    return short.rstrip(" ;:,") if command is not None and finding.accept_command in command else text
