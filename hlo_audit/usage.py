"""A user's mistake in what they gave hlo-audit (a file, an option, a cell id): ``InputError``, one line naming what
and where. A leaf, so every layer can raise it; the CLI prints it and exits 2 (``errors``)."""

from __future__ import annotations


class InputError(Exception):
    """Bad input or usage the user can fix; the message names what and where."""
