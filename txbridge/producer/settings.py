"""A producer's settings: the keyword options both producers take, validated without I/O.

:class:`ProducerOptions` names and documents every option (mypy checks them, and
:func:`check_option_names` refuses an unknown one at run time);
:class:`ProducerSettings` is what is left once they are checked and normalised.
"""

from __future__ import annotations

import difflib
import os
import socket
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Required, TypedDict

from txbridge import limits, wire
from txbridge.client_config import ClientConfig
from txbridge.errors import ConfigurationError
from txbridge.producer.records import RecordEncoder
from txbridge.serializers import BytesSerializer, Serializer
from txbridge.transaction import LocalTransaction, TransactionListener
from txbridge.wire import Topics

ExecuteFunction = Callable[[LocalTransaction, Any], Any]
CheckFunction = Callable[[LocalTransaction], Any]


class ProducerOptions(TypedDict, total=False):
    """The keyword settings of both producers (everything after ``bootstrap`` and ``group``).

    :class:`~txbridge.TransactionProducer` and :class:`~txbridge.AsyncTransactionProducer`
    take exactly these, checked by mypy (``**options: Unpack[ProducerOptions]``) and, for a
    name that is not one of them, at run time (``TypeError`` naming it).

    Attributes:
        secret: the group's HMAC secret for back-check signatures (never logged). Required.
        listener: a :class:`~txbridge.TransactionListener` (execute + check), or:
        check: a check function ``check(txn) -> TxState`` (e.g. ``barrier.check``).
        namespace: the txbridge topic prefix (as given to ``txbridge init``).
        partitions: partitions of ``<ns>_half``/``<ns>_op``; default: their count, read at start.
            A value that disagrees with the topics is refused at start, and so is a count that
            changes under a running producer (its keys would move to other half partitions).
        instance_id: this instance's id (default ``host-pid-random``).
        check_host: interface of the built-in check server (default ``127.0.0.1``).
        check_port: its port; 0 (default) picks a free one.
        serve_checks: False to mount ``check_app`` in your own ASGI server instead (default True).
        advertised_url: the check URL put in the registry (default from host and port).
        value_serializer: turns message values into bytes (default: bytes as they are).
        key_serializer: turns message keys into bytes.
        heartbeat_interval_s: seconds between registry heartbeats (default 1; each says it, so a
            coordinator that hears none for 2.5 intervals asks another live instance about this
            one's transactions at once when the check is decisive, instead of after the check delay).
        max_message_bytes: must match the coordinator's ``max_message_bytes`` (default 1 MiB):
            a larger message (as :func:`txbridge.limits.record_size` counts it republished) is
            refused before its half record is written, instead of quarantined once committed.
        settle_unknown: when the local transaction ends UNKNOWN (or raises), ask the check
            function at once (then after 50 and 250 ms) and write its COMMIT or ROLLBACK
            instead of leaving the outcome to a back-check seconds later. Default (None): only
            when the check is marked :func:`~txbridge.decisive` (the barrier's ``check`` is):
            an ordinary check asked too early could answer ROLLBACK for a commit still on its
            way, which is what the coordinator's check delay guards against.
        check_source: the source of truth the check answers from, said in every half record and
            heartbeat: a coordinator asks another instance about this one's transactions only
            when that instance says the same source. Default: a barrier's check says its
            database's identity; any other check answers for this instance only
            (``"instance"``). ``"group"``: the check answers for every instance of the group
            (one shared source of truth); any other name: the instances that say that name read
            one source of truth. See :func:`txbridge.wire.can_answer`.
        client_config: the cluster's client settings (security), shared by every part: a
            :class:`~txbridge.client_config.ClientConfig` (e.g. ``ClientConfig.load("client.properties")``)
            or a dict of Java or librdkafka names.
        extra_config: librdkafka settings on top of txbridge's (idempotent, acks=all) and of
            ``client_config``.
    """

    secret: Required[bytes | str]
    listener: TransactionListener | None
    check: CheckFunction | None
    namespace: str
    partitions: int | None
    instance_id: str | None
    check_host: str
    check_port: int
    serve_checks: bool
    advertised_url: str | None
    value_serializer: Serializer | None
    key_serializer: Serializer | None
    heartbeat_interval_s: float
    max_message_bytes: int
    settle_unknown: bool | None
    check_source: str | None
    client_config: ClientConfig | Mapping[str, Any] | None
    extra_config: dict[str, Any] | None


#: Every name of :class:`ProducerOptions` (required or not).
OPTION_NAMES = ProducerOptions.__required_keys__ | ProducerOptions.__optional_keys__


def check_option_names(owner: str, options: Mapping[str, Any]) -> None:
    """Refuse a keyword that is not a :class:`ProducerOptions` name, as Python refuses one.

    Raises:
        TypeError: naming the keyword, and the option it is closest to.
    """
    unknown = sorted(set(options) - OPTION_NAMES)
    if unknown:
        name = unknown[0]
        close = difflib.get_close_matches(name, OPTION_NAMES, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise TypeError(
            f"{owner}() got an unexpected keyword argument {name!r}{hint}; "
            f"its options are txbridge.ProducerOptions: {', '.join(sorted(OPTION_NAMES))}"
        )


def default_instance_id() -> str:
    """``host-pid-random``: unique per process, readable in the registry."""
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:6]}"


@dataclass(frozen=True)
class ProducerSettings:
    """A producer's validated settings (no I/O). The secret is kept out of ``repr``."""

    bootstrap: str
    group: str
    secret: bytes = field(repr=False)
    namespace: str = wire.DEFAULT_NAMESPACE
    partitions: int | None = None  # None until start() reads the half topic's count
    instance_id: str = ""
    check_host: str = "127.0.0.1"
    check_port: int = 0
    serve_checks: bool = True
    advertised_url: str | None = None
    value_serializer: Serializer = field(default_factory=BytesSerializer)
    key_serializer: Serializer = field(default_factory=BytesSerializer)
    heartbeat_interval_s: float = 1.0
    max_message_bytes: int = limits.DEFAULT_MAX_MESSAGE_BYTES
    settle_unknown: bool | None = None
    #: as given (None: from the check function); once started, the source the halves say
    check_source: str | None = None
    # Not in repr: it holds the client settings, sasl.password and ssl.key.password among them.
    extra_config: dict[str, Any] = field(default_factory=dict, repr=False)

    @classmethod
    def build(
        cls, bootstrap: str, group: str, secret: bytes | str | None, **options: Any
    ) -> ProducerSettings:
        """Validate and normalise the constructor's arguments.

        Raises:
            ConfigurationError: a setting is missing or invalid; the message names it.
        """
        if not bootstrap:
            raise ConfigurationError(
                "no Kafka bootstrap address: pass bootstrap= (e.g. from KAFKA_BOOTSTRAP_SERVERS)"
            )
        if not isinstance(group, str) or not group.strip():
            raise ConfigurationError(
                "group must be a non-empty producer group name (who answers back-checks)"
            )
        if "/" in group:
            raise ConfigurationError(
                f"group {group!r} must not contain '/' (registry keys are group/instance)"
            )
        if not secret:
            raise ConfigurationError(
                "secret is required: the group's HMAC secret that signs back-checks "
                "(the same value the coordinator is configured with)"
            )
        raw_secret = secret.encode() if isinstance(secret, str) else bytes(secret)
        _check_numbers(options)
        if not options.get("serve_checks", True) and not options.get("advertised_url"):
            raise ConfigurationError(
                "serve_checks=False needs advertised_url=: the URL where you mounted producer.check_app "
                "(path /txbridge/check), so the coordinator can reach it"
            )
        if not options.get("instance_id"):
            options["instance_id"] = default_instance_id()
        if "/" in options["instance_id"]:
            raise ConfigurationError("instance_id must not contain '/'")
        source = options.get("check_source")
        if source is not None and (not isinstance(source, str) or not source.isprintable() or not source):
            raise ConfigurationError(
                f"check_source must be a non-empty printable name, got {source!r}: "
                f"{wire.SOURCE_GROUP!r} when your check answers for every instance of the group, "
                f"{wire.SOURCE_INSTANCE!r} when only for this instance, or the name of the database it reads"
            )
        options["extra_config"] = dict(options.get("extra_config") or {})
        for name in ("value_serializer", "key_serializer"):
            if options.get(name) is None:
                options[name] = BytesSerializer()
            elif not callable(getattr(options[name], "serialize", None)):
                raise ConfigurationError(f"{name} must have a serialize(value) -> bytes method")
        return cls(bootstrap=bootstrap, group=group, secret=raw_secret, **options)

    # Cached: every transaction reads them (``dataclasses.replace`` makes new settings, new caches).
    @cached_property
    def topics(self) -> Topics:
        return Topics(self.namespace)

    @cached_property
    def half_topic(self) -> str:
        return self.topics.half

    @cached_property
    def op_topic(self) -> str:
        return self.topics.op

    @cached_property
    def encoder(self) -> RecordEncoder:
        """The encoder of this instance's half and op records."""
        return RecordEncoder(
            self.group, self.instance_id, self.key_serializer, self.value_serializer, self.check_source
        )


def _check_numbers(options: Mapping[str, Any]) -> None:
    partitions = options.get("partitions")
    if partitions is not None and (not isinstance(partitions, int) or partitions < 1):
        raise ConfigurationError(f"partitions must be a positive integer, got {partitions!r}")
    if options.get("heartbeat_interval_s", 1.0) <= 0:
        raise ConfigurationError("heartbeat_interval_s must be positive")
    max_bytes = options.get("max_message_bytes", limits.DEFAULT_MAX_MESSAGE_BYTES)
    if isinstance(max_bytes, bool) or not isinstance(max_bytes, int) or max_bytes < 1:
        raise ConfigurationError(
            "max_message_bytes must be a positive integer, the coordinator's max_message_bytes "
            f"(default {limits.DEFAULT_MAX_MESSAGE_BYTES}), got {max_bytes!r}"
        )
