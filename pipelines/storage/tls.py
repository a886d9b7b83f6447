"""Certificates for the embedded SeaweedFS's gRPC ports: mutual TLS, so that only weed itself
(which holds the key) can call its master, volume, filer, S3 and admin services.

A fresh certificate authority signs one certificate for 127.0.0.1 at every start; the
authority's key is never written, the node's key is written mode 0600.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from pipelines.storage.credentials import write_private_file

VALID_DAYS = 3650
BOTH_ENDS = [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]


@dataclass(frozen=True, slots=True)
class GrpcCertificates:
    ca: Path  # the authority's certificate: what every side trusts
    cert: Path  # the one certificate weed presents, as a server and as a client
    key: Path


def certificate_paths(directory: Path) -> GrpcCertificates:
    """Where `write_grpc_certificates` keeps them: what a client of the same server presents."""
    return GrpcCertificates(
        ca=directory / "ca.crt", cert=directory / "node.crt", key=directory / "node.key"
    )


def write_grpc_certificates(directory: Path) -> GrpcCertificates:
    """A new authority and a certificate it signed, for both ends of weed's gRPC calls."""
    now = datetime.datetime.now(datetime.UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kindex embedded S3 CA")])
    ca_cert = (
        _builder(ca_name, ca_name, ca_key.public_key(), now)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    node_key = ec.generate_private_key(ec.SECP256R1())
    node_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kindex embedded S3")])
    node_cert = (
        _builder(node_name, ca_name, node_key.public_key(), now)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1")), x509.DNSName("localhost")]
            ),
            critical=False,
        )
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    certificates = certificate_paths(directory)
    pem = serialization.Encoding.PEM
    write_private_file(certificates.ca, ca_cert.public_bytes(pem))
    write_private_file(certificates.cert, node_cert.public_bytes(pem))
    write_private_file(
        certificates.key,
        node_key.private_bytes(
            pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
        ),
    )
    return certificates


def _builder(
    subject: x509.Name, issuer: x509.Name, key: ec.EllipticCurvePublicKey, now: datetime.datetime
) -> x509.CertificateBuilder:
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(days=VALID_DAYS))
    )
