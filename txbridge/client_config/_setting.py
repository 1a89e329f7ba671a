"""A client setting as written and where, and what it became under librdkafka's name."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from txbridge.kafka.secrets import MASK, is_secret


def shown(name: str, value: Any) -> str:
    """``value`` as messages may show it: ``***`` when ``name`` holds a secret."""
    return MASK if is_secret(name) else str(value)


@dataclass(frozen=True)
class Setting:
    """One setting as written, and where: ``admin.properties line 4``, ``-X``, ``client_config``."""

    name: str
    value: Any = field(repr=False)
    origin: str

    def __repr__(self) -> str:
        return f"Setting({self.name}={shown(self.name, self.value)!r}, {self.origin})"

    def named(self) -> str:
        """The name and its origin, as error messages name a setting."""
        return f"{self.name} ({self.origin})"


@dataclass(frozen=True)
class Canonical:
    """A setting under librdkafka's name (or a Java-only one), and the setting it came from."""

    value: Any
    origin: Setting  # the (last) setting it came from
    order: int


def by_order(item: Canonical) -> int:
    """Sort key: where the setting stood among the settings as written."""
    return item.order
