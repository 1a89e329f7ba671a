"""Which client settings are secret, and how a secret is shown.

Apart from :mod:`txbridge.client_config` so that the Kafka layer (:mod:`txbridge.kafka`), which
that module uses, can mask secrets in its errors without importing it back (no import cycle).
"""

MASK = "***"

_SECRET_PARTS = ("password", "secret", "jaas", "passphrase", "key.pem", "keystore.key", "oauthbearer.config")


def is_secret(name: str) -> bool:
    """True for a setting whose value must never be shown (passwords, JAAS, private keys)."""
    lowered = name.lower()
    return any(part in lowered for part in _SECRET_PARTS)
