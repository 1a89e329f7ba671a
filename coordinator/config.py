"""The coordinator's settings: one frozen object, loaded from flags, ``TXBRIDGE_*`` env vars or TOML.

Precedence: explicit flags, then environment, then the TOML file, then the defaults
below. Every bad value fails fast with a message naming the setting. Secrets never
appear in ``repr`` or logs.
"""

from __future__ import annotations

import dataclasses
import socket
import tomllib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from txbridge.client_config import COMMAND_CONFIG_ENV, ClientConfig
from txbridge.errors import ConfigurationError
from txbridge.wire import DEFAULT_NAMESPACE, default_coordinator_group, partition_transactional_id

ENV_PREFIX = "TXBRIDGE_"


class Secrets:
    """HMAC secrets per producer group plus a default; ``repr`` shows only which groups have one."""

    __slots__ = ("_by_group", "_default")

    def __init__(self, by_group: Mapping[str, str] | None = None, default: str | None = None) -> None:
        self._by_group = {g: s.encode() for g, s in (by_group or {}).items() if s}
        self._default = default.encode() if default else None

    def for_group(self, group: str) -> bytes | None:
        """The secret that signs back-checks to ``group`` (its own, else the default)."""
        return self._by_group.get(group, self._default)

    def __repr__(self) -> str:
        default = "set" if self._default else "unset"
        return f"Secrets(groups={sorted(self._by_group)}, default={default})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Secrets) and (self._by_group, self._default) == (
            other._by_group,
            other._default,
        )

    def __hash__(self) -> int:
        return hash((tuple(sorted(self._by_group)), self._default is not None))


def _default_instance_id() -> str:
    """The host name: stable across restarts (a StatefulSet pod keeps its name), so a restarted
    coordinator, a static member, gets its partitions back at once. Several coordinators of
    one group on one host need an ``instance_id`` each."""
    return socket.gethostname()


#: The group protocols the coordinator's group can run (:attr:`CoordinatorConfig.group_protocol`).
GROUP_PROTOCOLS = ("classic", "consumer")


@dataclass(frozen=True)
class CoordinatorConfig:
    """Everything the coordinator needs; see docs/coordinator.md for the table.

    Attributes:
        bootstrap: Kafka bootstrap servers.
        namespace: prefix of the internal topics.
        group_id: the coordinators' consumer group over half + op; default (or ""):
            :func:`~txbridge.wire.default_coordinator_group` of ``namespace``, resolved when the
            config is built (``replace(namespace=...)`` keeps the group already resolved).
        instance_id: this coordinator (default: the host name): its consumer's ``client.id`` and,
            with ``static_membership``, its ``group.instance.id``, which must be unique among the
            running coordinators of its group; stable across its restarts. Each incarnation
            commits under ``<namespace>-coord-<instance_id>-<random hex>``, a new id each time
            its clients are built (:mod:`coordinator.commit.ownership`).
        static_membership: join the group as a static member (``group.instance.id`` =
            ``instance_id``): a restart within ``session.timeout.ms`` keeps the partitions,
            without a rebalance; a clean stop releases them only after ``session.timeout.ms``.
        group_protocol: the group protocol of the coordinators' consumer group: ``"classic"``
            (JoinGroup/SyncGroup, eager, the client-side ``range`` assignor) or ``"consumer"``
            (KIP-848: the broker assigns, with its ``range`` assignor, and moves partitions
            incrementally; Kafka 4.0 or later). Every coordinator of a group must use the same.
        check_delay_s: seconds after a half's broker append time before the first back-check.
        max_checks: back-checks before a transaction expires (rolled back, copied to ``<ns>_expired``).
        check_backoff_s: wait after the first UNKNOWN check; doubles per check ...
        check_backoff_max_s: ... up to this cap.
        max_unasked_s: how long a transaction waits while no back-check can be sent at all
            (no live instance of its group, no secret, its URLs refused by
            ``allowed_check_hosts`` or refusing the connection) before it expires; such
            attempts are not answers and do not count toward ``max_checks``.
        check_timeout_s: the longest one back-check request may take, whole (not per read).
        check_concurrency_per_group: back-check requests in flight per producer group.
        check_batch_size: transactions asked about in one back-check request (1: one per request).
        allowed_check_hosts: hosts a check URL may point at; any other is refused.
        secrets: HMAC secrets per producer group and a default (hidden from repr).
        producer_liveness_s: a producer instance is live this long after its last heartbeat.
        commit_interval_ms: how often the Kafka transaction commits (far below transaction_timeout_ms).
        commit_pace_ms: 0 (the default): a partition with a transaction ready to republish starts
            its Kafka transaction as soon as its previous one has ended. Above 0: a partition
            whose previous transaction republished two or more waits until this long after that
            one began, so that a busy partition commits in larger batches (fewer Kafka
            transactions for the broker) while a lone transaction still goes out at once.
        transaction_timeout_ms: the transactional producer's transaction.timeout.ms.
        payload_cache_bytes: budget of cached half payloads; evicted ones are re-read by offset.
        max_message_bytes: a committed message larger than this is quarantined, not republished.
        offset_metadata_bytes: characters of committed-offset metadata per half partition that
            list young transactions instead of ``<ns>_state`` entries (0: always entries). Keep it
            below the broker's ``offset.metadata.max.bytes`` (4096 by default).
        metrics_port: serve Prometheus metrics on this port (None: off).
        log_interval_s: seconds between INFO lines with counts.
        client_config: the cluster's client settings (security) for every client: ``--command-config``
            and ``-X``, or the TOML's ``client_config = "file.properties"`` and ``[kafka]`` table
            (Java or librdkafka names; see docs/security.md). Folded into ``extra_config``.
        extra_config: librdkafka settings passed through to every client, on top of ``client_config``.
        resume_expired: when an instance of a group becomes live again, re-check its expired
            transactions (oldest first) and publish those answered COMMIT, exactly once.
        resume_expired_max: at most this many expired transactions asked about per return.
        check_invariants: assert the state's invariants after every step (tests, debugging;
            costs a pass over the pending transactions each time).
        tracing: record OpenTelemetry spans of back-checks and republishes, continuing the
            producers' traces (docs/tracing.md); needs opentelemetry-api, and the SDK under
            ``python -m coordinator``, which configures it from the ``OTEL_*`` variables.
    """

    bootstrap: str = ""
    namespace: str = DEFAULT_NAMESPACE
    group_id: str = ""  # "": the namespace's default group, set in __post_init__
    instance_id: str = field(default_factory=_default_instance_id)
    static_membership: bool = True
    group_protocol: str = "classic"
    check_delay_s: float = 6.0
    max_checks: int = 15
    check_backoff_s: float = 5.0
    check_backoff_max_s: float = 60.0
    max_unasked_s: float = 3600.0
    check_timeout_s: float = 5.0
    check_concurrency_per_group: int = 4
    check_batch_size: int = 200
    allowed_check_hosts: tuple[str, ...] = ("127.0.0.1", "localhost")
    secrets: Secrets = field(default_factory=Secrets, repr=True)
    producer_liveness_s: float = 10.0
    commit_interval_ms: int = 20
    commit_pace_ms: int = 0
    # librdkafka's default. A new owner fences a dead one's transaction itself, and a timeout
    # shorter than a broker failover (its 9 s session plus the election) would let the broker
    # abort live coordinators' transactions, which then stop (INVALID_TXN_STATE).
    transaction_timeout_ms: int = 60_000
    payload_cache_bytes: int = 64 * 1024 * 1024
    max_message_bytes: int = 1024 * 1024
    offset_metadata_bytes: int = 1000  # about 200 halves; the broker allows 4096 by default
    metrics_port: int | None = None
    log_interval_s: float = 30.0
    # Its repr masks passwords and keys.
    client_config: ClientConfig = field(default_factory=ClientConfig)
    # Not in repr: it may hold sasl.password or ssl.key.password. The loop logs its keys only.
    extra_config: Mapping[str, Any] = field(default_factory=dict, repr=False)
    resume_expired: bool = True
    resume_expired_max: int = 100
    check_invariants: bool = False
    tracing: bool = False

    def __post_init__(self) -> None:
        if not self.group_id:
            object.__setattr__(self, "group_id", default_coordinator_group(self.namespace))
        # Every client takes extra_config: the client settings go in first, the librdkafka ones on top.
        object.__setattr__(self, "extra_config", {**self.client_config.librdkafka(), **self.extra_config})
        self.validate()

    def validate(self) -> None:
        """Raise :class:`ConfigurationError` naming the first bad setting."""
        positive = {
            "check_backoff_s": self.check_backoff_s,
            "check_backoff_max_s": self.check_backoff_max_s,
            "max_unasked_s": self.max_unasked_s,
            "check_timeout_s": self.check_timeout_s,
            "producer_liveness_s": self.producer_liveness_s,
            "log_interval_s": self.log_interval_s,
        }
        for name, value in positive.items():
            if not value > 0:
                raise ConfigurationError(f"{name} must be positive, got {value!r}")
        at_least_one = {
            "max_checks": self.max_checks,
            "check_concurrency_per_group": self.check_concurrency_per_group,
            "check_batch_size": self.check_batch_size,
            "commit_interval_ms": self.commit_interval_ms,
            "payload_cache_bytes": self.payload_cache_bytes,
            "max_message_bytes": self.max_message_bytes,
            "resume_expired_max": self.resume_expired_max,
        }
        for name, value in at_least_one.items():
            if value < 1:
                raise ConfigurationError(f"{name} must be at least 1, got {value!r}")
        if self.group_protocol not in GROUP_PROTOCOLS:
            raise ConfigurationError(
                f"group_protocol must be one of {', '.join(GROUP_PROTOCOLS)}, got {self.group_protocol!r}"
            )
        if self.offset_metadata_bytes < 0:
            raise ConfigurationError(
                "offset_metadata_bytes must not be negative (0 turns it off), "
                f"got {self.offset_metadata_bytes!r}"
            )
        if self.check_delay_s < 0:
            raise ConfigurationError(f"check_delay_s must not be negative, got {self.check_delay_s!r}")
        if self.commit_interval_ms * 10 > self.transaction_timeout_ms:
            raise ConfigurationError(
                f"commit_interval_ms ({self.commit_interval_ms}) must stay far below "
                f"transaction_timeout_ms ({self.transaction_timeout_ms}): at most a tenth of it"
            )
        if not self.namespace or not self.group_id or not self.instance_id:
            raise ConfigurationError("namespace, group_id and instance_id must not be empty")
        if not self.allowed_check_hosts:
            raise ConfigurationError("allowed_check_hosts is empty: no back-check could ever be made")
        if self.metrics_port is not None and not 0 <= self.metrics_port < 65536:
            raise ConfigurationError(f"metrics_port must be a TCP port, got {self.metrics_port!r}")

    def partition_transactional_id(self, partition: int) -> str:
        """The transactional.id under which an older txbridge committed partition ``partition``.

        One id per partition, whoever owned it. A coordinator taking over a partition that has
        no owner record in ``<ns>_state`` yet (data an older txbridge wrote) fences this id
        before it reads anything of the partition (docs/DESIGN.md, "Ownership": the upgrade),
        which is why ``txbridge acls`` still grants the ``<namespace>-partition-`` prefix.
        """
        return partition_transactional_id(self.namespace, partition)

    def host_allowed(self, url: str) -> bool:
        """True when ``url`` is http(s) and its host is in ``allowed_check_hosts``."""
        try:
            parts = urlsplit(url)
        except ValueError:
            return False
        return parts.scheme in ("http", "https") and (parts.hostname or "") in self.allowed_check_hosts

    def replace(self, **changes: Any) -> CoordinatorConfig:
        return dataclasses.replace(self, **changes)

    # ------------------------------------------------------------------ loading

    @classmethod
    def load(
        cls,
        *,
        flags: Mapping[str, Any] | None = None,
        env: Mapping[str, str] | None = None,
        toml_path: str | Path | None = None,
    ) -> CoordinatorConfig:
        """Merge defaults < TOML file < env (``TXBRIDGE_<SETTING>``) < flags (None = not given).

        The client configuration: the properties file of the ``command_config`` flag, else of
        ``$TXBRIDGE_COMMAND_CONFIG``, else the TOML's ``client_config`` (relative to the TOML's
        folder); then the TOML's ``[kafka]`` table; then the ``client_overrides`` flag (``-X``).

        Raises:
            ConfigurationError: an unknown setting, an unreadable file or a bad value; the
                message names the setting.
        """
        raw: dict[str, Any] = {}
        flags = dict(flags or {})
        command_config = flags.pop("command_config", None) or (env or {}).get(COMMAND_CONFIG_ENV) or None
        overrides = tuple(flags.pop("client_overrides", None) or ())
        if toml_path is not None:
            raw.update(read_toml(Path(toml_path)))
            file = raw.get("client_config")
            if isinstance(file, str) and file:
                raw["client_config"] = str(Path(toml_path).parent / Path(file).expanduser())
        raw.update(_from_env(env or {}))
        raw.update({k: v for k, v in flags.items() if v is not None and v != ()})
        if command_config:
            raw["client_config"] = command_config
        client = _client_config(raw, toml_path)
        raw.pop("kafka", None)
        raw["client_config"] = client.merged(ClientConfig.load(None, overrides)) if overrides else client
        return cls.from_mapping(raw)

    @classmethod
    def from_mapping(cls, raw: Mapping[str, Any]) -> CoordinatorConfig:
        """Build from plain values (strings are converted); unknown keys are errors."""
        known = {f.name: f for f in dataclasses.fields(cls)}
        values: dict[str, Any] = {"client_config": _client_config(raw)}
        by_group = dict(raw.get("secrets") or {})
        default_secret = raw.get("default_secret")
        for name, value in raw.items():
            if name in ("secrets", "default_secret", "client_config", "kafka"):
                continue
            if name not in known:
                raise ConfigurationError(f"unknown coordinator setting {name!r}; known: {sorted(known)}")
            values[name] = _convert(name, known[name].type, value)
        if not isinstance(by_group, dict) or not all(isinstance(v, str) for v in by_group.values()):
            raise ConfigurationError("secrets must map producer group names to secret strings")
        values["secrets"] = Secrets(by_group, str(default_secret) if default_secret else None)
        return cls(**values)


_ENV_SIMPLE = (
    "bootstrap",
    "namespace",
    "group_id",
    "instance_id",
    "static_membership",
    "group_protocol",
    "check_delay_s",
    "max_checks",
    "check_backoff_s",
    "check_backoff_max_s",
    "max_unasked_s",
    "check_timeout_s",
    "check_concurrency_per_group",
    "check_batch_size",
    "allowed_check_hosts",
    "producer_liveness_s",
    "commit_interval_ms",
    "commit_pace_ms",
    "transaction_timeout_ms",
    "payload_cache_bytes",
    "max_message_bytes",
    "offset_metadata_bytes",
    "metrics_port",
    "log_interval_s",
    "check_invariants",
    "tracing",
    "resume_expired",
    "resume_expired_max",
    "default_secret",
)


def _from_env(env: Mapping[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name in _ENV_SIMPLE:
        value = env.get(ENV_PREFIX + name.upper())
        if value not in (None, ""):
            out[name] = value
    secrets = env.get(ENV_PREFIX + "SECRETS")
    if secrets:
        out["secrets"] = parse_pairs(secrets.split(","), "TXBRIDGE_SECRETS")
    return out


def _client_config(raw: Mapping[str, Any], toml_path: str | Path | None = None) -> ClientConfig:
    """``client_config`` (a ClientConfig, a properties file's path or a dict), ``[kafka]`` on top."""
    given = raw.get("client_config")
    if isinstance(given, (str, Path)):
        client = ClientConfig.load(given)
    else:
        client = ClientConfig.coerce(given, "client_config")
    table = raw.get("kafka")
    if table is None:
        return client
    if not isinstance(table, Mapping):
        raise ConfigurationError("kafka must be a table of Kafka client settings ([kafka] in the TOML file)")
    where = f"[kafka] of {toml_path}" if toml_path else "[kafka]"
    return client.merged(ClientConfig.from_mapping(table, where))


def parse_pairs(items: Any, setting: str) -> dict[str, str]:
    """``["a=1", "b=2"]`` as a dict; a malformed item names ``setting``."""
    out: dict[str, str] = {}
    for item in items:
        name, sep, value = str(item).strip().partition("=")
        if not sep or not name:
            raise ConfigurationError(f"{setting}: expected NAME=VALUE, got an item without '='")
        out[name.strip()] = value.strip()
    return out


def read_toml(path: Path) -> dict[str, Any]:
    """The settings of a TOML file (top level or a ``[coordinator]`` table)."""
    try:
        with path.open("rb") as handle:
            data = tomllib.load(handle)
    except FileNotFoundError:
        raise ConfigurationError(f"config file {path} does not exist") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigurationError(f"config file {path} is not valid TOML: {exc}") from None
    # Accept either top-level keys or a [coordinator] table (the [kafka] table beside it).
    settings = dict(data.get("coordinator", data))
    if "coordinator" in data and "kafka" in data:
        settings.setdefault("kafka", data["kafka"])
    return settings


def _convert(name: str, annotation: Any, value: Any) -> Any:
    kind = str(annotation)
    converters: dict[str, Callable[[Any], Any]] = {
        "float": float,
        "int": _strict_int,
        "bool": _bool,
        "int | None": lambda v: None if v in (None, "", "none") else _strict_int(v),
        "tuple[str, ...]": _str_tuple,
        "Mapping[str, Any]": lambda v: parse_pairs(v.split(","), name) if isinstance(v, str) else dict(v),
    }
    try:
        return converters.get(kind, str)(value)
    except (TypeError, ValueError):
        raise ConfigurationError(f"setting {name}: {value!r} is not a valid {kind}") from None


def _bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in ("1", "true", "yes", "on"):
        return True
    if text in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(value)


def _strict_int(value: Any) -> int:
    if isinstance(value, bool) or (isinstance(value, float) and not value.is_integer()):
        raise ValueError(value)
    return int(value)


def _str_tuple(value: Any) -> tuple[str, ...]:
    items = value.split(",") if isinstance(value, str) else list(value)
    return tuple(str(v).strip() for v in items if str(v).strip())
