"""What one console serves: the cluster, its client settings, the namespaces, the admin credential."""

from __future__ import annotations

import hmac
from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any
from urllib.parse import urlsplit

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
        coordinator_metrics: where a namespace's coordinators serve ``/metrics`` (key ``""``: every
            namespace not named): a port, scraped on each member of the coordinators' group, or
            URLs. Empty: the producer groups page shows no check latency or failures.
    """

    bootstrap: str
    client: Mapping[str, Any] = field(default_factory=dict, repr=False)
    namespaces: tuple[str, ...] = ()
    groups: Mapping[str, str] = field(default_factory=dict)
    admin_token: AdminToken | None = None
    liveness_s: float = 10.0
    allowed_hosts: tuple[str, ...] = ("*",)
    coordinator_metrics: Mapping[str, tuple[str, ...]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "client", MappingProxyType(dict(self.client)))
        object.__setattr__(self, "groups", MappingProxyType(dict(self.groups)))
        object.__setattr__(self, "coordinator_metrics", MappingProxyType(dict(self.coordinator_metrics)))
        for namespace, where in self.coordinator_metrics.items():
            for one in where:
                port = one.isdigit() and 0 < int(one) < 65536
                if not port and urlsplit(one).scheme not in {"http", "https"}:
                    raise ConfigurationError(
                        f"coordinator metrics of {namespace or 'every namespace'}: {one!r} is neither a "
                        "TCP port nor an http(s) URL: give the coordinators' metrics_port, or their "
                        "/metrics URLs"
                    )

    def metrics_of(self, namespace: str) -> tuple[str, ...]:
        """Where the coordinators of ``namespace`` serve their metrics (empty: not known)."""
        return self.coordinator_metrics.get(namespace) or self.coordinator_metrics.get("", ())

    @property
    def read_only(self) -> bool:
        return self.admin_token is None

    def group_of(self, namespace: str) -> str:
        return self.groups.get(namespace) or default_coordinator_group(namespace)
