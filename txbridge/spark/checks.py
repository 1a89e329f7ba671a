"""The driver's back-check service for the Spark sink's transactions.

The sink leaves every transaction it writes undecided until the driver decides its batch;
a transaction whose decision is late (the driver is slow, a task attempt failed, the driver
died) is back-checked by the coordinator. :class:`SinkChecks` runs in the driver program: a
:class:`~txbridge.TransactionProducer` of the group that serves back-checks and heartbeats
in the producer registry, with a check function (:class:`~txbridge.spark.decisions.DecisionBook`)
fed by a thread that reads ``<ns>_spark_sink`` from its start and then follows it. A driver
restarted from its checkpoint starts one again, and answers for the dead driver's
transactions too.

Spark runs a Python data source's ``commit`` in a Python worker process, not in the driver
program, and the workers come and go; so the check server is not started by the data source
but by the driver program, before the query (``with SinkChecks(...) as checks:``), and the
query gets its URL as option ``checkUrl`` (:meth:`SinkChecks.options`).
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Mapping
from typing import Any

from txbridge import kafka, wire
from txbridge.client_config import ClientConfig
from txbridge.errors import TxBridgeError
from txbridge.producer import TransactionProducer
from txbridge.spark.decide import ensure_sink_topic
from txbridge.spark.decisions import (
    DEFAULT_COMMIT_GRACE_S,
    BatchDecision,
    DecisionBook,
    JournalEntry,
    decode_record,
    journal_tx_of,
    sink_topic,
)
from txbridge.spark.options import SinkOptions

logger = logging.getLogger(__name__)


class SinkChecks:
    """Answers the back-checks of the Spark sink's transactions of ``group``, from the driver.

    Args:
        bootstrap: Kafka bootstrap servers.
        group: the producer group the sink writes as (option ``group``).
        secret: the group's HMAC secret (never logged).
        namespace: the txbridge namespace (option ``namespace``).
        client_config: the cluster's client settings (a :class:`ClientConfig` or a dict).
        check_host: interface of the check server (the coordinators must reach it).
        check_port: its port (0: a free one).
        advertised_url: the URL to register, when ``check_host`` is not how the coordinators
            reach this host.
        load_timeout_s: how long :meth:`start` waits to have read the existing decisions.
        commit_grace_s: how long a decision record must have been known before a back-check
            answers COMMIT from it (the driver's in-order COMMITs come first).
    """

    def __init__(
        self,
        bootstrap: str,
        group: str,
        *,
        secret: bytes | str,
        namespace: str = wire.DEFAULT_NAMESPACE,
        client_config: ClientConfig | Mapping[str, Any] | None = None,
        check_host: str = "127.0.0.1",
        check_port: int = 0,
        advertised_url: str | None = None,
        load_timeout_s: float = 60.0,
        commit_grace_s: float = DEFAULT_COMMIT_GRACE_S,
    ) -> None:
        self.book = DecisionBook(commit_grace_s)
        self._client = ClientConfig.coerce(client_config)
        self._producer = TransactionProducer(
            bootstrap,
            group,
            secret=secret,
            check=self.book.check,
            namespace=namespace,
            client_config=self._client,
            check_host=check_host,
            check_port=check_port,
            advertised_url=advertised_url,
            instance_id=f"spark-checks-{uuid.uuid4().hex[:10]}",
            settle_unknown=False,
            # The decisions topic is the one source of truth of every driver and task of the group.
            check_source=wire.SOURCE_GROUP,
        )
        self.bootstrap = bootstrap
        self.group = group
        self.namespace = namespace
        self._load_timeout_s = load_timeout_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failure: BaseException | None = None

    @property
    def url(self) -> str:
        """The check URL (option ``checkUrl`` of the sink), once started."""
        return self._producer.check_url

    def options(self) -> dict[str, str]:
        """The sink options this service determines: bootstrap, group, namespace, checkUrl,
        and ``clientProperties`` when the client settings came from a file. Not the secret:
        pass ``secret`` or ``secretEnv`` yourself."""
        out = {
            "kafka.bootstrap.servers": self.bootstrap,
            "group": self.group,
            "namespace": self.namespace,
            "checkUrl": self.url,
        }
        if self._client.file is not None:
            out["clientProperties"] = str(self._client.file)
        return out

    def start(self) -> SinkChecks:
        """Create ``<ns>_spark_sink`` if needed, read it to its end, then serve back-checks.

        Raises:
            KafkaOperationError, ConfigurationError: Kafka or the txbridge topics are not there
                (``txbridge init``), or the check server cannot listen.
            TxBridgeError: the decisions could not be read within ``load_timeout_s``.
        """
        ensure_sink_topic(self._sink_options())
        self._thread = threading.Thread(target=self._follow, name="txbridge-spark-decisions", daemon=True)
        self._thread.start()
        if not self.book.loaded.wait(self._load_timeout_s):
            self.stop()
            raise TxBridgeError(
                f"reading {sink_topic(self.namespace)} did not reach its end in {self._load_timeout_s:.0f}s"
                + (f": {self._failure}" if self._failure else "")
            )
        self._producer.start()
        self.book.own_urls.add(self.url)  # the URL the sink's tasks journal (option checkUrl)
        logger.info("serving the Spark sink's back-checks of group %s at %s", self.group, self.url)
        return self

    def stop(self) -> None:
        """Stop serving (the coordinators then ask another live instance of the group, or keep
        the transactions pending until one is back). Idempotent."""
        self._producer.close()
        self._stop.set()
        if self._thread is not None:
            self._thread.join(10)
            self._thread = None

    def __enter__(self) -> SinkChecks:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _sink_options(self) -> SinkOptions:
        return SinkOptions(
            bootstrap=self.bootstrap,
            group=self.group,
            secret=b"-",
            namespace=self.namespace,
            check_url="http://unused",
            sink_id="-",
            client_config=self._client,
        )

    def _follow(self) -> None:
        """Read every decision record, then follow the topic until stopped."""
        topic = sink_topic(self.namespace)
        extra = kafka.settings_for("consumer", self._client.librdkafka())
        while not self._stop.is_set():
            try:
                self._read(topic, extra)
            except Exception as exc:  # a broker hiccup: read again from the start (records are idempotent)
                self._failure = exc
                logger.warning("reading %s failed, reading it again: %s", topic, exc)
                time.sleep(1.0)

    def _read(self, topic: str, extra: Mapping[str, Any]) -> None:
        consumer = kafka.consumer(self.bootstrap, f"txbridge-spark-checks-{uuid.uuid4().hex[:8]}", extra)
        try:
            _low, end = consumer.get_watermark_offsets(kafka.partition_at(topic, 0), timeout=10)
            consumer.assign([kafka.partition_at(topic, 0, kafka.FROM_START)])
            if end <= 0:
                self.book.loaded.set()
            while not self._stop.is_set():
                for msg in kafka.consume_available(consumer, 500, 0.2):
                    if msg.error() is not None:
                        if not kafka.is_partition_eof(msg.error()):
                            raise kafka.to_error(msg.error(), f"reading {topic}")
                        continue
                    record = decode_record(msg.value())
                    if isinstance(record, BatchDecision):
                        self.book.add(record)
                    elif isinstance(record, JournalEntry):
                        self.book.note_journal(record)
                    elif msg.value() is None and (tx_id := journal_tx_of(msg.key())) is not None:
                        self.book.forget_journal(tx_id)
                    if msg.offset() + 1 >= end:
                        self.book.loaded.set()
                if not self.book.loaded.is_set():
                    (position,) = consumer.position([kafka.partition_at(topic, 0)])
                    if position.offset >= end:
                        self.book.loaded.set()
        finally:
            consumer.close()
