"""A restarted coordinator's start-up imports only what serving needs (issue 16).

Every import before the coordinator serves is downtime after a crash: on the demo's busy two
cores the restarted process took 1.4 s to start, most of it the interpreter and its imports.
httpx (with the rich and click its command line pulls in) is imported by the checker in the
background once the coordinator starts, beside its Kafka round trips, and prometheus_client only
with a metrics port; imported up front they were ~40% of the import time.
"""

from __future__ import annotations

import json
import subprocess
import sys

LATE = ("httpx", "prometheus_client", "rich")


def test_starting_a_coordinator_imports_neither_http_client_nor_metrics() -> None:
    code = (
        "import json, sys\n"
        "import coordinator.cli, coordinator.service\n"
        f"print(json.dumps(sorted(m for m in {LATE!r} if m in sys.modules)))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == []
