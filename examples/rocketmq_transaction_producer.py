"""RocketMQ's transaction demo on txbridge.

RocketMQ's own example (``example/.../transaction/TransactionProducer.java``) sends ten
messages, TagA to TagE, all UNKNOWN at first, and its back-check answers UNKNOWN, COMMIT
or ROLLBACK by turns; this one shows the same three outcomes in one short run. Three
messages, each in its own transaction: the local transaction of TAGA commits, TAGB
rolls back, TAGC answers UNKNOWN, and the back-check of TAGC answers COMMIT. A
read_committed consumer ends up with exactly TAGA and TAGC (see
rocketmq_orderly_consumer.py), as a consumer of RocketMQ 5.3.3 does after the same
three transactions (tests/rocketmq/test_examples_vs_rocketmq.py runs both).

Run `txbridge init` and a coordinator whose secret for group `demo-tx` matches
TXBRIDGE_SECRET (e.g. `txbridge coordinator --secret demo-tx=change-me`) first.

The topic (TopicTest) is created with 4 partitions if it does not exist, as
RocketMQ's broker creates it for its demo: txbridge refuses a transaction to a
missing topic, since the coordinator could never publish it (see create_topic.py).
"""

import argparse
import os
import threading
import time

from create_topic import create_topic_if_missing

from txbridge import Message, TransactionProducer, TxState
from txbridge.wire import H_TAGS

args = argparse.ArgumentParser()
args.add_argument("--bootstrap", default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "localhost:9092"))
args.add_argument("--topic", default="TopicTest")
args.add_argument("--topic-partitions", type=int, default=4, help="partitions of --topic if it is created")
args.add_argument("--namespace", default="__txbridge")
args.add_argument("--partitions", type=int, default=None, help="default: the half topic's count")
args.add_argument("--check-after", type=float, default=2.0, help="seconds before TAGC is back-checked")
args.add_argument("--wait", type=float, default=60.0, help="seconds to wait for the back-check")
opts = args.parse_args()

OUTCOME = {"TAGA": TxState.COMMIT, "TAGB": TxState.ROLLBACK, "TAGC": TxState.UNKNOWN}
checked = threading.Event()


class Listener:  # RocketMQ's TransactionListener
    def execute_local_transaction(self, txn, tag):
        return OUTCOME[tag]

    def check_local_transaction(self, txn):
        print(f"back-check of {txn.tx_id} (attempt {txn.attempt}): COMMIT", flush=True)
        checked.set()
        return TxState.COMMIT


if create_topic_if_missing(opts.bootstrap, opts.topic, opts.topic_partitions):
    print(f"created topic {opts.topic} ({opts.topic_partitions} partitions)", flush=True)
secret = os.environ.get("TXBRIDGE_SECRET", "change-me")  # the coordinator's secret for this group
options = {"namespace": opts.namespace, "partitions": opts.partitions, "listener": Listener()}
with TransactionProducer(opts.bootstrap, "demo-tx", secret=secret, **options) as producer:
    for i, tag in enumerate(OUTCOME):
        body = f"Hello txbridge {i}".encode()
        message = Message(
            opts.topic, body, key=b"demo", headers=[(H_TAGS, tag.encode())], check_after=opts.check_after
        )
        result = producer.send_in_transaction(message, arg=tag)
        print(f"{tag}: tx {result.tx_id} local transaction {result.state}", flush=True)
    # Stay up to answer the back-check of TAGC (RocketMQ's demo sleeps for the same reason).
    if not checked.wait(opts.wait):
        raise SystemExit(f"no back-check within {opts.wait}s: is a coordinator running for {opts.namespace}?")
    time.sleep(1.0)  # let the check's HTTP answer reach the coordinator
