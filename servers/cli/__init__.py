"""The local servers' commands: ``txbridge kafka``, ``setup``, ``rocketmq`` and ``spark``.

The ``txbridge`` command (:mod:`cli.main`) adds them, and falls back on :func:`local_bootstrap`
when no source names the bootstrap servers.
"""

from servers.cli.kafka import kafka, local_bootstrap, setup
from servers.cli.rocketmq import rocketmq
from servers.cli.spark import spark

__all__ = ["kafka", "local_bootstrap", "rocketmq", "setup", "spark"]
