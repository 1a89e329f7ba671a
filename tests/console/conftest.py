"""Fixtures of the console tests: the coordinator tests' namespace, producer and coordinators, the
console served on a free port, and Debian's headless chromium driven by Selenium."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import uvicorn

from console import AdminToken, ConsoleSettings, build_app
from servers.broker import free_port
from tests.coordinator.conftest import _state_invariants, check_server, env  # noqa: F401  (fixtures)

TOKEN = "console-test-admin-token-0123456789"  # noqa: S105 - a test-only credential
CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
#: A folder to write the pages' screenshots to (docs/console/ holds the committed ones).
SCREENSHOTS_ENV = "TXBRIDGE_CONSOLE_SCREENSHOTS"


@dataclass
class LiveConsole:
    url: str
    settings: ConsoleSettings
    server: uvicorn.Server
    thread: threading.Thread

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)


def serve(settings: ConsoleSettings) -> LiveConsole:
    """The console's app served by uvicorn on a free port, on a thread; returns once it listens."""
    port = free_port()
    server = uvicorn.Server(
        uvicorn.Config(build_app(settings), host="127.0.0.1", port=port, log_config=None, access_log=False)
    )
    thread = threading.Thread(target=server.run, name="console", daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline, "the console did not start listening within 20s"
        assert thread.is_alive(), "the console's server thread died"
        time.sleep(0.05)
    return LiveConsole(f"http://127.0.0.1:{port}", settings, server, thread)


@pytest.fixture
def console_factory() -> Iterator[Callable[..., LiveConsole]]:
    """``console_factory(bootstrap, namespace, group, admin=True, metrics=())``: a console serving
    one namespace (``metrics``: where its coordinators serve /metrics, a port or URLs)."""
    started: list[LiveConsole] = []

    def make(
        bootstrap: str, namespace: str, group: str, *, admin: bool = True, metrics: tuple[str, ...] = ()
    ) -> LiveConsole:
        settings = ConsoleSettings(
            bootstrap,
            namespaces=(namespace,),
            groups={namespace: group},
            admin_token=AdminToken(TOKEN, "the test") if admin else None,
            allowed_hosts=("127.0.0.1", "localhost"),  # as txbridge console on loopback
            coordinator_metrics={namespace: metrics} if metrics else {},
        )
        live = serve(settings)
        started.append(live)
        return live

    yield make
    for live in started:
        live.stop()


def _browser_missing() -> str | None:
    missing = [str(p) for p in (CHROMIUM, CHROMEDRIVER) if not p.exists()]
    if not missing:
        return None
    return (
        f"the console's browser test needs {', '.join(missing)}: install Debian's chromium and "
        "chromium-driver (make setup runs scripts/system-packages.sh, as root)"
    )


@pytest.fixture
def browser() -> Iterator[Any]:
    """Headless chromium through its chromedriver, both by path: Selenium Manager is never asked
    to download a browser or a driver. Missing binaries skip the test locally and fail it in CI."""
    why = _browser_missing()
    if why is not None:
        if os.environ.get("CI"):
            pytest.fail(why)
        pytest.skip(why)
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,1000"):
        options.add_argument(arg)
    driver = webdriver.Chrome(service=Service(executable_path=str(CHROMEDRIVER)), options=options)
    driver.implicitly_wait(0)
    try:
        yield driver
    finally:
        driver.quit()


def screenshot(driver: Any, name: str) -> None:
    """Save the page to ``$TXBRIDGE_CONSOLE_SCREENSHOTS/<name>.png`` when that is set (full height)."""
    folder = os.environ.get(SCREENSHOTS_ENV)
    if not folder:
        return
    Path(folder).mkdir(parents=True, exist_ok=True)
    height = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(1400, min(max(int(height) + 40, 600), 2400))
    driver.save_screenshot(str(Path(folder) / f"{name}.png"))
    driver.set_window_size(1400, 1000)
