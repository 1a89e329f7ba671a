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
"""

from __future__ import annotations

import difflib
import functools
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from txbridge._java_client_names import JAVA_CLIENT_NAMES
from txbridge._secrets import MASK, is_secret
from txbridge.errors import ConfigurationError

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

SCRAM_LOGIN = "org.apache.kafka.common.security.scram.ScramLoginModule"
PLAIN_LOGIN = "org.apache.kafka.common.security.plain.PlainLoginModule"

#: Java name -> librdkafka name, for settings that mean the same under two names.
_RENAMED = {
    "sasl.mechanism": "sasl.mechanisms",
    "fetch.max.wait.ms": "fetch.wait.max.ms",
    "send.buffer.bytes": "socket.send.buffer.bytes",
    "receive.buffer.bytes": "socket.receive.buffer.bytes",
}
_RENAMED_BACK = {v: k for k, v in _RENAMED.items()}

#: Set by txbridge per client: one value for every client would break them (a coordinator's
#: consumer in someone else's group, a producer without idempotence).
_PER_CLIENT = frozenset(
    {
        "group.id",
        "group.instance.id",
        "transactional.id",
        "isolation.level",
        "enable.auto.commit",
        "enable.idempotence",
        "acks",
        "key.serializer",
        "value.serializer",
        "key.deserializer",
        "value.deserializer",
    }
)

_TRUSTSTORE = ("ssl.truststore.type", "ssl.truststore.location", "ssl.truststore.certificates")
_KEYSTORE = (
    "ssl.keystore.type",
    "ssl.keystore.location",
    "ssl.keystore.password",
    "ssl.keystore.key",
    "ssl.keystore.certificate.chain",
)
#: Settings holding a file path that librdkafka opens when a client is created.
_FILES = ("ssl.ca.location", "ssl.certificate.location", "ssl.key.location", "ssl.keystore.location")

#: librdkafka names offered when a name is misspelt (the Java names come from the table).
_COMMON_LIBRDKAFKA = (
    "sasl.mechanisms",
    "sasl.username",
    "sasl.password",
    "ssl.ca.location",
    "ssl.ca.pem",
    "ssl.certificate.location",
    "ssl.key.location",
    "ssl.key.pem",
    "ssl.certificate.pem",
    "enable.ssl.certificate.verification",
    "socket.timeout.ms",
    "message.timeout.ms",
    "debug",
)


def _shown(name: str, value: Any) -> str:
    return MASK if is_secret(name) else str(value)


# ------------------------------------------------------------------ the Java properties format


def parse_properties(text: str) -> list[tuple[str, str, int]]:
    """``(key, value, line number)`` of each entry of a Java properties text.

    The format of ``java.util.Properties.load``: ``#`` and ``!`` comments, ``key=value``,
    ``key: value`` and ``key value``, a backslash at the end of a line continues it, and
    the escapes ``\\t \\n \\r \\f \\uXXXX`` (any other escaped character stands for itself).
    """
    entries = []
    lines = text.splitlines()
    index = 0
    while index < len(lines):
        first = index
        line = lines[index].lstrip(" \t\f")
        index += 1
        if not line or line[0] in "#!":
            continue
        while _continues(line) and index < len(lines):
            line = line[:-1] + lines[index].lstrip(" \t\f")
            index += 1
        if _continues(line):
            line = line[:-1]
        key, value = _split_entry(line)
        entries.append((_unescape(key), _unescape(value), first + 1))
    return entries


def _continues(line: str) -> bool:
    trailing = len(line) - len(line.rstrip("\\"))
    return trailing % 2 == 1


def _split_entry(line: str) -> tuple[str, str]:
    position = 0
    while position < len(line):
        char = line[position]
        if char == "\\":
            position += 2
            continue
        if char in "=: \t\f":
            break
        position += 1
    key = line[:position]
    rest = line[position:].lstrip(" \t\f")
    if rest[:1] in ("=", ":"):
        rest = rest[1:].lstrip(" \t\f")
    return key, rest


_ESCAPES = {"t": "\t", "n": "\n", "r": "\r", "f": "\f"}


def _unescape(text: str) -> str:
    if "\\" not in text:
        return text
    out = []
    position = 0
    while position < len(text):
        char = text[position]
        if char != "\\" or position + 1 == len(text):
            out.append(char)
            position += 1
            continue
        escaped = text[position + 1]
        if escaped == "u" and re.fullmatch(r"[0-9a-fA-F]{4}", text[position + 2 : position + 6]):
            out.append(chr(int(text[position + 2 : position + 6], 16)))
            position += 6
            continue
        out.append(_ESCAPES.get(escaped, escaped))
        position += 2
    return "".join(out)


# ------------------------------------------------------------------ JAAS


_JAAS_TOKEN = re.compile(r'\s*(?:"((?:[^"\\]|\\.)*)"|([^\s=;"]+)|(=)|(;))')


def _parse_jaas(text: str) -> tuple[str, str, dict[str, str]] | None:
    """``(login module, control flag, options)`` of a one-module ``sasl.jaas.config``, or None."""
    tokens: list[tuple[str, str]] = []
    position = 0
    text = text.strip()
    while position < len(text):
        match = _JAAS_TOKEN.match(text, position)
        if match is None:
            return None
        quoted, word, equals, semicolon = match.groups()
        if quoted is not None:
            tokens.append(("value", re.sub(r"\\(.)", r"\1", quoted)))
        elif word is not None:
            tokens.append(("word", word))
        else:
            tokens.append(("=", "=") if equals else (";", ";"))
        position = match.end()
        if semicolon:
            break
    if text[position:].strip() or len(tokens) < 3 or tokens[-1][0] != ";":
        return None
    (kind_module, module), (kind_flag, flag) = tokens[0], tokens[1]
    if kind_module != "word" or kind_flag != "word":
        return None
    options: dict[str, str] = {}
    body = tokens[2:-1]
    if len(body) % 3:
        return None
    for at in range(0, len(body), 3):
        (kind_key, key), (kind_eq, _), (_, value) = body[at : at + 3]
        if kind_key != "word" or kind_eq != "=":
            return None
        options[key] = value
    return module, flag, options


def _jaas(module: str, username: str, password: str) -> str:
    def quote(value: str) -> str:
        return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'

    return f"{module} required username={quote(username)} password={quote(password)};"


# ------------------------------------------------------------------ what librdkafka knows

_SENTINEL = "socket.timeout.ms"


@functools.lru_cache(maxsize=512)
def _librdkafka_has(name: str) -> str:
    """``"yes"``, ``"no"`` (no such setting) or ``"unsupported"`` (a Java name it refuses)."""
    # A bad value after the name stops the producer from being created once the name is taken.
    from txbridge.kafka import librdkafka_refusal

    sentinel = "message.timeout.ms" if name == _SENTINEL else _SENTINEL
    complaint = librdkafka_refusal({name: "1", sentinel: "not-a-number"}) or ""
    if complaint.startswith("No such configuration property"):
        return "no"
    if "not supported" in complaint:
        return "unsupported"
    return "yes"


# ------------------------------------------------------------------ the value object


@dataclass(frozen=True)
class Setting:
    """One setting as written, and where: ``admin.properties line 4``, ``-X``, ``client_config``."""

    name: str
    value: Any = field(repr=False)
    origin: str

    def __repr__(self) -> str:
        return f"Setting({self.name}={_shown(self.name, self.value)!r}, {self.origin})"

    def named(self) -> str:
        return f"{self.name} ({self.origin})"


@dataclass(frozen=True)
class _Canonical:
    value: Any
    origin: Setting  # the (last) setting it came from
    order: int


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
    _canonical: dict[str, _Canonical]
    _java_only: dict[str, _Canonical]
    _checked: bool

    def __init__(self, settings: Sequence[Setting] = (), *, file: Path | None = None) -> None:
        init = functools.partial(object.__setattr__, self)
        #: The settings as written, in order (later ones win).
        init("settings", tuple(settings))
        #: The properties file these came from, if any.
        init("file", file)
        #: ``bootstrap.servers`` of the settings, if given: the default bootstrap.
        init("bootstrap", None)
        init("_canonical", {})
        init("_java_only", {})
        init("_checked", False)
        self._canonicalise()

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
        settings.extend(_parse_overrides(overrides))
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
            raise ConfigurationError(self._java_only_problem(min(self._java_only.values(), key=_order)))
        settings = {name: c.value for name, c in self._canonical.items()}
        if not self._checked:
            self._check_librdkafka(settings)
            object.__setattr__(self, "_checked", True)
        return settings

    def java(self) -> dict[str, str]:
        """The settings for the Java client (its names), without ``bootstrap.servers``.

        Raises:
            ConfigurationError: a librdkafka setting the Java client does not have, or a pair
                it cannot express (a certificate and a key in two files).
        """
        out: dict[str, str] = {}
        done: set[str] = set()
        canonical = self._canonical
        for name, item in sorted(canonical.items(), key=lambda kv: kv[1].order):
            if name in done:
                continue
            done.add(name)
            if name in ("sasl.username", "sasl.password"):
                done.update(("sasl.username", "sasl.password"))
                out["sasl.jaas.config"] = self._java_jaas()
            elif name in ("ssl.ca.location", "ssl.ca.pem"):
                out.update(self._java_truststore(name, item))
            elif name in ("ssl.certificate.location", "ssl.key.location"):
                done.update(("ssl.certificate.location", "ssl.key.location"))
                out.update(self._java_pem_keystore_file())
            elif name in ("ssl.certificate.pem", "ssl.key.pem"):
                done.update(("ssl.certificate.pem", "ssl.key.pem"))
                out.update(self._java_pem_keystore_inline())
            elif name in ("ssl.keystore.location", "ssl.keystore.password"):
                out["ssl.keystore.type"] = "PKCS12"
                out[name] = _java_value(item)
            elif name == "ssl.endpoint.identification.algorithm":
                value = str(item.value).strip().lower()
                out[name] = "" if value == "none" else str(item.value)
            elif name in _RENAMED_BACK:
                out[_RENAMED_BACK[name]] = _java_value(item)
            elif name in JAVA_CLIENT_NAMES:
                out[name] = _java_value(item)
            else:
                raise ConfigurationError(
                    f"client setting {item.origin.named()} is a librdkafka setting the Java client "
                    "(Spark's Kafka source) does not have: remove it, or use the Java client's setting"
                )
        for name, item in sorted(self._java_only.items(), key=lambda kv: kv[1].order):
            out[name] = _java_value(item)
        return out

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
        shown = {s.name: _shown(s.name, s.value) for s in self.settings}
        file = f"file={str(self.file)!r}, " if self.file else ""
        return f"ClientConfig({file}settings={shown!r})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ClientConfig) and (self.settings, self.file) == (other.settings, other.file)

    def __hash__(self) -> int:
        return hash((tuple(s.name for s in self.settings), self.file))

    # ------------------------------------------------------------------ Java -> canonical (librdkafka names)

    def _canonicalise(self) -> None:
        latest: dict[str, tuple[Setting, int]] = {}
        for order, setting in enumerate(self.settings):
            name = setting.name.strip()
            if not name:
                raise ConfigurationError(f"a client setting without a name ({setting.origin})")
            latest.pop(name, None)  # a later one replaces it, at its own place
            latest[name] = (Setting(name, setting.value, setting.origin), order)
        bootstrap = latest.pop("bootstrap.servers", None)
        if bootstrap is not None:
            if not str(bootstrap[0].value).strip():
                raise ConfigurationError(f"bootstrap.servers is empty ({bootstrap[0].origin})")
            object.__setattr__(self, "bootstrap", str(bootstrap[0].value).strip())
        self._truststore(
            {n: latest.pop(n) for n in _TRUSTSTORE if n in latest},
            latest.pop("ssl.truststore.password", None),
        )
        self._keystore({n: latest.pop(n) for n in _KEYSTORE if n in latest})
        for name, (setting, order) in latest.items():
            self._one(name, setting, order)

    def _put(self, name: str, value: Any, origin: Setting, order: int) -> None:
        current = self._canonical.get(name)
        if current is None or current.order <= order:
            self._canonical[name] = _Canonical(value, origin, order)

    def _keep_java(self, setting: Setting, order: int) -> None:
        self._java_only[setting.name] = _Canonical(setting.value, setting, order)

    def _one(self, name: str, setting: Setting, order: int) -> None:
        if name in _PER_CLIENT:
            raise ConfigurationError(
                f"client setting {setting.named()} is set by txbridge for each client: remove it "
                "(the client configuration applies to every producer, consumer and admin client)"
            )
        if name == "sasl.jaas.config":
            self._jaas(setting, order)
        elif name in _RENAMED:
            self._put(_RENAMED[name], setting.value, setting, order)
        elif name == "security.protocol":
            self._put(name, str(setting.value).strip().upper(), setting, order)
        elif name == "ssl.endpoint.identification.algorithm":
            value = str(setting.value).strip()
            self._put(name, value.lower() if value else "none", setting, order)
        else:
            known = _librdkafka_has(name)
            if known == "yes":
                self._put(name, setting.value, setting, order)
            elif name in JAVA_CLIENT_NAMES:
                self._keep_java(setting, order)
            else:
                raise ConfigurationError(_unknown(setting))

    def _jaas(self, setting: Setting, order: int) -> None:
        parsed = _parse_jaas(str(setting.value))
        if parsed is None:
            raise ConfigurationError(
                f"client setting {setting.named()} is not a JAAS entry: expected "
                '\'<LoginModule class> required username="..." password="...";\''
            )
        module, _flag, options = parsed
        simple = module.rsplit(".", 1)[-1] in ("ScramLoginModule", "PlainLoginModule")
        if simple and set(options) == {"username", "password"}:
            self._put("sasl.username", options["username"], setting, order)
            self._put("sasl.password", options["password"], setting, order)
        else:
            self._keep_java(setting, order)

    def _truststore(
        self, group: dict[str, tuple[Setting, int]], password: tuple[Setting, int] | None
    ) -> None:
        if password is not None:
            self._keep_java(*password)
        if not group:
            return
        kind = group.get("ssl.truststore.type")
        is_pem = kind is not None and str(kind[0].value).strip().upper() == "PEM"
        targets = {"ssl.truststore.location": "ssl.ca.location", "ssl.truststore.certificates": "ssl.ca.pem"}
        for name, (setting, order) in group.items():
            if not is_pem:
                self._keep_java(setting, order)
            elif name in targets:
                self._put(targets[name], setting.value, setting, order)

    def _keystore(self, group: dict[str, tuple[Setting, int]]) -> None:
        if not group:
            return
        kind_entry = group.get("ssl.keystore.type")
        kind = str(kind_entry[0].value).strip().upper() if kind_entry else "PKCS12"
        for name, (setting, order) in group.items():
            if name == "ssl.keystore.type" and kind in ("PEM", "PKCS12"):
                continue
            if kind == "PEM" and name == "ssl.keystore.location":
                self._put("ssl.certificate.location", setting.value, setting, order)
                self._put("ssl.key.location", setting.value, setting, order)
            elif kind == "PEM" and name == "ssl.keystore.key":
                self._put("ssl.key.pem", setting.value, setting, order)
            elif kind == "PEM" and name == "ssl.keystore.certificate.chain":
                self._put("ssl.certificate.pem", setting.value, setting, order)
            elif kind == "PKCS12" and name in ("ssl.keystore.location", "ssl.keystore.password"):
                self._put(name, setting.value, setting, order)
            else:
                self._keep_java(setting, order)

    # ------------------------------------------------------------------ checks

    def _java_only_problem(self, item: _Canonical) -> str:
        setting = item.origin
        name = setting.name
        where = f"client setting {setting.named()}"
        if name.startswith("ssl.truststore."):
            return (
                f"{where}: librdkafka reads a PEM CA file, not a Java truststore: export the CA "
                "(keytool -exportcert -rfc) and set ssl.truststore.type=PEM with ssl.truststore.location "
                "(or ssl.ca.location)"
            )
        if name.startswith("ssl.keystore."):
            return (
                f"{where}: librdkafka reads a PKCS12 or PEM keystore, not a JKS one: "
                "set ssl.keystore.type=PKCS12 or PEM (or ssl.certificate.location and ssl.key.location)"
            )
        if name == "sasl.jaas.config":
            return (
                f"{where}: librdkafka takes only ScramLoginModule/PlainLoginModule with username and "
                "password from it; use its sasl.* settings (e.g. sasl.oauthbearer.*) instead"
            )
        return f"{where} is a Java client setting librdkafka does not have: remove it for txbridge's clients"

    def _check_librdkafka(self, settings: dict[str, Any]) -> None:
        from txbridge.kafka import librdkafka_refusal

        for name in _FILES:
            item = self._canonical.get(name)
            if item is None or (name == "ssl.ca.location" and str(item.value) == "probe"):
                continue
            if not Path(str(item.value)).exists():
                raise ConfigurationError(f"client setting {item.origin.named()}: {item.value} does not exist")
        protocol = self._canonical.get("security.protocol")
        if (
            protocol is not None
            and str(protocol.value) in ("SASL_SSL", "SASL_PLAINTEXT")
            and "sasl.mechanisms" not in settings
        ):
            raise ConfigurationError(
                f"client setting {protocol.origin.named()} needs sasl.mechanism too (e.g. SCRAM-SHA-512) "
                "and the user's credentials (sasl.jaas.config, or sasl.username and sasl.password)"
            )
        complaint = librdkafka_refusal(settings)
        if complaint is None:
            return
        match = re.match(r'Invalid value (?:".*" )?for configuration property "([^"]+)"', complaint)
        culprit = self._culprit(settings) if match else None
        if culprit is not None:
            raise ConfigurationError(
                f"client setting {culprit.origin.named()}: librdkafka does not accept the value "
                f"{_shown(culprit.origin.name, culprit.origin.value)!r}"
            )
        reason = complaint.removeprefix("Failed to create producer: ")
        raise ConfigurationError(
            self.scrub(f"librdkafka refuses the client settings of {self.describe()}: {reason}")
        )

    def _culprit(self, settings: Mapping[str, Any]) -> _Canonical | None:
        from txbridge.kafka import librdkafka_refusal

        for name, value in settings.items():
            sentinel = "message.timeout.ms" if name == _SENTINEL else _SENTINEL
            complaint = librdkafka_refusal({name: value, sentinel: "not-a-number"}) or ""
            if complaint.startswith("Invalid value") and f'"{sentinel}"' not in complaint:
                return self._canonical[name]
        return None

    # ------------------------------------------------------------------ canonical -> Java

    def _java_jaas(self) -> str:
        username, password = self._canonical.get("sasl.username"), self._canonical.get("sasl.password")
        present = username or password
        assert present is not None
        if username is None or password is None:
            missing = "sasl.username" if username is None else "sasl.password"
            raise ConfigurationError(
                f"client setting {present.origin.named()} needs {missing} too "
                "for the Java client's sasl.jaas.config"
            )
        mechanism = (
            str(self._canonical["sasl.mechanisms"].value).upper()
            if "sasl.mechanisms" in self._canonical
            else ""
        )
        if mechanism == "PLAIN":
            module = PLAIN_LOGIN
        elif mechanism.startswith("SCRAM-"):
            module = SCRAM_LOGIN
        else:
            raise ConfigurationError(
                f"client setting {present.origin.named()}: a username and password need sasl.mechanism "
                f"PLAIN or SCRAM-SHA-256/512 for the Java client (got {mechanism or 'none'})"
            )
        return _jaas(module, str(username.value), str(password.value))

    def _java_truststore(self, name: str, item: _Canonical) -> dict[str, str]:
        if name == "ssl.ca.pem":
            return {"ssl.truststore.type": "PEM", "ssl.truststore.certificates": str(item.value)}
        location = str(item.value)
        if location == "probe":
            return {}  # the system's CAs: the JVM's default truststore
        if Path(location).is_dir():
            raise ConfigurationError(
                f"client setting {item.origin.named()} is a folder: the Java client needs one PEM file of CAs"
            )
        return {"ssl.truststore.type": "PEM", "ssl.truststore.location": location}

    def _java_pem_keystore_file(self) -> dict[str, str]:
        cert, key = self._canonical.get("ssl.certificate.location"), self._canonical.get("ssl.key.location")
        present = cert or key
        assert present is not None
        if cert is None or key is None or str(cert.value) != str(key.value):
            raise ConfigurationError(
                f"client setting {present.origin.named()}: the Java client reads the certificate and its key "
                "from one PEM file (ssl.keystore.type=PEM, ssl.keystore.location): give "
                "ssl.certificate.location and ssl.key.location the same file holding both"
            )
        return {"ssl.keystore.type": "PEM", "ssl.keystore.location": str(cert.value)}

    def _java_pem_keystore_inline(self) -> dict[str, str]:
        cert, key = self._canonical.get("ssl.certificate.pem"), self._canonical.get("ssl.key.pem")
        present = cert or key
        assert present is not None
        if cert is None or key is None:
            raise ConfigurationError(
                f"client setting {present.origin.named()} needs its pair (ssl.certificate.pem with "
                "ssl.key.pem) for the Java client's PEM keystore"
            )
        return {
            "ssl.keystore.type": "PEM",
            "ssl.keystore.key": str(key.value),
            "ssl.keystore.certificate.chain": str(cert.value),
        }


def _rebuild(settings: tuple[Setting, ...], file: Path | None) -> ClientConfig:
    return ClientConfig(settings, file=file)


def _order(item: _Canonical) -> int:
    return item.order


def _java_value(item: _Canonical) -> str:
    value = item.value
    if callable(value):
        raise ConfigurationError(
            f"client setting {item.origin.named()} is a callback: the Java client takes none"
        )
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _parse_overrides(pairs: Iterable[str]) -> list[Setting]:
    settings = []
    for pair in pairs:
        name, sep, value = str(pair).partition("=")
        if not sep or not name.strip():
            shown = MASK if is_secret(name) else str(pair)
            raise ConfigurationError(f"-X expects KEY=VALUE, got {shown!r}")
        settings.append(Setting(name.strip(), value.strip(), "-X"))
    return settings


def _unknown(setting: Setting) -> str:
    candidates = sorted(JAVA_CLIENT_NAMES | set(_COMMON_LIBRDKAFKA) | set(_RENAMED.values()))
    close = difflib.get_close_matches(setting.name, candidates, n=1, cutoff=0.75)
    hint = f" (did you mean {close[0]}?)" if close else ""
    return f"unknown client setting {setting.named()}: neither librdkafka nor the Java client has it{hint}"
