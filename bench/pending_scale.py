"""Many partitions, many producer groups, many pending transactions.

Per N pending (undecided) transactions, against a real broker and real coordinator processes:

- ``rss_mb`` / ``bytes_per_tx``: the RSS of a coordinator holding them (check delay 1 h, so
  they stay pending; 512-byte payloads, cached within the default budget), less its RSS
  before any was written;
- ``idle_cpu_pct``: its CPU while idle with them pending (the loop's scheduler, gauges and
  commit-boundary passes), over ``idle_s``;
- ``restore_s``: after that coordinator stopped and the group emptied, a second one's time
  from its assignment of every partition to running with all N restored (its log line
  ``restored %d pending transactions in %.3fs``);
- ``checks_per_s``: that second coordinator has a check delay of 0, so all N are due as
  soon as it runs; distinct transactions asked per second by a check server answering
  UNKNOWN to everything (backoff 1 h: each is asked once), from the first to the last.

Run: ``python -m bench.pending_scale --sizes 2500,5000,10000,20000``. ``--tree DIR``
runs the coordinators from another checkout (a ``git worktree`` of another commit), so two
versions of the coordinator are measured side by side in one run.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import threading
import time
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import psutil

from servers.broker import free_port
from servers.coordinator_process import CoordinatorProcess
from txbridge import kafka
from txbridge.topics import init_topics
from txbridge.wire import HalfMessage, ProducerInstance, Topics, half_partition

PARTITIONS = 48
GROUPS = 50
SIZE = 512
_RESTORED = re.compile(r"restored (\d+) pending transactions in ([0-9.]+)s")
_ASSIGNED = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) .*assigned partitions", re.MULTILINE)


@dataclass
class UnknownServer:
    """A back-check endpoint answering UNKNOWN to every transaction; notes when each is first asked."""

    first_asked: dict[str, float] = field(default_factory=dict)
    requests: int = 0
    _server: ThreadingHTTPServer | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def url(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}/check"

    def start(self) -> UnknownServer:
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))))
                ids = [c["tx"] for c in body["checks"]] if "checks" in body else [body["tx"]]
                now = time.time()
                with owner._lock:
                    owner.requests += 1
                    for tx in ids:
                        owner.first_asked.setdefault(tx, now)
                answer = (
                    {"states": dict.fromkeys(ids, "UNKNOWN")} if "checks" in body else {"state": "UNKNOWN"}
                )
                data = json.dumps(answer).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *_args: Any) -> None:
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def close(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()


def write_pending(bootstrap: str, ns: str, count: int, url: str) -> None:
    """Heartbeats of ``GROUPS`` producer groups, then ``count`` one-half transactions spread over
    them and over the partitions, none decided."""
    topics = Topics(ns)
    producer = kafka.producer(bootstrap)
    for g in range(GROUPS):
        beat = ProducerInstance(f"group-{g:02d}", "inst-1", url)
        producer.produce(topics.producers, key=beat.key(), value=beat.encode(), partition=0)
    value = os.urandom(SIZE)
    for i in range(count):
        key = f"key-{i}".encode()
        half = HalfMessage(
            tx_id=uuid.uuid4().hex,
            seq=0,
            topic=f"{ns}-orders",
            value=value,
            key=key,
            group=f"group-{i % GROUPS:02d}",
            instance="inst-1",
            timestamp_ms=int(time.time() * 1000),
        )
        partition = half_partition(key, PARTITIONS)
        while True:
            try:
                producer.produce(
                    topics.half,
                    key=half.record_key(),
                    value=value,
                    headers=list(half.to_headers()),
                    partition=partition,
                )
                break
            except BufferError:
                producer.poll(0.1)
        producer.poll(0)
    if producer.flush(120):
        raise RuntimeError("half records were not acknowledged")


def _metric(port: int, name: str) -> float:
    body = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    match = re.search(rf"^txbridge_coordinator_{name}(?:_total)? ([0-9.e+]+)$", body, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


@contextlib.contextmanager
def _in_tree(tree: Path | None) -> Iterator[None]:
    """Start children from ``tree`` (``python -m coordinator`` imports from the working directory)."""
    if tree is None:
        yield
        return
    before = Path.cwd()
    os.chdir(tree)
    try:
        yield
    finally:
        os.chdir(before)


def _coordinators(
    bootstrap: str, ns: str, secret: str, work: Path, port: int
) -> tuple[CoordinatorProcess, CoordinatorProcess]:
    """The first coordinator, which holds the pending transactions, and the one taking them over."""
    # A group of its own: the default group is shared with every other coordinator on the broker,
    # whose joins would rebalance these ones (and restore them again) mid-measurement.
    group = ("--group-id", f"{ns}-coordinators")
    first = CoordinatorProcess(
        bootstrap,
        ns,
        secret=secret,
        log_path=work / f"{ns}-a.log",
        args=("--check-delay", "3600", "--metrics-port", str(port), "--log-interval", "3600", *group),
        instance_id="pscale-a",
    )
    second = CoordinatorProcess(
        bootstrap,
        ns,
        secret=secret,
        log_path=work / f"{ns}-b.log",
        args=(
            "--check-delay", "0", "--check-backoff", "3600", "--check-backoff-max", "3600",
            "--producer-liveness", "3600", "--log-interval", "3600", *group,
        ),
        instance_id="pscale-b",
    )  # fmt: skip
    return first, second


def _measure_holding(
    first: CoordinatorProcess,
    *,
    bootstrap: str,
    ns: str,
    count: int,
    check_url: str,
    port: int,
    idle_s: float,
    out: dict[str, float],
) -> None:
    """The first coordinator's memory for ``count`` pending transactions and its idle CPU."""
    first.wait_ready(120)
    time.sleep(2.0)
    base = first.rss_bytes()
    write_pending(bootstrap, ns, count, check_url)
    deadline = time.monotonic() + 600
    while _metric(port, "pending_transactions") < count:
        if time.monotonic() > deadline:
            raise RuntimeError(f"only {_metric(port, 'pending_transactions'):.0f} of {count} pending")
        time.sleep(0.5)
    time.sleep(3.0)  # the commit that persists them, and the payloads settle
    rss = first.rss_bytes()
    out["rss_mb"] = rss / 2**20
    out["bytes_per_tx"] = (rss - base) / count
    assert first.pid is not None
    proc = psutil.Process(first.pid)
    cpu0, t0 = sum(proc.cpu_times()[:2]), time.monotonic()
    time.sleep(idle_s)
    out["idle_cpu_pct"] = 100 * (sum(proc.cpu_times()[:2]) - cpu0) / (time.monotonic() - t0)


def _measure_takeover(
    second: CoordinatorProcess, server: UnknownServer, count: int, out: dict[str, float]
) -> None:
    """The second coordinator's restore, from its log, and how fast it checks every transaction."""
    second.wait_ready(300)
    log = second.log_path.read_text(errors="replace")
    restored, seconds = _RESTORED.findall(log)[-1]
    out["assignments"] = float(len(_ASSIGNED.findall(log)))
    stamp, millis = _ASSIGNED.findall(log)[0]
    running = time.mktime(time.strptime(stamp, "%Y-%m-%d %H:%M:%S")) + int(millis) / 1000
    out["restored"] = float(restored)
    out["restore_s"] = float(seconds)
    deadline = time.monotonic() + 600
    while len(server.first_asked) < count and time.monotonic() < deadline:
        time.sleep(0.2)
    asked = sorted(server.first_asked.values())
    out["asked"] = float(len(asked))
    span = asked[-1] - running if asked else 0.0
    out["checks_span_s"] = span  # from running to the last first check
    out["checks_per_s"] = len(asked) / span if span else 0.0
    out["requests"] = float(server.requests)


def measure(bootstrap: str, count: int, work: Path, tree: Path | None, idle_s: float) -> dict[str, float]:
    """One measurement at ``count`` pending transactions: a coordinator holds them, another takes over."""
    ns = f"__txb_pscale_{uuid.uuid4().hex[:6]}_{count}"
    init_topics(bootstrap, ns, PARTITIONS)
    secret = os.urandom(16).hex()
    server = UnknownServer().start()
    out: dict[str, float] = {"n": float(count)}
    port = free_port()
    first, second = _coordinators(bootstrap, ns, secret, work, port)
    try:
        with _in_tree(tree):
            first.start()
        _measure_holding(
            first,
            bootstrap=bootstrap,
            ns=ns,
            count=count,
            check_url=server.url,
            port=port,
            idle_s=idle_s,
            out=out,
        )
        first.stop(60)
        time.sleep(8.0)  # the static member's session times out: the group is empty
        with _in_tree(tree):
            second.start()
        _measure_takeover(second, server, count, out)
    finally:
        first.stop(60)
        second.stop(60)
        server.close()
        with contextlib.suppress(Exception):
            kafka.delete_topics_with_prefix(bootstrap, ns)
    return out


COLUMNS = (
    "n",
    "rss_mb",
    "bytes_per_tx",
    "idle_cpu_pct",
    "restored",
    "restore_s",
    "asked",
    "checks_per_s",
    "checks_span_s",
    "assignments",
)


def table(rows: list[dict[str, float]], label: str) -> str:
    lines = [f"## {label}", " | ".join(COLUMNS)]
    for row in rows:
        whole = ("n", "restored", "asked", "bytes_per_tx")
        lines.append(" | ".join(f"{row.get(c, float('nan')):.{0 if c in whole else 2}f}" for c in COLUMNS))
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--bootstrap", default=os.environ.get("KAFKA_BOOTSTRAP_SERVERS", "127.0.0.1:9092"))
    parser.add_argument("--sizes", default="2500,5000,10000,20000")
    parser.add_argument("--tree", type=Path, action="append", default=[], help="LABEL=DIR (repeatable)")
    parser.add_argument("--idle-s", type=float, default=10.0)
    parser.add_argument("--work", type=Path, default=Path(".cache/pending-scale"))
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    trees: list[tuple[str, Path | None]] = [("this tree", None)]
    for spec in args.tree:
        label, _, path = str(spec).partition("=")
        trees.append((label, Path(path).resolve()))
    results: dict[str, list[dict[str, float]]] = {label: [] for label, _ in trees}
    for count in sizes:  # interleaved, so both trees see the same machine load
        for label, tree in trees:
            row = measure(args.bootstrap, count, args.work.resolve(), tree, args.idle_s)
            results[label].append(row)
            print(label, json.dumps(row), flush=True)
    for label, rows in results.items():
        print(table(rows, label))


if __name__ == "__main__":
    main()
