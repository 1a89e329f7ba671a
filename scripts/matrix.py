"""make matrix: the exactly-once black-box tests on each version docs/local-servers.md lists.

A case is a Kafka broker version (``TXBRIDGE_KAFKA_VERSION``: the local broker runs that
version's Maven Central jars, fetched once into ``.cache/jars/kafka-<version>``; each session
formats its own data directory) or a set of Python packages (a scratch venv in
``.cache/matrix/<case>``, built from constraints.txt with those packages swapped). Each case runs
pytest on the transaction black-box tests, in one process, and the end is one line per case.

``--scope full`` (make matrix) runs every test of BLACK_BOX on every case; ``--scope ci``
(.ci/run) runs one short test of each kind on the oldest and newest of each.

Usage: python scripts/matrix.py [--scope full|ci] [--cases name,...] [--list]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MATRIX_HOME = ROOT / ".cache" / "matrix"

# What the matrix proves: a transaction's messages reach a read_committed consumer exactly once
# (the producer SDK, the coordinator's back-check, the Spark sink end to end).
PRODUCER = "tests/producer/test_send.py"
COORDINATOR = "tests/coordinator/test_with_sdk.py"
SPARK_SINK = "tests/spark_sink/test_spark_sink.py"
BLACK_BOX = (PRODUCER, COORDINATOR, SPARK_SINK)
# --scope ci: one short test per kind.
SHORT_COORDINATOR = f"{COORDINATOR}::test_sdk_transactions_through_the_coordinator"
SHORT_SPARK_SINK = (
    f"{SPARK_SINK}::test_batch_write_publishes_every_row_once_with_key_order_headers_and_topics"
)

# The ends of each range (docs/local-servers.md, "Versions and why"). A new release: change
# the newest here and in the docs, then run make matrix.
KAFKA_OLDEST, KAFKA_LAST_3X, KAFKA_NEWEST = "3.7.2", "3.9.2", "4.4.0"
PYSPARK_OLDEST, PYSPARK_NEWEST = "4.0.0", "4.3.0"
CONFLUENT_OLDEST, CONFLUENT_NEWEST = "2.6.0", "2.16.1"
# The pyspark versions whose Kafka source jars Maven Central serves (jars.SPARK_KAFKA_SERVED);
# beside another, the tests that read Kafka through Spark skip, the sink's others run.
SPARK_KAFKA_SERVED = ("4.0.0", "4.1.1", "4.2.0")
# pyspark pins its py4j exactly: it goes with pyspark, not with the lock.
_FOLLOWS_PYSPARK = ("py4j",)


@dataclass(frozen=True)
class Case:
    name: str
    kafka: str | None = None  # None: the default broker (jars.KAFKA_VERSION)
    packages: dict[str, str] = field(default_factory=dict)  # None of them: the checkout's .venv
    full: tuple[str, ...] = BLACK_BOX
    short: tuple[str, ...] = (SHORT_COORDINATOR,)
    in_ci: bool = False


CASES = (
    Case(f"kafka-{KAFKA_OLDEST}", kafka=KAFKA_OLDEST, in_ci=True),
    Case(f"kafka-{KAFKA_LAST_3X}", kafka=KAFKA_LAST_3X),
    Case(f"kafka-{KAFKA_NEWEST}", kafka=KAFKA_NEWEST, in_ci=True),
    # The two ends of the Python clients, the oldest together and the newest together.
    Case(
        "oldest-clients",
        packages={"pyspark": PYSPARK_OLDEST, "confluent-kafka": CONFLUENT_OLDEST},
        short=(SHORT_COORDINATOR, SHORT_SPARK_SINK),
        in_ci=True,
    ),
    Case(
        "newest-clients",
        packages={"pyspark": PYSPARK_NEWEST, "confluent-kafka": CONFLUENT_NEWEST},
        short=(SHORT_COORDINATOR, SHORT_SPARK_SINK),
        in_ci=True,
    ),
)


def _constraints(packages: dict[str, str]) -> str:
    """constraints.txt with ``packages`` (and what follows pyspark) swapped in."""
    swapped = {_norm(name) for name in packages}
    if "pyspark" in swapped:
        swapped.update(_FOLLOWS_PYSPARK)
    lines = []
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        name = re.split(r"[=<>~! @\[]", line.strip(), maxsplit=1)[0]
        if line.startswith("#") or _norm(name) not in swapped:
            lines.append(line)
    lines.extend(f"{name}=={version}" for name, version in sorted(packages.items()))
    return "\n".join(lines) + "\n"


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _python(case: Case) -> Path:
    """The interpreter of ``case``: the checkout's venv, or a scratch one built once per constraint set."""
    if not case.packages:
        return ROOT / ".venv" / "bin" / "python"
    home = MATRIX_HOME / case.name
    constraints = _constraints(case.packages)
    digest = hashlib.sha256((constraints + (ROOT / "pyproject.toml").read_text()).encode()).hexdigest()
    python, stamp = home / "venv" / "bin" / "python", home / "installed"
    if stamp.is_file() and stamp.read_text() == digest and python.is_file():
        return python
    home.mkdir(parents=True, exist_ok=True)
    (home / "constraints.txt").write_text(constraints)
    started = time.monotonic()
    print(f"matrix: {case.name}: building {home / 'venv'} with {case.packages}", flush=True)
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(home / "venv")], check=True)
    pip = [str(python), "-m", "pip", "install", "-q", "-c", str(home / "constraints.txt")]
    subprocess.run([*pip, "--upgrade", "pip"], check=True)
    subprocess.run([*pip, "-e", f"{ROOT}[test]"], check=True, cwd=ROOT)
    stamp.write_text(digest)
    print(f"matrix: {case.name}: venv built in {time.monotonic() - started:.0f}s", flush=True)
    return python


def _installed(python: Path) -> str:
    probe = (
        "import importlib.metadata as m; "
        "print(', '.join(f'{p} {m.version(p)}' for p in ('pyspark', 'confluent-kafka')))"
    )
    result = subprocess.run([str(python), "-c", probe], capture_output=True, text=True, check=True)
    return result.stdout.strip()


def _summary(output: str) -> str:
    """pytest's last line (``3 passed, 1 skipped in 40.1s``)."""
    counts = re.compile(r"\d+ (passed|failed|error)")
    lines = [line.strip("= ") for line in output.splitlines() if counts.search(line)]
    return lines[-1] if lines else "no pytest summary (see above)"


def run_case(case: Case, scope: str, extra: list[str]) -> tuple[bool, str]:
    python = _python(case)
    kafka = case.kafka or "default"
    env = {k: v for k, v in os.environ.items() if k != "KAFKA_BOOTSTRAP_SERVERS"}
    env["TXBRIDGE_TEST_DOCKER"] = "0"  # the local broker, of the version asked for
    if case.kafka:
        env["TXBRIDGE_KAFKA_VERSION"] = case.kafka
    pyspark = case.packages.get("pyspark")
    if pyspark and pyspark not in SPARK_KAFKA_SERVED:
        env["TXBRIDGE_TEST_SPARK_KAFKA_SOURCE"] = "0"
    tests = case.full if scope == "full" else case.short
    versions = f"kafka {kafka}; {_installed(python)}"
    print(f"\nmatrix: {case.name} ({versions}): {' '.join(tests)}", flush=True)
    started = time.monotonic()
    result = subprocess.run(
        [str(python), "-m", "pytest", *tests, "-n", "0", "-q", "-p", "no:cacheprovider", *extra],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        check=False,
    )
    sys.stdout.write(result.stdout)
    line = f"{case.name}: {versions}: {_summary(result.stdout)} ({time.monotonic() - started:.0f}s)"
    return result.returncode == 0, line


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--scope", choices=["full", "ci"], default="full")
    parser.add_argument("--cases", default="", help="comma-separated case names (default: the scope's)")
    parser.add_argument("--list", action="store_true", help="print the cases and exit")
    args, extra = parser.parse_known_args()
    cases = [c for c in CASES if args.scope == "full" or c.in_ci]
    if args.cases:
        wanted = set(args.cases.split(","))
        unknown = wanted - {c.name for c in CASES}
        if unknown:
            parser.error(f"unknown cases {sorted(unknown)}; the cases: {[c.name for c in CASES]}")
        cases = [c for c in CASES if c.name in wanted]
    if args.list:
        for case in cases:
            print(case.name, case.kafka or "default", case.packages)
        return 0
    lines, ok = [], True
    for case in cases:
        passed, line = run_case(case, args.scope, extra)
        ok = ok and passed
        lines.append(("PASS " if passed else "FAIL ") + line)
    print("\nmatrix: one line per case")
    print("\n".join(lines))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
