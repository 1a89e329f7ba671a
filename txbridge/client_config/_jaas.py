"""``sasl.jaas.config``: the one-module entries the two clients' user and password settings map to."""

from __future__ import annotations

import re

SCRAM_LOGIN = "org.apache.kafka.common.security.scram.ScramLoginModule"
PLAIN_LOGIN = "org.apache.kafka.common.security.plain.PlainLoginModule"

_JAAS_TOKEN = re.compile(r'\s*(?:"((?:[^"\\]|\\.)*)"|([^\s=;"]+)|(=)|(;))')


def parse_jaas(text: str) -> tuple[str, str, dict[str, str]] | None:
    """``(login module, control flag, options)`` of a one-module ``sasl.jaas.config``, or None."""
    tokens: list[tuple[str, str]] = []
    position = 0
    text = text.strip()
    while position < len(text):
        match = _JAAS_TOKEN.match(text, position)
        if match is None:
            return None
        quoted, word, equals, semicolon = match.groups()
        if quoted is not None:
            tokens.append(("value", re.sub(r"\\(.)", r"\1", quoted)))
        elif word is not None:
            tokens.append(("word", word))
        else:
            tokens.append(("=", "=") if equals else (";", ";"))
        position = match.end()
        if semicolon:
            break
    if text[position:].strip() or len(tokens) < 3 or tokens[-1][0] != ";":
        return None
    (kind_module, module), (kind_flag, flag) = tokens[0], tokens[1]
    if kind_module != "word" or kind_flag != "word":
        return None
    options: dict[str, str] = {}
    body = tokens[2:-1]
    if len(body) % 3:
        return None
    for at in range(0, len(body), 3):
        (kind_key, key), (kind_eq, _), (_, value) = body[at : at + 3]
        if kind_key != "word" or kind_eq != "=":
            return None
        options[key] = value
    return module, flag, options


def jaas_entry(module: str, username: str, password: str) -> str:
    """A ``sasl.jaas.config`` of ``module`` with ``username`` and ``password``, quoted."""

    def quote(value: str) -> str:
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'

    return f"{module} required username={quote(username)} password={quote(password)};"
