"""TLS material for the local secured cluster: a throwaway CA and one certificate per node.

Everything is PEM, which Kafka reads with ``ssl.keystore.type=PEM`` /
``ssl.truststore.type=PEM`` and librdkafka with ``ssl.ca.location``. Keys are EC P-256:
fast to generate, and Kafka's PEM loader accepts them.

A node's private key is written unencrypted to a 0600 file and handed to Kafka
inline (``ssl.keystore.key``): Kafka's file-based PEM keystore insists on an
encrypted key, and Java 17 cannot decrypt the PBES2 (AES) PKCS#8 keys that the
``cryptography`` package writes. The CA's private key is never written: the
certificates are all issued in one go, and a later start issues a new set.

Layout of ``folder``::

    ca.pem                      the CA certificate (the truststore of nodes and clients)
    node-<id>.pem               the node's certificate followed by the CA's (its chain)
    node-<id>.key               the node's private key, PKCS#8, 0600
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

VALIDITY = dt.timedelta(days=365)
# A start re-issues the set when any certificate expires sooner than this.
RENEW_BEFORE = dt.timedelta(days=7)
HOSTS = ("localhost", "127.0.0.1")


def node_common_name(node_id: int) -> str:
    """The CN of node ``node_id``'s certificate; its Kafka principal is ``User:CN=<this>``."""
    return f"txbridge-kafka-node-{node_id}"


@dataclass(frozen=True)
class NodeTls:
    """Paths of one node's certificate chain and private key."""

    chain: Path
    key: Path


@dataclass(frozen=True)
class ClusterTls:
    """Paths of the CA certificate and of each node's TLS files."""

    ca: Path
    nodes: dict[int, NodeTls]


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _write_private(path: Path, data: bytes) -> None:
    """Write ``data`` to a file only its owner can read, with no window where it is wider."""
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as out:
        out.write(data)


def _issue(
    subject: str,
    key: ec.EllipticCurvePrivateKey,
    issuer: x509.Certificate | None,
    issuer_key: ec.EllipticCurvePrivateKey,
    now: dt.datetime,
) -> x509.Certificate:
    is_ca = issuer is None
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(subject))
        .issuer_name(issuer.subject if issuer else _name(subject))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + VALIDITY)
        .add_extension(x509.BasicConstraints(ca=is_ca, path_length=0 if is_ca else None), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
    )
    if is_ca:
        builder = builder.add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
    else:
        assert issuer is not None
        builder = (
            builder.add_extension(
                x509.SubjectAlternativeName(
                    [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
                ),
                critical=False,
            )
            # A node is a TLS server to clients and a TLS client to the other nodes (mutual TLS).
            .add_extension(
                x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]),
                critical=False,
            )
            .add_extension(
                x509.AuthorityKeyIdentifier.from_issuer_public_key(issuer_key.public_key()), critical=False
            )
        )
    return builder.sign(issuer_key, hashes.SHA256())


def cluster_tls_paths(folder: Path, node_ids: list[int]) -> ClusterTls:
    """The paths of the TLS files in ``folder``, without issuing anything."""
    return ClusterTls(
        ca=folder / "ca.pem",
        nodes={i: NodeTls(folder / f"node-{i}.pem", folder / f"node-{i}.key") for i in node_ids},
    )


def _still_valid(tls: ClusterTls, now: dt.datetime) -> bool:
    files = [tls.ca, *(p for n in tls.nodes.values() for p in (n.chain, n.key))]
    if not all(f.is_file() for f in files):
        return False
    certs = [x509.load_pem_x509_certificate(tls.ca.read_bytes())]
    certs += [x509.load_pem_x509_certificate(n.chain.read_bytes()) for n in tls.nodes.values()]
    return all(c.not_valid_after_utc - now > RENEW_BEFORE for c in certs)


def ensure_cluster_tls(folder: Path, node_ids: list[int]) -> ClusterTls:
    """Return the CA and node certificates in ``folder``, issuing a new set when needed.

    A set is issued when a file is missing or a certificate expires within
    :data:`RENEW_BEFORE`; otherwise the existing set is kept, so clients that
    trust ``ca.pem`` keep working across restarts.

    Args:
        folder: where the PEM files live (created if missing).
        node_ids: the nodes that need a certificate.
    """
    tls = cluster_tls_paths(folder, node_ids)
    now = dt.datetime.now(dt.UTC)
    if _still_valid(tls, now):
        return tls
    folder.mkdir(parents=True, exist_ok=True)
    # The CA goes last: a start interrupted half-way leaves no ca.pem, so the next one issues a full set.
    tls.ca.unlink(missing_ok=True)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = _issue("txbridge local Kafka CA", ca_key, None, ca_key, now)
    ca_pem = ca_cert.public_bytes(serialization.Encoding.PEM)
    for node_id, paths in tls.nodes.items():
        key = ec.generate_private_key(ec.SECP256R1())
        cert = _issue(node_common_name(node_id), key, ca_cert, ca_key, now)
        _write_private(
            paths.key,
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            ),
        )
        paths.chain.write_bytes(cert.public_bytes(serialization.Encoding.PEM) + ca_pem)
    tls.ca.write_bytes(ca_pem)
    return tls
