"""Signed HTTP back-checks, batched, with bounded concurrency per producer group.

Jobs run on a thread pool; the loop submits them (up to ``check_batch_size``
transactions of one group and writer per request) and drains results, so a slow
or dead group occupies at most ``concurrency_per_group`` workers and never the
loop. Only an explicit, well-formed verdict counts (DTM #535); everything else is
UNKNOWN. A check that reached no producer (no live instance, no secret, every URL
refused by the allow-list or refusing the connection) is not an answer at all.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

from coordinator.commit import tracing
from coordinator.config import CoordinatorConfig
from coordinator.monitoring.metrics import Histogram, LabelledCounter
from txbridge.wire import (
    SIGNATURE_HEADER,
    CheckBatch,
    CheckRequest,
    TxState,
    decode_check_answer,
    decode_check_batch_answer,
    sign,
)

if TYPE_CHECKING:
    import httpx  # imported at the first check: it and what it pulls in (rich, click) slow a restart

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class CheckJob:
    """One back-check: the request plus where to send it (targets in order of preference)."""

    partition: int
    request: CheckRequest
    targets: tuple[str, ...]


@dataclass(frozen=True)
class CheckResult:
    """How one transaction's back-check ended.

    ``asked`` is False when no request reached a producer (no live instance of the
    group, no secret for it, every URL refused by ``allowed_check_hosts``, refusing the
    connection, as a killed instance's does until its liveness runs out, or dropping it without
    a response, as an instance killed while it handled the check does): a configuration
    problem or a group that is down or restarting, not an answer, so it does not use up
    the transaction's ``max_checks``, and it is asked again soon (0.5 s, then as long again
    as it has waited, up to ``check_backoff_s``) instead of a growing backoff.
    """

    job: CheckJob
    state: TxState
    detail: str  # which URL answered, or why nothing did
    refused: int = 0  # targets refused by the host allow-list
    asked: bool = True


class Checker:
    """Runs :class:`CheckJob` s, many per request. ``transport`` is for tests (httpx.MockTransport).

    ``now_s`` is the clock of the signatures' timestamps: the brokers' clock as the coordinator
    estimates it (:class:`coordinator.checks.broker_clock.BrokerClock`), which the producers' hosts
    share more likely than the coordinator's own wall clock does; producers refuse a signature
    more than their tolerance (5 minutes by default) off their clock.
    """

    def __init__(
        self,
        config: CoordinatorConfig,
        transport: httpx.BaseTransport | None = None,
        *,
        now_s: Callable[[], float] = time.time,
    ) -> None:
        self._config = config
        self._transport = transport
        self._now_s = now_s
        self._client: httpx.Client | None = None  # made by start(), in the background (_http)
        self._client_lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        self._results: queue.SimpleQueue[CheckResult] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._in_flight: Counter[str] = Counter()
        self._single_only: set[str] = set()  # URLs that answered a batch with 400
        self._reported: set[tuple[str, str]] = set()  # (group, problem) already logged at ERROR
        self.in_flight_txs: set[str] = set()
        #: Every back-check request's time, answered or failed, by producer group (the checker's
        #: threads observe it). A group is a label once a request was sent to it: it had a live
        #: instance and a secret, so the groups are the operator's few, not any a half names.
        self.latency = Histogram(
            "check_request_seconds",
            "back-check HTTP requests: time to the answer or the failure",
            label="group",
        )
        #: The requests of :attr:`latency` that got no answer, by group and :func:`failure_kind`.
        self.failures = LabelledCounter(
            "check_request_failures",
            "back-check HTTP requests that got no answer: timeout, refused (no connection), dropped "
            "(closed without a response), http_error (a status other than 200), error (another)",
            ("group", "kind"),
        )
        self._spans = tracing.spans_for(config.tracing)

    def start(self) -> None:
        workers = max(4, min(64, self._config.check_concurrency_per_group * 4))
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="txbridge-check")
        # httpx is imported beside the start-up (which mostly waits for Kafka), neither in its way
        # nor at the first check, which would wait for it.
        self._pool.submit(self._http)

    def free_slots(self, group: str) -> int:
        """How many more requests ``group`` may have in flight now (``check_concurrency_per_group``).

        Only the caller's own submissions take slots, so a pass may plan that many at once.
        """
        with self._lock:
            return max(0, self._config.check_concurrency_per_group - self._in_flight[group])

    def submit(self, job: CheckJob) -> bool:
        """Start ``job`` unless its group already has its share in flight. Returns whether it started."""
        return self.submit_batch([job])

    def submit_batch(self, jobs: list[CheckJob]) -> bool:
        """Start one request about ``jobs`` (one group, the same targets) unless the group is at
        its concurrency limit. Returns whether it started."""
        group = jobs[0].request.group
        with self._lock:
            if self._in_flight[group] >= self._config.check_concurrency_per_group:
                return False
            self._in_flight[group] += 1
            self.in_flight_txs.update(j.request.tx_id for j in jobs)
        assert self._pool is not None, "Checker.start() first"
        self._pool.submit(self._run, jobs)
        return True

    def results(self) -> list[CheckResult]:
        """Results that arrived since the last call.

        A transaction stays in :attr:`in_flight_txs` until its result is taken here, so the
        loop never asks about a transaction whose answer it has not applied yet.
        """
        out = []
        while True:
            try:
                out.append(self._results.get_nowait())
            except queue.Empty:
                break
        if out:
            with self._lock:
                self.in_flight_txs.difference_update(r.job.request.tx_id for r in out)
        return out

    def _run(self, jobs: list[CheckJob]) -> None:
        try:
            results = self._spans.checked(jobs, self.check_batch)
        except Exception as exc:  # a bug here must not lose the jobs: they become UNKNOWN
            logger.exception("back-check of %d transactions failed", len(jobs))
            results = [CheckResult(j, TxState.UNKNOWN, f"internal error: {type(exc).__name__}") for j in jobs]
        for result in results:
            self._results.put(result)
        with self._lock:  # the request slot is free now; the tx ids leave in_flight_txs in results()
            self._in_flight[jobs[0].request.group] -= 1

    def check(self, job: CheckJob) -> CheckResult:
        """Try the targets in order; the first COMMIT or ROLLBACK wins, else UNKNOWN."""
        return self.check_batch([job])[0]

    def check_batch(self, jobs: list[CheckJob]) -> list[CheckResult]:
        """Ask the targets in order about the transactions still undecided; one result per job.

        Every job must have the same group and targets (the coordinator batches by writer).
        """
        first = jobs[0]
        group = first.request.group
        if not first.targets:
            why = f"no live instance of producer group {group!r} is registered"
            self._report(
                group,
                "no live instance",
                "%s: its transactions wait, not counted toward max_checks, until an instance "
                "heartbeats to the producer registry (is the group down, or on another namespace?)",
                why,
            )
            return self._not_asked(jobs, why)
        secret = self._config.secrets.for_group(group)
        if secret is None:
            why = f"no secret configured for producer group {group!r}"
            self._report(
                group,
                "no secret",
                "%s: back-checks cannot be signed; set TXBRIDGE_SECRETS=%s=<secret> "
                "(or TXBRIDGE_DEFAULT_SECRET, or [coordinator.secrets] in the TOML)",
                why,
                group,
            )
            return self._not_asked(jobs, why)
        remaining = list(jobs)
        results: list[CheckResult] = []
        refused = unreachable = 0
        details: list[str] = []
        for url in first.targets:
            if not self._config.host_allowed(url):
                refused += 1
                self._report(
                    group,
                    url,
                    "check URL %s of producer group %r refused: its host is not in allowed_check_hosts "
                    "(%s); add it there (TXBRIDGE_ALLOWED_CHECK_HOSTS) to let the coordinator check it",
                    url,
                    group,
                    ", ".join(self._config.allowed_check_hosts),
                )
                details.append(f"{url}: host not in allowed_check_hosts")
                continue
            states, detail, reached = self._ask(url, remaining, secret)
            details.append(f"{url}: {detail}")
            if not reached:
                unreachable += 1
                self._report(
                    group,
                    url,
                    "check URL %s of producer group %r gave no answer (%s: refused, or dropped "
                    "without a response): the check is asked again soon. Normal for a moment while "
                    "an instance restarts or is killed; if it lasts, the instance advertises a URL "
                    "it does not serve",
                    url,
                    group,
                    detail,
                    level=logging.WARNING,
                )
            undecided = []
            for job in remaining:
                state = states[job.request.tx_id]
                if state is TxState.UNKNOWN:
                    undecided.append(job)
                else:
                    results.append(CheckResult(job, state, url, refused))
            remaining = undecided
            if not remaining:
                return results
        why = "; ".join(details)
        if refused + unreachable == len(first.targets):  # no request reached a producer
            return self._not_asked(remaining, why, refused)
        return results + [CheckResult(j, TxState.UNKNOWN, why, refused) for j in remaining]

    @staticmethod
    def _not_asked(jobs: list[CheckJob], why: str, refused: int = 0) -> list[CheckResult]:
        return [CheckResult(j, TxState.UNKNOWN, why, refused, asked=False) for j in jobs]

    def _report(
        self, group: str, problem: str, message: str, *args: object, level: int = logging.ERROR
    ) -> None:
        """Log a check that could not be made, once per group and problem (or URL)."""
        with self._lock:
            if (group, problem) in self._reported:
                return
            self._reported.add((group, problem))
        logger.log(level, message, *args)

    def _ask(self, url: str, jobs: list[CheckJob], secret: bytes) -> tuple[dict[str, TxState], str, bool]:
        """The states ``url`` answered, a detail, and whether any answer came from it.

        A request that could not connect (``httpx.ConnectError``: refused, unreachable, a failed
        TLS handshake) was never seen by a producer, and one whose connection the producer
        dropped without any response (:func:`_dropped`: it died or was killed while the check
        ran) got nothing back: neither is an answer. A producer that answered badly or not in
        time (an error status, garbage, a timeout) did answer: UNKNOWN.
        """
        import httpx

        if len(jobs) == 1 or url in self._single_only:
            return self._ask_one_by_one(url, jobs, secret)
        batch = CheckBatch(jobs[0].request.group, tuple(j.request for j in jobs))
        try:
            response = self._post(url, batch.encode(), secret, batch.group, batch=True)
        except httpx.HTTPError as exc:
            states = dict.fromkeys((j.request.tx_id for j in jobs), TxState.UNKNOWN)
            return states, type(exc).__name__, not _dropped(exc)
        if response.status_code == 400:
            # A producer that predates batches reads the batch as a malformed single check.
            logger.info("check URL %s refused a batch (HTTP 400): asking it one transaction at a time", url)
            with self._lock:
                self._single_only.add(url)
            return self._ask_one_by_one(url, jobs, secret)
        states = decode_check_batch_answer(
            response.status_code, response.content, (j.request.tx_id for j in jobs)
        )
        decided = sum(s is TxState.COMMIT or s is TxState.ROLLBACK for s in states.values())
        return states, f"HTTP {response.status_code}, {decided} of {len(jobs)} decided", True

    def _ask_one_by_one(
        self, url: str, jobs: list[CheckJob], secret: bytes
    ) -> tuple[dict[str, TxState], str, bool]:
        import httpx

        states: dict[str, TxState] = {}
        detail = ""
        reached = False
        for job in jobs:
            try:
                response = self._post(url, job.request.encode(), secret, job.request.group)
            except httpx.HTTPError as exc:
                states[job.request.tx_id], detail = TxState.UNKNOWN, type(exc).__name__
                reached |= not _dropped(exc)
                continue
            reached = True
            state = decode_check_answer(response.status_code, response.content)
            states[job.request.tx_id], detail = state, f"HTTP {response.status_code} -> {state.value}"
        return states, detail, reached

    def _post(
        self, url: str, body: bytes, secret: bytes, group: str, *, batch: bool = False
    ) -> httpx.Response:
        """POST a check; its time and any failure counted for ``group`` (a batch's 400 is not a
        failure: a producer that predates batches, asked again one by one)."""
        assert self._pool is not None, "Checker.start() first"
        headers = {
            "Content-Type": "application/json",
            SIGNATURE_HEADER: sign(secret, body, now=self._now_s()),
        }
        client = self._http()
        started = time.monotonic()
        try:
            response = client.post(url, content=body, headers=headers)
        except Exception as exc:
            self.latency.observe(time.monotonic() - started, group)
            self.failures.inc(group, failure_kind(exc))
            raise
        self.latency.observe(time.monotonic() - started, group)
        if response.status_code != 200 and not (batch and response.status_code == 400):
            self.failures.inc(group, "http_error")
        return response

    def _http(self) -> httpx.Client:
        with self._client_lock:  # not self._lock: the loop's free_slots() must not wait for an import
            if self._client is None:
                import httpx

                from coordinator.checks.http_deadline import DeadlineTransport

                # httpx's timeout is per phase and per read: the transport bounds the whole request.
                timeout = self._config.check_timeout_s
                transport = self._transport or DeadlineTransport(timeout)
                self._client = httpx.Client(timeout=timeout, transport=transport, follow_redirects=False)
            return self._client

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        with self._client_lock:
            client, self._client = self._client, None
        if client is not None:
            client.close()


def failure_kind(exc: Exception) -> str:
    """What kind of failure a check request's exception is, for the ``kind`` label."""
    import httpx

    if isinstance(exc, httpx.TimeoutException):
        return "timeout"
    if isinstance(exc, httpx.ConnectError):
        return "refused"
    if _dropped(exc):
        return "dropped"
    return "error"


def _dropped(exc: Exception) -> bool:
    """True for a check request that no producer answered at all: the connection was never made,
    or the producer closed or reset it without a response, as a process killed while it handled
    the check does (in the demo its replacement answered a second later, where an UNKNOWN answer
    would have waited out ``check_backoff_s`` with the orders of that key behind it)."""
    import httpx

    if isinstance(exc, httpx.ConnectError | httpx.ReadError | httpx.WriteError):
        return True
    return isinstance(exc, httpx.RemoteProtocolError) and "without sending a response" in str(exc)
