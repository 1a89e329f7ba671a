"""The ACLs of ``txbridge acls``, proven on the secured cluster.

Each role's principal gets exactly the ACLs :func:`txbridge.acls.role_acls` computes,
nothing else: the whole transaction path works (a commit, a rollback, a back-check,
an expired transaction resumed when its group comes back), a read_committed consumer
sees each committed message once, and every role is refused what it must not do,
with the error a user sees.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from click.testing import CliRunner
from confluent_kafka import KafkaError, KafkaException

from cli.main import main
from coordinator.config import CoordinatorConfig, Secrets
from tests.kafka_helpers import delete_namespaces, delete_topics
from tests.secure.conftest import SecureKafka, running_coordinator, wait_granted, wait_readable
from txbridge import Message, TransactionProducer, TxState
from txbridge import kafka as txkafka
from txbridge.acls import Acl, apply_acls, role_acls
from txbridge.topics import internal_topics
from txbridge.wire import Topics

pytestmark = [pytest.mark.integration, pytest.mark.cluster]

SECRET = "acl-test-secret"  # noqa: S105 - a test-only HMAC secret
PARTITIONS = 3


@dataclass(frozen=True)
class Roles:
    """A namespace whose producer, coordinator and consumer principals have their role's ACLs only."""

    kafka: SecureKafka
    namespace: str
    #: the producer principal may only DESCRIBE it (--producers-may-not-write-real-topics).
    topic: str
    #: the producer principal may also write it directly (the default).
    open_topic: str
    coordinator_group: str
    consumer_group: str
    acls: tuple[Acl, ...]

    def config(self, user: str) -> dict[str, str]:
        return self.kafka.cluster.client_config(user)


@pytest.fixture(scope="module")
def roles(secure_kafka: SecureKafka) -> Iterator[Roles]:
    kafka = secure_kafka
    namespace = f"txba{uuid.uuid4().hex[:10]}"
    topic, open_topic = f"orders-{uuid.uuid4().hex[:8]}", f"audit-{uuid.uuid4().hex[:8]}"
    # Topics are the admin's to create: no role may.
    txkafka.ensure_topics(kafka.bootstrap, internal_topics(namespace, PARTITIONS, 3), extra=kafka.config)
    txkafka.ensure_topics(
        kafka.bootstrap,
        [txkafka.TopicSpec(t, PARTITIONS, replication_factor=3) for t in (topic, open_topic)],
        extra=kafka.config,
    )
    coordinator_group, consumer_group = f"coord-{namespace}", f"billing-{namespace}"
    acls = [
        *role_acls(
            "producer", "User:producer", namespace=namespace, topics=[topic],
            producers_may_write_real_topics=False,
        ),
        *role_acls("producer", "User:producer", namespace=namespace, topics=[open_topic]),
        *role_acls(
            "coordinator", "User:coordinator", namespace=namespace, topics=[topic, open_topic],
            groups=[coordinator_group],
        ),
        *role_acls(
            "consumer", "User:consumer", namespace=namespace, topics=[topic, open_topic],
            groups=[consumer_group],
        ),
    ]  # fmt: skip
    apply_acls(kafka.bootstrap, acls, kafka.config)
    wait_granted(kafka, acls)
    roles = Roles(kafka, namespace, topic, open_topic, coordinator_group, consumer_group, tuple(acls))
    t = Topics(namespace)
    wait_readable(kafka, roles.config("coordinator"), [t.half, t.op, t.state, t.producers, t.expired])
    yield roles
    delete_namespaces(kafka.bootstrap, [namespace], extra=kafka.config)
    delete_topics(kafka.bootstrap, [topic, open_topic], extra=kafka.config)


def _eventually(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, f"not within {timeout:.0f}s: {what}"
        time.sleep(0.2)


def _consume(roles: Roles, user: str, group: str, topics: list[str], seconds: float) -> list[Any]:
    """Every record and error event a read_committed consumer of ``user`` in ``group`` gets in ``seconds``."""
    consumer = txkafka.consumer(roles.kafka.bootstrap, group, {**roles.config(user), "log_level": 0})
    consumer.subscribe(topics)
    seen: list[Any] = []
    try:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            seen.extend(consumer.consume(100, 0.5))
    finally:
        consumer.close()
    return seen


def _errors(seen: list[Any]) -> set[tuple[str | None, int]]:
    return {(m.topic(), m.error().code()) for m in seen if m.error() is not None}


def _produce(roles: Roles, user: str, topic: str, **producer: Any) -> KafkaError | None:
    """What the delivery report says of one record ``user`` writes directly to ``topic``."""
    outcomes: list[KafkaError | None] = []
    client = txkafka.producer(roles.kafka.bootstrap, {**roles.config(user), "log_level": 0}, **producer)
    client.produce(topic, b"direct", key=b"k", on_delivery=lambda err, _msg: outcomes.append(err))
    client.flush(30)
    assert len(outcomes) == 1
    return outcomes[0]


# ------------------------------------------------------------------ the whole path, exactly these ACLs


def test_the_transaction_path_works_with_exactly_the_roles_acls(
    roles: Roles, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING)
    caplog.set_level(logging.INFO, logger="coordinator.checks.resume")  # what the resumer did, if it fails
    config = CoordinatorConfig(
        bootstrap=roles.kafka.bootstrap,
        namespace=roles.namespace,
        group_id=roles.coordinator_group,
        instance_id="acl-1",
        secrets=Secrets(default=SECRET),
        check_delay_s=1.0,
        check_backoff_s=0.5,
        max_checks=2,
        extra_config=roles.config("coordinator"),
    )
    answers: dict[str, TxState] = {}  # the producers' database: UNKNOWN until it says otherwise

    def producer(instance: str) -> TransactionProducer:
        return TransactionProducer(
            roles.kafka.bootstrap,
            "orders-svc",
            secret=SECRET,
            check=lambda txn: answers.get(txn.tx_id, TxState.UNKNOWN),
            namespace=roles.namespace,
            partitions=PARTITIONS,
            instance_id=instance,
            heartbeat_interval_s=0.5,
            extra_config=roles.config("producer"),
        )

    with running_coordinator(config) as service, producer("p-1") as first:
        committed = first.send_in_transaction(
            Message(roles.topic, b"paid", key=b"o-1"), lambda _t, _a: TxState.COMMIT
        )
        rolled_back = first.send_in_transaction(
            Message(roles.topic, b"never", key=b"o-2"), lambda _t, _a: TxState.ROLLBACK
        )
        checked = first.send_in_transaction(
            Message(roles.topic, b"checked", key=b"o-3"), lambda _t, _a: TxState.UNKNOWN
        )
        answers[checked.tx_id] = TxState.COMMIT  # the back-check finds it committed
        expired = first.send_in_transaction(
            Message(roles.open_topic, b"resumed", key=b"o-4"), lambda _t, _a: TxState.UNKNOWN
        )
        _eventually(lambda: service.stats["resolved_expired"] >= 1, 60, f"an expiry; {dict(service.stats)}")

        # The group comes back (a new instance) and now knows the answer: published once,
        # through admin resolve's fencing transactional.id.
        answers[expired.tx_id] = TxState.COMMIT
        with producer("p-2"):
            _eventually(lambda: service.stats["expired_resumed"] >= 1, 60, f"a resume; {dict(service.stats)}")

    seen = _consume(roles, "consumer", roles.consumer_group, [roles.topic, roles.open_topic], 15)

    assert (committed.state, rolled_back.state, checked.state) == (
        TxState.COMMIT,
        TxState.ROLLBACK,
        TxState.UNKNOWN,
    )
    assert _errors(seen) == set()
    delivered = Counter((m.topic(), m.key(), m.value()) for m in seen)
    assert delivered == Counter(
        {
            (roles.topic, b"o-1", b"paid"): 1,
            (roles.topic, b"o-3", b"checked"): 1,
            (roles.open_topic, b"o-4", b"resumed"): 1,
        }
    )
    denied = [r.getMessage() for r in caplog.records if "AUTHORIZATION" in r.getMessage().upper()]
    assert denied == []


# ------------------------------------------------------------------ what each role is refused


def test_the_producer_principal_cannot_read_the_half_topic(roles: Roles) -> None:
    half = Topics(roles.namespace).half
    assert _produce(roles, "producer", half) is None  # it writes half records ...

    # ... but reading them: it has no consumer group at all,
    refused = _consume(roles, "producer", f"snoop-{uuid.uuid4().hex[:6]}", [half], 6)
    assert (None, KafkaError.GROUP_AUTHORIZATION_FAILED) in _errors(refused)
    assert [m for m in refused if m.error() is None] == []

    # and given a group of its own (not a role ACL: an operator's slip), the topic still refuses it.
    group = f"snoop-{uuid.uuid4().hex[:6]}"
    slip = [Acl("User:producer", "group", group, False, "Read", "a group of its own")]
    apply_acls(roles.kafka.bootstrap, slip, roles.kafka.config)
    wait_granted(roles.kafka, [*slip, *(a for a in roles.acls if a.principal == "User:producer")])
    refused = _consume(roles, "producer", group, [half], 8)
    assert _errors(refused) == {(half, KafkaError.TOPIC_AUTHORIZATION_FAILED)}
    assert [m for m in refused if m.error() is None] == []


def test_the_producer_principal_cannot_write_a_real_topic_when_only_the_coordinator_may(roles: Roles) -> None:
    refused = _produce(roles, "producer", roles.topic)
    allowed = _produce(roles, "producer", roles.open_topic)  # without --producers-may-not-write-real-topics

    assert refused is not None
    assert refused.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED
    assert allowed is None


def test_the_producer_principal_cannot_pose_as_a_coordinator(roles: Roles) -> None:
    impostor = txkafka.producer(
        roles.kafka.bootstrap,
        {**roles.config("producer"), "log_level": 0},
        transactional_id=f"{roles.namespace}-coord-impostor-0",
    )
    with pytest.raises(KafkaException) as refused:
        impostor.init_transactions(30)
    joined = _consume(roles, "producer", roles.coordinator_group, [Topics(roles.namespace).half], 6)

    assert refused.value.args[0].code() == KafkaError.TRANSACTIONAL_ID_AUTHORIZATION_FAILED
    assert (None, KafkaError.GROUP_AUTHORIZATION_FAILED) in _errors(joined)


def test_the_consumer_principal_reads_no_internal_topic(roles: Roles) -> None:
    internal = [spec.name for spec in internal_topics(roles.namespace, PARTITIONS)]

    refused = _consume(roles, "consumer", roles.consumer_group, internal, 10)

    assert _errors(refused) == {(topic, KafkaError.TOPIC_AUTHORIZATION_FAILED) for topic in internal}
    assert [m for m in refused if m.error() is None] == []


def test_the_consumer_principal_cannot_forge_an_op_record(roles: Roles) -> None:
    refused = _produce(roles, "consumer", Topics(roles.namespace).op)

    assert refused is not None
    assert refused.code() == KafkaError.TOPIC_AUTHORIZATION_FAILED


def test_txbridge_acls_apply_creates_them_with_the_admins_properties_file(roles: Roles) -> None:
    group = f"cli-{uuid.uuid4().hex[:6]}"
    args = ["acls", "--role", "consumer", "--principal", "User:consumer", "--namespace", roles.namespace,
            "--topic", roles.topic, "--group", group, "--plain-consumer"]  # fmt: skip
    before = _consume(roles, "consumer", group, [roles.topic], 5)

    result = CliRunner().invoke(
        main,
        [
            *args,
            "--apply",
            "--bootstrap",
            roles.kafka.bootstrap,
            "--command-config",
            str(roles.kafka.properties_file),
        ],
    )

    assert result.exit_code == 0, result.output
    assert result.output.splitlines()[-1] == f"created 2 ACLs for User:consumer at {roles.kafka.bootstrap}"
    assert f"--command-config {roles.kafka.properties_file} --add" in result.output
    assert roles.kafka.cluster.password() not in result.output
    assert (None, KafkaError.GROUP_AUTHORIZATION_FAILED) in _errors(before)
    granted = role_acls(
        "consumer", "User:consumer", namespace=roles.namespace, topics=[roles.topic], groups=[group],
        plain_consumer=True,
    )  # fmt: skip
    wait_granted(roles.kafka, granted)
    assert _errors(_consume(roles, "consumer", group, [roles.topic], 5)) == set()


def test_txbridge_acls_apply_as_a_role_principal_is_refused_with_what_to_do(roles: Roles) -> None:
    config = str(roles.kafka.cluster.client_properties_file("coordinator"))
    args = ["acls", "--role", "consumer", "--principal", "User:consumer", "--namespace", roles.namespace,
            "--topic", roles.topic, "--group", "g", "--apply", "--bootstrap", roles.kafka.bootstrap,
            "--command-config", config]  # fmt: skip

    result = CliRunner().invoke(main, args)

    assert result.exit_code == 2
    error = result.output.splitlines()[-1]
    assert error.startswith("error: creating the ACL User:consumer may ")
    assert "(CLUSTER_AUTHORIZATION_FAILED)" in error
    assert error.endswith("apply ACLs as a principal allowed to alter the cluster's ACLs (a super user): "
                          "pass its --command-config")  # fmt: skip
    assert roles.kafka.cluster.password("coordinator") not in result.output
