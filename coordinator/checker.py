"""Signed HTTP back-checks, with bounded concurrency per producer group.

Jobs run on a thread pool; the loop submits them and drains results, so a slow
or dead group occupies at most ``concurrency_per_group`` workers and never the
loop. Only an explicit, well-formed verdict counts (DTM #535); everything else,
including refused URLs, is UNKNOWN.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import httpx

from coordinator.config import CoordinatorConfig
from txbridge.wire import SIGNATURE_HEADER, CheckRequest, TxState, decode_check_answer, sign

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class CheckJob:
    """One back-check: the request plus where to send it (targets in order of preference)."""

    partition: int
    request: CheckRequest
    targets: tuple[str, ...]


@dataclass(frozen=True)
class CheckResult:
    job: CheckJob
    state: TxState
    detail: str  # which URL answered, or why nothing did
    refused: int = 0  # targets refused by the host allow-list


class Checker:
    """Runs :class:`CheckJob` s. ``transport`` is for tests (httpx.MockTransport)."""

    def __init__(self, config: CoordinatorConfig, transport: httpx.BaseTransport | None = None) -> None:
        self._config = config
        self._transport = transport
        self._client: httpx.Client | None = None
        self._pool: ThreadPoolExecutor | None = None
        self._results: queue.SimpleQueue[CheckResult] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._in_flight: Counter[str] = Counter()
        self.in_flight_txs: set[str] = set()

    def start(self) -> None:
        workers = max(4, min(64, self._config.check_concurrency_per_group * 4))
        self._client = httpx.Client(
            timeout=self._config.check_timeout_s, transport=self._transport, follow_redirects=False
        )
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="txbridge-check")

    def submit(self, job: CheckJob) -> bool:
        """Start ``job`` unless its group already has its share in flight. Returns whether it started."""
        group = job.request.group
        with self._lock:
            if self._in_flight[group] >= self._config.check_concurrency_per_group:
                return False
            self._in_flight[group] += 1
            self.in_flight_txs.add(job.request.tx_id)
        assert self._pool is not None, "Checker.start() first"
        self._pool.submit(self._run, job)
        return True

    def results(self) -> list[CheckResult]:
        """Results that arrived since the last call."""
        out = []
        while True:
            try:
                out.append(self._results.get_nowait())
            except queue.Empty:
                return out

    def _run(self, job: CheckJob) -> None:
        try:
            result = self.check(job)
        except Exception as exc:  # a bug here must not lose the job: it becomes UNKNOWN
            logger.exception("back-check of tx %s failed", job.request.tx_id)
            result = CheckResult(job, TxState.UNKNOWN, f"internal error: {type(exc).__name__}")
        # Queue the result before clearing in-flight, so the loop never re-checks a tx in between.
        self._results.put(result)
        with self._lock:
            self._in_flight[job.request.group] -= 1
            self.in_flight_txs.discard(job.request.tx_id)

    def check(self, job: CheckJob) -> CheckResult:
        """Try the targets in order; the first COMMIT or ROLLBACK wins, else UNKNOWN."""
        if not job.targets:
            return CheckResult(job, TxState.UNKNOWN, f"no live instance of group {job.request.group!r}")
        secret = self._config.secrets.for_group(job.request.group)
        if secret is None:
            logger.warning("no secret for producer group %r: back-checks cannot be signed", job.request.group)
            return CheckResult(job, TxState.UNKNOWN, "no secret configured for the group")
        body = job.request.encode()
        refused = 0
        details = []
        for url in job.targets:
            if not self._config.host_allowed(url):
                refused += 1
                logger.warning("check URL %s refused: its host is not in allowed_check_hosts", url)
                details.append(f"{url}: host not allowed")
                continue
            state, detail = self._post(url, body, secret)
            details.append(f"{url}: {detail}")
            if state is not TxState.UNKNOWN:
                return CheckResult(job, state, url, refused)
        return CheckResult(job, TxState.UNKNOWN, "; ".join(details), refused)

    def _post(self, url: str, body: bytes, secret: bytes) -> tuple[TxState, str]:
        assert self._client is not None, "Checker.start() first"
        headers = {"Content-Type": "application/json", SIGNATURE_HEADER: sign(secret, body)}
        try:
            response = self._client.post(url, content=body, headers=headers)
        except httpx.HTTPError as exc:
            return TxState.UNKNOWN, f"{type(exc).__name__}"
        state = decode_check_answer(response.status_code, response.content)
        return state, f"HTTP {response.status_code} -> {state.value}"

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        if self._client is not None:
            self._client.close()
            self._client = None
