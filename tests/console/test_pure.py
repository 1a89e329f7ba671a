"""The console's pure parts, without a broker: health from what was read, the rows and their
search, producer liveness and shown URLs, the check figures read from the coordinators' metrics,
sessions and origins, the admin token's sources."""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from console.checks import GroupChecks, merge, metrics_urls, parse
from console.cli import admin_token, coordinator_metrics
from console.health import Member, NamespaceHealth, assemble
from console.producers import groups_of, shown_url, with_checks
from console.security import Sessions, same_origin
from console.settings import AdminToken, ConsoleSettings
from console.transactions import PendingRow, matches, pending_by_group, pending_rows
from txbridge.admin import Registered
from txbridge.errors import ConfigurationError
from txbridge.wire import ProducerInstance, Topics

NS = "__txbridge"
HALF, OP = Topics(NS).half, Topics(NS).op


def _health(
    members: list[Member], state: str = "stable", pending: list[dict] | None = None
) -> NamespaceHealth:
    ends = {(t, p): 100 for t in (HALF, OP) for p in range(3)}
    committed = {(HALF, 0): 90, (HALF, 1): 100, (OP, 0): 95, (OP, 1): -1001}
    return assemble(
        NS,
        group="g",
        group_state=state,
        partitions=3,
        members=members,
        ends=ends,
        committed=committed,
        pending=pending or [],
    )


def test_health_owners_lag_unserved_and_oldest_pending() -> None:
    pending = [{"tx": "a", "p": 0, "first": 5_000}, {"tx": "b", "p": 0, "first": 2_000}, {"tx": "c", "p": 2}]
    h = _health([Member("c-1", "10.0.0.1", (0, 1)), Member("c-2", "10.0.0.2", ())], pending=pending)
    assert [(p.partition, p.owner, p.half_lag, p.op_lag, p.pending) for p in h.partitions] == [
        (0, "c-1", 10, 5, 2),
        (1, "c-1", 0, None, 0),  # no committed op position: unknown, not zero
        (2, None, None, None, 1),
    ]
    assert h.unserved == [2]
    assert h.pending == 3
    assert h.oldest_pending_ms == 2_000
    assert h.oldest_age_s(12_000) == 10.0
    c1, c2 = h.coordinators
    assert (c1.ready, c1.partitions, c1.half_lag, c1.op_lag) == (True, (0, 1), 10, 5)
    assert (c2.ready, c2.why) == (False, "owns nothing while partitions [2] are unserved")


def test_health_readiness_follows_the_group() -> None:
    standby = _health([Member("c-1", "h", (0, 1, 2)), Member("c-2", "h", ())])
    assert [(c.name, c.ready) for c in standby.coordinators] == [("c-1", True), ("c-2", True)]
    assert "standby" in standby.coordinators[1].why
    leaving = _health([Member("c-1", "h", (0, 1, 2)), Member("c-2", "h", (), holds_other=True)])
    assert [c.ready for c in leaving.coordinators] == [True, False]
    rebalancing = _health([Member("c-1", "h", (0, 1, 2))], state="preparing_rebalance")
    assert rebalancing.coordinators[0].why == "the group is preparing rebalance"
    assert not rebalancing.coordinators[0].ready


def _entry(tx: str, group: str, first: int | None, key: bytes = b"order-42", **more: object) -> dict:
    halves = [[0, 10, 3, "orders", base64.b64encode(key).decode()]]
    return {
        "tx": tx,
        "group": group,
        "p": 1,
        "phase": "open",
        "checks": 2,
        "first": first,
        "halves": halves,
        **more,
    }


def test_pending_rows_oldest_first_by_group_and_searchable_by_key_topic_and_id() -> None:
    rows = pending_rows(
        [
            _entry("tx-b", "orders", 2_000),
            _entry("tx-a", "orders", 1_000, key=b"order-7"),
            _entry("tx-c", "billing", None, unasked=3_000, problem="no live instance"),
        ]
    )
    assert [r.tx_id for r in rows] == ["tx-a", "tx-b", "tx-c"]
    assert [(g, [r.tx_id for r in rs]) for g, rs in pending_by_group(rows)] == [
        ("billing", ["tx-c"]),
        ("orders", ["tx-a", "tx-b"]),
    ]
    assert rows[1].keys == ("order-42",)
    assert rows[2].problem == "no live instance"
    assert rows[0].age_s(4_000) == 3.0

    def found(query: str) -> list[str]:
        return [r.tx_id for r in rows if matches(query, r.tx_id, r.topics, r.keys)]

    assert found("ORDER-42") == ["tx-b", "tx-c"]
    assert found("tx-a") == ["tx-a"]
    assert found("orders") == ["tx-a", "tx-b", "tx-c"]  # the topic
    assert found("") == ["tx-a", "tx-b", "tx-c"]
    assert found("nothing") == []


def _registered(
    instance: str, seen_ms: int, interval: float = 0.0, url: str = "http://127.0.0.1:1/c"
) -> Registered:
    return Registered(ProducerInstance("orders", instance, url, interval_s=interval), seen_ms)


def test_producer_groups_liveness_and_what_kafka_holds_of_their_checks() -> None:
    pending = [
        PendingRow("t1", "orders", 0, "open", 3, 0, None, None, "", 1, ("o",), ()),
        PendingRow("t2", "orders", 0, "open", 1, 0, None, 5_000, "no secret for group orders", 1, ("o",), ()),
        PendingRow("t3", "billing", 0, "open", 0, 0, None, None, "", 1, ("o",), ()),
    ]
    now = 100_000
    groups = groups_of(
        [
            _registered("live", 99_000),
            _registered("silent", 96_000, interval=1.0),
            _registered("gone", 80_000),
        ],
        pending,
        [],
        now,
        liveness_s=10.0,
    )
    assert [g.group for g in groups] == ["billing", "orders"]
    billing, orders = groups
    assert (billing.instances, billing.pending) == ([], 1)
    assert [(i.instance, i.status) for i in orders.instances] == [
        ("live", "live"),
        ("silent", "silent"),
        ("gone", "gone"),
    ]
    assert (orders.live, orders.pending, orders.checks, orders.not_asked) == (2, 2, 4, 1)
    assert orders.problem == "no secret for group orders"


def test_check_urls_are_shown_without_credentials_query_or_fragment() -> None:
    assert (
        shown_url("https://user:pa55@host.example:8443/check?token=s3cret#x")
        == "https://host.example:8443/check"
    )
    assert shown_url("http://[::1]:8431/txbridge/check") == "http://[::1]:8431/txbridge/check"
    assert shown_url("http://h:notaport/") == "(not a URL)"


def test_sessions_renew_on_sign_in_and_forget_the_idle_and_the_oldest() -> None:
    sessions = Sessions(idle_s=3600, limit=2)
    first = sessions.new()
    assert sessions.get(first.sid) is first
    admin = sessions.renew(first, admin=True)
    assert sessions.get(first.sid) is None  # the id known before sign-in is worth nothing after
    assert admin.admin
    assert admin.csrf != first.csrf
    assert admin.csrf_ok(admin.csrf)
    assert not admin.csrf_ok(None)
    assert not admin.csrf_ok(first.csrf)
    sessions.new()
    sessions.new()
    assert sessions.get(admin.sid) is None  # over the limit: the least recently used went
    idle = Sessions(idle_s=0)
    assert idle.get(idle.new().sid) is None


def test_same_origin_needs_the_origin_or_the_referer_of_the_console() -> None:
    own = "http://127.0.0.1:8480"
    assert same_origin(own, None, own)
    assert same_origin(None, f"{own}/ns/x/transactions?q=1", own)
    assert not same_origin("http://evil.example", f"{own}/", own)  # Origin decides when present
    assert not same_origin("null", None, own)
    assert not same_origin(None, "http://127.0.0.1:8481/", own)
    assert not same_origin(None, None, own)


def test_the_admin_token_comes_from_a_variable_or_a_file_and_is_never_shown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    secret = "a-long-enough-admin-token-value"  # noqa: S105 - a test-only credential
    monkeypatch.setenv("CONSOLE_TOKEN", secret + "\n")
    token = admin_token("CONSOLE_TOKEN", None)
    assert token is not None
    assert token.matches(secret)
    assert not token.matches(secret[:-1])
    file = tmp_path / "token"
    file.write_text(secret)
    from_file = admin_token(None, str(file))
    assert from_file is not None
    assert from_file.matches(secret)
    settings = ConsoleSettings("k:9092", client={"sasl.password": "pw-123"}, admin_token=token)
    assert secret not in repr(settings)
    assert "pw-123" not in repr(settings)
    assert admin_token(None, None) is None

    with pytest.raises(ConfigurationError, match="CONSOLE_MISSING is unset"):
        admin_token("CONSOLE_MISSING", None)
    with pytest.raises(ConfigurationError, match="not both"):
        admin_token("CONSOLE_TOKEN", str(file))
    with pytest.raises(ConfigurationError, match="cannot read it"):
        admin_token(None, str(tmp_path / "absent"))
    monkeypatch.setenv("CONSOLE_SHORT", "short")
    with pytest.raises(ConfigurationError, match="fewer than 16") as raised:
        admin_token("CONSOLE_SHORT", None)
    assert "short" not in str(raised.value)
    assert repr(AdminToken(secret, "$X")) == "AdminToken(from $X, ***)"


def _metrics(
    namespace: str, group: str, buckets: list[tuple[str, int]], seconds: float, failures: dict
) -> str:
    """A coordinator's /metrics text with one group's check requests, as the coordinator serves it."""
    m = "txbridge_coordinator_"
    lines = [f'{m}info{{namespace="{namespace}",group="g",instance_id="c1"}} 1.0']
    lines += [f'{m}check_request_seconds_bucket{{group="{group}",le="{le}"}} {n}' for le, n in buckets]
    lines += [f'{m}check_request_seconds_count{{group="{group}"}} {buckets[-1][1]}']
    lines += [f'{m}check_request_seconds_sum{{group="{group}"}} {seconds}']
    lines += [
        f'{m}check_request_failures_total{{group="{group}",kind="{k}"}} {n}' for k, n in failures.items()
    ]
    lines += [f"{m}checks_total 7.0"]  # not a group's: ignored
    return "\n".join(lines) + "\n"


def test_check_figures_are_summed_over_the_coordinators_by_group() -> None:
    one_ns, one = parse(_metrics(NS, "orders", [("0.01", 2), ("0.1", 3), ("+Inf", 4)], 5.2, {"timeout": 1}))
    _, other = parse(_metrics(NS, "orders", [("0.01", 0), ("0.1", 4), ("+Inf", 4)], 0.2, {"refused": 2}))
    _, refunds = parse(_metrics(NS, "refunds", [("0.01", 1), ("0.1", 1), ("+Inf", 1)], 0.005, {}))

    groups = merge([one, other, refunds])

    assert one_ns == NS
    orders = groups["orders"]
    assert (orders.requests, orders.failed, orders.answered) == (8, 3, 5)
    assert orders.failure_list() == [("timeout", 1), ("refused", 2)]
    assert orders.mean_s == pytest.approx(5.4 / 8)
    assert orders.buckets == {0.01: 2, 0.1: 7, float("inf"): 8}
    # As histogram_quantile: the median is the 4th of 8, interpolated in (0.01, 0.1]; the p99 is
    # in +Inf: the highest finite bound; every request took less than no finite bound.
    assert orders.quantile(0.5) == pytest.approx(0.01 + 0.09 * (4 - 2) / (7 - 2))
    assert orders.quantile(0.99) == 0.1
    assert orders.slowest_below_s is None
    assert (groups["refunds"].failed, groups["refunds"].slowest_below_s) == (0, 0.01)
    assert GroupChecks().quantile(0.5) is None


def test_coordinators_metrics_are_found_on_the_groups_members_or_at_urls_given() -> None:
    members = [Member("c1", "10.0.0.1", (0,)), Member("c2", "fe80::1", (1,)), Member("c3", "", ())]

    assert metrics_urls(("9464", "http://c9:1/metrics"), members) == [
        "http://10.0.0.1:9464/metrics",
        "http://[fe80::1]:9464/metrics",
        "http://c9:1/metrics",
    ]
    settings = ConsoleSettings("b:9092", coordinator_metrics={"": ("9464",), "other": ("https://o/metrics",)})
    assert settings.metrics_of(NS) == ("9464",)
    assert settings.metrics_of("other") == ("https://o/metrics",)
    for wrong in ("0", "99999", "c1:9464", "file:///etc/passwd"):
        with pytest.raises(ConfigurationError, match="neither a TCP port nor an http"):
            ConsoleSettings("b:9092", coordinator_metrics={"": (wrong,)})
    assert coordinator_metrics(("9464", "orders=9465", "orders=http://c:1/metrics?a=b")) == {
        "": ("9464",),
        "orders": ("9465", "http://c:1/metrics?a=b"),
    }
    assert coordinator_metrics(("http://c:1/metrics?a=b",)) == {"": ("http://c:1/metrics?a=b",)}
    with pytest.raises(ConfigurationError, match="NAMESPACE"):
        coordinator_metrics(("orders=",))


def test_a_group_only_the_coordinators_know_of_is_listed_with_its_checks() -> None:
    figures = GroupChecks(requests=3, failures={"refused": 3})
    known = groups_of([], [], [], 0, 10.0)

    (view,) = with_checks(known, {"gone": figures})

    assert (view.group, view.live, view.requests) == ("gone", 0, figures)
