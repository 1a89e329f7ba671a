"""docs/results/current.md: one table made from the newest full run's JSON, never by hand."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench import results_table
from bench.kafka_native import Figure
from bench.results import write_json

ROOT = Path(__file__).resolve().parents[2]


def _figures() -> list[Figure]:
    return [
        Figure("raw produce", 100_000, 1.0, {"msgs_per_s": 100_000.0, "broker_cpu_us_per_msg": 11.36}),
        Figure("txbridge end to end", 5_000, 1.0, {"msgs_per_s": 5_000.0}),
        Figure("floor end to end", 12_500, 1.0, {"msgs_per_s": 12_500.0}),
        Figure(
            "txbridge commit-to-visible",
            1_000,
            10.0,
            {"rate_msgs_per_s": 2_500.0, "p50_ms": 48.44, "p99_ms": 109.4, "max_ms": 159.87},
        ),
        Figure(
            "scale-out, 1 coordinator",
            100,
            1.0,
            {"msgs_per_s": 7_625.7, "instance_cpu_us_per_msg_min": 81.5, "instance_cpu_us_per_msg_max": 81.5},
        ),
        Figure(
            "scale-out, 2 coordinators",
            100,
            1.0,
            {
                "msgs_per_s": 5_554.8,
                "instance_cpu_us_per_msg_min": 108.06,
                "instance_cpu_us_per_msg_max": 119.83,
            },
        ),
    ]


@pytest.fixture
def results_dir(tmp_path: Path) -> Path:
    """A bench/results with one run written by the bench's own writer, and an older copy of it."""
    out = tmp_path / "bench" / "results"
    path = write_json(_figures(), out, mode="full", bootstrap="127.0.0.1:9092")
    older = json.loads(path.read_text())
    older["figures"][1]["values"]["msgs_per_s"] = 1.0
    (out / "bench-full-20000101T000000Z.json").write_text(json.dumps(older))
    (out / "bench-quick-29991231T235959Z.json").write_text(path.read_text())  # not a full run
    some = write_json(_figures()[:1], out, mode="full", bootstrap="127.0.0.1:9092", some_steps=True)  # --only
    assert some.name.startswith("bench-steps-full-")
    some.rename(out / "bench-steps-full-29991231T235959Z.json")  # newer than the whole run, and not one
    return out


def test_the_newest_full_run_is_the_one_rendered(results_dir: Path) -> None:
    newest = results_table.newest_full_run(results_dir)

    assert newest.name.startswith("bench-full-")
    assert newest.name != "bench-full-20000101T000000Z.json"
    page = results_table.generate(results_dir, root=results_dir.parents[1])
    assert "| txbridge end to end | msgs/s | 5,000 |" in page
    assert f"[{newest.name}](../../bench/results/{newest.name})" in page


def test_the_table_joins_a_figures_values_and_shows_ranges(results_dir: Path) -> None:
    run = json.loads(results_table.newest_full_run(results_dir).read_text())
    lines = results_table.table_for(run)

    assert "| raw produce | broker CPU µs/msg | 11.4 |" in lines
    assert "| txbridge commit-to-visible | at msgs/s (half load) | 2,500 |" in lines
    assert "| txbridge commit-to-visible | p50 / p99 / max ms | 48.4 / 109 / 160 |" in lines
    # a figure measured for only some of a row's cells says so; min = max is one value
    assert "| scale-out 1 / 2 / 4 coordinators | msgs/s | 7,626 / 5,555 / n/a |" in lines
    assert (
        "| scale-out 1 / 2 / 4 coordinators | per-instance CPU µs per message it republished "
        "| 81.5 / 108-120 / n/a |"
    ) in lines
    # the ratios the bench computed, as it stored them
    assert "| ratio | txbridge / floor | 0.400 |" in lines
    assert "| ratio | txbridge / raw produce | 0.050 |" in lines


def test_rows_of_steps_that_did_not_run_are_left_out(results_dir: Path) -> None:
    run = json.loads(results_table.newest_full_run(results_dir).read_text())
    text = "\n".join(results_table.table_for(run))

    for absent in ("rocketmq", "node kill", "failover", "coordinator memory", "native txn"):
        assert absent not in text


def test_the_header_names_the_runs_date_commit_and_machine(results_dir: Path) -> None:
    run = json.loads(results_table.newest_full_run(results_dir).read_text())
    run |= {"date": "20261127T140702Z", "commit": "858eb7e", "skipped": {"rocketmq": "no JDK"}}
    run["machine"] |= {"cpu_cores": 2, "memory_gib": 23.5, "kafka": "4.1.1"}

    page = results_table.render(run, "bench/results/bench-full-20261127T140702Z.json")

    assert "finished 2026-11-27 14:07 UTC, code 858eb7e." in page
    assert "2 cores, 23.5 GiB" in page
    assert "Kafka 4.1.1" in page
    assert "- **Skipped:** rocketmq (no JDK)." in page
    del run["commit"]
    assert "code not recorded." in results_table.render(run, "x.json")


def test_an_empty_results_directory_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=r"no bench-full-\*\.json in .*run `txbridge bench`"):
        results_table.newest_full_run(tmp_path)


def test_check_reports_a_stale_page_and_writing_fixes_it(results_dir: Path, tmp_path: Path) -> None:
    page = tmp_path / "current.md"
    page.write_text("old figures\n")
    args = ["--results", str(results_dir), "--out", str(page)]

    assert results_table.main([*args, "--check"]) == 1
    assert results_table.main(args) == 0
    assert results_table.main([*args, "--check"]) == 0
    assert "| txbridge end to end | msgs/s | 5,000 |" in page.read_text()


def test_the_committed_page_is_what_the_newest_committed_run_gives() -> None:
    """The committed docs/results/current.md cannot drift from bench/results/."""
    expected = results_table.generate(ROOT / "bench" / "results", root=ROOT)
    committed = (ROOT / "docs" / "results" / "current.md").read_text()

    assert committed == expected, "docs/results/current.md is out of date: run python -m bench.results_table"
    # and the page is a real run's: a full table, not a stub
    assert committed.count("\n| ") > 30
