"""What users write: the Java properties format of a client properties file, and ``-X`` pairs."""

from __future__ import annotations

import re
from collections.abc import Iterable

from txbridge.client_config._setting import Setting
from txbridge.errors import ConfigurationError
from txbridge.kafka.secrets import MASK, is_secret


def parse_properties(text: str) -> list[tuple[str, str, int]]:
    """``(key, value, line number)`` of each entry of a Java properties text.

    The format of ``java.util.Properties.load``: ``#`` and ``!`` comments, ``key=value``,
    ``key: value`` and ``key value``, a backslash at the end of a line continues it, and
    the escapes ``\\t \\n \\r \\f \\uXXXX`` (any other escaped character stands for itself).
    """
    entries = []
    lines = text.splitlines()
    index = 0
    while index < len(lines):
        first = index
        line = lines[index].lstrip(" \t\f")
        index += 1
        if not line or line[0] in "#!":
            continue
        while _continues(line) and index < len(lines):
            line = line[:-1] + lines[index].lstrip(" \t\f")
            index += 1
        if _continues(line):
            line = line[:-1]
        key, value = _split_entry(line)
        entries.append((_unescape(key), _unescape(value), first + 1))
    return entries


def _continues(line: str) -> bool:
    trailing = len(line) - len(line.rstrip("\\"))
    return trailing % 2 == 1


def _split_entry(line: str) -> tuple[str, str]:
    position = 0
    while position < len(line):
        char = line[position]
        if char == "\\":
            position += 2
            continue
        if char in "=: \t\f":
            break
        position += 1
    key = line[:position]
    rest = line[position:].lstrip(" \t\f")
    if rest[:1] in ("=", ":"):
        rest = rest[1:].lstrip(" \t\f")
    return key, rest


_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}


def _unescape(text: str) -> str:
    if "\\" not in text:
        return text
    out = []
    position = 0
    while position < len(text):
        char = text[position]
        if char != "\\" or position + 1 == len(text):
            out.append(char)
            position += 1
            continue
        escaped = text[position + 1]
        if escaped == "u" and re.fullmatch(r"[0-9a-fA-F]{4}", text[position + 2 : position + 6]):
            out.append(chr(int(text[position + 2 : position + 6], 16)))
            position += 6
            continue
        out.append(_ESCAPES.get(escaped, escaped))
        position += 2
    return "".join(out)


def parse_overrides(pairs: Iterable[str]) -> list[Setting]:
    """The settings of ``-X`` ``KEY=VALUE`` pairs.

    Raises:
        ConfigurationError: a pair has no ``=`` or no name (a secret's value is not shown).
    """
    settings = []
    for pair in pairs:
        name, sep, value = str(pair).partition("=")
        if not sep or not name.strip():
            shown = MASK if is_secret(name) else str(pair)
            raise ConfigurationError(f"-X expects KEY=VALUE, got {shown!r}")
        settings.append(Setting(name.strip(), value.strip(), "-X"))
    return settings
