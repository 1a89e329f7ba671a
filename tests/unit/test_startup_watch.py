"""A local server's start-up waits while its logs grow and gives up once they stop."""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest

from servers import startup
from servers.startup import StartupWatch


def test_a_start_that_keeps_logging_is_waited_for_past_the_quiet_limit(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    watch = StartupWatch([log, tmp_path / "absent.log"], quiet_s=0.3, what="the test server")
    started = time.monotonic()
    while time.monotonic() - started < 1.0:  # three times the limit, logging all along
        with log.open("a") as out:
            out.write("Recovering segment\n")
        assert not watch.hung()
        time.sleep(0.05)


def test_a_start_that_stops_logging_is_hung_after_the_quiet_limit(tmp_path: Path) -> None:
    log = tmp_path / "server.log"
    log.write_text("starting\n")
    watch = StartupWatch([log], quiet_s=0.2, what="the test server")
    assert not watch.hung()
    time.sleep(0.3)
    assert watch.hung()


def test_a_long_start_says_that_it_still_waits(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setattr(startup, "NOTE_EVERY_S", 0.0)
    watch = StartupWatch([tmp_path / "server.log"], quiet_s=60, what="the test server")
    with caplog.at_level(logging.INFO, logger="servers.startup"):
        assert not watch.hung()
    assert "the test server is still starting" in caplog.text
