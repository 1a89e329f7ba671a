"""The console is safe by default, against a real Kafka and coordinator: pages read without a
credential; every post needs the console's own origin and the session's CSRF token; actions
need the admin sign-in; a read-only console has none; and nothing is published by a refused post."""

from __future__ import annotations

import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner

from cli.main import main
from servers.broker import free_port
from tests.console.conftest import TOKEN, LiveConsole
from tests.coordinator.check_server import CheckServer
from tests.coordinator.conftest import Env
from tests.coordinator.wire_producer import Msg
from tests.kafka_helpers import read_topic, wait_for
from txbridge.admin import list_expired
from txbridge.wire import TxState

pytestmark = pytest.mark.integration


def _csrf(page: str) -> str:
    found = re.search(r'<meta name="csrf-token" content="([^"]+)">', page)
    assert found is not None, "the page has no CSRF token"
    return found.group(1)


def test_posts_without_token_origin_or_admin_are_refused_and_publish_nothing(
    env: Env,
    check_server: CheckServer,
    topic_factory: Callable[..., str],
    console_factory: Callable[..., LiveConsole],
) -> None:
    topic = topic_factory()
    env.producer.heartbeat(check_server.url)
    handle = env.start(max_checks=2)
    tx_id = env.producer.transaction([Msg(topic, b"v", key=b"<b>k</b>")], TxState.UNKNOWN)
    assert wait_for(env.bootstrap, env.topics.expired, 1)
    console = console_factory(env.bootstrap, env.namespace, handle.service.config.group_id)
    read_only = console_factory(env.bootstrap, env.namespace, handle.service.config.group_id, admin=False)
    resolve = f"/ns/{env.namespace}/expired/{tx_id}/resolve"

    with httpx.Client(base_url=console.url, timeout=60, follow_redirects=True) as client:
        page = client.get(f"/ns/{env.namespace}/transactions")
        assert page.status_code == 200
        assert tx_id in page.text
        assert "&lt;b&gt;k&lt;/b&gt;" in page.text  # the key is escaped, never markup
        assert "<b>k</b>" not in page.text
        assert "/resolve" not in page.text  # read-only until signed in: no action form
        assert page.headers["content-security-policy"].startswith("default-src 'none'")
        cookie = page.headers["set-cookie"].lower()
        assert "httponly" in cookie
        assert "samesite=strict" in cookie
        token = _csrf(page.text)
        own = {"origin": console.url}
        # Another host name for this address (DNS rebinding): refused before any page.
        rebound = client.get(f"/ns/{env.namespace}/transactions", headers={"host": "evil.example"})
        assert rebound.status_code == 400
        assert tx_id not in rebound.text

        # Not signed in: refused, with or without the token.
        refused = client.post(resolve, data={"csrf": token, "state": "COMMIT"}, headers=own)
        assert refused.status_code == 403
        assert "admin token" in refused.text

        # A wrong admin token does not sign in; the right one does, with a new session.
        wrong = client.post("/login", data={"csrf": token, "token": "x" * 40}, headers=own)
        assert "wrong admin token" in wrong.text
        signed = client.post("/login", data={"csrf": token, "token": TOKEN}, headers=own)
        assert "signed in as admin" in signed.text
        token = _csrf(signed.text)

        # Signed in, but without the CSRF token, with a wrong one, or from another origin: refused.
        for data, headers in [
            ({"state": "COMMIT"}, own),
            ({"csrf": "forged", "state": "COMMIT"}, own),
            ({"csrf": token, "state": "COMMIT"}, {"origin": "http://evil.example"}),
            ({"csrf": token, "state": "COMMIT"}, {"referer": "http://evil.example/page"}),
            ({"csrf": token, "state": "COMMIT"}, {}),  # neither Origin nor Referer
        ]:
            answer = client.post(resolve, data=data, headers=headers)
            assert answer.status_code == 403, (data, headers, answer.text)

    # The read-only console has no sign-in and no action.
    with httpx.Client(base_url=read_only.url, timeout=60, follow_redirects=True) as client:
        page = client.get(f"/ns/{env.namespace}/transactions")
        assert "read-only console" in page.text
        token = _csrf(page.text)
        own = {"origin": read_only.url}
        login = client.post("/login", data={"csrf": token, "token": TOKEN}, headers=own)
        assert "this console is read-only" in login.text
        assert "/login" not in client.get("/").text.split("<main>")[0]  # no sign-in link
        answer = client.post(resolve, data={"csrf": token, "state": "COMMIT"}, headers=own)
        assert answer.status_code == 403

    assert [e.resolved for e in list_expired(env.bootstrap, env.namespace)] == [None]
    assert read_topic(env.bootstrap, topic, isolation="read_uncommitted") == []


def test_the_command_serves_the_namespaces_found_on_the_cluster_and_keeps_its_secrets(
    kafka_bootstrap: str, namespace_factory: Callable[..., str], tmp_path: Path
) -> None:
    """``txbridge console`` as an operator runs it: a process, the cluster's client settings
    (with a password, which no page shows), read-only without a token. (Limited to the test's
    namespace: the session's broker holds every other test's.)"""
    namespace = namespace_factory(2, prefix="txbcon")
    port = free_port()
    config = tmp_path / "client.properties"
    config.write_text("client.id=console-test\nsasl.password=pw-never-shown\n")  # unused on PLAINTEXT
    process = subprocess.Popen(
        [
            str(Path(sys.executable).with_name("txbridge")),
            "console",
            "--bootstrap",
            kafka_bootstrap,
            "--port",
            str(port),
            "--command-config",
            str(config),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                page = httpx.get(url + "/", timeout=30)
                break
            except httpx.TransportError:
                assert process.poll() is None, process.communicate()[0]
                assert time.monotonic() < deadline, "the console did not answer within 60s"
                time.sleep(0.2)
        assert page.status_code == 200
        assert f'id="ns-{namespace}"' in page.text  # found on the cluster
        assert "txbcon-not-on-the-cluster" not in page.text
        assert "read-only console" in page.text
        assert "pw-never-shown" not in page.text
        assert "pw-never-shown" not in httpx.get(f"{url}/ns/{namespace}/producers", timeout=30).text
    finally:
        process.terminate()
        output = process.communicate(timeout=30)[0]
    assert f"txbridge console for {kafka_bootstrap} at {url}/ (read-only (no admin token))" in output
    assert "pw-never-shown" not in output


def test_a_missing_admin_token_is_a_one_line_error_before_anything_starts() -> None:
    result = CliRunner().invoke(
        main, ["console", "--bootstrap", "127.0.0.1:1", "--admin-token-env", "TXBRIDGE_NO_SUCH_TOKEN"]
    )
    assert result.exit_code == 2
    assert "the variable TXBRIDGE_NO_SUCH_TOKEN is unset or empty" in result.output
