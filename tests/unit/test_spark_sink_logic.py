"""The Spark sink's pure parts, without Spark or a broker: options, the check resolver, chunking."""

from __future__ import annotations

import subprocess
import sys

import pytest

from txbridge.errors import ConfigurationError
from txbridge.spark.decisions import (
    H_BATCH,
    BatchDecision,
    DecisionBook,
    JournalEntry,
    TxRef,
    batch_label,
    chunks,
    decode_record,
    journal_tx_of,
    ordered_refs,
    parse_label,
)
from txbridge.spark.options import DEFAULT_MAX_ROWS, parse_options, sink_key
from txbridge.transaction import LocalTransaction, Message
from txbridge.wire import TxState

SECRET = "s3cr3t-value"  # noqa: S105 - a test value
BASE = {
    "kafka.bootstrap.servers": "localhost:9092",
    "group": "orders",
    "secret": SECRET,
    "checkUrl": "http://127.0.0.1:9999/txbridge/check",
    "checkpointLocation": "/chk/q1",
}


def _parse(options: dict[str, str], *, streaming: bool = True, environ: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
    return parse_options(options, streaming=streaming, environ=environ or {}, fresh_sink_id="fresh")


def test_options_are_read_without_case_and_defaults_apply() -> None:
    # path and queryname (a streaming query's .queryName()) are Spark's own: accepted, not used.
    spark_own = {"path": "ignored", "queryname": "orders-query"}
    opts = _parse({k.lower(): v for k, v in BASE.items()} | {"kafka.client.id": "x"} | spark_own)

    assert (opts.bootstrap, opts.group, opts.secret, opts.sink_id) == (
        "localhost:9092",
        "orders",
        SECRET.encode(),
        "/chk/q1",
    )
    assert opts.namespace == "__txbridge"
    assert opts.max_rows == DEFAULT_MAX_ROWS
    assert opts.sink_key == sink_key("/chk/q1")
    assert SECRET not in repr(opts)


def test_the_secret_comes_from_the_environment_variable_secretenv_names() -> None:
    options = {k: v for k, v in BASE.items() if k != "secret"} | {"secretEnv": "SINK_SECRET"}

    assert _parse(options, environ={"SINK_SECRET": "from-env"}).secret == b"from-env"
    with pytest.raises(ConfigurationError, match="SINK_SECRET"):
        _parse(options)


@pytest.mark.parametrize(
    ("change", "named"),
    [
        ({"group": None}, "option group"),
        ({"secret": None}, "option secret"),
        ({"checkUrl": None}, "option checkUrl"),
        ({"checkUrl": "ftp://x"}, "option checkUrl"),
        ({"kafka.bootstrap.servers": None}, "kafka.bootstrap.servers"),
        ({"checkpointLocation": None}, "checkpointLocation"),
        ({"maxRowsPerTransaction": "0"}, "option maxRowsPerTransaction"),
        ({"maxTransactionBytes": "lots"}, "option maxTransactionBytes"),
        ({"grup": "x"}, "did you mean 'group'"),
        ({"kafka.sasl.mechanizm": "PLAIN"}, "sasl.mechanizm"),
        ({"secretEnv": "X"}, "not both"),
    ],
)
def test_a_missing_or_bad_option_is_named_and_the_secret_never_shown(
    change: dict[str, str | None], named: str
) -> None:
    options = {k: v for k, v in (BASE | change).items() if v is not None}

    with pytest.raises(ConfigurationError) as failure:
        _parse(options)

    assert named in str(failure.value)
    assert SECRET not in str(failure.value)


def test_a_batch_write_without_sink_id_gets_a_fresh_one() -> None:
    options = {k: v for k, v in BASE.items() if k != "checkpointLocation"}

    assert _parse(options, streaming=False).sink_id == "fresh"
    assert _parse(options | {"sinkId": "mine"}, streaming=False).sink_id == "mine"


def _txn(tx_id: str, label: str | None) -> LocalTransaction:
    headers = [(H_BATCH, label.encode())] if label is not None else []
    return LocalTransaction(tx_id, "orders", (Message("t", None, key=b"k", headers=headers),))


def test_the_resolver_commits_the_recorded_rolls_back_the_rest_and_waits_for_running_batches() -> None:
    book = DecisionBook(commit_grace_s=0)
    book.add(BatchDecision("s1", 3, (TxRef("a", 0, 5), TxRef("b", 1, 2))))
    label = batch_label("s1", 3)

    assert book.check(_txn("a", label)) is TxState.UNKNOWN  # not loaded yet: nothing is known
    book.loaded.set()
    assert book.check(_txn("a", label)) is TxState.COMMIT
    assert book.check(_txn("b", label)) is TxState.COMMIT
    assert book.check(_txn("failed-attempt", label)) is TxState.ROLLBACK
    assert book.check(_txn("older-run", batch_label("s1", 2))) is TxState.ROLLBACK  # batch 3 was decided
    assert book.check(_txn("running", batch_label("s1", 4))) is TxState.UNKNOWN
    assert book.check(_txn("other-sink", batch_label("s2", 1))) is TxState.UNKNOWN
    assert book.check(_txn("no-header", None)) is TxState.UNKNOWN


def test_the_first_decision_record_of_a_batch_is_final() -> None:
    book = DecisionBook(commit_grace_s=0)
    book.loaded.set()
    book.add(BatchDecision("s1", 0, (TxRef("first", 0, 1),)))
    book.add(BatchDecision("s1", 0, (TxRef("second", 0, 1),)))

    assert book.answer(batch_label("s1", 0), "first") is TxState.COMMIT
    assert book.answer(batch_label("s1", 0), "second") is TxState.ROLLBACK


def test_decision_records_round_trip_and_labels_parse() -> None:
    decision = BatchDecision("abc", 7, (TxRef("t1", 2, 10), TxRef("t2", 2, 3)), sink_id="/chk/q")

    assert BatchDecision.decode(decision.encode()) == decision
    assert decision.key == b"abc/7"
    assert parse_label("abc/7") == ("abc", 7)
    assert parse_label("abc") is None
    assert parse_label("abc/x") is None
    with pytest.raises(ValueError, match="version"):
        BatchDecision.decode(b'{"v": 99}')


def test_commit_messages_keep_task_order_and_skip_failed_tasks() -> None:
    assert ordered_refs([[TxRef("a", 0, 1), TxRef("b", 0, 1)], None, [TxRef("c", 1, 1)]]) == [
        TxRef("a", 0, 1),
        TxRef("b", 0, 1),
        TxRef("c", 1, 1),
    ]


def test_chunks_cut_by_rows_and_bytes_in_order() -> None:
    messages = [Message("t", b"x" * 100, key=f"k{i}".encode()) for i in range(10)]

    by_rows = list(chunks(messages, max_rows=4, max_bytes=10**6))
    by_bytes = list(chunks(messages, max_rows=100, max_bytes=400))

    assert [len(c) for c in by_rows] == [4, 4, 2]
    assert [m for c in by_rows for m in c] == messages
    assert [len(c) for c in by_bytes] == [2, 2, 2, 2, 2]  # 100 + 2 + 64 bytes each
    assert [len(c) for c in chunks([Message("t", b"x" * 1000)], 10, 100)] == [1]  # alone when larger


def test_the_sdk_never_imports_pyspark() -> None:
    code = "import sys, txbridge, txbridge.producer, txbridge.admin; print('pyspark' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)

    assert out.stdout.strip() == "False"


def test_the_sink_topic_holds_decisions_journal_entries_and_tombstones() -> None:
    decision = BatchDecision("abc", 7, (TxRef("t1", 2, 10),))
    entry = JournalEntry("abc", 7, "t9", 1, "0/1")

    assert decode_record(decision.encode()) == decision
    assert decode_record(entry.encode()) == entry
    assert entry.key == b"abc/7/j/0/1/t9"
    assert decode_record(None) is None
    assert decode_record(b"not json") is None


def test_a_check_answers_commit_only_once_the_record_is_known_for_the_grace_period() -> None:
    now = [100.0]
    book = DecisionBook(commit_grace_s=10.0, clock=lambda: now[0])
    book.loaded.set()
    book.add(BatchDecision("s1", 0, (TxRef("a", 0, 1),)))

    assert book.answer(batch_label("s1", 0), "a") is TxState.UNKNOWN  # the driver's COMMITs go first
    assert book.answer(batch_label("s1", 0), "stray") is TxState.ROLLBACK  # a rollback cannot overtake
    now[0] += 10.0
    assert book.answer(batch_label("s1", 0), "a") is TxState.COMMIT


def test_a_transaction_this_driver_journaled_is_running_until_its_batch_is_decided() -> None:
    book = DecisionBook(commit_grace_s=0)
    book.own_urls.add("http://driver:1/txbridge/check")
    book.loaded.set()
    for tx, batch, url in [
        ("ours", 4, "http://driver:1/txbridge/check"),
        ("dead-attempt", 4, "http://driver:1/txbridge/check"),
        ("another-driver", 4, "http://driver:2/txbridge/check"),
        ("no-url", 4, ""),
    ]:
        book.note_journal(JournalEntry("s1", batch, tx, 0, "0/0", url))
    label = batch_label("s1", 4)

    assert book.answer(label, "ours") is TxState.RUNNING
    assert book.answer(label, "dead-attempt") is TxState.RUNNING  # until the batch is decided
    assert book.answer(label, "another-driver") is TxState.UNKNOWN  # its driver may be gone
    assert book.answer(label, "no-url") is TxState.UNKNOWN
    assert book.answer(batch_label("s1", 5), "ours") is TxState.UNKNOWN  # not the batch it wrote
    book.add(BatchDecision("s1", 4, (TxRef("ours", 0, 5),)))
    assert book.answer(label, "ours") is TxState.COMMIT
    assert book.answer(label, "dead-attempt") is TxState.ROLLBACK
    book.forget_journal("ours")
    assert book.answer(label, "ours") is TxState.COMMIT


def test_a_journal_entry_round_trips_with_its_check_url_and_its_tombstone_names_it() -> None:
    entry = JournalEntry("s1", 2, "tx-1", 3, "0/1", "http://driver:1/txbridge/check")
    assert decode_record(entry.encode()) == entry
    assert journal_tx_of(entry.key) == "tx-1"
    assert journal_tx_of(BatchDecision("s1", 2, ()).key) is None
