"""Every integer read from HLO text, bounded where XLA's own parser bounds it (issue 48: a 5,000-digit
``source_line`` made ``diff`` raise ValueError from ``int()``, since Python 3.12 refuses strings of more than 4,300
digits). XLA reads the numbers of an instruction's metadata and of the debug tables (``source_line``,
``stack_frame_id``, a frame's ``file_location_id``, a location's ``line``) as int32, and every other integer
(dimensions, parameter numbers, tuple indices, the header's aliases) as int64: past that it says "value out of
range". Here the same bound is one line naming the file, the line where known, and what the number is
(``text.hlo_int`` adds the place; ``bounded`` is the check, for the parts that have no place to name). XLA reads
leading zeros, so a number kept as text for later readers is kept without them (``canonical``).
"""

from __future__ import annotations

INT32_MAX = 2**31 - 1
INT64_MAX = 2**63 - 1


class OutOfRange(ValueError):
    """A number of HLO text past the bound XLA reads it with; the message names what and the bound."""


def bounded(digits: str, what: str, limit: int = INT64_MAX) -> int:
    """``digits`` (optionally signed) as an int, its magnitude at most ``limit``, else ``OutOfRange``. The digits are
    counted before any conversion: ``int()`` of a 5,000-digit string raises, and of a 4,000-digit one costs."""
    text = digits.strip()
    sign, magnitude = ("-" if text.startswith("-") else ""), text.lstrip("+-").lstrip("0")
    if len(magnitude) > len(str(limit)) or (magnitude.isdigit() and int(magnitude) > limit):
        shown = text if len(text) <= 24 else f"{text[:12]}... ({len(text):,} digits)"
        raise OutOfRange(f"{what} {shown} is out of range (at most {limit:,}, as XLA reads it)")
    # XLA reads leading zeros (index=000...01 is 1): converted without them, int() never sees 4,300 digits.
    return int(sign + (magnitude or "0"))


def canonical(digits: str, what: str, limit: int = INT64_MAX) -> str:
    """``digits`` bounded and written without leading zeros: what a text keeps for later readers' ``int()``."""
    return str(bounded(digits, what, limit))
