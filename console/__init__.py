"""The txbridge web console (``txbridge console``): one cluster, every namespace on it.

Server-rendered pages over what the cluster holds: each namespace's health (its coordinators,
who owns which partition, half and op lag, the oldest pending transaction), its transactions
(pending, expired, quarantined, searchable), its producer groups; and the admin actions
(resolve, requeue, re-drive) through the SDK's exactly-once admin path, the one
``txbridge admin`` takes. Read-only without an admin token. It imports only the SDK
(``txbridge``, and Kafka through ``txbridge.kafka``): a process of its own, it stays up when
coordinators do not (docs/console.md).

Parts: :mod:`console.settings` (what one console serves), :mod:`console.health`,
:mod:`console.transactions`, :mod:`console.producers` (each page's rows, pure where they can
be), :mod:`console.actions`, :mod:`console.security` (sessions, sign-in, CSRF) and
:mod:`console.app` (the Starlette app and its routes); its command is :mod:`console.cli`.

The public names load on first use (PEP 562), so that the ``txbridge`` command lists
``console`` without importing the pages' packages (the ``console`` extra).
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from console.app import build_app
    from console.settings import AdminToken, ConsoleSettings

__all__ = ["AdminToken", "ConsoleSettings", "build_app"]

_WHERE = {"AdminToken": "console.settings", "ConsoleSettings": "console.settings", "build_app": "console.app"}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'console' has no attribute {name!r}")
    value = getattr(import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_WHERE])
