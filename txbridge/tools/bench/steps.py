"""The benchmark's steps, in the order a run takes them (``txbridge bench --only/--skip``).

Apart from :mod:`txbridge.tools.bench.runner` so that the command's options need neither psutil
nor rich.
"""

__all__ = ["STEPS"]

STEPS = (
    "raw",
    "native1",
    "native100",
    "e2e",
    "floor",
    "latency",
    "floor_latency",
    "checks",
    "memory",
    "failover",
    "restart",
    "scaleout",
    "addremove",
    "nodekill",
    "rocketmq",
)
