"""One call to a SparkSession that has the Kafka source and the Avro functions."""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping
from typing import TYPE_CHECKING

from txbridge.local import jars

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

logger = logging.getLogger(__name__)


def build_session(
    app_name: str = "txbridge",
    *,
    master: str | None = None,
    conf: Mapping[str, str] | None = None,
) -> SparkSession:
    """Build (or return the running) SparkSession with ``spark.jars`` set.

    The jars (``spark-sql-kafka-0-10_2.13`` matching pyspark, its runtime deps,
    ``spark-avro``) are fetched from Maven Central on first use.

    Args:
        app_name: the Spark application name.
        master: a Spark master URL; ``$TXBRIDGE_SPARK_MASTER`` or ``local[2]`` by default.
        conf: extra Spark settings, applied last.
    """
    from pyspark.sql import SparkSession

    spark_jars = ",".join(str(p) for p in jars.spark_jars())
    builder = (
        SparkSession.builder.appName(app_name)
        .master(master or os.environ.get("TXBRIDGE_SPARK_MASTER", "local[2]"))
        .config("spark.jars", spark_jars)
        .config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.memory", "2g")
    )
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    logger.info("SparkSession %s on %s", app_name, session.sparkContext.master)
    return session
