"""What one console serves: the cluster, its client settings, the namespaces, the admin credential."""

from __future__ import annotations

import hmac
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from txbridge.errors import ConfigurationError
from txbridge.wire import default_coordinator_group

__all__ = ["MIN_TOKEN_CHARS", "AdminToken", "ConsoleSettings"]

#: An admin token shorter than this is refused at start: it would be guessable.
MIN_TOKEN_CHARS = 16


class AdminToken:
    """The admin credential: compared in constant time, never shown (its repr is masked)."""

    def __init__(self, value: str, source: str) -> None:
        value = value.strip()
        if len(value) < MIN_TOKEN_CHARS:
            raise ConfigurationError(
                f"the admin token from {source} has {len(value)} characters, fewer than {MIN_TOKEN_CHARS}: "
                "use a long random one (say: python -c 'import secrets; print(secrets.token_urlsafe(32))')"
            )
        self._value = value.encode()
        self.source = source

    def matches(self, offered: str) -> bool:
        return hmac.compare_digest(self._value, offered.strip().encode())

    def __repr__(self) -> str:
        return f"AdminToken(from {self.source}, ***)"


@dataclass(frozen=True)
class ConsoleSettings:
    """One console's settings.

    Attributes:
        bootstrap: the cluster's bootstrap servers.
        client: librdkafka settings for every client (the cluster's security settings, as
            ``--command-config`` and ``-X`` give them to every command). Never rendered.
        namespaces: the namespaces served; empty: every namespace found on the cluster.
        groups: the coordinators' consumer group of a namespace, where it is not the
            namespace's default (:func:`~txbridge.wire.default_coordinator_group`).
        admin_token: the credential actions need; None: the console is read-only.
        liveness_s: a producer instance is live this long after its last heartbeat's append
            time (the coordinators' ``producer_liveness_s``).
        allowed_hosts: the host names the console answers to (its requests' ``Host``; ``*``: any);
            others are refused, so a page rebinding its own name to this address reads nothing.
    """

    bootstrap: str
    client: Mapping[str, Any] = field(default_factory=dict, repr=False)
    namespaces: tuple[str, ...] = ()
    groups: Mapping[str, str] = field(default_factory=dict)
    admin_token: AdminToken | None = None
    liveness_s: float = 10.0
    allowed_hosts: tuple[str, ...] = ("*",)

    def __post_init__(self) -> None:
        object.__setattr__(self, "client", MappingProxyType(dict(self.client)))
        object.__setattr__(self, "groups", MappingProxyType(dict(self.groups)))

    @property
    def read_only(self) -> bool:
        return self.admin_token is None

    def group_of(self, namespace: str) -> str:
        return self.groups.get(namespace) or default_coordinator_group(namespace)
