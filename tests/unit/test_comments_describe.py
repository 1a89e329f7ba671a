"""Comments and docstrings of the product code describe: no dates, no issue numbers of ours.

The story of a change belongs in its commit message and CHANGELOG.md, figures in docs/results/.
Upstream references that explain why (``librdkafka#5511``, ``RocketMQ #9640``) are welcome, and
so is a link to a dated results page (``docs/results/2026-11-27-warm-up.md``).
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ("txbridge", "coordinator", "spark_pipelines")

DATE = re.compile(r"(?<![\w-])20\d\d-\d\d-\d\d(?![\w-]*\.md)")
ISSUE = re.compile(r"\bissues? #?\d+", re.IGNORECASE)


def _texts(path: Path) -> Iterator[tuple[int, str]]:
    """(line, text) of each comment and each docstring line of ``path``."""
    source = path.read_text()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.string
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            docstring = ast.get_docstring(node, clean=False)
            if docstring is not None:
                first = node.body[0].lineno
                for offset, line in enumerate(docstring.splitlines()):
                    yield first + offset, line


def _offences(pattern: re.Pattern[str]) -> list[str]:
    found = []
    for package in PRODUCT:
        for path in sorted((ROOT / package).rglob("*.py")):
            if not pattern.search(path.read_text()):  # most files: no need to parse them
                continue
            for line, text in _texts(path):
                if pattern.search(text):
                    found.append(f"{path.relative_to(ROOT)}:{line}: {text.strip()}")
    return found


def test_no_dates_in_comments_or_docstrings() -> None:
    assert _offences(DATE) == [], "a date in a comment: say what and why; the when goes in the commit"


def test_no_issue_numbers_in_comments_or_docstrings() -> None:
    assert _offences(ISSUE) == [], "an issue number in a comment: say what and why, not which issue"


def test_the_patterns_tell_ours_from_upstream_references() -> None:
    assert DATE.search("measured 2026-11-23 on this box")
    assert DATE.search("(2 s before 2026-11-24)")
    assert not DATE.search("docs/results/2026-11-27-native-resume.md")
    assert not DATE.search("bench-full-20261127T140702Z.json")
    assert ISSUE.search("the package cycle issue 15 removes")
    assert ISSUE.search("(Issue #12)")
    assert not ISSUE.search("confluentinc/librdkafka#5511")
    assert not ISSUE.search("(RocketMQ #9640: producer clock skew)")
    assert not ISSUE.search("rocketmq-dashboard #4343, #4435")
