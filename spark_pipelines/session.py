"""One call to a SparkSession that has the Kafka source and the Avro functions.

The session runs in ``local[2]`` by default, or on the Spark cluster that ``master``
(``--master``, ``$TXBRIDGE_SPARK_MASTER``) names, e.g. ``spark://host:7077``. On a
cluster the executors get the Kafka source and ``spark-avro`` jars from the driver:
``spark.jars`` holds the driver's local paths and the driver serves them, so the
executors need no copy of ``.cache/jars``, but they must reach the driver's address.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from servers import jars

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

logger = logging.getLogger(__name__)

MASTER_ENV = "TXBRIDGE_SPARK_MASTER"
DEFAULT_MASTER = "local[2]"
_LOOPBACK = {"127.0.0.1", "localhost", "::1"}


def resolve_master(master: str | None = None) -> str:
    """``master``, else ``$TXBRIDGE_SPARK_MASTER``, else ``local[2]``."""
    return master or os.environ.get(MASTER_ENV) or DEFAULT_MASTER


def runs_on_this_host(master: str) -> bool:
    """True for ``local[...]`` and for a cluster master on a loopback address (every executor here)."""
    if master == "local" or master.startswith("local["):
        return True
    hosts = [urlsplit(f"spark://{part}").hostname for part in master.split("://", 1)[-1].split(",")]
    return all(host in _LOOPBACK for host in hosts)


def build_session(
    app_name: str = "txbridge",
    *,
    master: str | None = None,
    conf: Mapping[str, str] | None = None,
    kafka_source: bool = True,
) -> SparkSession:
    """Build (or return the running) SparkSession with ``spark.jars`` set.

    The jars (``spark-sql-kafka-0-10_2.13`` matching pyspark, its runtime deps,
    ``spark-avro``) are fetched from Maven Central on first use.

    When every executor runs on this host (``local[N]``, or a master on 127.0.0.1), the
    driver binds to 127.0.0.1 and Python workers run this interpreter. On another cluster
    the driver listens on Spark's default address (``SPARK_LOCAL_IP`` /
    ``SPARK_LOCAL_HOSTNAME`` choose another) and Python workers run ``$PYSPARK_PYTHON``
    (``python3``): executors must reach the driver, and their Python must have pyspark
    of the same version.

    Args:
        app_name: the Spark application name.
        master: a Spark master URL; ``$TXBRIDGE_SPARK_MASTER`` or ``local[2]`` by default.
        conf: extra Spark settings, applied last.
        kafka_source: put the Kafka source and Avro jars on ``spark.jars``; without them
            the session still runs the ``txbridge`` sink, which needs no jar (a pyspark
            whose Kafka source Maven Central does not serve).
    """
    from pyspark.sql import SparkSession

    master = resolve_master(master)
    builder = SparkSession.builder.appName(app_name).master(master)
    if kafka_source:
        builder = builder.config("spark.jars", ",".join(str(p) for p in jars.spark_jars()))
    builder = (
        builder.config("spark.ui.enabled", "false")
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.driver.memory", "2g")
    )
    here = runs_on_this_host(master)
    if here:
        builder = builder.config("spark.driver.bindAddress", "127.0.0.1").config(
            "spark.driver.host", "127.0.0.1"
        )
        if not os.environ.get("PYSPARK_PYTHON"):
            # The Python workers the JVM starts itself (the Python data sources' lookup) read
            # this setting; `python3` from PATH may lack pyspark or txbridge.
            builder = builder.config("spark.pyspark.python", sys.executable)
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    if here and not os.environ.get("PYSPARK_PYTHON"):
        # pyspark starts Python workers with `python3` from PATH otherwise (pyspark reads only
        # $PYSPARK_PYTHON, not spark.pyspark.python), which may be another minor version.
        session.sparkContext.pythonExec = sys.executable
    session.sparkContext.setLogLevel("WARN")
    logger.info("SparkSession %s on %s", app_name, session.sparkContext.master)
    return session
