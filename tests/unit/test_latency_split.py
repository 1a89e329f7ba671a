"""The demo's split of txbridge's commit-to-visible time (spark_pipelines.latency_split): pure logic."""

from __future__ import annotations

from spark_pipelines.latency_split import Decision, Republished, sentences, split
from spark_pipelines.store import CommittedOrder


def _order(order_id: str, customer: str, seq: int, committed_ms: int) -> CommittedOrder:
    return CommittedOrder(order_id, customer, seq, 100, committed_ms)


def test_each_order_is_split_at_its_op_record_and_its_republished_record() -> None:
    committed = [_order("o1", "c1", 1, 1_000), _order("o2", "c2", 1, 1_000)]
    republished = {"o1": Republished(1_020, 1_008, "t1"), "o2": Republished(1_040, 1_010, "t2")}
    decisions = {"t1": Decision(1_003, "producer"), "t2": Decision(1_004, "producer")}

    figures = split(committed, republished, decisions)

    prompt = figures["prompt"]
    assert prompt["orders"] == 2
    assert prompt["whole"] == {"p50": 20.0, "p99": 40.0}  # nearest rank, as the report table's
    assert prompt["producer"]["p50"] == 3.0
    assert prompt["republish"]["p50"] == 5.0
    assert prompt["visible"]["p50"] == 12.0
    assert figures["held_by_key"]["orders"] == figures["back_checked"]["orders"] == 0
    assert figures["unsplit"] == 0


def test_an_order_republished_after_a_later_order_of_its_customer_was_decided_holds_that_one() -> None:
    # o1's producer never learned the outcome: a back-check decides it 2 s later. o2 (same
    # customer) is decided at once but must wait for o1; o3 (another customer) does not.
    committed = [_order("o1", "c1", 1, 1_000), _order("o2", "c1", 2, 1_100), _order("o3", "c2", 1, 1_100)]
    republished = {
        "o1": Republished(3_020, 3_010, "t1"),
        "o2": Republished(3_021, 3_011, "t2"),
        "o3": Republished(1_115, 1_108, "t3"),
    }
    decisions = {
        "t1": Decision(3_000, "check"),
        "t2": Decision(1_103, "producer"),
        "t3": Decision(1_104, "producer"),
    }

    figures = split(committed, republished, decisions)

    assert figures["back_checked"]["orders"] == 1
    assert figures["back_checked"]["producer"]["p50"] == 2_000.0
    assert figures["held_by_key"]["orders"] == 1
    assert figures["held_by_key"]["republish"]["p50"] == 3_011.0 - 1_103
    assert figures["prompt"]["orders"] == 1
    assert figures["prompt"]["whole"]["p50"] == 15.0


def test_an_order_republished_before_the_next_one_was_decided_holds_nothing() -> None:
    committed = [_order("o1", "c1", 1, 1_000), _order("o2", "c1", 2, 1_050)]
    republished = {"o1": Republished(1_030, 1_020, "t1"), "o2": Republished(1_080, 1_070, "t2")}
    decisions = {"t1": Decision(1_005, "producer"), "t2": Decision(1_055, "producer")}

    assert split(committed, republished, decisions)["prompt"]["orders"] == 2


def test_orders_not_seen_or_without_an_op_record_are_counted_apart() -> None:
    committed = [_order("o1", "c1", 1, 1_000), _order("o2", "c1", 2, 1_100), _order("o3", "c2", 1, 1_000)]
    republished = {"o1": Republished(1_030, 1_020, "t1"), "o3": Republished(1_030, 1_020, "t3")}
    decisions = {"t1": Decision(1_005, "producer")}

    figures = split(committed, republished, decisions)

    assert figures["unsplit"] == 2
    assert figures["prompt"]["orders"] == 1


def test_the_sentences_name_only_the_kinds_that_occurred() -> None:
    committed = [_order("o1", "c1", 1, 1_000)]
    figures = split(committed, {"o1": Republished(1_030, 1_020, "t1")}, {"t1": Decision(1_005, "producer")})

    (line,) = sentences(figures)

    assert line.startswith("prompt (decided by its producer, not held back): 1 orders, whole 30 / 30 ms")
    assert "producer 5 / 5, republish 15 / 15, visible 10 / 10" in line
