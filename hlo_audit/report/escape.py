"""One escaping function per output kind, for every string that comes from input.

Cell ids, model names, waiver reasons, messages (a target's own exception text), file paths and state-path
patterns (an HLO module's ``op_name`` metadata) are whatever the user, their config or their model said. Each
sink reads some characters as structure, so each has its own function here and every formatter sends every such
string through it:

* ``visible``: what all of them start from. Control characters (C0 including newline, CR and tab; DEL; C1,
  whose 0x9b a terminal reads as ESC [), the Unicode line and paragraph separators, the bidirectional overrides
  and isolates (text that reads one way and runs another), lone surrogates (a file name decoded with
  ``surrogateescape``) and the noncharacters U+FFFE / U+FFFF are written as ``\\x1b``-style escapes. A newline
  in a waiver reason or ESC ] ... BEL (OSC, which sets a terminal's title or a hyperlink) in a message then is
  text, never a line of its own or a terminal command, and every sink shows it the same way.
* ``terminal``: a rich ``Text`` of ``visible(s)``: never read as rich markup (``[bold]``, ``[tool.x]``).
* ``markdown_text``: plain text in Markdown (a table cell, a list item, a sentence): CommonMark's backslash
  escape for each character that opens an inline construct (emphasis, code, links, raw HTML such as ``<!--``
  or ``<img onerror=...>``, entities, GitHub's ``$`` math) and for ``|`` (a GFM table cell's border);
  ``line_start`` also escapes what would open a block (``#`` heading, ``-``/``+``/``*`` list, ``1.`` list,
  ``>`` quote, ``=`` setext underline).
* ``markdown_code``: a code span around the text, with a fence longer than any backtick run inside it.
* ``markdown_fence``: the backtick fence for a fenced block whose lines must not close it.
* ``junit``: text and attribute values of JUnit XML: nothing XML 1.0 forbids (C0 controls but tab, newline
  and CR; lone surrogates; U+FFFE, U+FFFF) survives, so ``xml.etree`` parses the report; ElementTree
  escapes ``<``, ``&``, ``"`` itself.
* ``html``: ``html.escape`` (``<``, ``>``, ``&``, both quotes) of ``visible(s)``.
* ``csv_field``: a text field of CSV output, which spreadsheets open: one that starts with ``=``, ``+``, ``-``
  or ``@`` would be read as a formula (``=HYPERLINK(...)`` in a target's error message), so a leading ``'``
  makes it text, as OWASP's CSV-injection advice says. Numbers are not text fields and keep their sign.
"""

from __future__ import annotations

import html as _html
import re

from rich.text import Text

# Characters that are never shown as themselves: see the module docstring.
_INVISIBLE = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069\ud800-\udfff\ufffe\uffff]")
_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape_char(match: re.Match) -> str:
    c = match.group(0)
    return _NAMED.get(c) or (f"\\x{ord(c):02x}" if ord(c) < 0x100 else f"\\u{ord(c):04x}")


def visible(s: object) -> str:
    """``s`` with every control, separator, bidi and XML-illegal character written as a ``\\x..`` escape."""
    return _INVISIBLE.sub(_escape_char, str(s))


def terminal(s: object, style: str = "") -> Text:
    """Text for a rich console: control characters visible, no markup read."""
    return Text(visible(s), style=style)


# Every ASCII character CommonMark lets a backslash escape that opens something inline, plus `|` (GFM tables)
# and `$` (GitHub's math); `_` only where it could open or close emphasis, i.e. not inside a word
# (`rng_key` stays readable: an underscore between two letters or digits never emphasizes).
_MARKDOWN_INLINE = re.compile(r"[\\`*\[\]<>&|~$!]|(?<![^\W_])_|_(?![^\W_])")
_MARKDOWN_BLOCK_START = re.compile(r"^(\s*)([#>+=-]|\d+[.)])")


def markdown_text(s: object, line_start: bool = False) -> str:
    """Plain text in Markdown: no emphasis, code, link, HTML, entity or math is read in it; with ``line_start``,
    no heading, list, quote or setext underline either (for text that begins a line)."""
    text = _MARKDOWN_INLINE.sub(lambda m: "\\" + m.group(0), visible(s))
    if line_start:
        match = _MARKDOWN_BLOCK_START.match(text)
        if match:
            lead, marker = match.groups()
            text = f"{lead}{marker[:-1]}\\{marker[-1]}{text[match.end():]}"
    return text


def markdown_code(s: object, in_table: bool = True) -> str:
    """``s`` in a code span that shows it verbatim (control characters visible).

    The fence is one backtick longer than the longest run inside; a space pads content that starts or ends
    with a backtick or a space (CommonMark strips one from each side). In a GFM table a ``|`` splits the cell
    even inside a code span, so there it is escaped (the table reads ``\\|`` as ``|``).
    """
    content = visible(s)
    if in_table:
        content = content.replace("|", "\\|")
    if not content:
        return ""
    fence = "`" * (max((len(run) for run in re.findall(r"`+", content)), default=0) + 1)
    if content[0] in "` " or content[-1] in "` ":
        content = f" {content} "
    return f"{fence}{content}{fence}"


def markdown_fence(lines: list[str], at_least: int = 3) -> str:
    """The backtick fence for a fenced code block holding ``lines``: longer than any backtick run in them."""
    longest = max((len(run) for line in lines for run in re.findall(r"`+", line)), default=0)
    return "`" * max(at_least, longest + 1)


def junit(s: object) -> str:
    """Text for a JUnit XML attribute or element: every character XML 1.0 allows, and no other."""
    return visible(s)


def html(s: object) -> str:
    """Text for HTML (element content and quoted attribute values)."""
    return _html.escape(visible(s), quote=True)


_FORMULA_START = ("=", "+", "-", "@")


def csv_field(s: object) -> str:
    """A CSV text field: control characters visible, never read as a spreadsheet formula."""
    text = visible(s)
    return "'" + text if text.startswith(_FORMULA_START) else text
