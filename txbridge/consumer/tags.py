"""Tags and subscription expressions (RocketMQ syntax), pure.

A message carries at most one tag, in the ``txb.tags`` header (UTF-8). A
subscription is ``*`` (everything, tagged or not) or tags joined by ``||``:
``TAGA``, ``TAGA || TAGB``; whitespace around tags is ignored. Unlike RocketMQ,
which silently drops empty parts, a malformed expression is an error when the
consumer is built, so a typo cannot turn into "receive nothing".
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from txbridge.errors import ConfigurationError, WireFormatError
from txbridge.wire import H_TAGS

WILDCARD = "*"
#: Letters, digits (any script), ``_``, ``-``, ``.`` and ``:``; no spaces, ``|`` or ``*``.
_TAG = re.compile(r"[\w.:\-]+")


def validate_tag(tag: str) -> str:
    """Return ``tag`` if it may be sent as a message tag.

    Raises:
        ConfigurationError: empty, or a character outside letters, digits, ``_ - . :``.
    """
    if not isinstance(tag, str) or not _TAG.fullmatch(tag):
        raise ConfigurationError(
            f"tag {tag!r} is not valid: use letters, digits, '_', '-', '.' or ':' (no spaces, '|' or '*')"
        )
    return tag


@dataclass(frozen=True)
class Subscription:
    """A parsed subscription expression.

    Attributes:
        expression: the expression as given.
        tags: the accepted tags; empty means everything (``*``).
    """

    expression: str
    tags: frozenset[str] = frozenset()

    @property
    def accepts_all(self) -> bool:
        return not self.tags

    def matches(self, tag: str | None) -> bool:
        """True when a message with ``tag`` (None: untagged) is for this subscription."""
        return self.accepts_all or (tag is not None and tag in self.tags)


def parse_subscription(expression: str) -> Subscription:
    """Parse ``*``, ``TAGA`` or ``TAGA || TAGB`` (whitespace tolerant).

    Raises:
        ConfigurationError: the expression is empty, has an empty part (``TAGA ||``,
            ``||``), mixes ``*`` with tags, or a tag has an illegal character.
    """
    if not isinstance(expression, str) or not expression.strip():
        raise ConfigurationError(
            "subscription expression is empty: use '*' for every message, or 'TAGA || TAGB'"
        )
    parts = [part.strip() for part in expression.split("||")]
    if parts == [WILDCARD]:
        return Subscription(expression)
    tags = []
    for part in parts:
        if not part:
            raise ConfigurationError(
                f"subscription expression {expression!r} has an empty tag around '||': write 'TAGA || TAGB'"
            )
        if part == WILDCARD:
            raise ConfigurationError(
                f"subscription expression {expression!r} mixes '*' with tags: '*' must stand alone"
            )
        if not _TAG.fullmatch(part):
            raise ConfigurationError(
                f"subscription expression {expression!r}: tag {part!r} has an illegal character "
                "(allowed: letters, digits, '_', '-', '.', ':'; tags are separated by '||')"
            )
        tags.append(part)
    return Subscription(expression, frozenset(tags))


def tag_of(headers: Sequence[tuple[str, bytes | None]] | None) -> str | None:
    """The message's tag from its ``txb.tags`` header (the last one wins), or None.

    Raises:
        WireFormatError: the header is not UTF-8.
    """
    tag = None
    for name, raw in headers or ():
        if name == H_TAGS:
            try:
                tag = (raw or b"").decode("utf-8") or None
            except UnicodeDecodeError:
                raise WireFormatError(f"header {H_TAGS} is not UTF-8: {raw!r}") from None
    return tag
