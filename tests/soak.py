"""Tests that only ``make soak`` runs: long runs whose bounded sibling ``make test`` keeps.

``make test`` must stay within its budget on a 2-core box (docs/testing.md); a run that repeats
what a shorter test already shows, on another server or at another size, is marked with
:func:`soak_only` and runs at ``make soak``'s scale (``TXBRIDGE_SOAK_SCALE`` above 1.0).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TypeVar

import pytest

_Test = TypeVar("_Test", bound=Callable[..., object])

#: ``TXBRIDGE_SOAK_SCALE``: 1.0 in ``make test`` and CI, ``SOAK_SCALE`` (3) in ``make soak``.
SCALE = float(os.environ.get("TXBRIDGE_SOAK_SCALE", "1.0"))


def soak_only(reason: str) -> list[pytest.MarkDecorator]:
    """The marks of a test that only ``make soak`` runs; ``reason`` says what it costs, and
    which test ``make test`` keeps in its place."""
    return [pytest.mark.soak, pytest.mark.skipif(SCALE <= 1.0, reason=f"{reason}: run with make soak")]


def soak_test(reason: str) -> Callable[[_Test], _Test]:
    """:func:`soak_only` as a decorator of one test function."""

    def mark(test: _Test) -> _Test:
        for decorator in soak_only(reason):
            test = decorator(test)
        return test

    return mark
