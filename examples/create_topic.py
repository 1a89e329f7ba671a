"""Create a topic unless it exists: `python examples/create_topic.py TopicTest --partitions 4`.

txbridge never creates your topics, and its producer refuses a transaction to a
topic that does not exist (`UnknownTopicError`, before anything is written): the
coordinator could never publish it. Your deployment creates them (kafka-topics.sh
--create, Terraform, RocketMQ's `mqadmin updateTopic`); the examples that produce
call `create_topic_if_missing` so they run on a fresh broker.
"""

import argparse
import os
import time

from txbridge.kafka import AdminClient, KafkaError, KafkaException, NewTopic


def create_topic_if_missing(bootstrap, topic, partitions):
    """Create `topic` with `partitions` unless it exists; True when it was created."""
    admin = AdminClient({"bootstrap.servers": bootstrap})
    if topic in admin.list_topics(timeout=10).topics:  # all topics: asking for one may auto-create it
        return False
    try:
        admin.create_topics([NewTopic(topic, partitions, replication_factor=-1)])[topic].result(30)
    except KafkaException as exc:
        if exc.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
            raise
        return False
    deadline = time.monotonic() + 30  # until the broker's metadata shows it with a leader
    while time.monotonic() < deadline:
        found = admin.list_topics(timeout=10).topics.get(topic)
        if found is not None and found.error is None:
            break
        time.sleep(0.1)
    return True


if __name__ == "__main__":
    args = argparse.ArgumentParser()
    args.add_argument("topic")
    args.add_argument("--partitions", type=int, default=4)
    args.add_argument("--bootstrap", default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "localhost:9092"))
    opts = args.parse_args()
    created = create_topic_if_missing(opts.bootstrap, opts.topic, opts.partitions)
    print(f"{'created' if created else 'exists':8} {opts.topic}")
