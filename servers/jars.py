"""Fetch the Java artifacts txbridge runs locally (Kafka broker, Spark's Kafka source).

Jars come from Maven Central through ``mvn dependency:copy-dependencies`` into a
git-ignored cache (``.cache/`` of the source checkout, or ``$TXBRIDGE_CACHE``).
A set is fetched once: a ``.complete`` marker makes later calls free.
"""

from __future__ import annotations

import fcntl
import logging
import os
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from txbridge.errors import SetupError

logger = logging.getLogger(__name__)

#: The broker version run by default; ``$TXBRIDGE_KAFKA_VERSION`` chooses another
#: (:func:`kafka_version`; docs/local-servers.md lists the versions tested).
KAFKA_VERSION = "4.1.1"
LOG4J_VERSION = "2.24.3"
#: The pyspark versions whose Kafka source (``spark-sql-kafka-0-10_2.13`` and its runtime
#: dependency ``spark-token-provider-kafka-0-10_2.13``) Maven Central was seen to serve: the
#: jars must match pyspark exactly, so only these run the demo and the Kafka-reading tests.
#: Named in errors; the fetch itself asks Maven for whatever pyspark is installed.
SPARK_KAFKA_SERVED = ("4.0.0", "4.1.1", "4.2.0")
ROCKETMQ_VERSION = "5.3.3"
DEPENDENCY_PLUGIN_VERSION = "3.8.1"
MIN_JAVA = 17

_MVN_TIMEOUT_S = 900

# Spark's parent POM names extra repositories (a cloud mirror of Central) that
# may be unreachable; this settings file sends every repository to Central.
# ``$TXBRIDGE_MAVEN_SETTINGS`` names your own settings.xml instead (a corporate mirror).
_MAVEN_SETTINGS = """<settings xmlns="http://maven.apache.org/SETTINGS/1.0.0">
  <mirrors><mirror>
    <id>txbridge-central-only</id><mirrorOf>external:*,!central</mirrorOf>
    <url>https://repo.maven.apache.org/maven2</url>
  </mirror></mirrors>
</settings>
"""


@dataclass(frozen=True)
class JarSet:
    """A named set of Maven coordinates (``group:artifact:version``) fetched together."""

    name: str
    coordinates: tuple[str, ...]


_VERSION = re.compile(r"^\d+\.\d+\.\d+$")


def kafka_version() -> str:
    """The Kafka broker version the local broker and cluster run.

    ``$TXBRIDGE_KAFKA_VERSION`` (``make matrix`` sets it), else :data:`KAFKA_VERSION`.

    Raises:
        SetupError: the variable is not a version (``major.minor.patch``).
    """
    version = os.environ.get("TXBRIDGE_KAFKA_VERSION", "").strip() or KAFKA_VERSION
    if not _VERSION.match(version):
        raise SetupError(f"TXBRIDGE_KAFKA_VERSION={version!r} is not a Kafka version such as {KAFKA_VERSION}")
    return version


def kafka_broker(version: str | None = None) -> JarSet:
    """The broker's jars for Kafka ``version`` (:func:`kafka_version` by default)."""
    version = version or kafka_version()
    # Kafka 3.x calls log4j 1's API directly (its log-level MBean); this bridge sends those
    # calls to log4j2 too. 4.x logs through log4j2 alone.
    log4j1 = [f"org.apache.logging.log4j:log4j-1.2-api:{LOG4J_VERSION}"] if version.startswith("3.") else []
    return JarSet(
        f"kafka-{version}",
        (
            f"org.apache.kafka:kafka_2.13:{version}",
            # SLF4J binding: the broker logs through SLF4J 1.7 into log4j2.
            f"org.apache.logging.log4j:log4j-slf4j-impl:{LOG4J_VERSION}",
            *log4j1,
        ),
    )


def installed_pyspark() -> str:
    """The version of the installed pyspark.

    Raises:
        SetupError: pyspark is not installed.
    """
    try:
        import pyspark
    except ImportError:
        raise SetupError(
            "pyspark is not installed: pip install 'txbridge[spark]' (or -e '.[spark]' in a checkout)"
        ) from None
    return str(pyspark.__version__)


def spark_kafka(version: str | None = None) -> JarSet:
    """Spark's Kafka source and Avro functions for pyspark ``version`` (the installed one by default)."""
    version = version or installed_pyspark()
    return JarSet(
        f"spark-kafka-{version}",
        (
            f"org.apache.spark:spark-sql-kafka-0-10_2.13:{version}",
            f"org.apache.spark:spark-avro_2.13:{version}",
        ),
    )


# The name server, the proxy with its embedded broker (``-pm local``) and the admin
# tools (topics, groups, cluster list): one classpath runs all three.
ROCKETMQ = JarSet(
    f"rocketmq-{ROCKETMQ_VERSION}",
    tuple(
        f"org.apache.rocketmq:rocketmq-{part}:{ROCKETMQ_VERSION}"
        for part in ("namesrv", "proxy", "broker", "tools")
    ),
)


def cache_root() -> Path:
    """The folder that holds fetched jars and local broker data.

    ``$TXBRIDGE_CACHE`` when set; else ``.cache/`` beside ``pyproject.toml`` in a
    source checkout; else ``~/.cache/txbridge``.
    """
    env = os.environ.get("TXBRIDGE_CACHE")
    if env:
        return Path(env).expanduser().resolve()
    checkout = Path(__file__).resolve().parents[1]  # servers/jars.py
    if (checkout / "pyproject.toml").is_file() and (checkout / "txbridge").is_dir():
        return checkout / ".cache"
    return Path.home() / ".cache" / "txbridge"


def java_major_version(java: str = "java") -> int:
    """Return the major version of the JDK on PATH.

    Raises:
        SetupError: no ``java`` on PATH, or its version cannot be read.
    """
    if shutil.which(java) is None:
        raise SetupError(
            f"no '{java}' on PATH: install a JDK {MIN_JAVA}+ "
            "(Debian: apt-get install openjdk-17-jdk-headless)"
        )
    out = subprocess.run([java, "-version"], capture_output=True, text=True, check=False)
    match = re.search(r'version "(\d+)(?:\.(\d+))?', out.stderr + out.stdout)
    if not match:
        raise SetupError(f"cannot read the Java version from: {out.stderr.strip()[:200]}")
    major = int(match.group(1))
    return int(match.group(2) or 0) if major == 1 else major


def check_prerequisites() -> None:
    """Fail fast, with what to install, when the JDK or Maven is missing.

    Raises:
        SetupError: Java older than 17, or no ``mvn`` on PATH.
    """
    major = java_major_version()
    if major < MIN_JAVA:
        raise SetupError(f"Java {major} found, txbridge's local Kafka and Spark need Java {MIN_JAVA}+")
    if shutil.which("mvn") is None:
        raise SetupError("no 'mvn' on PATH: install Maven 3.6+ (Debian: apt-get install maven)")


def _pom(jar_set: JarSet) -> str:
    deps = []
    for coordinate in jar_set.coordinates:
        group, artifact, version = coordinate.split(":")
        deps.append(
            f"<dependency><groupId>{group}</groupId><artifactId>{artifact}</artifactId>"
            f"<version>{version}</version></dependency>"
        )
    return f"""<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>servers</groupId><artifactId>{jar_set.name}</artifactId>
  <version>1</version><packaging>pom</packaging>
  <dependencies>{"".join(deps)}</dependencies>
  <build><plugins><plugin>
    <groupId>org.apache.maven.plugins</groupId><artifactId>maven-dependency-plugin</artifactId>
    <version>{DEPENDENCY_PLUGIN_VERSION}</version>
  </plugin></plugins></build>
</project>
"""


def ensure_jars(jar_set: JarSet, *, root: Path | None = None) -> Path:
    """Fetch ``jar_set`` once and return the folder holding its jars.

    Raises:
        SetupError: Java or Maven missing, or Maven failed (its output's tail is in the message).
    """
    folder = (root or cache_root()) / "jars" / jar_set.name
    jars = folder / "jars"
    if _complete(folder):
        return jars
    check_prerequisites()
    folder.mkdir(parents=True, exist_ok=True)
    # One fetch of a set at a time: processes started together (pytest-xdist's workers on a
    # fresh clone) otherwise empty the folder under each other's mvn, which then fails to copy.
    # The others wait here and find the set complete.
    with (folder / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if _complete(folder):
            return jars
        _fetch(jar_set, folder)
    return jars


def _complete(folder: Path) -> bool:
    return (folder / ".complete").is_file() and any((folder / "jars").glob("*.jar"))


def _fetch(jar_set: JarSet, folder: Path) -> None:
    jars = folder / "jars"
    shutil.rmtree(jars, ignore_errors=True)
    (folder / "pom.xml").write_text(_pom(jar_set))
    settings = os.environ.get("TXBRIDGE_MAVEN_SETTINGS")
    if not settings:
        settings = str(folder / "settings.xml")
        Path(settings).write_text(_MAVEN_SETTINGS)
    logger.info("fetching %s from Maven Central into %s", jar_set.name, jars)
    try:
        result = subprocess.run(
            [
                "mvn",
                "-B",
                "-q",
                "-s",
                settings,
                "-f",
                str(folder / "pom.xml"),
                "dependency:copy-dependencies",
                f"-DoutputDirectory={jars}",
                "-DincludeScope=runtime",
            ],
            capture_output=True,
            text=True,
            timeout=_MVN_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise SetupError(f"mvn did not finish fetching {jar_set.name} in {_MVN_TIMEOUT_S}s") from exc
    if result.returncode != 0:
        tail = "\n".join((result.stdout + result.stderr).strip().splitlines()[-15:])
        raise SetupError(f"mvn failed to fetch {jar_set.name} (exit {result.returncode}):\n{tail}")
    (folder / ".complete").write_text("\n".join(jar_set.coordinates) + "\n")


def kafka_classpath(root: Path | None = None) -> str:
    """The classpath (``dir/*``) of the Kafka broker jars (:func:`kafka_version`), fetching them if needed."""
    return str(ensure_jars(kafka_broker(), root=root) / "*")


_ARTIFACT = re.compile(r"^(?P<artifact>.+?)-\d[^-]*(?:-[A-Za-z0-9.]+)*\.jar$")


def rocketmq_classpath(root: Path | None = None) -> str:
    """The classpath (``dir/*``) of the RocketMQ jars, fetching them if needed."""
    return str(ensure_jars(ROCKETMQ, root=root) / "*")


def _artifact_name(jar: Path) -> str:
    match = _ARTIFACT.match(jar.name)
    return match.group("artifact") if match else jar.stem


def spark_jars(root: Path | None = None) -> list[Path]:
    """Jars to put on ``spark.jars`` for the Kafka source and Avro functions.

    The jars are those of the installed pyspark's version: Spark loads a connector only
    beside the Spark it was built with. Artifacts pyspark already ships (avro, lz4, snappy,
    slf4j, ...) are left out, so the session has one copy of each class.

    Raises:
        SetupError: no pyspark, or Maven Central serves no Kafka source for its version
            (the message names the versions it was seen to serve).
    """
    import pyspark

    version = installed_pyspark()
    try:
        folder = ensure_jars(spark_kafka(version), root=root)
    except SetupError as exc:
        if version in SPARK_KAFKA_SERVED:
            raise
        raise SetupError(
            f"Spark's Kafka source for pyspark {version} could not be fetched (Maven Central was seen "
            f"to serve it for {', '.join(SPARK_KAFKA_SERVED)} only): install one of those pyspark "
            f"versions to read Kafka from Spark (the txbridge sink itself needs no jar).\n{exc}"
        ) from exc
    shipped = {_artifact_name(j) for j in (Path(pyspark.__file__).parent / "jars").glob("*.jar")}
    ours = sorted(folder.glob("*.jar"))
    return [jar for jar in ours if _artifact_name(jar) not in shipped]
