"""What librdkafka takes: which names it has, and whether it accepts the values given.

Asked of librdkafka itself (:func:`txbridge.kafka.librdkafka_refusal`), never of a copied list.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from txbridge.client_config._setting import Canonical, shown
from txbridge.errors import ConfigurationError

#: A setting given a bad value beside the one tried: librdkafka refuses it once it takes the other.
SENTINEL = "socket.timeout.ms"
#: Settings holding a file path that librdkafka opens when a client is created.
FILES = ("ssl.ca.location", "ssl.certificate.location", "ssl.key.location", "ssl.keystore.location")


@functools.lru_cache(maxsize=512)
def librdkafka_has(name: str) -> str:
    """``"yes"``, ``"no"`` (no such setting) or ``"unsupported"`` (a Java name it refuses)."""
    # A bad value after the name stops the producer from being created once the name is taken.
    from txbridge.kafka import librdkafka_refusal

    sentinel = "message.timeout.ms" if name == SENTINEL else SENTINEL
    complaint = librdkafka_refusal({name: "1", sentinel: "not-a-number"}) or ""
    if complaint.startswith("No such configuration property"):
        return "no"
    if "not supported" in complaint:
        return "unsupported"
    return "yes"


def java_only_problem(item: Canonical) -> str:
    """Why librdkafka cannot take the Java-only setting ``item``, and what to do instead."""
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


def check_librdkafka(canonical: Mapping[str, Canonical], settings: Mapping[str, Any]) -> str | None:
    """Whether librdkafka takes ``settings``: a missing file, SASL without a mechanism, and a value
    it refuses are errors naming the setting; a refusal no one setting explains is returned.

    Raises:
        ConfigurationError: what is wrong, with the setting and its origin.
    """
    from txbridge.kafka import librdkafka_refusal

    for name in FILES:
        item = canonical.get(name)
        if item is None or (name == "ssl.ca.location" and str(item.value) == "probe"):
            continue
        if not Path(str(item.value)).exists():
            raise ConfigurationError(f"client setting {item.origin.named()}: {item.value} does not exist")
    protocol = canonical.get("security.protocol")
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
        return None
    match = re.match(r'Invalid value (?:".*" )?for configuration property "([^"]+)"', complaint)
    culprit = _culprit(canonical, settings) if match else None
    if culprit is not None:
        raise ConfigurationError(
            f"client setting {culprit.origin.named()}: librdkafka does not accept the value "
            f"{shown(culprit.origin.name, culprit.origin.value)!r}"
        )
    return complaint.removeprefix("Failed to create producer: ")


def _culprit(canonical: Mapping[str, Canonical], settings: Mapping[str, Any]) -> Canonical | None:
    """The one setting whose value librdkafka refuses, tried alone."""
    from txbridge.kafka import librdkafka_refusal

    for name, value in settings.items():
        sentinel = "message.timeout.ms" if name == SENTINEL else SENTINEL
        complaint = librdkafka_refusal({name: value, sentinel: "not-a-number"}) or ""
        if complaint.startswith("Invalid value") and f'"{sentinel}"' not in complaint:
            return canonical[name]
    return None
