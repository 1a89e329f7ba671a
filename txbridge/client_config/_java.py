"""The settings for the Java client (Spark's Kafka source), from their librdkafka form."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from txbridge.client_config._canonical import RENAMED
from txbridge.client_config._jaas import PLAIN_LOGIN, SCRAM_LOGIN, jaas_entry
from txbridge.client_config._java_client_names import JAVA_CLIENT_NAMES
from txbridge.client_config._setting import Canonical
from txbridge.errors import ConfigurationError

RENAMED_BACK = {v: k for k, v in RENAMED.items()}


def java_settings(canonical: Mapping[str, Canonical], java_only: Mapping[str, Canonical]) -> dict[str, str]:
    """The settings for the Java client (its names), without ``bootstrap.servers``.

    Raises:
        ConfigurationError: a librdkafka setting the Java client does not have, or a pair
            it cannot express (a certificate and a key in two files).
    """
    out: dict[str, str] = {}
    done: set[str] = set()
    for name, item in sorted(canonical.items(), key=lambda kv: kv[1].order):
        if name in done:
            continue
        done.add(name)
        if name in ("sasl.username", "sasl.password"):
            done.update(("sasl.username", "sasl.password"))
            out["sasl.jaas.config"] = _jaas(canonical)
        elif name in ("ssl.ca.location", "ssl.ca.pem"):
            out.update(_truststore(name, item))
        elif name in ("ssl.certificate.location", "ssl.key.location"):
            done.update(("ssl.certificate.location", "ssl.key.location"))
            out.update(_pem_keystore_file(canonical))
        elif name in ("ssl.certificate.pem", "ssl.key.pem"):
            done.update(("ssl.certificate.pem", "ssl.key.pem"))
            out.update(_pem_keystore_inline(canonical))
        elif name in ("ssl.keystore.location", "ssl.keystore.password"):
            out["ssl.keystore.type"] = "PKCS12"
            out[name] = java_value(item)
        elif name == "ssl.endpoint.identification.algorithm":
            value = str(item.value).strip().lower()
            out[name] = "" if value == "none" else str(item.value)
        elif name in RENAMED_BACK:
            out[RENAMED_BACK[name]] = java_value(item)
        elif name in JAVA_CLIENT_NAMES:
            out[name] = java_value(item)
        else:
            raise ConfigurationError(
                f"client setting {item.origin.named()} is a librdkafka setting the Java client "
                "(Spark's Kafka source) does not have: remove it, or use the Java client's setting"
            )
    for name, item in sorted(java_only.items(), key=lambda kv: kv[1].order):
        out[name] = java_value(item)
    return out


def _jaas(canonical: Mapping[str, Canonical]) -> str:
    """``sasl.jaas.config`` of the user and password, its login module by the mechanism."""
    username, password = canonical.get("sasl.username"), canonical.get("sasl.password")
    present = username or password
    assert present is not None
    if username is None or password is None:
        missing = "sasl.username" if username is None else "sasl.password"
        raise ConfigurationError(
            f"client setting {present.origin.named()} needs {missing} too "
            "for the Java client's sasl.jaas.config"
        )
    mechanism = str(canonical["sasl.mechanisms"].value).upper() if "sasl.mechanisms" in canonical else ""
    if mechanism == "PLAIN":
        module = PLAIN_LOGIN
    elif mechanism.startswith("SCRAM-"):
        module = SCRAM_LOGIN
    else:
        raise ConfigurationError(
            f"client setting {present.origin.named()}: a username and password need sasl.mechanism "
            f"PLAIN or SCRAM-SHA-256/512 for the Java client (got {mechanism or 'none'})"
        )
    return jaas_entry(module, str(username.value), str(password.value))


def _truststore(name: str, item: Canonical) -> dict[str, str]:
    """The PEM truststore of ``ssl.ca.pem`` or ``ssl.ca.location`` (none for the system's CAs)."""
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


def _pem_keystore_file(canonical: Mapping[str, Canonical]) -> dict[str, str]:
    """The PEM keystore file holding both the certificate and its key."""
    cert, key = canonical.get("ssl.certificate.location"), canonical.get("ssl.key.location")
    present = cert or key
    assert present is not None
    if cert is None or key is None or str(cert.value) != str(key.value):
        raise ConfigurationError(
            f"client setting {present.origin.named()}: the Java client reads the certificate and its key "
            "from one PEM file (ssl.keystore.type=PEM, ssl.keystore.location): give "
            "ssl.certificate.location and ssl.key.location the same file holding both"
        )
    return {"ssl.keystore.type": "PEM", "ssl.keystore.location": str(cert.value)}


def _pem_keystore_inline(canonical: Mapping[str, Canonical]) -> dict[str, str]:
    """The PEM keystore of an inline certificate and key."""
    cert, key = canonical.get("ssl.certificate.pem"), canonical.get("ssl.key.pem")
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


def java_value(item: Canonical) -> str:
    """``item``'s value as the Java client writes it (``true``/``false`` for booleans)."""
    value = item.value
    if callable(value):
        raise ConfigurationError(
            f"client setting {item.origin.named()} is a callback: the Java client takes none"
        )
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
