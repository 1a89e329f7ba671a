"""Where a command's bootstrap servers come from, first found wins (docs/cli.md): the flag, else
``KAFKA_BOOTSTRAP_SERVERS``; the coordinator's ``TXBRIDGE_BOOTSTRAP``, else its TOML file; the
client properties' ``bootstrap.servers``; under ``txbridge``, the local broker.

No broker: each source names a port where nothing listens, and the one-line error says which
address the command went to.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from cli.main import main
from coordinator.cli import coordinator
from servers.broker import free_port

SOURCES = ("flag", "env", "txbridge_env", "toml", "client_file")


@pytest.fixture
def addresses() -> dict[str, str]:
    return {source: f"127.0.0.1:{free_port()}" for source in SOURCES}


def _environment(tmp_path: Path, **values: str | None) -> dict[str, str | None]:
    # Nothing of the caller's environment picks the address, and no local broker runs in this cache.
    base: dict[str, str | None] = {
        "KAFKA_BOOTSTRAP_SERVERS": None,
        "TXBRIDGE_BOOTSTRAP": None,
        "TXBRIDGE_COMMAND_CONFIG": None,
        "TXBRIDGE_CACHE": str(tmp_path / "cache"),
    }
    return {**base, **values}


def _run_coordinator(
    tmp_path: Path, addresses: dict[str, str], given: tuple[str, ...], *, under_txbridge: bool
) -> Result:
    args: list[str] = []
    env = _environment(tmp_path)
    if "flag" in given:
        args += ["--bootstrap", addresses["flag"]]
    if "env" in given:
        env["KAFKA_BOOTSTRAP_SERVERS"] = addresses["env"]
    if "txbridge_env" in given:
        env["TXBRIDGE_BOOTSTRAP"] = addresses["txbridge_env"]
    if "toml" in given:
        toml = tmp_path / "coordinator.toml"
        toml.write_text(f'bootstrap = "{addresses["toml"]}"\n')
        args += ["--config", str(toml)]
    if "client_file" in given:
        properties = tmp_path / "client.properties"
        properties.write_text(f"bootstrap.servers={addresses['client_file']}\n")
        args += ["--command-config", str(properties)]
    if under_txbridge:
        return CliRunner().invoke(main, ["coordinator", *args], env=env)
    return CliRunner().invoke(coordinator, args, env=env)


@pytest.mark.parametrize(
    "under_txbridge", [False, True], ids=["python-m-coordinator", "txbridge-coordinator"]
)
@pytest.mark.parametrize("first", range(len(SOURCES)))
def test_the_coordinator_takes_the_first_source_given(
    tmp_path: Path, addresses: dict[str, str], first: int, under_txbridge: bool
) -> None:
    given = SOURCES[first:]

    result = _run_coordinator(tmp_path, addresses, given, under_txbridge=under_txbridge)

    assert result.exit_code == 2, result.output
    assert f"no Kafka broker answers at {addresses[SOURCES[first]]}" in result.output
    assert not [a for s, a in addresses.items() if s != SOURCES[first] and a in result.output]


def test_python_m_coordinator_without_a_source_says_what_to_pass(tmp_path: Path) -> None:
    result = CliRunner().invoke(coordinator, [], env=_environment(tmp_path))

    assert result.exit_code == 2
    assert result.output.strip() == (
        "error: no bootstrap given: pass --bootstrap, set KAFKA_BOOTSTRAP_SERVERS or TXBRIDGE_BOOTSTRAP, "
        "or name it in --config or --command-config"
    )


@pytest.mark.parametrize("command", [["coordinator"], ["init"], ["admin", "pending"]])
def test_under_txbridge_every_command_falls_back_on_the_local_broker(
    tmp_path: Path, command: list[str]
) -> None:
    result = CliRunner().invoke(main, command, env=_environment(tmp_path))

    assert result.exit_code == 2
    assert "the local broker is not running: start it with 'txbridge kafka start'" in result.output


def test_a_txbridge_command_takes_the_flag_then_the_client_file(
    tmp_path: Path, addresses: dict[str, str]
) -> None:
    properties = tmp_path / "client.properties"
    properties.write_text(f"bootstrap.servers={addresses['client_file']}\n")
    env = _environment(tmp_path, TXBRIDGE_COMMAND_CONFIG=str(properties))

    from_file = CliRunner().invoke(main, ["init"], env=env)
    from_env = CliRunner().invoke(main, ["init"], env={**env, "KAFKA_BOOTSTRAP_SERVERS": addresses["env"]})

    assert f"no Kafka broker answers at {addresses['client_file']}" in from_file.output
    assert f"no Kafka broker answers at {addresses['env']}" in from_env.output
