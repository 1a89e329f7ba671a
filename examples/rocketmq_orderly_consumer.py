"""An orderly consumer subscribed with `*`, printing topic, tag and body.

After RocketMQ's orderly consumer example, without its scripted suspends (every fifth call
answers SUSPEND_CURRENT_QUEUE_A_MOMENT there; docs/consumers.md compares txbridge's suspend
with RocketMQ's). After rocketmq_transaction_producer.py (which creates TopicTest) it prints
exactly TAGA and TAGC, then stops after --idle-exit seconds without a message.
"""

import argparse
import os
import threading
import time

from txbridge.consumer import ConsumeOrderlyStatus, OrderlyConsumer

args = argparse.ArgumentParser()
args.add_argument("--bootstrap", default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "localhost:9092"))
args.add_argument("--topic", default="TopicTest")
args.add_argument("--group", default="demo-orderly")
args.add_argument("--subscription", default="*")
args.add_argument(
    "--idle-exit", type=float, default=5.0, help="stop after this many seconds without a message"
)
opts = args.parse_args()

last = [time.monotonic()]  # when the last message came


def listener(message, context):
    body = (message.value or b"").decode()
    print(f"topic={message.topic} tag={message.tag} body={body}", flush=True)
    last[0] = time.monotonic()
    return ConsumeOrderlyStatus.SUCCESS


stop = threading.Event()
with OrderlyConsumer(opts.bootstrap, opts.group, [opts.topic], listener, subscription=opts.subscription):
    while time.monotonic() - last[0] < opts.idle_exit:
        stop.wait(0.2)
