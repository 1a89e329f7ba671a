"""The layout's contracts (``lint-imports``, ``[tool.importlinter]`` in pyproject.toml) cover it all.

The layers contract names top-level packages, not module lists: it holds only if every package
of the repository is one of its layers, named once, and is also what is packaged, type-checked
and checked for cycles. A package added beside them must be placed in a layer.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
_CONFIG = tomllib.loads((ROOT / "pyproject.toml").read_text())


def _packages() -> set[str]:
    return {
        path.parent.name
        for path in ROOT.glob("*/__init__.py")
        if path.parent.name not in {"tests", "examples", "scripts"}
    }


def _contract(type_: str) -> dict[str, object]:
    return next(c for c in _CONFIG["tool"]["importlinter"]["contracts"] if c["type"] == type_)


def _layer_names() -> list[str]:
    layers = _contract("layers")["layers"]
    assert isinstance(layers, list)
    return [name.strip() for layer in layers for name in layer.split("|")]


def test_every_top_level_package_is_a_layer_named_once() -> None:
    names = _layer_names()

    assert len(names) == len(set(names)), names
    assert set(names) == _packages()
    assert all("." not in name for name in names)  # packages, not modules


def test_the_sdk_is_the_bottom_layer_and_the_cli_the_top() -> None:
    layers = _contract("layers")["layers"]

    assert layers[-1] == "txbridge"  # type: ignore[index]
    assert layers[0] == "cli"  # type: ignore[index]


def test_every_layer_is_analysed_packaged_and_type_checked() -> None:
    packages = _packages()
    find = _CONFIG["tool"]["setuptools"]["packages"]["find"]["include"]

    assert set(_CONFIG["tool"]["importlinter"]["root_packages"]) == packages
    assert set(_contract("acyclic_siblings")["ancestors"]) == packages  # type: ignore[arg-type]
    assert set(_CONFIG["tool"]["mypy"]["packages"]) == packages
    assert {pattern.removesuffix("*") for pattern in find} == packages


#: Modules that reach into the producer's private modules on purpose: the bench measures (and, for
#: one run, replaces) the producer's internal steps.
_MEASURES_PRIVATE_PARTS = frozenset({"bench.latency_breakdown", "bench.tracing_cost"})


def test_nothing_outside_a_package_imports_its_private_modules() -> None:
    import grimp

    graph = grimp.build_graph(*_packages())
    reaching = []
    for importer in sorted(graph.modules):
        for imported in sorted(graph.find_modules_directly_imported_by(importer)):
            parts = imported.split(".")
            private = next((i for i, p in enumerate(parts) if p.startswith("_") and p[1:2] != "_"), None)
            if private is None or importer in _MEASURES_PRIVATE_PARTS:
                continue
            owner = ".".join(parts[:private])
            if importer != owner and not importer.startswith(owner + "."):
                reaching.append(f"{importer} -> {imported}")

    assert reaching == []
