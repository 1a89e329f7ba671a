"""compose/ works on first use: its services agree with each other and with what the code reads.

There is no Docker engine here, so docker-compose.yml is loaded as Compose would read it
(variables interpolated from a given environment) and each service's command is parsed by
the txbridge command itself; the coordinator's settings are loaded as its container would
load them, with the mounted files read from compose/. The image installs txbridge with the
coordinator extra; its commands run with everything else blocked.
The wait-for-kafka wrapper runs for real against the local broker.
"""

from __future__ import annotations

import os
import re
import shlex
import socket
import subprocess
import sys
import threading
import time
import tomllib
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import click
import pytest
import yaml

from cli.main import main
from coordinator.config import _ENV_SIMPLE, ENV_PREFIX, CoordinatorConfig, read_toml
from servers.broker import free_port
from tests.unit.installs import absent_modules, run_without
from tests.unit.test_alerts import promtool
from txbridge.client_config import ClientConfig

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "compose"
HOST_ENV = {"KAFKA_BOOTSTRAP_SERVERS": "broker-1:9092,broker-2:9092", "TXBRIDGE_DEFAULT_SECRET": "s3cret"}

_VARIABLE = re.compile(
    r"\$\$|\$\{(?P<name>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\}|\$(?P<bare>[A-Za-z_]\w*)"
)


def interpolate(value: Any, env: Mapping[str, str]) -> Any:
    """``value`` with Compose's ``${VAR}``, ``${VAR:-default}``, ``${VAR:?error}`` and ``$$`` resolved."""
    if isinstance(value, dict):
        return {k: interpolate(v, env) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env) for v in value]
    if not isinstance(value, str):
        return value

    def one(match: re.Match[str]) -> str:
        if match.group(0) == "$$":
            return "$"
        name = match.group("name") or match.group("bare")
        op, arg, found = (
            match.group("op"),
            match.group("arg"),
            env.get(match.group("name") or match.group("bare")),
        )
        unset = found is None or (op is not None and op.startswith(":") and found == "")
        if op in (":-", "-"):
            return arg if unset else str(found)
        if op in (":?", "?") and unset:
            raise ValueError(f"{name}: {arg}")
        return found or ""

    return _VARIABLE.sub(one, value)


def compose(env: Mapping[str, str] = HOST_ENV) -> dict[str, Any]:
    """docker-compose.yml as Compose sees it with ``env`` as the shell's environment."""
    return interpolate(yaml.safe_load((COMPOSE / "docker-compose.yml").read_text()), env)


def mounts(service: Mapping[str, Any]) -> dict[str, Path]:
    """``{container path: host path}`` of a service's bind mounts."""
    out = {}
    for volume in service.get("volumes", []):
        source, target, *_ = volume.split(":")
        out[target] = (COMPOSE / source).resolve()
    return out


def on_host(service: Mapping[str, Any], value: str) -> str:
    """A container path of a mounted file as the host file it is; anything else as it is."""
    return str(mounts(service).get(value, value))


def command_of(service: Mapping[str, Any]) -> tuple[click.Command, dict[str, Any]]:
    """The txbridge subcommand a service runs and its parameters, parsed as the container would
    (with the service's environment, mounted files read from the host)."""
    argv = list(service["command"])
    if argv[0] == "wait-for-kafka":
        argv = argv[1:]
    assert argv[0] == "txbridge", argv
    command = main.get_command(click.Context(main), argv[1])
    assert command is not None, f"txbridge has no command {argv[1]!r}"
    args = [on_host(service, a) for a in argv[2:]]
    env = {k: on_host(service, v) for k, v in service["environment"].items()}
    saved = dict(os.environ)
    try:
        os.environ.update(env)
        context = command.make_context(argv[1], args)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    return command, dict(context.params)


def coordinator_config(service: Mapping[str, Any]) -> CoordinatorConfig:
    """The coordinator service's settings, loaded as ``txbridge coordinator`` loads them."""
    _, params = command_of(service)
    config_path = params.pop("config_path")
    params.pop("secrets")
    env = {k: on_host(service, v) for k, v in service["environment"].items()}
    return CoordinatorConfig.load(flags=params, env=env, toml_path=config_path)


def txbridge_services(spec: Mapping[str, Any]) -> dict[str, Any]:
    return {name: s for name, s in spec["services"].items() if "build" in s}


# ------------------------------------------------------------------ the services agree


@pytest.mark.parametrize("namespace", [None, "orders_ns"])
def test_init_and_the_coordinator_use_one_namespace(namespace: str | None) -> None:
    env = {**HOST_ENV, **({"TXBRIDGE_NAMESPACE": namespace} if namespace else {})}
    services = compose(env)["services"]

    _, init = command_of(services["init"])
    coordinator = coordinator_config(services["coordinator"])

    assert init["namespace"] == coordinator.namespace == (namespace or "__txbridge")


@pytest.mark.parametrize(
    ("namespace", "group"),
    [(None, "txbridge-coordinator"), ("orders_ns", "txbridge-coordinator.orders_ns")],
)
def test_the_coordinators_group_follows_the_namespace(namespace: str | None, group: str) -> None:
    env = {**HOST_ENV, **({"TXBRIDGE_NAMESPACE": namespace} if namespace else {})}

    assert coordinator_config(compose(env)["services"]["coordinator"]).group_id == group


def test_init_and_the_coordinator_use_one_client_properties_file() -> None:
    services = compose({**HOST_ENV, "TXBRIDGE_CLIENT_PROPERTIES": "./client.properties"})["services"]
    init, coordinator = services["init"], services["coordinator"]

    _, init_params = command_of(init)
    config = coordinator_config(coordinator)

    path = init["environment"]["TXBRIDGE_COMMAND_CONFIG"]
    assert coordinator["environment"]["TXBRIDGE_COMMAND_CONFIG"] == path
    assert mounts(init)[path] == mounts(coordinator)[path] == COMPOSE / "client.properties"
    assert init_params["command_config"] == str(COMPOSE / "client.properties")
    assert config.client_config.file == COMPOSE / "client.properties"
    assert config.extra_config["security.protocol"] == "PLAINTEXT"
    # The file as shipped is a valid client configuration, for librdkafka and Java alike.
    shipped = ClientConfig.load(COMPOSE / "client.properties")
    assert shipped.librdkafka() == {"security.protocol": "PLAINTEXT"}


def test_the_coordinator_gets_the_bootstrap_and_the_secret_of_the_environment() -> None:
    config = coordinator_config(compose()["services"]["coordinator"])

    assert config.bootstrap == HOST_ENV["KAFKA_BOOTSTRAP_SERVERS"]
    assert config.secrets.for_group("any-group") == b"s3cret"


def test_the_metrics_port_is_published() -> None:
    coordinator = compose()["services"]["coordinator"]
    port = coordinator_config(coordinator).metrics_port

    published = {}
    for mapping in coordinator["ports"]:
        host, _, container = str(mapping).rpartition(":")
        published[int(container.split("/")[0])] = host
    assert port is not None
    assert port in published
    first, _, last = published[port].rpartition(":")[2].partition("-")
    assert int(first) <= int(last or first)


def test_the_coordinator_toml_names_only_known_settings() -> None:
    raw = read_toml(COMPOSE / "coordinator.toml")

    config = CoordinatorConfig.from_mapping(raw)  # an unknown key is a ConfigurationError

    assert set(raw) <= {*CoordinatorConfig.__dataclass_fields__, "secrets", "default_secret"}
    assert config.metrics_port == 9464


def test_every_environment_variable_named_is_read_by_the_code() -> None:
    wait_script = (COMPOSE / "wait-for-kafka.sh").read_text()
    read = {ENV_PREFIX + name.upper() for name in _ENV_SIMPLE} | {ENV_PREFIX + "SECRETS"}
    read |= set(re.findall(r"\$\{?([A-Z][A-Z0-9_]+)", wait_script))
    for command in _all_commands(main):
        for param in command.params:
            envvars = param.envvar if isinstance(param.envvar, list | tuple) else [param.envvar]
            read |= {e for e in envvars if e}

    for name, service in txbridge_services(compose()).items():
        unknown = set(service["environment"]) - read
        assert not unknown, f"{name}: nothing reads {sorted(unknown)}"


def _all_commands(group: click.Command) -> Iterator[click.Command]:
    yield group
    if isinstance(group, click.Group):
        for command in group.commands.values():
            yield from _all_commands(command)


def test_a_required_variable_left_unset_is_a_message_saying_what_to_set() -> None:
    with pytest.raises(ValueError, match="set KAFKA_BOOTSTRAP_SERVERS to your cluster"):
        compose({"TXBRIDGE_DEFAULT_SECRET": "s"})
    with pytest.raises(ValueError, match="set TXBRIDGE_DEFAULT_SECRET"):
        compose({"KAFKA_BOOTSTRAP_SERVERS": "b:9092"})


def test_init_waits_for_kafka_and_the_coordinator_for_init() -> None:
    services = compose()["services"]

    assert services["init"]["command"][0] == "wait-for-kafka"
    assert services["init"]["depends_on"]["kafka"] == {"condition": "service_healthy", "required": False}
    assert "healthcheck" in services["kafka"]
    assert services["coordinator"]["depends_on"] == {"init": {"condition": "service_completed_successfully"}}


# ------------------------------------------------------------------ the image


def _dockerfile() -> list[list[str]]:
    lines = (COMPOSE / "Dockerfile").read_text().splitlines()
    return [shlex.split(line) for line in lines if line.strip() and not line.lstrip().startswith("#")]


def _name(requirement: str) -> str:
    return re.split(r"[<>=!~\[ ;]", requirement, maxsplit=1)[0].lower()


def test_the_image_builds_from_files_that_exist_and_copies_no_spark() -> None:
    services = txbridge_services(compose())
    builds = {(s["build"]["context"], s["build"]["dockerfile"]) for s in services.values()}
    assert builds == {("..", "compose/Dockerfile")}
    assert len({s["image"] for s in services.values()}) == 1  # one image, built once

    copies = [line for line in _dockerfile() if line[0] == "COPY"]
    sources = [arg for line in copies for arg in line[1:-1] if not arg.startswith("--")]
    assert all((ROOT / source).exists() for source in sources), sources
    assert not [s for s in sources if "spark" in s]
    wrapper = next(line for line in copies if "compose/wait-for-kafka.sh" in line)
    assert wrapper[-1] == "/usr/local/bin/wait-for-kafka"


def test_the_image_installs_txbridge_with_the_coordinator_extra_only() -> None:
    installs = [line for line in _dockerfile() if line[:2] == ["RUN", "pip"]]
    extras = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]

    assert installs == [["RUN", "pip", "install", "--no-cache-dir", ".[coordinator]"]]
    assert "coordinator" in extras
    assert not {"pyspark", "matplotlib"} & {_name(r) for r in extras["coordinator"]}


_IMAGE_RUNNER = (
    "import coordinator.service\nfrom cli.main import main\nmain(sys.argv[1:], prog_name='txbridge')\n"
)


@pytest.mark.parametrize(
    "args",
    [
        ["--help"],
        ["init", "--help"],
        ["coordinator", "--help"],
        ["kafka", "status", "--help"],
        ["acls", "--role", "coordinator", "--principal", "User:txbridge", "--topic", "orders"],
    ],
)
def test_the_images_commands_run_with_only_what_it_installs(args: list[str]) -> None:
    # What the image would not have, and spark_pipelines (not copied).
    result = run_without(_IMAGE_RUNNER, ["coordinator"], more_modules=["spark_pipelines"], args=args)

    assert {"pyspark", "matplotlib", "yaml", "psutil"} <= absent_modules(["coordinator"])
    assert result.returncode == 0, result.stderr[-2000:]
    assert "Usage: txbridge" in result.stdout or "kafka-acls.sh" in result.stdout


# ------------------------------------------------------------------ wait-for-kafka, for real


def _wait_for_kafka(bootstrap: str, wait_s: int) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != "TXBRIDGE_COMMAND_CONFIG"}
    env.update(
        KAFKA_BOOTSTRAP_SERVERS=bootstrap,
        TXBRIDGE_WAIT_S=str(wait_s),
        PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
    )
    return subprocess.run(
        ["sh", str(COMPOSE / "wait-for-kafka.sh"), "echo", "ready"],
        capture_output=True,
        text=True,
        timeout=wait_s + 60,
        check=False,
        env=env,
    )


@contextmanager
def _late_listener(port: int, target: str, after_s: float) -> Iterator[None]:
    """Listen on ``port`` only after ``after_s``, forwarding each connection to ``target``."""
    host, _, target_port = target.split(",", maxsplit=1)[0].rpartition(":")
    stop = threading.Event()

    def pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            dst.close()

    def serve() -> None:
        if stop.wait(after_s):
            return
        with socket.create_server(("127.0.0.1", port)) as server:
            server.settimeout(0.2)
            while not stop.is_set():
                try:
                    client, _ = server.accept()
                except TimeoutError:
                    continue
                upstream = socket.create_connection((host, int(target_port)))
                threading.Thread(target=pipe, args=(client, upstream), daemon=True).start()
                threading.Thread(target=pipe, args=(upstream, client), daemon=True).start()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join(5)


@pytest.mark.integration
def test_wait_for_kafka_runs_the_command_once_kafka_answers(kafka_bootstrap: str) -> None:
    port = free_port()
    started = time.monotonic()
    with _late_listener(port, kafka_bootstrap, after_s=4):
        result = _wait_for_kafka(f"127.0.0.1:{port}", wait_s=60)

    assert result.returncode == 0, result.stderr
    assert result.stdout == "ready\n"
    assert time.monotonic() - started >= 4


@pytest.mark.integration
def test_wait_for_kafka_gives_up_after_its_limit_with_the_last_answer() -> None:
    port = free_port()

    result = _wait_for_kafka(f"127.0.0.1:{port}", wait_s=3)

    assert result.returncode == 1
    assert result.stdout == ""
    lines = result.stderr.strip().splitlines()
    assert lines[-1] == f"wait-for-kafka: no answer from Kafka at 127.0.0.1:{port} within 3s"
    assert f"no Kafka broker answers at 127.0.0.1:{port}" in lines[-2]


# ------------------------------------------------------------------ prometheus and grafana


def _bind_mounts(service: Mapping[str, Any]) -> dict[str, Path]:
    """``{container path: host path}`` of a service's bind mounts (named volumes left out)."""
    out = {}
    for volume in service["volumes"]:
        source, target, *_ = volume.split(":")
        if source.startswith("."):
            out[target] = (COMPOSE / source).resolve()
    return out


def test_prometheus_scrapes_every_coordinator_on_its_metrics_port_and_loads_the_alerts() -> None:
    services = compose()["services"]
    prometheus = services["prometheus"]
    files = _bind_mounts(prometheus)
    config_path = next(a.split("=", 1)[1] for a in prometheus["command"] if a.startswith("--config.file="))
    config = yaml.safe_load(files[config_path].read_text())

    assert all(path.is_file() for path in files.values()), files
    (job,) = config["scrape_configs"]
    (discovery,) = job["dns_sd_configs"]
    # Compose's DNS answers the service name with every container of it (--scale).
    assert discovery["names"] == ["coordinator"]
    assert discovery["port"] == coordinator_config(services["coordinator"]).metrics_port
    assert [files[path] for path in config["rule_files"]] == [COMPOSE / "prometheus" / "alerts.yml"]


def test_prometheus_config_passes_promtool(tmp_path: Path) -> None:
    prometheus = compose()["services"]["prometheus"]
    files = _bind_mounts(prometheus)
    config = yaml.safe_load((COMPOSE / "prometheus" / "prometheus.yml").read_text())
    config["rule_files"] = [str(files[path]) for path in config["rule_files"]]  # as mounted
    (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))

    result = subprocess.run(
        [promtool(), "check", "config", str(tmp_path / "prometheus.yml")],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )

    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


def test_grafana_is_provisioned_with_prometheus_and_the_dashboard() -> None:
    services = compose()["services"]
    grafana, prometheus = services["grafana"], services["prometheus"]
    files = _bind_mounts(grafana)
    provisioning = files["/etc/grafana/provisioning"]
    (source,) = yaml.safe_load((provisioning / "datasources" / "prometheus.yml").read_text())["datasources"]
    (provider,) = yaml.safe_load((provisioning / "dashboards" / "txbridge.yml").read_text())["providers"]
    dashboards = files[provider["options"]["path"]]
    home = grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]

    published = {int(str(p).rpartition(":")[2]) for p in prometheus["ports"]}
    assert source["url"] == f"http://prometheus:{published.pop()}"
    assert grafana["depends_on"] == ["prometheus"]
    assert (dashboards / "txbridge.json").is_file()
    assert home.startswith(provider["options"]["path"] + "/")
    assert (dashboards / home.rpartition("/")[2]).is_file()


def test_the_monitoring_ports_listen_on_the_host_only_by_default() -> None:
    services = compose()["services"]

    for name in ("prometheus", "grafana"):
        (mapping,) = services[name]["ports"]
        assert str(mapping).startswith("127.0.0.1:"), name
