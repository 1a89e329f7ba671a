"""Where a source checkout keeps its jars and local broker data."""

from __future__ import annotations

from pathlib import Path

import pytest

from servers import jars

ROOT = Path(__file__).resolve().parents[2]


def test_a_source_checkout_keeps_its_cache_beside_pyproject(monkeypatch: pytest.MonkeyPatch) -> None:
    # The layout move put jars.py one folder deeper; the checkout was then missed and the cache
    # silently went to ~/.cache/txbridge, where `txbridge kafka start`'s broker was not found.
    monkeypatch.delenv("TXBRIDGE_CACHE", raising=False)
    assert jars.cache_root() == ROOT / ".cache"


def test_txbridge_cache_wins(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TXBRIDGE_CACHE", str(tmp_path))
    assert jars.cache_root() == tmp_path.resolve()
