"""The README: the two commands first, short, and every link it gives leads somewhere."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
LINK = re.compile(r"\]\(([^)\s]+)\)")
PAGES = ("README.md", "docs/install.md", "docs/results/README.md", "docs/results/settings.md")


def test_the_readme_starts_with_the_two_commands() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()

    assert lines[0].startswith("# ")
    assert lines[2:6] == [
        "```sh",
        lines[3],
        lines[4],
        "```",
    ]
    assert lines[3].split()[:2] == ["make", "demo"]
    assert lines[4].split()[:2] == ["make", "test"]


def test_the_readme_is_at_most_120_lines() -> None:
    assert len((ROOT / "README.md").read_text().splitlines()) <= 120


@pytest.mark.parametrize("page", PAGES)
def test_every_relative_link_resolves(page: str) -> None:
    path = ROOT / page
    broken = []
    for target in LINK.findall(path.read_text()):
        if re.match(r"[a-z]+:", target) or target.startswith("#"):
            continue
        file = target.split("#", 1)[0]
        if not (path.parent / file).exists():
            broken.append(target)
    assert broken == [], f"{page} links to what does not exist"
