"""A user's mistake in what they gave hlo-audit (a file, an option, a cell id): ``InputError``, one line naming what
and where. A leaf, so every layer can raise it; the CLI prints it and exits 2 (``errors``)."""

from __future__ import annotations

# The exit codes every command's result decides (``exit_code`` on its outcome) and the CLI only passes on: 0 clean;
# 1 a difference, a regression or a failing cell; 2 a usage, input or environment error.
EXIT_OK, EXIT_DIFFERENCE, EXIT_INPUT_ERROR = 0, 1, 2


class InputError(Exception):
    """Bad input or usage the user can fix; the message names what and where."""
