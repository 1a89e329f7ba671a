"""Rows of a Spark DataFrame published exactly once with the txbridge Spark sink (docs/spark-sink.md).

Run `txbridge init` and a coordinator whose secret for group `spark-orders` is `TXBRIDGE_SECRET`
(default `change-me`) first. Needs the `[spark]` extra. The topic is created if it does not exist.
"""

import argparse
import os
import sys

from create_topic import create_topic_if_missing
from pyspark.sql import SparkSession

from txbridge.spark import SinkChecks, register

args = argparse.ArgumentParser()
args.add_argument("--bootstrap", default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "localhost:9092"))
args.add_argument("--topic", default="spark-orders")
args.add_argument("--namespace", default="__txbridge")
args.add_argument("--rows", type=int, default=20)
opts = args.parse_args()
if create_topic_if_missing(opts.bootstrap, opts.topic, 2):
    print(f"created topic {opts.topic}", flush=True)
os.environ.setdefault("TXBRIDGE_SECRET", "change-me")  # the coordinator's secret for this group
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)  # Spark's Python workers import txbridge too

spark = (
    SparkSession.builder.master("local[2]")
    .appName("txbridge-sink")
    .config("spark.ui.enabled", "false")
    .getOrCreate()
)
register(spark)  # the data source "txbridge"
orders = spark.createDataFrame(
    [(f"customer-{i % 3}", f'{{"order": {i}, "amount": {10 * i}}}') for i in range(opts.rows)],
    "key string, value string",
).repartition(2, "key")  # one customer's orders in one task: their order is kept

secret = os.environ["TXBRIDGE_SECRET"]
with SinkChecks(opts.bootstrap, "spark-orders", secret=secret, namespace=opts.namespace) as checks:
    # The driver answers the coordinator's back-checks while the write runs (checks.url).
    orders.write.format("txbridge").mode("append").options(**checks.options()).option(
        "secretEnv", "TXBRIDGE_SECRET"
    ).option("topic", opts.topic).save()
print(f"published {opts.rows} orders to {opts.topic} once", flush=True)
spark.stop()
