"""txbridge's Spark sink: ``df.write.format("txbridge")`` and ``df.writeStream.format("txbridge")``
publish every row exactly once, through txbridge transactions (docs/spark-sink.md).

Installed with the ``[spark]`` extra; the rest of the SDK never imports pyspark. In the driver::

    from txbridge.spark import SinkChecks, register

    register(spark)
    with SinkChecks(bootstrap, "orders-sink", secret=SECRET) as checks:
        query = (df.writeStream.format("txbridge").options(**checks.options())
                 .option("secretEnv", "TXBRIDGE_SECRET").option("topic", "orders")
                 .option("checkpointLocation", "/chk/orders").start())
        query.awaitTermination()
"""

from __future__ import annotations

from typing import Any

from txbridge.spark.checks import SinkChecks
from txbridge.spark.datasource import TxbridgeDataSource
from txbridge.spark.decisions import H_BATCH, BatchDecision, DecisionBook, TxRef
from txbridge.spark.options import SinkOptions, parse_options

__all__ = [
    "H_BATCH",
    "BatchDecision",
    "DecisionBook",
    "SinkChecks",
    "SinkOptions",
    "TxRef",
    "TxbridgeDataSource",
    "parse_options",
    "register",
]


def register(spark: Any) -> None:
    """Register the ``txbridge`` data source in ``spark`` (a SparkSession)."""
    spark.dataSource.register(TxbridgeDataSource)
