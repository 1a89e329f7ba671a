"""The bench's nodekill step end to end, quick: a secured 3-node cluster of its own, its half/op
leader then its transaction coordinator SIGKILLed under txbridge and native transactions.

It starts its own cluster whatever Kafka the session has (4 to 5 minutes on 2 cores, most of it
the cluster's start and the two nodes' restarts), so it runs under ``make soak``: ``make test``
asserts the same guarantee under the same two kills with tests/secure/test_broker_chaos.py on the
session's cluster, and CI's ``txbridge bench --quick`` runs this step.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from bench import node_kill
from tests.soak import soak_only

pytestmark = [
    pytest.mark.integration,
    pytest.mark.cluster,
    *soak_only("a cluster of its own for 4 to 5 minutes"),
]


def test_nodekill_times_both_paths_and_loses_nothing(tmp_path: Path) -> None:
    (figure,) = node_kill.run(node_kill.OPTIONS["quick"], tmp_path, size=128)

    values, params = figure.values, figure.params
    assert figure.name == "node kill"
    for path in ("txbridge", "native"):
        assert values[f"{path} committed"] > 0
        assert values[f"{path} lost"] == 0, params
        assert values[f"{path} duplicated"] == 0, params
        for kill in ("", " (leader kill)", " (txn coordinator kill)"):
            assert values[f"{path} stall s{kill}"] >= 0
            assert values[f"{path} stall after ack s{kill}"] >= 0
    assert values["txbridge - native s"] == pytest.approx(
        values["txbridge stall s"] - values["native stall s"]
    )
    kills: Any = params["kills"]
    leader_kill, txn_kill = kills
    assert leader_kill["roles"]["half partitions led"] == node_kill.HALF_PARTITIONS
    assert txn_kill["roles"]["native transactional id"] == 1
    # One transactional id per coordinator incarnation (two coordinators): the node killed
    # coordinates at least one of those they commit under.
    assert txn_kill["roles"]["coordinator transactional ids"] >= 1
    # The cluster is stopped and its data gone; the logs stay for a look.
    run = next(tmp_path.glob("nodekill-*"))
    assert not list(run.glob("kafka-cluster/node-*/data"))
    assert list(run.glob("coordinator-*.log"))
