"""Which pyspark the sink runs beside, checked before anything of Spark's is used.

The sink is a Python data source (``pyspark.sql.datasource``), an API Spark 4.0 introduced;
it needs no jar, so any pyspark of the tested major line serves. A pyspark outside the range
fails with a message naming it, where a user first touches the sink (importing
``txbridge.spark`` or :func:`txbridge.spark.register`), not with an ``ImportError`` deep in
Spark's modules.
"""

from __future__ import annotations

import re

from txbridge.errors import SetupError

#: The oldest pyspark the sink's tests pass on (``make matrix``).
OLDEST = (4, 0, 0)
#: The first major line not supported: the data source API may change across majors.
FIRST_UNSUPPORTED = (5, 0, 0)
#: The range as pip writes it (the ``[spark-sink]`` extra of pyproject.toml says the same).
SUPPORTED = ">=4.0.0,<5"

_RELEASE = re.compile(r"^(\d+)\.(\d+)\.(\d+)")


def parse(version: str) -> tuple[int, int, int] | None:
    """``(major, minor, patch)`` of a pyspark version (``4.1.0.dev1`` counts as 4.1.0); None if unreadable."""
    match = _RELEASE.match(version)
    return (int(match[1]), int(match[2]), int(match[3])) if match else None


def check_pyspark(version: str | None = None) -> str:
    """Return the installed pyspark's version (or ``version``) if the sink supports it.

    Raises:
        SetupError: pyspark is missing, or its version is outside :data:`SUPPORTED`; the
            message names the supported versions and the command that installs one.
    """
    if version is None:
        try:
            import pyspark
        except ImportError:
            raise SetupError(
                f"the txbridge Spark sink needs pyspark {SUPPORTED}: pip install 'txbridge[spark-sink]'"
            ) from None
        version = str(pyspark.__version__)
    release = parse(version)
    if release is None or not OLDEST <= release < FIRST_UNSUPPORTED:
        raise SetupError(
            f"the txbridge Spark sink supports pyspark {SUPPORTED} (4.0.0 up to every 4.x), "
            f"not pyspark {version}: pip install 'pyspark{SUPPORTED}' or 'txbridge[spark-sink]'"
        )
    return version
