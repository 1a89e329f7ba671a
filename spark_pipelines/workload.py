"""One run of the order workload: its settings, names and the path objects.

A run has an id; topics, databases and the txbridge namespace are named from
it, so runs never mix. ``RunConfig`` is plain data (JSON) handed to each
producer process; the check secret travels in the environment, never on disk.
"""

from __future__ import annotations

import json
import os
import secrets
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from spark_pipelines.paths import ALL_PATHS, ROCKETMQ, OrderPath
from spark_pipelines.store import OrderStore
from txbridge.errors import ConfigurationError

if TYPE_CHECKING:
    from txbridge.client_config import ClientConfig

SECRET_ENV = "TXBRIDGE_DEMO_SECRET"  # noqa: S105 - the name of the variable, not a secret


def new_run_id() -> str:
    return f"run-{time.strftime('%Y%m%d-%H%M%S')}-{secrets.token_hex(2)}"


@dataclass(frozen=True)
class RunConfig:
    """Everything a producer process of the run needs (no secret).

    Attributes:
        run_id: names topics, tables and the namespace.
        bootstrap: Kafka bootstrap servers.
        run_dir: where the plan, databases, logs and the report go.
        db_url: a SQLAlchemy URL shared by the paths, or "" for one SQLite file per path.
        partitions: partitions of each path's topic and of txbridge's internal topics.
        check_after: seconds before the first back-check of a txbridge transaction.
        rocketmq_endpoint: the RocketMQ proxy's gRPC address ("" when the run has no rocketmq path).
        rate: orders per second of each path, paced from the moment the paths begin together
            (0: each as fast as it can; the paths then drift apart, and their latencies are
            measured at different moments of the run).
    """

    run_id: str
    bootstrap: str
    run_dir: str
    db_url: str = ""
    partitions: int = 3
    check_after: float = 2.0
    topics: dict[str, str] = field(default_factory=dict)
    rocketmq_endpoint: str = ""
    rate: float = 0.0

    @classmethod
    def create(
        cls, run_id: str, bootstrap: str, run_dir: Path, *, db_url: str = "", **kw: object
    ) -> RunConfig:
        topics = {path: f"orders-{run_id}-{path}" for path in ALL_PATHS}
        return cls(run_id, bootstrap, str(run_dir), db_url, topics=topics, **kw)  # type: ignore[arg-type]

    def topics_for(self, paths: Sequence[str]) -> dict[str, str]:
        """``{path: topic}`` for the given paths."""
        return {p: self.topics[p] for p in paths}

    @property
    def namespace(self) -> str:
        return f"__txbridge_{self.run_id.replace('-', '_')}"

    @property
    def group(self) -> str:
        return f"orders-{self.run_id}"

    @property
    def rocketmq_group(self) -> str:
        """The RocketMQ watcher's consumer group."""
        return f"watcher-{self.run_id}"

    @property
    def plan_file(self) -> Path:
        return Path(self.run_dir) / "plan.json"

    def store(self, path: str) -> OrderStore:
        """The path's order table: its own SQLite file, or ``orders_<run>_<path>`` at ``db_url``."""
        if self.db_url:  # shared by runs: the run's tag keeps their ground truths apart
            return OrderStore(self.db_url, path, run=self.run_id.replace("-", "_").lower())
        return OrderStore(f"sqlite:///{Path(self.run_dir) / 'db' / f'{path}.sqlite'}", path)

    def save(self) -> Path:
        target = Path(self.run_dir) / "run.json"
        target.write_text(json.dumps(asdict(self), indent=1))
        return target

    @classmethod
    def load(cls, run_dir: Path) -> RunConfig:
        return cls(**json.loads((run_dir / "run.json").read_text()))


def make_path(
    config: RunConfig, path: str, *, secret: str | None = None, client: ClientConfig | None = None
) -> OrderPath:
    """The path object ``path`` of a run (not started); ``client`` holds the cluster's client settings."""
    store = config.store(path)
    topic = config.topics[path]
    settings = client.librdkafka() if client is not None else {}
    if path == "native":
        from spark_pipelines.paths.native import NativePath

        return NativePath(
            config.bootstrap, topic, store, transactional_id=f"{config.group}-native", extra=settings
        )
    if path == "plain":
        from spark_pipelines.paths.plain import PlainPath

        return PlainPath(config.bootstrap, topic, store, extra=settings)
    if path == "txbridge":
        from spark_pipelines.paths.txbridge_path import TxbridgePath

        secret = secret or os.environ.get(SECRET_ENV)
        if not secret:
            raise ConfigurationError(f"the txbridge path needs the check secret in ${SECRET_ENV}")
        return TxbridgePath(
            config.bootstrap,
            topic,
            store,
            group=config.group,
            secret=secret,
            namespace=config.namespace,
            partitions=config.partitions,
            check_after=config.check_after,
            client_config=settings,
        )
    if path == ROCKETMQ:
        from spark_pipelines.paths.rocketmq_path import RocketMQPath

        if not config.rocketmq_endpoint:
            raise ConfigurationError("the rocketmq path needs the RocketMQ endpoint in the run's config")
        return RocketMQPath(config.rocketmq_endpoint, topic, store, Path(config.run_dir) / "logs")
    raise ConfigurationError(f"unknown path {path!r}; choose one of {', '.join(ALL_PATHS)}")
