"""The txbridge Spark sink's options, parsed and checked before any row is written (no Spark, no I/O).

They follow Spark's Kafka sink: ``kafka.``-prefixed client settings (``kafka.bootstrap.servers``
and, for a secured cluster, the security settings in Java or librdkafka names), ``topic``; and
add txbridge's: the producer ``group``, its ``secret`` (or ``secretEnv``, the name of an
environment variable holding it), ``namespace``, ``checkUrl`` (where the driver's
:class:`~txbridge.spark.SinkChecks` answers back-checks), the sink id, and the transaction sizes.

Spark hands a data source its options with lower-case names, so names are matched without case.
The secret is never put in a ``repr`` or an error message.
"""

from __future__ import annotations

import difflib
import hashlib
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from txbridge import limits, wire
from txbridge.client_config import ClientConfig
from txbridge.errors import ConfigurationError

#: Defaults of the transaction sizes: rows and bytes (as :func:`txbridge.limits.record_size` counts).
DEFAULT_MAX_ROWS = 500
DEFAULT_MAX_TX_BYTES = 4 * 1024 * 1024

KAFKA_PREFIX = "kafka."

#: The sink's own options, as written in the docs (matched without case).
OPTION_NAMES = (
    "topic",
    "group",
    "secret",
    "secretEnv",
    "namespace",
    "checkUrl",
    "sinkId",
    "checkpointLocation",
    "clientProperties",
    "maxRowsPerTransaction",
    "maxTransactionBytes",
    "maxMessageBytes",
)
_BY_LOWER = {name.lower(): name for name in OPTION_NAMES}
#: Options Spark itself may pass to a sink; accepted and not used (``queryName``: a streaming
#: query's ``.queryName()`` reaches its sink as an option).
_SPARK_OWN = frozenset({"path", "queryname"})


@dataclass(frozen=True)
class SinkOptions:
    """What a write of the sink needs, validated. ``secret`` is kept out of ``repr``."""

    bootstrap: str
    group: str
    secret: bytes = field(repr=False)
    namespace: str
    check_url: str
    sink_id: str
    topic: str | None = None
    client_config: ClientConfig = field(default_factory=ClientConfig)
    max_rows: int = DEFAULT_MAX_ROWS
    max_tx_bytes: int = DEFAULT_MAX_TX_BYTES
    max_message_bytes: int = limits.DEFAULT_MAX_MESSAGE_BYTES

    @property
    def sink_key(self) -> str:
        """A short stable name of the sink id, in record headers and decision keys."""
        return sink_key(self.sink_id)

    def librdkafka(self) -> dict[str, object]:
        """The client settings for librdkafka clients (without ``bootstrap.servers``)."""
        return self.client_config.librdkafka()


def sink_key(sink_id: str) -> str:
    """The first 16 hex digits of the SHA-256 of ``sink_id``."""
    return hashlib.sha256(sink_id.encode()).hexdigest()[:16]


def parse_options(
    options: Mapping[str, str],
    *,
    streaming: bool,
    environ: Mapping[str, str] | None = None,
    fresh_sink_id: str | None = None,
) -> SinkOptions:
    """Check the sink's options and build :class:`SinkOptions`.

    Args:
        options: the write's options (any case).
        streaming: a streaming query (its sink id is the checkpoint location or ``sinkId``)
            or a batch write (``sinkId``, else ``fresh_sink_id``).
        environ: where ``secretEnv`` is looked up (default ``os.environ``).
        fresh_sink_id: the sink id of a batch write without ``sinkId``.

    Raises:
        ConfigurationError: an option is missing, unknown or bad; the message names it (never
            the secret's value).
    """
    environ = os.environ if environ is None else environ
    kafka_settings: dict[str, str] = {}
    own: dict[str, str] = {}
    for raw_name, value in options.items():
        lower = raw_name.lower()
        if lower.startswith(KAFKA_PREFIX):
            kafka_settings[raw_name[len(KAFKA_PREFIX) :]] = value
        elif lower in _BY_LOWER:
            own[_BY_LOWER[lower]] = value
        elif lower not in _SPARK_OWN:
            close = difflib.get_close_matches(lower, list(_BY_LOWER), n=1)
            hint = f" (did you mean {_BY_LOWER[close[0]]!r}?)" if close else ""
            raise ConfigurationError(
                f"txbridge sink: unknown option {raw_name!r}{hint}; its options are "
                f"{', '.join(OPTION_NAMES)} and kafka.<client setting>"
            )
    client = _client_config(own.get("clientProperties"), kafka_settings)
    bootstrap = client.bootstrap
    if not bootstrap:
        raise ConfigurationError(
            "txbridge sink: option kafka.bootstrap.servers is required (the Kafka cluster's brokers)"
        )
    group = _required(own, "group", "the txbridge producer group whose secret signs back-checks")
    if "/" in group:
        raise ConfigurationError(f"txbridge sink: option group {group!r} must not contain '/'")
    secret = _secret(own, environ)
    namespace = own.get("namespace") or wire.DEFAULT_NAMESPACE
    check_url = _required(
        own,
        "checkUrl",
        "the URL of the driver's txbridge.spark.SinkChecks (its .url), which answers back-checks",
    )
    if not check_url.startswith(("http://", "https://")):
        raise ConfigurationError(f"txbridge sink: option checkUrl must be an http(s) URL, got {check_url!r}")
    sink_id = own.get("sinkId") or own.get("checkpointLocation") or ("" if streaming else fresh_sink_id or "")
    if not sink_id:
        raise ConfigurationError(
            "txbridge sink: a streaming query needs option checkpointLocation (or sinkId): "
            "it names the sink's decisions, and must differ between queries"
        )
    topic = own.get("topic") or None
    return SinkOptions(
        bootstrap=bootstrap,
        group=group,
        secret=secret,
        namespace=namespace,
        check_url=check_url,
        sink_id=sink_id,
        topic=topic,
        client_config=client,
        max_rows=_positive(own, "maxRowsPerTransaction", DEFAULT_MAX_ROWS),
        max_tx_bytes=_positive(own, "maxTransactionBytes", DEFAULT_MAX_TX_BYTES),
        max_message_bytes=_positive(own, "maxMessageBytes", limits.DEFAULT_MAX_MESSAGE_BYTES),
    )


def _client_config(properties: str | None, kafka_settings: Mapping[str, str]) -> ClientConfig:
    base = ClientConfig.load(Path(properties)) if properties else ClientConfig()
    try:
        client = base.merged(ClientConfig.from_mapping(kafka_settings, origin="the kafka.* options"))
        client.librdkafka()  # a setting librdkafka cannot take is refused now, not in a task
    except ConfigurationError as exc:
        raise ConfigurationError(f"txbridge sink: option kafka.*: {exc}") from None
    return client


def _required(own: Mapping[str, str], name: str, what: str) -> str:
    value = (own.get(name) or "").strip()
    if not value:
        raise ConfigurationError(f"txbridge sink: option {name} is required: {what}")
    return value


def _secret(own: Mapping[str, str], environ: Mapping[str, str]) -> bytes:
    if own.get("secret") and own.get("secretEnv"):
        raise ConfigurationError("txbridge sink: pass option secret or option secretEnv, not both")
    if own.get("secret"):
        return own["secret"].encode()
    env_name = own.get("secretEnv")
    if env_name:
        value = environ.get(env_name)
        if not value:
            raise ConfigurationError(
                f"txbridge sink: option secretEnv names environment variable {env_name!r}, "
                "which is not set (or empty) on the driver"
            )
        return value.encode()
    raise ConfigurationError(
        "txbridge sink: option secret (or secretEnv, the name of an environment variable holding it) "
        "is required: the producer group's HMAC secret, as the coordinator has it"
    )


def _positive(own: Mapping[str, str], name: str, default: int) -> int:
    raw = own.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = int(raw)
    except ValueError:
        raise ConfigurationError(
            f"txbridge sink: option {name} must be a positive integer, got {raw!r}"
        ) from None
    if value < 1:
        raise ConfigurationError(f"txbridge sink: option {name} must be a positive integer, got {raw!r}")
    return value
