"""``pip install txbridge`` is the SDK; the tools come with extras, and say which when missing.

Each install is simulated in a subprocess that cannot import what that install would not
have (tests/unit/installs.py): the SDK imports with the base requirements alone, each tool
with its extra, and a subcommand run without its extra is a one-line error naming it.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
import socket
import subprocess
from importlib import metadata

import pytest
from packaging.requirements import Requirement

from cli.main import _EXTRAS, _PARTLY
from tests.unit.installs import absent_modules, canonical, closure, declared, run_without

#: Beside the SDK, what serves the base install's own commands: the txbridge command (every
#: layer's command module, which it loads to list them), smoke, setup and the local broker.
BASE_TOOLS = (
    "bench.cli",
    "cli",
    "console.cli",
    "coordinator.cli",
    "servers.broker",
    "servers.cli",
    "servers.cli.kafka",
    "servers.cli.rocketmq",
    "servers.cli.spark",
    "servers.jars",
    "spark_pipelines.cli",
)
#: Tool modules that import their extra's packages when loaded, and that extra.
EXTRA_OF = {
    "bench.runner": "bench",
    "servers.certs": "local",
    "txbridge.spark": "spark-sink",  # the Spark sink: the one part of the SDK that needs pyspark
    "console.app": "console",  # the web console's pages: jinja2
}
HEAVY = {"pyspark", "matplotlib", "rich", "psutil", "numpy", "pandas", "httpx", "prometheus-client"}


def _modules(package: str) -> list[str]:
    module = importlib.import_module(package)
    return sorted(m.name for m in pkgutil.walk_packages(module.__path__, package + "."))


def _sdk_modules() -> list[str]:
    sdk = [n for n in _modules("txbridge") if not any(n == t or n.startswith(t + ".") for t in EXTRA_OF)]
    cli = _modules("cli")
    return sorted([*sdk, *BASE_TOOLS, *cli])


def test_the_base_install_brings_no_spark_plots_or_tool_packages() -> None:
    base = closure(declared())

    assert not base & HEAVY, sorted(base & HEAVY)
    # The installed metadata (what pip reads from the wheel) says the same as pyproject.toml.
    installed = [Requirement(r) for r in metadata.requires("txbridge") or []]
    unconditional = {canonical(r.name) for r in installed if r.marker is None}
    assert unconditional == {canonical(r.name) for r in declared()}


def test_the_sdk_imports_with_the_base_install_alone() -> None:
    modules = _sdk_modules()
    code = (
        "import importlib, sys, txbridge\n"
        "names = [getattr(txbridge, n) for n in txbridge.__all__]\n"
        "for m in sys.argv[1:]: importlib.import_module(m)\n"
        "print(len(names), len(sys.argv) - 1)\n"
    )

    result = run_without(code, args=modules)

    assert {"pyspark", "matplotlib", "rich", "psutil", "httpx"} <= absent_modules()
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == [str(len(__import__("txbridge").__all__)), str(len(modules))]


@pytest.mark.parametrize(("module", "extra"), sorted(EXTRA_OF.items()))
def test_each_tool_module_needs_its_extra_and_imports_with_it(module: str, extra: str) -> None:
    code = f"import {module}\n"

    without = run_without(code)
    with_extra = run_without(code, [extra])

    assert without.returncode != 0
    if module == "txbridge.spark":  # names its extra, before Spark's modules are imported
        assert "pip install 'txbridge[spark-sink]'" in without.stderr
    else:
        assert "ModuleNotFoundError" in without.stderr
    assert with_extra.returncode == 0, with_extra.stderr[-3000:]


def test_every_module_imports_with_all_the_extras() -> None:
    packages = ("txbridge", "coordinator", "console", "servers", "spark_pipelines", "bench", "cli")
    modules = [m for p in packages for m in _modules(p)]
    code = "import importlib, sys\nfor m in sys.argv[1:]: importlib.import_module(m)\n"

    result = run_without(code, ["all"], args=[m for m in modules if not m.endswith("__main__")])

    assert result.returncode == 0, result.stderr[-3000:]


_CLI = "from cli.main import main\nmain(sys.argv[1:], prog_name='txbridge')\n"


def test_the_base_install_lists_every_command_and_what_to_install_for_the_missing() -> None:
    result = run_without(_CLI, args=["--help"])

    assert result.returncode == 0, result.stderr[-3000:]
    listed = {line.split()[0]: line for line in result.stdout.splitlines() if line.startswith("  ")}
    assert {"init", "admin", "acls", "consume", *_EXTRAS} <= set(listed)
    assert "pip install 'txbridge[bench]'" in listed["bench"]


def _one_line_error(result: subprocess.CompletedProcess[str], command: str, extra: str) -> None:
    assert result.returncode == 2, result.stderr[-3000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith(f"error: 'txbridge {command}' needs ")
    assert lines[0].endswith(f"not installed: pip install 'txbridge[{extra}]'")


@pytest.mark.parametrize(("command", "extra"), sorted((c, e) for c, e in _EXTRAS.items() if c not in _PARTLY))
def test_a_command_without_its_extra_is_a_one_line_error_naming_it(command: str, extra: str) -> None:
    result = run_without(_CLI, args=[command, "--help"])
    with_extra = run_without(_CLI, [extra], args=[command, "--help"])

    _one_line_error(result, command, extra)
    assert result.stdout == ""
    assert with_extra.returncode == 0, with_extra.stderr[-3000:]
    assert "Usage: txbridge" in with_extra.stdout


def test_the_local_kafka_names_its_extra_where_it_needs_it_and_asks_a_broker_without() -> None:
    unset = ("KAFKA_BOOTSTRAP_SERVERS", "TXBRIDGE_COMMAND_CONFIG")
    env = {k: v for k, v in os.environ.items() if k not in unset}
    with socket.socket() as probe:  # a port nothing listens on
        probe.bind(("127.0.0.1", 0))
        closed = f"127.0.0.1:{probe.getsockname()[1]}"

    local = run_without(_CLI, args=["kafka", "status"], env=env)
    remote = run_without(_CLI, args=["kafka", "status", "--bootstrap", closed], env=env)

    _one_line_error(local, "kafka", "local")
    assert remote.returncode == 2
    assert f"no Kafka broker answers at {closed}" in remote.stderr
    assert "not installed" not in remote.stderr


@pytest.mark.parametrize("command", ["init", "admin", "acls", "consume", "smoke", "setup"])
def test_the_sdks_own_commands_run_with_the_base_install(command: str) -> None:
    result = run_without(_CLI, args=[command, "--help"])

    assert result.returncode == 0, result.stderr[-3000:]
    assert "Usage: txbridge" in result.stdout
