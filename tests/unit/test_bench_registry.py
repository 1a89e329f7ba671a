"""The bench's steps are a registry: every name the command takes is in it, in the order a run
takes them, and ``BenchRun.step`` is a lookup and a call (no broker: nothing here runs a step)."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import click
import pytest

from bench import steps
from bench.cli import bench
from bench.kafka_native import Figure
from bench.runner import MODES, BenchRun
from bench.steps import REGISTRY, STEPS, Step, StepRun, lookup

ORDER = (
    "raw",
    "native1",
    "native100",
    "e2e",
    "floor",
    "latency",
    "floor_latency",
    "checks",
    "memory",
    "failover",
    "restart",
    "renamed",
    "scaleout",
    "addremove",
    "protocols",
    "nodekill",
    "rocketmq",
)


def _choices(option: str) -> tuple[str, ...]:
    (param,) = (p for p in bench.params if p.name == option)
    assert isinstance(param.type, click.Choice)
    return tuple(param.type.choices)


@pytest.fixture
def run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[BenchRun]:
    """A run that never reaches its (closed) bootstrap: keep_topics, so leaving it deletes nothing."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # its work folder
    with BenchRun("127.0.0.1:1", MODES["quick"], size=8, concurrency=1, in_flight=1, keep_topics=True) as run:
        yield run


def test_the_steps_run_in_a_stable_order() -> None:
    assert STEPS == ORDER
    assert tuple(REGISTRY) == ORDER
    assert all(REGISTRY[name].name == name for name in ORDER)


def test_every_name_the_command_accepts_is_registered() -> None:
    assert _choices("only") == STEPS
    assert _choices("skip") == STEPS
    for name in _choices("only"):
        assert lookup(name) is REGISTRY[name]


def test_every_step_says_what_it_measures() -> None:
    assert all(step.description and callable(step.run) for step in REGISTRY.values())


def test_an_unknown_step_is_an_error_naming_the_known_ones(run: BenchRun) -> None:
    with pytest.raises(ValueError, match=r"unknown benchmark step 'nope'; known: raw, native1, ") as caught:
        lookup("nope")
    assert all(name in str(caught.value) for name in ORDER)

    with pytest.raises(ValueError, match="unknown benchmark step 'rocket'") as through_the_run:
        run.step("rocket")
    assert str(through_the_run.value) == str(caught.value).replace("'nope'", "'rocket'")
    assert run.figures == []


def test_a_step_keeps_every_figure_it_measured_and_returns_its_own(
    run: BenchRun, monkeypatch: pytest.MonkeyPatch
) -> None:
    def two(on: StepRun) -> list[Figure]:
        assert on is run
        return [Figure("first", messages=1, seconds=1.0), Figure("own", messages=2, seconds=1.0)]

    monkeypatch.setitem(steps.REGISTRY, "failover", Step("failover", "two figures", two))

    figure = run.step("failover")

    assert figure.name == "own"
    assert [f.name for f in run.figures] == ["first", "own"]


def test_the_registry_loads_without_the_bench_extra() -> None:
    """The command's options come from it: no psutil, rich or step module is imported with it."""
    heavy = ("psutil", "rich", "bench.kafka_native", "bench.runner")
    code = f"import sys, bench.steps\nprint([m for m in {heavy!r} if m in sys.modules])\n"

    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)

    assert result.stdout.strip() == "[]"
