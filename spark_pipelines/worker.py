"""A producer process of one path: ``python -m spark_pipelines.worker RUN_DIR PATH START``.

Once its path's producer has started it says ``{"ready": true}`` and waits for ``go T`` on
stdin, T being the wall time the run began: the paths of a run begin together (a native
producer's ``init_transactions`` on a freshly started broker can wait seconds for its
transaction coordinator to load, and a path that began meanwhile would be measured alone on
a broker still warming up). Then it handles the plan's orders from index START, order i not
before T + i / rate when the run is paced (``RunConfig.rate``), so every path's order i meets
the same moment of the run, and reports each on stdout as a JSON line
(``{"order": i, "outcome": ...}``). At a planned crash point it says
``{"crash": i, "stage": ...}`` and waits to be SIGKILLed by the runner. After
the last order it says ``{"done": true}`` and stays up (a txbridge producer
answers back-checks) until its stdin closes. ``--command-config FILE`` and
``-X KEY=VALUE`` give it the cluster's client settings, as the parent got them.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import time
from pathlib import Path
from typing import NoReturn

from spark_pipelines.faults import FaultPlan
from spark_pipelines.workload import RunConfig, make_path
from txbridge.client_config import ClientConfig

logger = logging.getLogger(__name__)


def _say(**message: object) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def run(run_dir: Path, path_name: str, start: int, client: ClientConfig | None = None) -> None:
    config = RunConfig.load(run_dir)
    plan = FaultPlan.from_json(config.plan_file.read_text())
    path = make_path(config, path_name, client=client)
    path.start()
    current = start

    def crash(stage: str) -> NoReturn:
        _say(crash=current, stage=stage)
        while True:  # the runner kills this process now
            time.sleep(60)

    try:
        _say(ready=True)
        go = sys.stdin.readline().split()
        if not go:  # the runner is gone
            return
        began = float(go[1])
        for order in plan.orders[start:]:
            current = order.index
            if config.rate > 0:
                early = began + order.index / config.rate - time.time()
                if early > 0:
                    time.sleep(early)
            outcome = path.handle(order, crash)
            _say(order=order.index, outcome=outcome)
        _say(done=True)
        sys.stdin.read()  # until the runner closes our stdin
    finally:
        path.close()


def main() -> None:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr, format="%(asctime)s %(name)s: %(message)s")
    parser = argparse.ArgumentParser(prog="python -m spark_pipelines.worker")
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("path")
    parser.add_argument("start", type=int)
    parser.add_argument("--command-config", default=None)
    parser.add_argument("-X", dest="overrides", action="append", default=[])
    args = parser.parse_args()
    client = ClientConfig.load(args.command_config, args.overrides)
    run(args.run_dir, args.path, args.start, client)


if __name__ == "__main__":
    main()
