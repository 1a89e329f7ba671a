"""The Spark sink names the pyspark versions it supports when it meets another.

The check runs where a user first touches the sink: importing ``txbridge.spark``, and
``register(spark)`` against the session's own Spark version.
"""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import pytest

from txbridge.errors import SetupError
from txbridge.spark import register
from txbridge.spark.support import SUPPORTED, check_pyspark


@pytest.mark.parametrize("version", ["4.0.0", "4.1.1", "4.2.0", "4.3.0", "4.9.12", "4.1.0.dev1"])
def test_every_pyspark_4_is_served(version: str) -> None:
    assert check_pyspark(version) == version


@pytest.mark.parametrize("version", ["3.5.3", "3.4.0", "5.0.0", "2.4.8", "nightly"])
def test_another_pyspark_is_refused_naming_the_supported_range(version: str) -> None:
    with pytest.raises(SetupError) as refused:
        check_pyspark(version)

    assert f"not pyspark {version}" in str(refused.value)
    assert SUPPORTED in str(refused.value)
    assert "txbridge[spark-sink]" in str(refused.value)


def test_register_refuses_a_session_of_an_unsupported_spark_before_registering() -> None:
    registered = []
    session = SimpleNamespace(version="3.5.1", dataSource=SimpleNamespace(register=registered.append))

    with pytest.raises(SetupError, match=r"supports pyspark >=4\.0\.0,<5"):
        register(session)

    assert registered == []


def test_importing_the_sink_beside_an_old_pyspark_names_the_range_not_a_missing_module() -> None:
    # pyspark 3.5 has no pyspark.sql.datasource; its version is what the check reads first.
    code = (
        "import sys, types\n"
        "sys.modules['pyspark'] = types.SimpleNamespace(__version__='3.5.3')\n"
        "import txbridge.spark\n"
    )

    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)

    assert result.returncode != 0
    assert "SetupError" in result.stderr
    assert "supports pyspark >=4.0.0,<5" in result.stderr
    assert "ModuleNotFoundError" not in result.stderr
