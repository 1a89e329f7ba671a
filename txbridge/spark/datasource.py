"""The ``txbridge`` data source of PySpark 4 (``df.write.format("txbridge")``, ``df.writeStream``).

Spark calls :meth:`TxbridgeDataSource.writer` / :meth:`~TxbridgeDataSource.streamWriter` in a
Python worker on the driver's host: the options and the input's columns are checked there,
so a missing or bad option fails the query before any row is written. ``write`` runs in the
tasks (:func:`~txbridge.spark.executor.write_task`); ``commit`` and ``abort`` run on the
driver's host once every task has ended (:mod:`txbridge.spark.decide`).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark import TaskContext
from pyspark.sql import Row
from pyspark.sql.datasource import DataSource, DataSourceStreamWriter, DataSourceWriter, WriterCommitMessage
from pyspark.sql.types import ArrayType, BinaryType, StringType, StructType

from txbridge.errors import ConfigurationError
from txbridge.spark.decide import abort_batch, commit_batch, ensure_sink_topic
from txbridge.spark.decisions import TxRef, ordered_refs
from txbridge.spark.executor import write_task
from txbridge.spark.options import SinkOptions, parse_options

#: The batch id of a (non-streaming) ``df.write``: one per sink id, which is fresh per write.
BATCH_WRITE_ID = 0


@dataclass
class TxbridgeCommitMessage(WriterCommitMessage):
    """What a task hands the driver: its transactions, in order."""

    txs: tuple[TxRef, ...]
    partition_id: int = 0


def check_schema(schema: StructType, opts: SinkOptions) -> None:
    """Refuse input columns the sink cannot write (as Spark's Kafka sink names them).

    Raises:
        ConfigurationError: naming the column.
    """
    fields = {f.name: f.dataType for f in schema.fields}
    if "value" not in fields:
        raise ConfigurationError("txbridge sink: the input needs a value column (binary or string)")
    for name in ("key", "value"):
        if name in fields and not isinstance(fields[name], BinaryType | StringType):
            raise ConfigurationError(f"txbridge sink: column {name} must be binary or string")
    if opts.topic is None and not isinstance(fields.get("topic"), StringType):
        raise ConfigurationError(
            "txbridge sink: option topic is required when the input has no string topic column"
        )
    headers = fields.get("headers")
    if headers is not None and not (
        isinstance(headers, ArrayType)
        and isinstance(headers.elementType, StructType)
        and [f.name for f in headers.elementType.fields] == ["key", "value"]
    ):
        raise ConfigurationError(
            "txbridge sink: column headers must be array<struct<key: string, value: binary>>"
        )


def _task() -> tuple[int, int]:
    context = TaskContext.get()
    if context is None:
        return 0, 0
    return context.partitionId(), context.attemptNumber()


def _refs(messages: Sequence[WriterCommitMessage | None]) -> list[TxRef]:
    return ordered_refs(m.txs if isinstance(m, TxbridgeCommitMessage) else None for m in messages)


class TxbridgeBatchWriter(DataSourceWriter):
    """``df.write.format("txbridge")``: one batch, decided in :meth:`commit`."""

    def __init__(self, opts: SinkOptions) -> None:
        self.opts = opts

    def write(self, iterator: Iterator[Row]) -> WriterCommitMessage:
        partition_id, attempt = _task()
        refs = write_task(
            self.opts, iterator, batch_id=BATCH_WRITE_ID, partition_id=partition_id, attempt=attempt
        )
        return TxbridgeCommitMessage(tuple(refs), partition_id)

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        commit_batch(self.opts, BATCH_WRITE_ID, _refs(messages))

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        abort_batch(self.opts, BATCH_WRITE_ID, _refs(messages))


class TxbridgeStreamWriter(DataSourceStreamWriter):
    """``df.writeStream.format("txbridge")``: each micro-batch decided in :meth:`commit`."""

    def __init__(self, opts: SinkOptions) -> None:
        self.opts = opts

    def write(self, iterator: Iterator[Row]) -> WriterCommitMessage:
        partition_id, attempt = _task()
        context = TaskContext.get()
        batch_id = int(context.getLocalProperty("streaming.sql.batchId") or -1) if context else -1
        if batch_id < 0:
            raise RuntimeError("txbridge sink: the micro-batch id is not known in this task")
        refs = write_task(self.opts, iterator, batch_id=batch_id, partition_id=partition_id, attempt=attempt)
        return TxbridgeCommitMessage(tuple(refs), partition_id)

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        commit_batch(self.opts, batchId, _refs(messages))

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        abort_batch(self.opts, batchId, _refs(messages))


class TxbridgeDataSource(DataSource):
    """The data source ``txbridge``: writes rows as txbridge transactions, published once.

    Register it with :func:`txbridge.spark.register` (``spark.dataSource.register``).
    """

    @classmethod
    def name(cls) -> str:
        return "txbridge"

    def _options(self, *, streaming: bool) -> SinkOptions:
        options: dict[str, Any] = dict(self.options)
        return parse_options(options, streaming=streaming, fresh_sink_id=f"write-{uuid.uuid4()}")

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        opts = self._prepare(schema, overwrite, streaming=False)
        return TxbridgeBatchWriter(opts)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        opts = self._prepare(schema, overwrite, streaming=True)
        return TxbridgeStreamWriter(opts)

    def _prepare(self, schema: StructType, overwrite: bool, *, streaming: bool) -> SinkOptions:
        if overwrite:
            raise ConfigurationError("txbridge sink: it appends only; use mode append (or outputMode append)")
        opts = self._options(streaming=streaming)
        check_schema(schema, opts)
        ensure_sink_topic(opts)
        return opts
