"""What the two command lines share, the ``txbridge`` command's (:mod:`txbridge.tools.cli`) and
the coordinator's (:mod:`coordinator.cli`): the Kafka address's environment variable and errors
printed as one line.

It sits in the SDK because the coordinator imports no tooling; it needs only click, which the
SDK depends on for the ``txbridge`` command anyway.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from functools import wraps
from typing import Any, TypeVar

import click

from txbridge.errors import TxBridgeError

F = TypeVar("F", bound=Callable[..., Any])

#: Where every command looks for the Kafka bootstrap servers when ``--bootstrap`` is not given.
BOOTSTRAP_ENV = "KAFKA_BOOTSTRAP_SERVERS"


def one_line_errors(func: F) -> F:
    """Turn a TxBridgeError into ``error: <message>`` and exit code 2, no traceback."""

    @wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return func(*args, **kwargs)
        except TxBridgeError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(2)

    return wrapper  # type: ignore[return-value]
