"""The RocketMQ of the ``rocketmq`` path: one the demo starts and stops, or an existing one.

The demo's own RocketMQ is :class:`servers.rocketmq.LocalRocketMQ` in
``<cache>/rocketmq-demo`` on ports the OS says are free (so neither a
``txbridge rocketmq start`` instance nor anything on 8081 or 9876 is in the way),
with :data:`DEMO_TRANSACTION_SETTINGS`. An existing RocketMQ is given by its proxy's
gRPC endpoint (what clients use) and its name server (what ``mqadmin`` uses to
create the run's transactional topic and to read the broker's settings back).

Either way the report gives the transaction settings the broker says it runs with,
read back with ``mqadmin getBrokerConfig``, not the ones the demo meant to set.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from servers import jars
from servers.broker import free_port, port_in_use
from servers.rocketmq import CLUSTER_NAME, LocalRocketMQ, free_broker_port
from txbridge.errors import BrokerError, ConfigurationError

logger = logging.getLogger(__name__)

#: The broker's transaction settings for the demo: RocketMQ 5.3.3's defaults but for the
#: check interval. A service that relies on back-checks to finish what a crashed producer
#: left open lowers the interval from 30 s, the only default the demo would otherwise wait
#: on; the scan reads only the half and op queues, so every 5 s costs little.
DEMO_TRANSACTION_SETTINGS: dict[str, int] = {
    # a half message with no COMMIT/ROLLBACK is first checked once 6 s old (default)
    "transactionTimeOut": 6_000,
    # the check service scans every 5 s (default 30 s)
    "transactionCheckInterval": 5_000,
    # after 15 checks with no answer the half message is dropped, never delivered (default)
    "transactionCheckMax": 15,
    # COMMIT/ROLLBACK op records are written in batches every 3 s (default): half the
    # timeout, so a transaction ended within 3 s of its half message is never checked
    "transactionOpBatchInterval": 3_000,
}
#: RocketMQ 5.3.3's own defaults (BrokerConfig), for the report's "default" column.
ROCKETMQ_DEFAULTS: dict[str, int] = {
    "transactionTimeOut": 6_000,
    "transactionCheckInterval": 30_000,
    "transactionCheckMax": 15,
    "transactionOpBatchInterval": 3_000,
}
#: How to skip the path, for error messages.
SKIP_HINT = "skip RocketMQ with --paths txbridge,native,plain"
_ADDRESS = re.compile(r"^(?P<host>[A-Za-z0-9._-]+|\[[0-9A-Fa-f:]+\]):(?P<port>\d{1,5})$")
_SETTING = re.compile(r"^\s*(?P<key>transaction\w+)\s*=\s*(?P<value>-?\d+)\s*$", re.MULTILINE)
# A cold start takes tens of seconds on shared cores, and minutes on a loaded machine.
START_TIMEOUT_S = 240.0


def parse_address(value: str, option: str) -> tuple[str, int]:
    """``host:port`` as a pair.

    Raises:
        ConfigurationError: not ``host:port``; the message names ``option``.
    """
    match = _ADDRESS.match(value.strip())
    if match is None or not 0 < int(match["port"]) < 65536:
        raise ConfigurationError(f"{option} {value!r} is not host:port (for example 127.0.0.1:8081)")
    return match["host"].strip("[]"), int(match["port"])


@dataclass
class RocketMQTarget:
    """Where the ``rocketmq`` path sends and its watcher receives.

    Attributes:
        endpoint: the proxy's gRPC address (``rocketmq.ClientConfiguration``).
        namesrv: the name server's address (``mqadmin -n``).
        cluster: the broker cluster that gets the run's topic (``mqadmin -c``).
        local: the instance the demo started (and stops); None for an existing RocketMQ.
        start_s: how long the local instance took to start.
    """

    endpoint: str
    namesrv: str
    cluster: str = CLUSTER_NAME
    local: LocalRocketMQ | None = None
    start_s: float | None = None
    _admin: LocalRocketMQ | None = field(default=None, repr=False)

    @classmethod
    def existing(cls, endpoint: str, namesrv: str, cluster: str = CLUSTER_NAME) -> RocketMQTarget:
        """An existing RocketMQ, checked to listen at both addresses.

        Raises:
            ConfigurationError: an address is malformed, or nothing listens there.
        """
        for value, option, what in (
            (endpoint, "--rocketmq-endpoint", "RocketMQ proxy (gRPC)"),
            (namesrv, "--rocketmq-namesrv", "RocketMQ name server"),
        ):
            host, port = parse_address(value, option)
            if not port_in_use(host, port):
                raise ConfigurationError(
                    f"no {what} listens at {value} ({option}); start it, fix the address, or {SKIP_HINT}"
                )
        return cls(endpoint.strip(), namesrv.strip(), cluster)

    @property
    def admin(self) -> LocalRocketMQ:
        """Something that runs ``mqadmin`` against :attr:`namesrv` (no process is started)."""
        if self._admin is None:
            if self.local is not None:
                self._admin = self.local
            else:
                host, port = parse_address(self.namesrv, "--rocketmq-namesrv")
                self._admin = LocalRocketMQ(
                    jars.cache_root() / "rocketmq-admin", host=host, namesrv_port=port
                )
        return self._admin

    def create_topic(self, topic: str, queues: int = 4) -> None:
        """Create the run's transactional topic (``+message.type=TRANSACTION``).

        Raises:
            BrokerError: mqadmin refused it (the message has its output's tail).
        """
        self.admin.admin(
            *("updateTopic", "-n", self.namesrv, "-c", self.cluster, "-t", topic),
            *("-r", str(queues), "-w", str(queues), "-a", "+message.type=TRANSACTION"),
        )

    def create_group(self, group: str) -> None:
        """Create the watcher's consumer group (a broker may not create groups on demand).

        Raises:
            BrokerError: mqadmin refused it.
        """
        self.admin.admin("updateSubGroup", "-n", self.namesrv, "-c", self.cluster, "-g", group)

    def transaction_settings(self) -> dict[str, int]:
        """The ``transaction*`` settings the cluster's (first) broker runs with.

        Raises:
            BrokerError: mqadmin could not read them.
        """
        out = self.admin.admin("getBrokerConfig", "-n", self.namesrv, "-c", self.cluster)
        settings: dict[str, int] = {}
        for match in _SETTING.finditer(out):
            settings.setdefault(match["key"], int(match["value"]))  # the first broker's
        return settings

    def stop(self) -> None:
        """Stop the local instance, if the demo started it."""
        if self.local is not None:
            self.local.stop()


def demo_rocketmq(
    home: Path | None = None,
    *,
    settings: Mapping[str, int] | None = None,
    proxy_heap: str = "512m",
) -> LocalRocketMQ:
    """The demo's local RocketMQ (not started): ``<cache>/rocketmq-demo``, free ports."""
    host = "127.0.0.1"
    return LocalRocketMQ(
        home or jars.cache_root() / "rocketmq-demo",
        namesrv_port=free_port(host),
        grpc_port=free_port(host),
        remoting_port=free_port(host),
        broker_port=free_broker_port(host),
        host=host,
        proxy_heap=proxy_heap,
        transaction_settings=DEMO_TRANSACTION_SETTINGS if settings is None else settings,
    )


def start_local(rocketmq: LocalRocketMQ, *, timeout: float = START_TIMEOUT_S) -> RocketMQTarget:
    """Start ``rocketmq`` (stopping what an earlier, killed demo left running in its home).

    Raises:
        BrokerError: it did not start; the first line says why (a taken port, a JVM that
            could not get its memory, its last exception) and how to skip RocketMQ.
        SetupError: Java or the jars are missing.
    """
    leftover = LocalRocketMQ.from_home(rocketmq.home)
    if leftover.status().namesrv_pid or leftover.status().proxy_pid:
        logger.warning("stopping the RocketMQ an earlier demo left running in %s", rocketmq.home)
        leftover.stop()
    started = time.monotonic()
    try:
        status = rocketmq.start(timeout=timeout)
    except BrokerError as exc:
        first, _, rest = str(exc).partition("\n")
        raise BrokerError(f"{first}; {SKIP_HINT}" + (f"\n{rest}" if rest else "")) from exc
    return RocketMQTarget(
        status.endpoint, status.namesrv_addr, local=rocketmq, start_s=time.monotonic() - started
    )


@dataclass
class RocketMQSetup:
    """The RocketMQ side of a run, prepared in a background thread while Kafka and Spark start.

    ``start()`` begins it; ``wait()`` returns the target once its topic exists, or raises what
    went wrong. It starts ``local`` (unless ``existing`` is given), creates the topic (and, on
    an existing RocketMQ, the watcher's group; the local one creates groups on demand), and
    then reads the broker's transaction settings back for the report (``finish()``).
    """

    topic: str
    group: str
    existing: RocketMQTarget | None = None
    local: LocalRocketMQ | None = None
    timeout: float = START_TIMEOUT_S
    target: RocketMQTarget | None = None
    #: the broker's transaction settings as it reports them (empty when they could not be read)
    settings: dict[str, int] = field(default_factory=dict)
    _error: BaseException | None = None
    _thread: threading.Thread | None = None
    _ready: threading.Event = field(default_factory=threading.Event)

    def start(self) -> RocketMQSetup:
        self._thread = threading.Thread(target=self._run, name="rocketmq-setup", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        try:
            if self.existing is not None:
                target = self.existing
            else:
                assert self.local is not None, "an existing RocketMQ or a local one to start"
                target = start_local(self.local, timeout=self.timeout)
            self.target = target
            target.create_topic(self.topic)
            if self.existing is not None:
                target.create_group(self.group)
        except BaseException as exc:  # re-raised by wait() in the caller's thread
            self._error = exc
            return
        finally:
            self._ready.set()
        try:
            reported = target.transaction_settings()
            self.settings = {k: reported[k] for k in ROCKETMQ_DEFAULTS if k in reported}
        except BrokerError as exc:  # only the report needs them
            logger.warning("could not read the RocketMQ broker's settings: %s", exc)

    def wait(self) -> RocketMQTarget:
        """The target, once the run's topic exists.

        Raises:
            BrokerError: RocketMQ did not start, or refused the topic or group.
        """
        self._ready.wait()
        if self._error is not None:
            raise self._error
        assert self.target is not None, "start() first"
        return self.target

    def finish(self) -> dict[str, int]:
        """The broker's transaction settings, once read (empty if they could not be)."""
        if self._thread is not None:
            self._thread.join()
        return self.settings

    def check_interval_s(self) -> float:
        """The broker's check interval: as it reported it, else as the demo configured it."""
        configured = self.local.transaction_settings if self.local is not None else {}
        interval = self.settings.get("transactionCheckInterval") or configured.get("transactionCheckInterval")
        return (interval or ROCKETMQ_DEFAULTS["transactionCheckInterval"]) / 1000

    def stop(self) -> None:
        """Stop the local instance, if the demo started one, even while it is still starting."""
        if self.local is None:
            return
        if self._thread is not None:
            self._thread.join(5)
        self.local.stop()
        if self._thread is not None and self._thread.is_alive():
            # Still starting: with its name server gone, start() fails within a second or
            # two; stop again what it spawned meanwhile.
            self._thread.join()
            self.local.stop()
