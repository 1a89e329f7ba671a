"""The layout's contracts (``lint-imports``, ``[tool.importlinter]`` in pyproject.toml) cover it all.

import-linter checks the SDK module by module, as listed; a module added to txbridge outside
``txbridge.tools`` must be added to that list, or the SDK contract would not see it.
"""

from __future__ import annotations

import pkgutil
import tomllib
from pathlib import Path

import txbridge

ROOT = Path(__file__).resolve().parents[2]


def _contract(name_start: str) -> dict[str, object]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["importlinter"]
    return next(c for c in config["contracts"] if c["name"].startswith(name_start))


def test_the_sdk_contract_lists_every_module_of_txbridge_but_the_tools() -> None:
    sdk = {f"txbridge.{m.name}" for m in pkgutil.iter_modules(txbridge.__path__) if m.name != "tools"}

    listed = _contract("The SDK imports no")["source_modules"]

    assert sorted(listed) == sorted(sdk)  # type: ignore[arg-type]
