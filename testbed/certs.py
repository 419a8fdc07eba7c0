"""The test bed's PKI: certificates for kube-apiserver, kubelets and webhook servers.

EC P-256 keys, certificates backdated against clock skew; what cert-manager or kubeadm would
issue, made in microseconds.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID


def pem_key(key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def pem_cert(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def write_private(path: Path, data: bytes) -> Path:
    """Write key material readable by the owner only (kube tools warn about looser modes)."""
    path.touch(mode=0o600, exist_ok=True)
    path.write_bytes(data)
    return path


def issue(
    subject: x509.Name,
    key: ec.EllipticCurvePrivateKey,
    issuer: tuple[x509.Name, ec.EllipticCurvePrivateKey] | None,
    extensions: list[tuple[x509.ExtensionType, bool]],
) -> x509.Certificate:
    """Sign a certificate; issuer None means self-signed. Backdated an hour against clock skew."""
    issuer_name, issuer_key = issuer if issuer is not None else (subject, key)
    now = dt.datetime.now(dt.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(hours=1))
        .not_valid_after(now + dt.timedelta(days=365))
    )
    for extension, critical in extensions:
        builder = builder.add_extension(extension, critical=critical)
    return builder.sign(issuer_key, hashes.SHA256())


def x509_name(common_name: str, organization: str | None = None) -> x509.Name:
    attributes = [x509.NameAttribute(NameOID.COMMON_NAME, common_name)]
    if organization is not None:
        attributes.append(x509.NameAttribute(NameOID.ORGANIZATION_NAME, organization))
    return x509.Name(attributes)


# The key usages no certificate here asserts (x509.KeyUsage takes every flag explicitly).
_UNUSED_KEY_USAGES = (
    "content_commitment",
    "data_encipherment",
    "key_agreement",
    "encipher_only",
    "decipher_only",
)


def key_usage(*, ca: bool) -> x509.KeyUsage:
    """A CA's key signs certificates and CRLs; a leaf's signs and enciphers keys."""
    return x509.KeyUsage(
        digital_signature=True,
        key_encipherment=not ca,
        key_cert_sign=ca,
        crl_sign=ca,
        **dict.fromkeys(_UNUSED_KEY_USAGES, False),
    )


def leaf_extensions(usage: x509.ObjectIdentifier) -> list[tuple[x509.ExtensionType, bool]]:
    return [
        (x509.BasicConstraints(ca=False, path_length=None), True),
        (key_usage(ca=False), True),
        (x509.ExtendedKeyUsage([usage]), False),
    ]


def new_ec_key() -> ec.EllipticCurvePrivateKey:
    """EC P-256: generated in microseconds, where RSA takes tens of milliseconds per key."""
    return ec.generate_private_key(ec.SECP256R1())


def general_name(host: str) -> x509.GeneralName:
    try:
        return x509.IPAddress(ipaddress.ip_address(host))
    except ValueError:
        return x509.DNSName(host)


@dataclass(frozen=True)
class ServingCert:
    ca_pem: bytes
    cert_file: Path
    key_file: Path


def ca_extensions() -> list[tuple[x509.ExtensionType, bool]]:
    return [(x509.BasicConstraints(ca=True, path_length=0), True), (key_usage(ca=True), True)]


def serving_cert(
    directory: Path, hosts: tuple[str, ...] = ("127.0.0.1", "localhost")
) -> ServingCert:
    """A throwaway CA and a serving certificate for HOSTS (a webhook server's)."""
    directory.mkdir(parents=True, exist_ok=True)
    ca_key, ca_name = new_ec_key(), x509_name("schedlock-test-ca")
    ca = issue(ca_name, ca_key, None, ca_extensions())
    key = new_ec_key()
    sans = x509.SubjectAlternativeName([general_name(host) for host in hosts])
    extensions = [*leaf_extensions(ExtendedKeyUsageOID.SERVER_AUTH), (sans, False)]
    cert = issue(x509_name(hosts[0]), key, (ca_name, ca_key), extensions)
    cert_file = directory / "tls.crt"
    cert_file.write_bytes(pem_cert(cert))
    key_file = write_private(directory / "tls.key", pem_key(key))
    return ServingCert(pem_cert(ca), cert_file, key_file)
