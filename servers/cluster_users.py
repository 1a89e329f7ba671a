"""The local cluster's SCRAM users: their passwords and their client settings.

Each user's password is generated once, before the storage that records its credential
is formatted, and kept in a 0600 file; each user's Java client settings are written to
``clients/<user>.properties`` (0600) for the Kafka CLIs' ``--command-config``.
"""

from __future__ import annotations

import secrets
from pathlib import Path

from servers.cluster_layout import ClusterLayout, java_properties, write_private
from txbridge.errors import BrokerError, ConfigurationError

SCRAM_MECHANISM = "SCRAM-SHA-512"
ADMIN_USER = "admin"
#: SCRAM users created at format time: the admin (a super user) and one per role of txbridge.
USERS = (ADMIN_USER, "producer", "coordinator", "consumer")
SCRAM_LOGIN = "org.apache.kafka.common.security.scram.ScramLoginModule"


def known(user: str) -> str:
    """``user``, if the local cluster has it.

    Raises:
        ConfigurationError: it does not.
    """
    if user not in USERS:
        raise ConfigurationError(f"unknown SCRAM user {user!r}: the local cluster has {', '.join(USERS)}")
    return user


class ClusterUsers:
    """The SCRAM users' password files and client settings of the cluster in ``layout``."""

    def __init__(self, layout: ClusterLayout) -> None:
        self._layout = layout

    def properties_file(self, user: str) -> Path:
        """``user``'s Java client properties file."""
        return self._layout.home / "clients" / f"{known(user)}.properties"

    def _password_file(self, user: str) -> Path:
        return self._layout.home / "users" / f"{known(user)}.password"

    def password(self, user: str) -> str:
        """``user``'s SCRAM password, read from its 0600 file.

        Raises:
            BrokerError: the cluster was never formatted in ``home``.
        """
        path = self._password_file(user)
        try:
            return path.read_text().strip()
        except FileNotFoundError:
            raise BrokerError(
                f"no password for {user!r} in {path.parent}: "
                "start the cluster with 'txbridge kafka start --brokers 3 --secure'"
            ) from None

    def client_config(self, user: str) -> dict[str, str]:
        """librdkafka security settings for ``user`` (no ``bootstrap.servers``)."""
        return {
            "security.protocol": "SASL_SSL",
            "sasl.mechanisms": SCRAM_MECHANISM,
            "sasl.username": user,
            "sasl.password": self.password(user),
            "ssl.ca.location": str(self._layout.ca_file),
        }

    def java_client_properties(self, user: str) -> dict[str, str]:
        """The same settings with the Java client's names, and the bootstrap list."""
        return {
            "bootstrap.servers": self._layout.bootstrap,
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": SCRAM_MECHANISM,
            "sasl.jaas.config": (
                f'{SCRAM_LOGIN} required username="{user}" password="{self.password(user)}";'
            ),
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(self._layout.ca_file),
        }

    def ensure_passwords(self, any_formatted: bool) -> None:
        """Generate each user's password once, before the storage that records it is formatted.

        Raises:
            BrokerError: a password is missing but the storage already holds its credential.
        """
        for user in USERS:
            path = self._password_file(user)
            if path.is_file():
                continue
            if any_formatted:
                raise BrokerError(
                    f"{path} is missing but the cluster's storage is formatted with its SCRAM "
                    f"credential: delete {self._layout.home} to begin afresh"
                )
            # URL-safe characters: no quoting needed in JAAS, properties or --add-scram.
            write_private(path, secrets.token_urlsafe(24) + "\n")

    def write_client_files(self) -> None:
        """Write every user's Java client properties file."""
        for user in USERS:
            write_private(self.properties_file(user), java_properties(self.java_client_properties(user)))
