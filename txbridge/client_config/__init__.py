"""One Kafka client configuration for every part: a properties file, ``-X`` overrides, both clients' names.

Kafka's own convention, as its CLIs take it with ``--command-config``: a client
properties file (``security.protocol=SASL_SSL``, ``sasl.jaas.config=...``,
``ssl.truststore.location=...``), plus ``-X KEY=VALUE`` overrides, plus
``$TXBRIDGE_COMMAND_CONFIG`` naming the file. The file may use the Java client's
names or librdkafka's; :class:`ClientConfig` gives each client its own:

- :meth:`ClientConfig.librdkafka` for confluent-kafka (the SDK, the coordinator, the CLI);
- :meth:`ClientConfig.java` for the Java client (Spark's Kafka source takes them ``kafka.``-prefixed,
  :meth:`ClientConfig.spark_options`).

The translation, written once here (Java name -> librdkafka name):

- ``security.protocol`` -> the same (upper case);
- ``sasl.mechanism`` -> ``sasl.mechanisms``;
- ``sasl.jaas.config`` of ``ScramLoginModule`` or ``PlainLoginModule`` with ``username`` and
  ``password`` -> ``sasl.username`` + ``sasl.password`` (back: the module by the mechanism);
- ``ssl.truststore.type=PEM`` with ``ssl.truststore.location`` -> ``ssl.ca.location``, with
  ``ssl.truststore.certificates`` -> ``ssl.ca.pem``;
- ``ssl.keystore.type=PEM`` with ``ssl.keystore.location`` (one file: key and chain) ->
  ``ssl.certificate.location`` + ``ssl.key.location`` (back: only when both name one file);
  with ``ssl.keystore.key`` / ``ssl.keystore.certificate.chain`` -> ``ssl.key.pem`` /
  ``ssl.certificate.pem``;
- ``ssl.keystore.type=PKCS12`` (or none) with ``ssl.keystore.location`` / ``ssl.keystore.password``
  -> the same names (librdkafka's keystore is PKCS#12);
- ``ssl.endpoint.identification.algorithm`` ``https`` / empty -> ``https`` / ``none``;
- ``fetch.max.wait.ms``, ``send.buffer.bytes``, ``receive.buffer.bytes`` -> ``fetch.wait.max.ms``,
  ``socket.send.buffer.bytes``, ``socket.receive.buffer.bytes``;
- any other name both clients have (``client.id``, ``request.timeout.ms``, ...) -> the same.

A name neither client has (a typo) is an error when the configuration is built; a
setting the client at hand cannot take (a JKS truststore for librdkafka,
``enable.ssl.certificate.verification`` for Java) is an error when that client's
settings are asked for. Both name the setting and where it came from. Settings that
txbridge sets per client (``group.id``, ``transactional.id``, ``isolation.level``, ...)
are refused: this configuration applies to every client. ``bootstrap.servers`` in the
file is the default bootstrap (:attr:`ClientConfig.bootstrap`), not a client setting.

Secrets (passwords, ``sasl.jaas.config``, private keys) never appear in ``repr`` or in
an error message: they are shown as ``***``.

The parts, each a private module of this package: reading what users write (``_properties``:
the properties format and ``-X`` pairs), the settings under librdkafka's names
(``_canonical``; JAAS entries in ``_jaas``), what librdkafka takes (``_librdkafka``) and the
Java client's settings (``_java``). :class:`ClientConfig` holds the result and is the only
public surface besides the names in ``__all__``.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from txbridge.client_config._canonical import Canonicalised
from txbridge.client_config._jaas import PLAIN_LOGIN, SCRAM_LOGIN
from txbridge.client_config._java import java_settings
from txbridge.client_config._librdkafka import check_librdkafka, java_only_problem
from txbridge.client_config._properties import parse_overrides, parse_properties
from txbridge.client_config._setting import Canonical, Setting, by_order, shown
from txbridge.errors import ConfigurationError
from txbridge.kafka.secrets import MASK, is_secret

__all__ = [
    "COMMAND_CONFIG_ENV",
    "MASK",
    "PLAIN_LOGIN",
    "SCRAM_LOGIN",
    "ClientConfig",
    "Setting",
    "is_secret",
    "parse_properties",
]

#: The environment variable naming the properties file when ``--command-config`` is not given.
COMMAND_CONFIG_ENV = "TXBRIDGE_COMMAND_CONFIG"


class ClientConfig:
    """Kafka client settings for every client of every part, as one immutable value.

    Build one with :meth:`load` (a properties file and ``-X`` pairs), :meth:`from_mapping`
    (a dict, as the SDK classes take it) or :meth:`coerce`; combine with :meth:`merged`
    (the other one's settings win). Building checks every name (a typo is an error);
    :meth:`librdkafka` and :meth:`java` check what only that client can take.

    Raises:
        ConfigurationError: a name neither client has, a setting txbridge sets per
            client, a ``bootstrap.servers`` that is empty; the message names it and its origin.
    """

    __slots__ = ("_canonical", "_checked", "_java_only", "bootstrap", "file", "settings")

    settings: tuple[Setting, ...]
    file: Path | None
    bootstrap: str | None
    _canonical: dict[str, Canonical]
    _java_only: dict[str, Canonical]
    _checked: bool

    def __init__(self, settings: Sequence[Setting] = (), *, file: Path | None = None) -> None:
        init = functools.partial(object.__setattr__, self)
        #: The settings as written, in order (later ones win).
        init("settings", tuple(settings))
        #: The properties file these came from, if any.
        init("file", file)
        read = Canonicalised(self.settings)
        #: ``bootstrap.servers`` of the settings, if given: the default bootstrap.
        init("bootstrap", read.bootstrap)
        init("_canonical", read.canonical)
        init("_java_only", read.java_only)
        init("_checked", False)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(
            f"ClientConfig is immutable: build another (merged, load) instead of setting {name}"
        )

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickled as what it was built from: a spawned process gets the same settings.
        return (_rebuild, (self.settings, self.file))

    # ------------------------------------------------------------------ building

    @classmethod
    def load(cls, path: str | os.PathLike[str] | None = None, overrides: Iterable[str] = ()) -> ClientConfig:
        """The settings of the properties file ``path`` (if any), then ``-X`` ``KEY=VALUE`` overrides.

        Raises:
            ConfigurationError: the file cannot be read, an override has no ``=``, or a
                setting is unknown or per client.
        """
        settings: list[Setting] = []
        file = None
        if path is not None and str(path) != "":
            file = Path(path)
            try:
                text = file.read_text(encoding="utf-8")
            except FileNotFoundError:
                raise ConfigurationError(
                    f"client properties file {file} does not exist (--command-config / ${COMMAND_CONFIG_ENV})"
                ) from None
            except (OSError, UnicodeDecodeError) as exc:
                raise ConfigurationError(f"client properties file {file} cannot be read: {exc}") from None
            settings.extend(Setting(k, v, f"{file} line {n}") for k, v, n in parse_properties(text))
        settings.extend(parse_overrides(overrides))
        return cls(settings, file=file)

    @classmethod
    def from_mapping(cls, settings: Mapping[str, Any], origin: str = "client_config") -> ClientConfig:
        """Settings from a dict (Java or librdkafka names); ``origin`` names them in errors."""
        return cls([Setting(str(k), v, origin) for k, v in settings.items()])

    @classmethod
    def coerce(
        cls, value: ClientConfig | Mapping[str, Any] | None, origin: str = "client_config"
    ) -> ClientConfig:
        """``value`` as a ClientConfig: itself, a dict's settings, or none (None)."""
        if value is None:
            return cls()
        if isinstance(value, ClientConfig):
            return value
        if isinstance(value, Mapping):
            return cls.from_mapping(value, origin)
        raise ConfigurationError(
            f"{origin} must be a ClientConfig or a dict of settings, not {type(value).__name__}"
        )

    def merged(self, other: ClientConfig) -> ClientConfig:
        """These settings with ``other``'s on top (its file, if it has one, is the one named)."""
        return ClientConfig([*self.settings, *other.settings], file=other.file or self.file)

    def __bool__(self) -> bool:
        return bool(self.settings)

    # ------------------------------------------------------------------ the two clients

    def librdkafka(self) -> dict[str, Any]:
        """The settings for confluent-kafka (librdkafka names), without ``bootstrap.servers``.

        Raises:
            ConfigurationError: a setting librdkafka does not have (a JKS truststore, a
                Java-only name), a value it refuses, or a file it would open that is missing.
        """
        if self._java_only:
            raise ConfigurationError(java_only_problem(min(self._java_only.values(), key=by_order)))
        settings = {name: c.value for name, c in self._canonical.items()}
        if not self._checked:
            refusal = check_librdkafka(self._canonical, settings)
            if refusal is not None:
                raise ConfigurationError(
                    self.scrub(f"librdkafka refuses the client settings of {self.describe()}: {refusal}")
                )
            object.__setattr__(self, "_checked", True)
        return settings

    def java(self) -> dict[str, str]:
        """The settings for the Java client (its names), without ``bootstrap.servers``.

        Raises:
            ConfigurationError: a librdkafka setting the Java client does not have, or a pair
                it cannot express (a certificate and a key in two files).
        """
        return java_settings(self._canonical, self._java_only)

    def spark_options(self) -> dict[str, str]:
        """:meth:`java`'s settings as options of Spark's Kafka source (``kafka.``-prefixed)."""
        return {f"kafka.{name}": value for name, value in self.java().items()}

    def cli_args(self) -> list[str]:
        """``--command-config FILE`` and ``-X KEY=VALUE`` giving a child process the same settings."""
        args: list[str] = []
        if self.file is not None:
            args += ["--command-config", str(self.file)]
        for setting in self.settings:
            if self.file is not None and setting.origin.startswith(f"{self.file} line "):
                continue
            args += ["-X", f"{setting.name}={setting.value}"]
        return args

    def describe(self) -> str:
        """Where the settings come from, for messages: the file and/or the overrides."""
        origins = []
        for setting in self.settings:
            where = (
                str(self.file)
                if self.file and setting.origin.startswith(f"{self.file} line ")
                else setting.origin
            )
            if where not in origins:
                origins.append(where)
        return " and ".join(origins) or "no client settings"

    def scrub(self, text: str) -> str:
        """``text`` with every secret value of these settings replaced by ``***``."""
        secrets = {str(s.value) for s in self.settings if is_secret(s.name) and str(s.value)}
        secrets |= {str(c.value) for n, c in self._canonical.items() if is_secret(n) and str(c.value)}
        for secret in sorted(secrets, key=len, reverse=True):
            text = text.replace(secret, MASK)
        return text

    def __repr__(self) -> str:
        shown_settings = {s.name: shown(s.name, s.value) for s in self.settings}
        file = f"file={str(self.file)!r}, " if self.file else ""
        return f"ClientConfig({file}settings={shown_settings!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ClientConfig) and (self.settings, self.file) == (other.settings, other.file)

    def __hash__(self) -> int:
        return hash((tuple(s.name for s in self.settings), self.file))


def _rebuild(settings: tuple[Setting, ...], file: Path | None) -> ClientConfig:
    return ClientConfig(settings, file=file)
