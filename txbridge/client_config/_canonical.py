"""The settings as written, under librdkafka's names: the one form both clients' settings come from.

Java names become librdkafka's (module docstring of :mod:`txbridge.client_config`); a Java-only
setting (a JKS truststore, a JAAS entry of another login module) is kept apart, for the Java
client only.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from typing import Any

from txbridge.client_config._jaas import parse_jaas
from txbridge.client_config._java_client_names import JAVA_CLIENT_NAMES
from txbridge.client_config._librdkafka import librdkafka_has
from txbridge.client_config._setting import Canonical, Setting
from txbridge.errors import ConfigurationError

#: Java name -> librdkafka name, for settings that mean the same under two names.
RENAMED = {
    "sasl.mechanism": "sasl.mechanisms",
    "fetch.max.wait.ms": "fetch.wait.max.ms",
    "send.buffer.bytes": "socket.send.buffer.bytes",
    "receive.buffer.bytes": "socket.receive.buffer.bytes",
}

#: Set by txbridge per client: one value for every client would break them (a coordinator's
#: consumer in someone else's group, a producer without idempotence).
PER_CLIENT = frozenset(
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

TRUSTSTORE = ("ssl.truststore.type", "ssl.truststore.location", "ssl.truststore.certificates")
KEYSTORE = (
    "ssl.keystore.type",
    "ssl.keystore.location",
    "ssl.keystore.password",
    "ssl.keystore.key",
    "ssl.keystore.certificate.chain",
)
#: librdkafka names offered when a name is misspelt (the Java names come from the table).
COMMON_LIBRDKAFKA = (
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


class Canonicalised:
    """``settings`` read: the default bootstrap, the librdkafka settings and the Java-only ones.

    Raises:
        ConfigurationError: a setting without a name, an empty ``bootstrap.servers``, a setting
            txbridge sets per client, a name neither client has, or a malformed JAAS entry.
    """

    def __init__(self, settings: Sequence[Setting]) -> None:
        #: ``bootstrap.servers``, if given.
        self.bootstrap: str | None = None
        #: librdkafka name -> its value and origin.
        self.canonical: dict[str, Canonical] = {}
        #: Java name -> a setting only the Java client has.
        self.java_only: dict[str, Canonical] = {}
        self._read(settings)

    def _read(self, settings: Sequence[Setting]) -> None:
        latest: dict[str, tuple[Setting, int]] = {}
        for order, setting in enumerate(settings):
            name = setting.name.strip()
            if not name:
                raise ConfigurationError(f"a client setting without a name ({setting.origin})")
            latest.pop(name, None)  # a later one replaces it, at its own place
            latest[name] = (Setting(name, setting.value, setting.origin), order)
        bootstrap = latest.pop("bootstrap.servers", None)
        if bootstrap is not None:
            if not str(bootstrap[0].value).strip():
                raise ConfigurationError(f"bootstrap.servers is empty ({bootstrap[0].origin})")
            self.bootstrap = str(bootstrap[0].value).strip()
        self._truststore(
            {n: latest.pop(n) for n in TRUSTSTORE if n in latest},
            latest.pop("ssl.truststore.password", None),
        )
        self._keystore({n: latest.pop(n) for n in KEYSTORE if n in latest})
        for name, (setting, order) in latest.items():
            self._one(name, setting, order)

    def _put(self, name: str, value: Any, origin: Setting, order: int) -> None:
        current = self.canonical.get(name)
        if current is None or current.order <= order:
            self.canonical[name] = Canonical(value, origin, order)

    def _keep_java(self, setting: Setting, order: int) -> None:
        self.java_only[setting.name] = Canonical(setting.value, setting, order)

    def _one(self, name: str, setting: Setting, order: int) -> None:
        if name in PER_CLIENT:
            raise ConfigurationError(
                f"client setting {setting.named()} is set by txbridge for each client: remove it "
                "(the client configuration applies to every producer, consumer and admin client)"
            )
        if name == "sasl.jaas.config":
            self._jaas(setting, order)
        elif name in RENAMED:
            self._put(RENAMED[name], setting.value, setting, order)
        elif name == "security.protocol":
            self._put(name, str(setting.value).strip().upper(), setting, order)
        elif name == "ssl.endpoint.identification.algorithm":
            value = str(setting.value).strip()
            self._put(name, value.lower() if value else "none", setting, order)
        else:
            known = librdkafka_has(name)
            if known == "yes":
                self._put(name, setting.value, setting, order)
            elif name in JAVA_CLIENT_NAMES:
                self._keep_java(setting, order)
            else:
                raise ConfigurationError(unknown(setting))

    def _jaas(self, setting: Setting, order: int) -> None:
        parsed = parse_jaas(str(setting.value))
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


def unknown(setting: Setting) -> str:
    """The error of a name neither client has, with the closest known name."""
    candidates = sorted(JAVA_CLIENT_NAMES | set(COMMON_LIBRDKAFKA) | set(RENAMED.values()))
    close = difflib.get_close_matches(setting.name, candidates, n=1, cutoff=0.75)
    hint = f" (did you mean {close[0]}?)" if close else ""
    return f"unknown client setting {setting.named()}: neither librdkafka nor the Java client has it{hint}"
