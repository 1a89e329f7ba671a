"""The wire format's rules, without a broker."""

from __future__ import annotations

import json
import os
import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

from txbridge import wire
from txbridge.errors import SignatureError, WireFormatError
from txbridge.wire import HalfMessage, OpRecord, OpSource, TxState


@pytest.mark.parametrize(
    ("data", "expected"),
    [  # Kafka's own test vectors (UtilsTest.testMurmur2)
        (b"21", -973932308),
        (b"foobar", -790332482),
        (b"a-little-bit-long-string", -985981536),
        (b"a-little-bit-longer-string", -1486304829),
        (b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
        (b"abc", 479470107),
    ],
)
def test_murmur2_matches_kafka(data: bytes, expected: int) -> None:
    assert wire.murmur2(data) == expected


@pytest.mark.parametrize(
    ("namespace", "group"),
    [
        ("__txbridge", "txbridge-coordinator"),  # as before namespaces had groups of their own
        ("orders", "txbridge-coordinator.orders"),
        ("txbt-1_a.b", "txbridge-coordinator.txbt-1_a.b"),
    ],
)
def test_each_namespace_has_a_default_coordinator_group_of_its_own(namespace: str, group: str) -> None:
    assert wire.default_coordinator_group(namespace) == group
    # Not under the default group's transactional-id prefix, which txbridge acls grants.
    assert namespace == wire.DEFAULT_NAMESPACE or not group.startswith("txbridge-coordinator-")


def test_half_partition_is_stable_and_in_range() -> None:
    parts = {wire.half_partition(f"customer-{i}".encode(), 12) for i in range(200)}
    assert parts <= set(range(12))
    assert len(parts) > 6
    assert wire.half_partition(b"customer-7", 12) == wire.half_partition(b"customer-7", 12)


def test_tx_ids_are_uuid7_and_sort_by_time() -> None:
    ids = [wire.new_tx_id() for _ in range(50)]
    assert all(uuid.UUID(i).version == 7 for i in ids)
    assert [i[:13] for i in ids] == sorted(i[:13] for i in ids)


def test_tx_ids_are_uuid_strings_with_the_variant_and_unique_across_blocks() -> None:
    # More ids than one block of entropy holds: the refill must not repeat bytes.
    ids = [wire.new_tx_id() for _ in range(3 * wire._Entropy.BLOCK // 10)]
    assert len(set(ids)) == len(ids)
    for i in ids[:: len(ids) // 20]:
        parsed = uuid.UUID(i)
        assert str(parsed) == i
        assert parsed.variant == uuid.RFC_4122


def test_tx_ids_are_unique_across_threads() -> None:
    def some(_: int) -> list[str]:
        return [wire.new_tx_id() for _ in range(2_000)]

    with ThreadPoolExecutor(4) as pool:
        ids = [i for batch in pool.map(some, range(4)) for i in batch]
    assert len(set(ids)) == len(ids)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_forked_child_does_not_repeat_its_parents_tx_ids() -> None:
    wire.new_tx_id()  # the parent holds a partly used block
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next ids, to the parent
        os.close(read)
        os.write(write, ",".join(wire.new_tx_id() for _ in range(20)).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        child = set(pipe.read().split(","))
    os.waitpid(pid, 0)
    parent = {wire.new_tx_id() for _ in range(20)}
    # Ids of one millisecond differ only in their random bits: a shared block would repeat them.
    assert len(child) == 20
    assert not child & parent
    assert {i[24:] for i in child}.isdisjoint(i[24:] for i in parent)


@pytest.mark.parametrize(
    ("body", "error"),
    [
        ({"v": 1, "ops": []}, "non-empty list"),
        ({"v": 1, "ops": "x"}, "non-empty list"),
        ({"v": 1, "ops": [["t1", "COMMIT"]]}, "is not \\[tx, state"),
        ({"v": 1, "ops": [["t1", "COMMIT", 1], ["", "COMMIT", 1]]}, "no tx id"),
        ({"v": 1, "ops": [["t1", "RUNNING", None]]}, "only COMMIT or ROLLBACK"),
        ({"v": 1, "ops": [["t1", "COMMIT", 0]]}, "positive integer"),
        ({"v": 2, "ops": [["t1", "COMMIT", 1]]}, "wire version"),
        ({"v": 1, "source": "nobody", "ops": [["t1", "COMMIT", 1]]}, "unknown source"),
    ],
)
def test_a_malformed_batch_of_decisions_is_refused_whole(body: dict[str, object], error: str) -> None:
    with pytest.raises(WireFormatError, match=error):
        wire.decode_ops(json.dumps(body).encode())


def test_one_decision_reads_the_same_through_either_reader() -> None:
    key, value = OpRecord("t1", TxState.COMMIT, OpSource.CHECK, group="g").encode()
    assert wire.decode_ops(value) == [wire.decode_op(value)]
    assert wire.op_tx_ids(key, value) == ["t1"]
    assert wire.op_tx_ids(None, b"not json") == []


def test_half_round_trip_keeps_user_headers_and_strips_protocol_on_republish() -> None:
    msg = HalfMessage(
        tx_id="t1",
        seq=2,
        topic="orders",
        value=b"v",
        key=b"\x00k",
        partition=3,
        group="g",
        instance="i",
        timestamp_ms=5,
        check_after_s=1.5,
        user_headers=(("trace", b"abc"),),
    )
    back = wire.decode_half(msg.value, msg.to_headers())
    assert back == msg
    assert msg.republish_headers() == [("trace", b"abc"), ("txb.tx", b"t1")]


def test_half_null_value_is_a_tombstone() -> None:
    msg = HalfMessage(tx_id="t1", seq=0, topic="orders", value=None, group="g", instance="i")
    assert wire.decode_half(b"", msg.to_headers()).value is None


@pytest.mark.parametrize(
    ("drop", "match"),
    [("txb.tx", "required headers"), ("txb.topic", "required headers"), ("txb.v", "required headers")],
)
def test_half_without_required_header_is_rejected(drop: str, match: str) -> None:
    headers = [
        h for h in HalfMessage("t", 0, "x", b"v", group="g", instance="i").to_headers() if h[0] != drop
    ]
    with pytest.raises(WireFormatError, match=match):
        wire.decode_half(b"v", headers)


def test_half_with_bad_seq_or_version_is_rejected() -> None:
    headers = dict(HalfMessage("t", 0, "x", b"v", group="g", instance="i").to_headers())
    with pytest.raises(WireFormatError, match="not an integer"):
        wire.decode_half(b"v", list({**headers, "txb.seq": b"one"}.items()))
    with pytest.raises(WireFormatError, match="version"):
        wire.decode_half(b"v", list({**headers, "txb.v": b"9"}.items()))


def test_op_round_trip() -> None:
    op = OpRecord("t1", TxState.COMMIT, OpSource.PRODUCER, count=3, group="g", instance="i", timestamp_ms=7)
    key, value = op.encode()
    assert key == b"t1"
    assert wire.decode_op(value) == op


@pytest.mark.parametrize(
    "value",
    [
        b"not json",
        b"[]",
        b'{"v":1,"tx":"t","state":"MAYBE"}',
        b'{"v":1,"tx":"t","state":"UNKNOWN"}',
        b'{"v":2,"tx":"t","state":"COMMIT"}',
        b'{"v":1,"state":"COMMIT"}',
        b'{"v":1,"tx":"t","state":"COMMIT","count":0}',
        b'{"v":1,"tx":"t","state":"COMMIT","source":"martians"}',
        None,
    ],
)
def test_invalid_op_records_are_rejected(value: bytes | None) -> None:
    with pytest.raises(WireFormatError):
        wire.decode_op(value)


def test_check_request_round_trip() -> None:
    req = wire.CheckRequest(
        "t1",
        "g",
        "i",
        2,
        (wire.CheckMessage("orders", b"\xffk", (("h", b"\x00"),)), wire.CheckMessage("o", None)),
    )
    assert wire.decode_check_request(req.encode()) == req


_ERROR_STATUSES = (400, 401, 403, 404, 408, 429, 500, 502, 503)


@pytest.mark.parametrize(
    ("status", "body", "expected"),
    [
        (200, b'{"state":"COMMIT"}', TxState.COMMIT),
        (200, b'{"state":"ROLLBACK"}', TxState.ROLLBACK),
        (200, b'{"state":"UNKNOWN"}', TxState.UNKNOWN),
        (200, b'{"state":"RUNNING"}', TxState.RUNNING),
        (200, b'{"state":"WAITING"}', TxState.UNKNOWN),  # a state this side does not know
        (200, b"OK", TxState.UNKNOWN),  # DTM #535
        (200, b'{"state":"commit"}', TxState.UNKNOWN),
        (200, b'{"status":"COMMIT"}', TxState.UNKNOWN),
        (200, b"", TxState.UNKNOWN),
        (500, b'{"state":"COMMIT"}', TxState.UNKNOWN),
        (401, b'{"state":"COMMIT"}', TxState.UNKNOWN),
        (409, b'{"error":"this request was already answered"}', TxState.UNKNOWN),  # a refused replay
        (409, b'{"state":"COMMIT"}', TxState.UNKNOWN),
        # Whatever the error status, a verdict in its body does not count (the coordinator's
        # tests on a broker ask through a few of these: tests/coordinator/test_check_endings.py).
        *((status, b'{"state":"COMMIT"}', TxState.UNKNOWN) for status in _ERROR_STATUSES),
    ],
)
def test_only_explicit_verdicts_count(status: int, body: bytes, expected: TxState) -> None:
    assert wire.decode_check_answer(status, body) is expected


def test_signature_accepts_fresh_and_refuses_bad_or_stale() -> None:
    secret, body = b"s3cret", b'{"v":1}'
    header = wire.sign(secret, body, now=1000)
    wire.verify(secret, header, body, now=1010)
    with pytest.raises(SignatureError, match="unsigned"):
        wire.verify(secret, None, body, now=1000)
    with pytest.raises(SignatureError, match="does not match"):
        wire.verify(b"other", header, body, now=1000)
    with pytest.raises(SignatureError, match="does not match"):
        wire.verify(secret, header, body + b" ", now=1000)
    with pytest.raises(SignatureError, match="stale"):
        wire.verify(secret, header, body, now=1000 + 301)
    with pytest.raises(SignatureError, match="timestamp"):
        wire.verify(secret, "v1=abc", body, now=1000)


def test_verify_returns_when_the_request_was_signed() -> None:
    body = b'{"v":1}'
    assert wire.verify(b"s", wire.sign(b"s", body, now=1000), body, now=1200) == 1000


def test_every_encoding_carries_a_fresh_signed_request_id() -> None:
    request = wire.CheckRequest("t1", "g", "i", 2, (wire.CheckMessage("o", b"k"),))
    batch = _batch("t1", "t2")
    for checks in (request, batch):
        first, second = checks.encode(), checks.encode()
        id_1, decoded = wire.decode_check_post(first)
        id_2, _ = wire.decode_check_post(second)
        assert decoded == checks  # the id is not part of the checks
        assert isinstance(id_1, str)
        assert isinstance(id_2, str)
        assert len(id_1) == 32
        assert id_1 != id_2
        # The id is inside the signed bytes: a replay with another id fails the signature.
        header = wire.sign(b"s", first, now=1000)
        with pytest.raises(SignatureError, match="does not match"):
            wire.verify(b"s", header, first.replace(id_1.encode(), id_2.encode()), now=1000)
    # Items of a batch carry no id of their own: only the POST is a request.
    assert all("id" not in item for item in json.loads(batch.encode())["checks"])


def test_a_body_without_id_still_parses() -> None:
    """Coordinators before request ids send none."""
    single = wire.CheckRequest("t1", "g", "i", 3)
    old_single = json.dumps({k: v for k, v in json.loads(single.encode()).items() if k != "id"}).encode()
    assert wire.decode_check_post(old_single) == (None, single)
    old_batch = json.dumps({k: v for k, v in json.loads(_batch("t1").encode()).items() if k != "id"}).encode()
    assert wire.decode_check_post(old_batch) == (None, _batch("t1"))


def test_producers_that_know_no_ids_ignore_them() -> None:
    """A producer that reads single checks only (or any JSON reader) skips the extra field."""
    request = wire.CheckRequest("t1", "g", "i", 3)
    assert wire.decode_check_request(request.encode()) == request


@pytest.mark.parametrize("request_id", [123, "", "x" * (wire.MAX_REQUEST_ID_LENGTH + 1), ["a"]])
def test_a_bad_request_id_is_refused(request_id: object) -> None:
    body = json.loads(wire.CheckRequest("t1", "g", "i", 3).encode())
    body["id"] = request_id
    with pytest.raises(WireFormatError, match="request id"):
        wire.decode_check_post(json.dumps(body).encode())


def test_producer_registry_round_trip() -> None:
    inst = wire.ProducerInstance("g", "i", "http://127.0.0.1:1/check", 9)
    assert wire.decode_producer(inst.encode()) == inst
    assert inst.key() == b"g/i"
    with pytest.raises(WireFormatError):
        wire.decode_producer(json.dumps({"group": "g"}).encode())


def _batch(*tx_ids: str, group: str = "g") -> wire.CheckBatch:
    return wire.CheckBatch(
        group, tuple(wire.CheckRequest(t, group, "i", 1, (wire.CheckMessage("o", b"k"),)) for t in tx_ids)
    )


def test_check_batch_round_trip_and_single_bodies_still_parse() -> None:
    batch = _batch("t1", "t2")
    assert wire.decode_check_body(batch.encode()) == batch
    single = wire.CheckRequest("t1", "g", "i", 3)
    assert wire.decode_check_body(single.encode()) == single
    with pytest.raises(WireFormatError):  # a producer that knows single checks only refuses a batch
        wire.decode_check_request(batch.encode())


@pytest.mark.parametrize(
    ("body", "why"),
    [
        (b'{"v":1,"group":"g","checks":[]}', "empty"),
        (
            _batch("t1", group="g").encode().replace(b'"group":"g","checks"', b'"group":"h","checks"'),
            "one group",
        ),
        (_batch(*(f"t{i}" for i in range(wire.MAX_CHECK_BATCH + 1))).encode(), "at most"),
        (b'{"v":1,"group":"g","checks":[{"tx":"t"}]}', "not valid"),
        (b'{"v":2,"group":"g","checks":[]}', "version"),
    ],
    ids=["empty", "one group", "at most", "not valid", "version"],  # the bodies hold random batch ids
)
def test_bad_check_batches_are_refused_with_a_reason(body: bytes, why: str) -> None:
    with pytest.raises(WireFormatError, match=why):
        wire.decode_check_body(body)


@pytest.mark.parametrize(
    ("status", "body", "expected"),
    [
        (200, b'{"states":{"a":"COMMIT","b":"ROLLBACK"}}', {"a": "COMMIT", "b": "ROLLBACK"}),
        (200, b'{"states":{"a":"COMMIT"}}', {"a": "COMMIT", "b": "UNKNOWN"}),  # b missing
        (200, b'{"states":{"a":"RUNNING","b":"WAITING"}}', {"a": "RUNNING", "b": "UNKNOWN"}),
        (200, b'{"states":{"a":"commit","b":"UNKNOWN"}}', {"a": "UNKNOWN", "b": "UNKNOWN"}),
        (200, b'{"states":{"a":"COMMIT","zz":"COMMIT"}}', {"a": "COMMIT", "b": "UNKNOWN"}),  # not asked
        (200, b'{"states":{"a":"COMMIT"},"ok":1}', {"a": "UNKNOWN", "b": "UNKNOWN"}),
        (200, b'{"state":"COMMIT"}', {"a": "UNKNOWN", "b": "UNKNOWN"}),
        (200, b'{"states":["COMMIT"]}', {"a": "UNKNOWN", "b": "UNKNOWN"}),
        (500, b'{"states":{"a":"COMMIT","b":"COMMIT"}}', {"a": "UNKNOWN", "b": "UNKNOWN"}),
        (409, b'{"states":{"a":"COMMIT","b":"COMMIT"}}', {"a": "UNKNOWN", "b": "UNKNOWN"}),  # a replay
        (200, b"OK", {"a": "UNKNOWN", "b": "UNKNOWN"}),
        *(
            (status, b'{"states":{"a":"COMMIT","b":"COMMIT"}}', {"a": "UNKNOWN", "b": "UNKNOWN"})
            for status in _ERROR_STATUSES
        ),
    ],
)
def test_batch_answers_count_only_explicit_verdicts(
    status: int, body: bytes, expected: dict[str, str]
) -> None:
    states = wire.decode_check_batch_answer(status, body, ["a", "b"])
    assert {tx: s.value for tx, s in states.items()} == expected


def test_batch_answer_round_trip() -> None:
    states = {"a": TxState.COMMIT, "b": TxState.UNKNOWN}
    assert wire.decode_check_batch_answer(200, wire.encode_check_batch_answer(states), states) == states
