"""The bench's restart step splits its figure by what the restarted coordinator logged
(bench/txbridge_runs.py ``restart_timeline``): seconds from the kill to each step back."""

import time

from bench.txbridge_runs import restart_timeline


def _line(at: float, text: str) -> str:
    stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(at))
    return f"{stamp},{round((at % 1) * 1000):03d} INFO {text}"


def test_each_step_is_timed_from_the_kill_and_a_missing_one_is_left_out() -> None:
    killed = 1_800_000_000.25
    log = "\n".join(
        [
            "a warning without a time stamp",
            _line(killed + 0.5, "coordinator.group.consumer: 1 broker(s): group session timeout 6000 ms"),
            _line(killed + 0.75, "coordinator.commit.ownership: c commits under the transactional id x"),
            _line(killed + 1.125, "coordinator.group.rebalance: assigned partitions [0, 1]"),
            _line(killed + 6.0, "coordinator.group.rebalance: assigned partitions [0, 1, 2]"),
        ]
    )

    assert restart_timeline(log, killed) == {
        "restart_first_log_s": 0.5,
        "restart_claimed_s": 0.75,
        "restart_assigned_s": 1.125,
    }
