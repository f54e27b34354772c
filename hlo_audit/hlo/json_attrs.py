"""Attributes whose value is a JSON object (``backend_config``), by content: keys sorted, at every depth.

XLA keeps a backend config as a protobuf and prints it as JSON, and two of its clients print one config two ways:
TPU v5e's own client sorts the keys, the compile-only client (libtpu from a topology, no chip) prints them in the
proto's field order (measured on the chip, 2026-12-05: every compiled pair differed only there). Key order is no
part of what a config says, so a canonical text, a name's digest and a structural match read the keys sorted; a
value changed, a key added or removed, an array reordered still differ. Arrays keep their order (it means
something), scalars and strings are kept as written; whitespace between tokens goes.

A value is read as JSON only when it is an object: bare (``backend_config={"known_trip_count":{"n":"16"}}``, how
XLA prints a config that is a JSON object) or in quotes with C escapes (``backend_config="{\\"n\\":\\"16\\"}"``, how
older XLA printed it). A quoted one reads as the bare one, the form XLA prints now. Anything else (``{0,1}``,
``{replicated}``, ``{flatten_axis = -1 : i64}``, text that is not JSON) is kept as written.
"""

from __future__ import annotations

import functools
import json
import re

_NUMBER = re.compile(r"-?(?:0|[1-9]\d*)(?:\.\d+)?(?:[eE][+-]?\d+)?")
_STRING = re.compile(r'"(?:[^"\\\x00-\x1f]|\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4}))*"')
_WORDS = ("true", "false", "null")
_SPACE = " \t\n\r"
_C_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", '"': '"', "'": "'", "\\": "\\", "?": "?", "a": "\a", "b": "\b",
              "f": "\f", "v": "\v"}
_C_ESCAPE = re.compile(r"\\(?:([0-7]{1,3})|x([0-9a-fA-F]{1,2})|(.))", re.DOTALL)


class _NotJson(ValueError):
    pass


def canonical_attr_value(value: str) -> str:
    """The value with every JSON object in it keys-sorted (a quoted JSON object: bare), or as written when it is
    not a JSON object."""
    head = value[:2]
    if head == '{"' or head == '"{':
        return _canonical(value)
    return value


@functools.lru_cache(maxsize=1 << 16)  # a module repeats few distinct configs; a golden diff reads each twice
def _canonical(value: str) -> str:
    text = _unquoted(value) if value.startswith('"') else value
    if text is None:
        return value
    try:
        canonical, end = _value(text, _skip(text, 0))
        if _skip(text, end) != len(text) or not canonical.startswith("{"):
            return value
    except (_NotJson, IndexError):
        return value
    return canonical


def _unquoted(value: str) -> str | None:
    """A quoted HLO string's text (XLA's C escapes undone), or None when it is not one quoted string."""
    if len(value) < 2 or not value.endswith('"') or re.search(r'(?<!\\)(?:\\\\)*"', value[1:-1]):
        return None
    return _C_ESCAPE.sub(_c_unescape, value[1:-1])


def _c_unescape(m: re.Match) -> str:
    octal, hexa, char = m.groups()
    if octal is not None:
        return chr(int(octal, 8))
    if hexa is not None:
        return chr(int(hexa, 16))
    return _C_ESCAPES.get(char, "\\" + char)


def _skip(text: str, at: int) -> int:
    while at < len(text) and text[at] in _SPACE:
        at += 1
    return at


def _value(text: str, at: int) -> tuple[str, int]:
    """The canonical text of the JSON value at ``at`` and where it ends."""
    first = text[at]
    if first == "{":
        return _object(text, at)
    if first == "[":
        items, at = _items(text, at + 1, "]", _value)
        return "[" + ",".join(items) + "]", at
    if first == '"':
        return _string(text, at)
    for word in _WORDS:
        if text.startswith(word, at):
            return word, at + len(word)
    m = _NUMBER.match(text, at)
    if m is None:
        raise _NotJson(at)
    return m.group(), m.end()


def _object(text: str, at: int) -> tuple[str, int]:
    members, at = _items(text, at + 1, "}", _member)
    # By the key's content (a key written with escapes sorts as what it says); equal keys keep their order.
    members.sort(key=lambda member: json.loads(member[0]))
    return "{" + ",".join(f"{key}:{value}" for key, value in members) + "}", at


def _member(text: str, at: int) -> tuple[tuple[str, str], int]:
    """A member's key as written and its value's canonical text, and where it ends."""
    key, at = _string(text, at)
    at = _skip(text, at)
    if text[at] != ":":
        raise _NotJson(at)
    value, at = _value(text, _skip(text, at + 1))
    return (key, value), at


def _items(text: str, at: int, close: str, read) -> tuple[list, int]:
    """The comma-separated items up to ``close`` (``at``: just past the opening bracket) and where they end."""
    items: list = []
    at = _skip(text, at)
    if text[at] == close:
        return items, at + 1
    while True:
        item, at = read(text, at)
        items.append(item)
        at = _skip(text, at)
        if text[at] == close:
            return items, at + 1
        if text[at] != ",":
            raise _NotJson(at)
        at = _skip(text, at + 1)


def _string(text: str, at: int) -> tuple[str, int]:
    m = _STRING.match(text, at)
    if m is None:
        raise _NotJson(at)
    return m.group(), m.end()
