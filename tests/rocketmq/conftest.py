"""The local RocketMQ of the ``rocketmq`` tests: started once per session.

A name server and a proxy with its broker embedded (:class:`servers.rocketmq.LocalRocketMQ`)
on free ports in ``<cache>/rocketmq`` of a temp cache folder whose ``jars`` link to the real
cache's, so ``txbridge rocketmq ...`` with ``TXBRIDGE_CACHE=<cache>`` finds it without a second
download. The fixture yields the running instance and that cache; the instance's ``endpoint`` is
what ``rocketmq.ClientConfiguration`` takes, ``create_topic`` and ``create_group`` administer it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from servers import jars
from servers.rocketmq import LocalRocketMQ

logger = logging.getLogger(__name__)

# Start-up is ~10 s on an idle machine; a loaded CI box takes minutes.
START_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class SessionRocketMQ:
    rocketmq: LocalRocketMQ
    #: the folder to pass as TXBRIDGE_CACHE for the CLI to find the instance.
    cache: Path


@pytest.fixture(scope="session")
def session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SessionRocketMQ]:
    cache = tmp_path_factory.mktemp("cache")
    jars.ensure_jars(jars.ROCKETMQ)
    (cache / "jars").symlink_to(jars.cache_root() / "jars", target_is_directory=True)
    rocketmq = LocalRocketMQ.on_free_ports(cache / "rocketmq")
    started = time.monotonic()
    status = rocketmq.start(timeout=START_TIMEOUT_S)
    logger.info(
        "RocketMQ up at %s (name server %s) in %.1fs",
        status.endpoint,
        status.namesrv_addr,
        time.monotonic() - started,
    )
    try:
        yield SessionRocketMQ(rocketmq, cache)
    finally:
        rocketmq.stop()
