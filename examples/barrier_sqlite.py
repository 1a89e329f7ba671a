"""An order in SQLite and its message in one txbridge transaction, with the barrier.

Run `txbridge init` first (and a coordinator to see the message republished on `orders`).
The topic is created if it does not exist (see create_topic.py).
"""

import argparse
import json
import os
import sqlite3

from create_topic import create_topic_if_missing

from txbridge import Message, SqliteBarrier, StringSerializer, TransactionProducer, TxState

args = argparse.ArgumentParser()
args.add_argument("--bootstrap", default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "localhost:9092"))
args.add_argument("--db", default="orders.db")
args.add_argument("--topic", default="orders")
args.add_argument("--namespace", default="__txbridge")
opts = args.parse_args()
if create_topic_if_missing(opts.bootstrap, opts.topic, 1):
    print(f"created topic {opts.topic}", flush=True)
with sqlite3.connect(opts.db) as db:
    db.execute("CREATE TABLE IF NOT EXISTS orders (id TEXT PRIMARY KEY, amount INTEGER)")
barrier = SqliteBarrier(opts.db)


def place_order(txn, order):  # runs once the half message is durable in Kafka
    with barrier.local_transaction(txn.tx_id) as conn:  # barrier row + the order: one DB transaction
        conn.execute("INSERT INTO orders VALUES (:id, :amount)", order)
    return TxState.COMMIT


secret = os.environ.get("TXBRIDGE_SECRET", "change-me")  # the coordinator's secret for this group
options = {"namespace": opts.namespace, "value_serializer": StringSerializer(), "check": barrier.check}
with TransactionProducer(opts.bootstrap, "orders-service", secret=secret, **options) as producer:
    order = {"id": f"o-{os.getpid()}", "amount": 42}
    message = Message(opts.topic, json.dumps(order), key=order["id"].encode())
    result = producer.send_in_transaction(message, place_order, order)
    print(f"tx {result.tx_id}: {result.state} (partition {result.partition}, error {result.error})")
