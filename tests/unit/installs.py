"""What an install of txbridge with some of its extras holds, and a Python that sees only that.

pyproject.toml names the base requirements and each extra's; the test environment has them
all installed, with their own requirements, whose metadata says what each brings. From
both, :func:`absent_modules` gives the top-level modules of every installed distribution
that such an install would not have, and :func:`run_without` runs Python code with those
modules made unimportable and those distributions unknown to ``importlib.metadata``: what
``pip install txbridge`` (or ``txbridge[coordinator]``, the image) would see, without a
fresh virtualenv and the package index (scripts/wheel-closure.sh does it for real).
"""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
from collections.abc import Iterable, Mapping
from functools import cache
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
_OURS = {"txbridge", "coordinator", "spark_pipelines"}


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def declared(extras: Iterable[str] = ()) -> list[Requirement]:
    """txbridge's requirements with ``extras``, as pyproject.toml declares them (``txbridge[x]``
    followed), without txbridge itself."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    optional: dict[str, list[str]] = project["optional-dependencies"]
    out = [Requirement(r) for r in project["dependencies"]]
    wanted, seen = list(extras), set()
    while wanted:
        extra = wanted.pop()
        if extra in seen:
            continue
        seen.add(extra)
        for line in optional[extra]:
            requirement = Requirement(line)
            if canonical(requirement.name) == "txbridge":
                wanted.extend(requirement.extras)
            else:
                out.append(requirement)
    return out


def closure(requirements: Iterable[Requirement]) -> set[str]:
    """Canonical names of the installed distributions these requirements bring, transitively."""
    found: set[str] = set()
    seen: set[tuple[str, frozenset[str]]] = set()
    todo = list(requirements)
    while todo:
        requirement = todo.pop()
        name = canonical(requirement.name)
        key = (name, frozenset(requirement.extras))
        if key in seen or (requirement.marker is not None and not requirement.marker.evaluate({"extra": ""})):
            continue
        seen.add(key)
        try:
            dist = metadata.distribution(name)
        except metadata.PackageNotFoundError:
            continue  # not for this platform or Python
        found.add(name)
        for line in dist.requires or []:
            nested = Requirement(line)
            if nested.marker is None or any(
                nested.marker.evaluate({"extra": e}) for e in {"", *requirement.extras}
            ):
                nested.marker = None
                todo.append(nested)
    return found


def absent_distributions(extras: Iterable[str] = ()) -> frozenset[str]:
    """Installed distributions (canonical names) that txbridge with ``extras`` would not bring."""
    return _absent_distributions(frozenset(extras))


def absent_modules(extras: Iterable[str] = ()) -> frozenset[str]:
    """Top-level modules that only distributions absent from that install provide."""
    return _absent_modules(frozenset(extras))


@cache
def _absent_distributions(extras: frozenset[str]) -> frozenset[str]:
    kept = closure(declared(extras)) | {"txbridge", "pip", "setuptools"}
    return frozenset({canonical(d.metadata["Name"]) for d in metadata.distributions()} - kept)


@cache
def _absent_modules(extras: frozenset[str]) -> frozenset[str]:
    absent = absent_distributions(extras)
    return frozenset(
        module
        for module, dists in _packages_distributions().items()
        if module not in _OURS and all(canonical(d) in absent for d in dists)
    )


@cache
def _packages_distributions() -> Mapping[str, list[str]]:
    return metadata.packages_distributions()


_PRELUDE = """
import importlib.abc, importlib.metadata as md, re, sys
modules, dists = (set(filter(None, a.split(","))) for a in sys.argv[1:3])
del sys.argv[1:3]
class NotInstalled(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in modules:
            raise ModuleNotFoundError(f"No module named {name!r} (not in this install)", name=name)
        return None
sys.meta_path.insert(0, NotInstalled())
real = md.distribution
def distribution(name):
    if re.sub(r"[-_.]+", "-", name).lower() in dists:
        raise md.PackageNotFoundError(name)
    return real(name)
md.distribution = distribution
"""


def run_without(
    code: str,
    extras: Iterable[str] = (),
    *,
    more_modules: Iterable[str] = (),
    args: Iterable[str] = (),
    env: Mapping[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run ``code`` in a new Python that has only txbridge with ``extras`` (``more_modules``
    blocked too); ``args`` become its ``sys.argv[1:]``, ``env`` its environment."""
    extras = list(extras)
    modules = absent_modules(extras) | set(more_modules)
    return subprocess.run(
        [
            sys.executable,
            "-c",
            _PRELUDE + code,
            ",".join(sorted(modules)),
            ",".join(sorted(absent_distributions(extras))),
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=ROOT,
        env=env,
    )
