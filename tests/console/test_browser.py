"""The console in a real browser against a real Kafka and coordinator: a transaction expires, is
found on the page by its key, resolved COMMIT there, and published exactly once; a second
operator's resolve of it from a page loaded before shows the decision already made. A
quarantined one is requeued from the page once its topic exists, and published once. The
producer groups page shows each group's check requests, failures by kind and latency, as the
coordinator's metrics count them, and says so when those cannot be read."""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

import pytest

from servers.broker import free_port
from tests.console.conftest import TOKEN, LiveConsole, screenshot
from tests.coordinator.check_server import CheckServer, Misbehaviour
from tests.coordinator.conftest import PARTITIONS, Env, eventually
from tests.coordinator.wire_producer import Msg, WireProducer
from tests.kafka_helpers import read_topic, wait_for
from txbridge import kafka
from txbridge.wire import TxState

pytestmark = pytest.mark.integration

HOSTILE = "<script>document.title='owned'</script>"


def _by_id(driver: Any, element_id: str) -> Any:
    from selenium.webdriver.common.by import By

    return driver.find_element(By.ID, element_id)


def _flash(driver: Any) -> str:
    """The message the page shows after a post (waits for the next page to load)."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    found = WebDriverWait(driver, 60).until(lambda d: d.find_elements(By.CSS_SELECTOR, "p.flash"))
    return " ".join(f.get_attribute("class") + ": " + f.text for f in found)


def _seconds(shown: str) -> float:
    """A time as the page shows it ("128 ms", "1 s") in seconds."""
    number, unit = shown.split()
    return float(number) / (1000 if unit == "ms" else 1)


def _sign_in(driver: Any, console: LiveConsole) -> None:
    driver.get(f"{console.url}/login")
    screenshot(driver, "login")
    _by_id(driver, "token").send_keys(TOKEN)
    _by_id(driver, "sign-in-submit").click()
    assert "signed in as admin" in _flash(driver)


def _click_and_confirm(driver: Any, button: Any, question: str) -> str:
    """Click an action's button, accept its confirmation, and return the next page's message."""
    button.click()
    alert = driver.switch_to.alert
    assert question in alert.text
    alert.accept()
    return _flash(driver)


def test_an_expired_transaction_is_found_resolved_on_the_page_and_published_once(
    env: Env,
    check_server: CheckServer,
    topic_factory: Callable[..., str],
    console_factory: Callable[..., LiveConsole],
    browser: Any,
) -> None:
    from selenium.webdriver.common.by import By

    topic = topic_factory()
    env.producer.heartbeat(check_server.url)  # answers UNKNOWN: the transaction expires
    handle = env.start(max_checks=2)
    group = handle.service.config.group_id
    tx_id = env.producer.transaction(
        [Msg(topic, b"order 42 paid", key=b"order-42", headers=(("note", HOSTILE.encode()),))],
        TxState.UNKNOWN,
    )
    assert wait_for(env.bootstrap, env.topics.expired, 1), "the transaction did not expire"
    # Another one, still open: its first check is an hour away.
    waiting, _partition = env.producer.halves([Msg(topic, b"order 43", key=b"order-43")], check_after=3600)
    console = console_factory(env.bootstrap, env.namespace, group)

    # Health: the coordinator, ready, owning every partition; the pending and the expired one
    # (the open one is listed once the coordinator's next commit has recorded it).
    def health() -> str:
        browser.get(console.url + "/")
        return " ".join(_by_id(browser, f"ns-{env.namespace}").text.split())

    text = eventually(lambda: next((t for t in [health()] if "1 pending" in t), ""))
    assert f"{handle.service.config.instance_id} 127.0.0.1 ready (owns 3 partition(s)) 0, 1, 2" in text
    assert "0 unserved of 3 partitions" in text
    assert "1 expired, unresolved" in text
    screenshot(browser, "health")

    # Read-only until signed in: the expired transaction is listed, with no action on it.
    transactions = f"{console.url}/ns/{env.namespace}/transactions?q=order-42"
    browser.get(transactions)
    row = _by_id(browser, f"expired-{tx_id}")
    assert "unresolved" in row.text
    assert not browser.find_elements(By.ID, f"pending-{waiting}")  # the search: order-42 only
    browser.get(f"{console.url}/ns/{env.namespace}/transactions?q=order-43")
    pending = _by_id(browser, f"pending-{waiting}")
    assert "open" in pending.text
    assert "not checked yet" in pending.text
    assert not browser.find_elements(By.ID, f"expired-{tx_id}")
    browser.get(transactions)
    row = _by_id(browser, f"expired-{tx_id}")
    assert not row.find_elements(By.TAG_NAME, "button")
    # The message's header is the user's data: shown as text, never run.
    row.find_element(By.TAG_NAME, "summary").click()
    assert HOSTILE in row.text
    assert browser.title != "owned"

    _sign_in(browser, console)
    browser.get(transactions)
    stale = browser.current_window_handle  # a second operator's page, loaded before the decision
    browser.switch_to.new_window("tab")
    browser.get(f"{console.url}/ns/{env.namespace}/transactions")  # everything, unfiltered
    assert _by_id(browser, f"pending-{waiting}")
    _by_id(browser, f"expired-{tx_id}").find_element(By.TAG_NAME, "summary").click()
    screenshot(browser, "transactions")
    commit = _by_id(browser, f"expired-{tx_id}").find_element(By.CSS_SELECTOR, "button[value=COMMIT]")
    said = _click_and_confirm(browser, commit, f"Publish the 1 message(s) of {tx_id} to {topic}?")
    assert "COMMIT by admin, republished 1 message(s)" in said
    assert "resolved COMMIT by an admin" in _by_id(browser, f"expired-{tx_id}").text
    screenshot(browser, "resolved")

    seen = wait_for(env.bootstrap, topic, 1)
    assert [(s.key, s.value, s.headers.get("txb.tx")) for s in seen] == [
        (b"order-42", b"order 42 paid", tx_id.encode())
    ]

    # The other operator's page still offers ROLLBACK: the decision made stands.
    browser.switch_to.window(stale)
    rollback = _by_id(browser, f"expired-{tx_id}").find_element(By.CSS_SELECTOR, "button[value=ROLLBACK]")
    said = _click_and_confirm(browser, rollback, f"Record ROLLBACK for {tx_id}?")
    assert f"flash already: transaction {tx_id} was already resolved COMMIT by an admin" in said
    assert "resolved COMMIT by an admin" in _by_id(browser, f"expired-{tx_id}").text

    # The coordinator reads the admin op back and changes nothing; the message is there once.
    assert eventually(lambda: handle.service.stats["admin_ops"] == 1)
    assert len(read_topic(env.bootstrap, topic)) == 1

    env.producer.heartbeat(check_server.url)  # heard again: live
    browser.get(f"{console.url}/ns/{env.namespace}/producers")
    group_text = " ".join(_by_id(browser, "group-orders").text.split())
    assert re.search(rf"inst-1 live \d+s ago {re.escape(check_server.url)}", group_text), group_text
    assert "1 pending" in group_text


def test_a_quarantined_transaction_is_requeued_from_the_page_once_its_topic_exists(
    env: Env,
    unique_name: Callable[[str], str],
    console_factory: Callable[..., LiveConsole],
    browser: Any,
) -> None:
    from selenium.webdriver.common.by import By

    topic = unique_name("missing")
    no_auto_create = {"allow.auto.create.topics": False}  # as on most clusters: quarantined, not created
    handle = env.start(extra_config=no_auto_create)
    tx_id = env.producer.transaction([Msg(topic, b"order 44", key=b"order-44")], TxState.COMMIT)
    assert wait_for(env.bootstrap, env.topics.quarantine, 1), "the transaction was not quarantined"
    console = console_factory(env.bootstrap, env.namespace, handle.service.config.group_id)

    _sign_in(browser, console)
    page = f"{console.url}/ns/{env.namespace}/transactions?q={topic}"
    browser.get(page)
    row = _by_id(browser, f"quarantined-{tx_id}")
    assert f"topic '{topic}' does not exist" in row.text
    assert "requeueable" in row.text

    # Requeued while the topic is still missing: refused, nothing written.
    said = _click_and_confirm(browser, row.find_element(By.TAG_NAME, "button"), f"Requeue {tx_id}")
    assert f"not requeued: topic {topic} does not exist: create it" in said

    kafka.ensure_topics(env.bootstrap, [kafka.TopicSpec(topic, 1)])
    # A coordinator remembers a topic's metadata for 30 s: a new one asks the broker again.
    handle.stop()
    env.start(extra_config=no_auto_create)
    browser.get(page)
    row = _by_id(browser, f"quarantined-{tx_id}")
    said = _click_and_confirm(browser, row.find_element(By.TAG_NAME, "button"), f"Requeue {tx_id}")
    assert f"{tx_id}: requeued as " in said
    new_tx = said.split("requeued as ")[1].split()[0]
    assert f"requeued as {new_tx}" in _by_id(browser, f"quarantined-{tx_id}").text
    assert not _by_id(browser, f"quarantined-{tx_id}").find_elements(By.TAG_NAME, "button")
    screenshot(browser, "requeued")

    seen = wait_for(env.bootstrap, topic, 1)
    assert [(s.key, s.value, s.headers.get("txb.tx")) for s in seen] == [
        (b"order-44", b"order 44", new_tx.encode())
    ]


def test_the_producer_groups_page_shows_each_groups_check_requests_failures_and_latency(
    env: Env,
    check_server: CheckServer,
    topic_factory: Callable[..., str],
    console_factory: Callable[..., LiveConsole],
    browser: Any,
) -> None:
    topic = topic_factory()
    # orders: the first check times out, the second is answered 503, the third UNKNOWN (an
    # answer, not a failure), the fourth COMMIT.
    odd = {1: Misbehaviour(delay_s=1.0), 2: Misbehaviour(status=503)}
    check_server.misbehave = lambda number, _checks: odd.get(number)
    check_server.script = lambda _req: TxState.COMMIT if check_server.requests >= 4 else TxState.UNKNOWN
    env.producer.heartbeat(check_server.url)
    # Another group's only instance advertises a port nobody listens on: every request is refused.
    refusing = WireProducer(env.bootstrap, env.namespace, PARTITIONS, group="refusing")
    refusing.heartbeat(f"http://127.0.0.1:{free_port()}/txbridge/check")
    port = free_port()
    handle = env.start(metrics_port=port, max_checks=5, check_timeout_s=0.5)
    group = handle.service.config.group_id
    tx_id = env.producer.transaction([Msg(topic, b"order 45", key=b"order-45")], TxState.UNKNOWN)
    refusing.halves([Msg(topic, b"order 46", key=b"order-46")])
    assert [s.headers.get("txb.tx") for s in wait_for(env.bootstrap, topic, 1)] == [tx_id.encode()]

    # The console finds the coordinator as a member of its group, and scrapes it on its port.
    console = console_factory(env.bootstrap, env.namespace, group, admin=False, metrics=(str(port),))
    page = f"{console.url}/ns/{env.namespace}/producers"
    browser.get(page)
    orders = " ".join(_by_id(browser, "checks-orders").text.split())
    # requests, answered, failed, failures by kind, mean, p50, p99, slowest
    time = r"(\d+ ms|[\d.]+ s)"
    found = re.search(rf"\bslowest 4 2 2 timeout 1, http_error 1 {time} {time} {time} < {time}$", orders)
    assert found, orders
    mean, _p50, p99, slowest = map(_seconds, found.groups())
    assert mean >= 0.125  # the timeout alone took check_timeout_s, 0.5 s, of the 4 requests
    assert 0.25 <= p99 <= 1.0  # in the bucket of the timeout: (0.25, 0.5] or (0.5, 1]
    assert slowest in {0.5, 1.0}
    refused = " ".join(_by_id(browser, f"checks-{refusing.group}").text.split())
    found = re.search(r"\bslowest (\d+) 0 (\d+) refused (\d+) ", refused)
    assert found, refused
    assert found[1] == found[2] == found[3], refused  # every request failed, each refused
    assert int(found[1]) >= 1
    sources = _by_id(browser, "checks-sources").text
    assert f"summed over the 1 coordinator(s) read: http://127.0.0.1:{port}/metrics" in " ".join(
        sources.split()
    )
    screenshot(browser, "producers")

    # Where no coordinator's metrics can be read, the page says so and shows the rest.
    nobody = free_port()
    blind = console_factory(env.bootstrap, env.namespace, group, admin=False, metrics=(str(nobody),))
    browser.get(f"{blind.url}/ns/{env.namespace}/producers")
    text = " ".join(_by_id(browser, "group-orders").text.split())
    assert re.search(rf"inst-1 (live|gone) \d+s ago {re.escape(check_server.url)}", text), text
    assert "Check requests: unavailable" in text
    assert (
        f"Unavailable: http://127.0.0.1:{nobody}/metrics (ConnectError)"
        in _by_id(browser, "checks-sources").text
    )
