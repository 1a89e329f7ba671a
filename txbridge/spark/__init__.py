"""txbridge's Spark sink: ``df.write.format("txbridge")`` and ``df.writeStream.format("txbridge")``
publish every row exactly once, through txbridge transactions (docs/spark-sink.md).

Installed with the ``[spark-sink]`` extra (pyspark 4.x and pyarrow; ``[spark]`` has it too); the
rest of the SDK never imports pyspark. Importing this package checks the pyspark version first
(:mod:`txbridge.spark.support`). In the driver::

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

from txbridge.spark.support import check_pyspark

# Before the data source's modules import pyspark.sql.datasource, which older pysparks lack.
check_pyspark()

from txbridge.spark.checks import SinkChecks  # noqa: E402
from txbridge.spark.datasource import TxbridgeDataSource  # noqa: E402
from txbridge.spark.decisions import H_BATCH, BatchDecision, DecisionBook, TxRef  # noqa: E402
from txbridge.spark.options import SinkOptions, parse_options  # noqa: E402

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
    """Register the ``txbridge`` data source in ``spark`` (a SparkSession).

    Raises:
        SetupError: the session's Spark is outside the pyspark versions the sink supports
            (:data:`txbridge.spark.support.SUPPORTED`; a driver may run another Spark than
            the pyspark this interpreter imports).
    """
    check_pyspark(str(spark.version))
    spark.dataSource.register(TxbridgeDataSource)
