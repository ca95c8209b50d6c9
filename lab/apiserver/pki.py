"""The lab cluster's PKI: a CA as ``kubeadm init`` makes one (RSA 2048, CN ``kubernetes``), the
API server's serving certificate, and the signer for kubelet client certificates.

The CA public-key pin is what ``kubeadm join --discovery-token-ca-cert-hash`` compares:
``sha256:`` + hex SHA-256 of the CA certificate's DER-encoded SubjectPublicKeyInfo.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_DAYS = 3650
LEAF_DAYS = 365


@dataclass(frozen=True)
class Pki:
    """Paths of the PKI files in a state directory's ``pki/``."""

    root: Path

    @property
    def ca_cert(self) -> Path:
        return self.root / "ca.crt"

    @property
    def ca_key(self) -> Path:
        return self.root / "ca.key"

    @property
    def serving_cert(self) -> Path:
        return self.root / "apiserver.crt"

    @property
    def serving_key(self) -> Path:
        return self.root / "apiserver.key"


def _now() -> dt.datetime:
    return dt.datetime.now(dt.UTC).replace(microsecond=0)


def _key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def _write_key(path: Path, key: rsa.RSAPrivateKey) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as handle:
        handle.write(key.private_bytes(serialization.Encoding.PEM,
                                       serialization.PrivateFormat.TraditionalOpenSSL,
                                       serialization.NoEncryption()))


def make_ca(pki: Pki) -> None:
    pki.root.mkdir(parents=True, exist_ok=True)
    key = _key()
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kubernetes")])
    now = _now()
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
            .public_key(key.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=CA_DAYS))
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, content_commitment=False,
                                         key_encipherment=True, data_encipherment=False,
                                         key_agreement=False, key_cert_sign=True,
                                         crl_sign=False, encipher_only=False,
                                         decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()),
                           critical=False)
            .sign(key, hashes.SHA256()))
    _write_key(pki.ca_key, key)
    pki.ca_cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def _load_ca(pki: Pki) -> tuple[x509.Certificate, rsa.RSAPrivateKey]:
    cert = x509.load_pem_x509_certificate(pki.ca_cert.read_bytes())
    key = serialization.load_pem_private_key(pki.ca_key.read_bytes(), password=None)
    assert isinstance(key, rsa.RSAPrivateKey)
    return cert, key


def make_serving_cert(pki: Pki, addresses: list[str], hostnames: list[str]) -> None:
    """kube-apiserver's serving certificate, with kubeadm's SANs plus the given ones."""
    ca, ca_key = _load_ca(pki)
    key = _key()
    dns = ["kubernetes", "kubernetes.default", "kubernetes.default.svc",
           "kubernetes.default.svc.cluster.local", *hostnames]
    sans: list[x509.GeneralName] = [x509.DNSName(d) for d in dict.fromkeys(dns)]
    sans += [x509.IPAddress(ipaddress.ip_address(a)) for a in dict.fromkeys(addresses)]
    now = _now()
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "kube-apiserver")]))
            .issuer_name(ca.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(days=LEAF_DAYS))
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]),
                           critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .sign(ca_key, hashes.SHA256()))
    _write_key(pki.serving_key, key)
    pki.serving_cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


class CsrError(ValueError):
    """A certificate signing request that cannot be read."""


def csr_subject(request_pem: bytes) -> tuple[str, list[str]]:
    """(common name, organizations) of a PEM CSR; raises CsrError."""
    try:
        csr = x509.load_pem_x509_csr(request_pem)
    except ValueError as exc:
        raise CsrError(f"the CSR is not a PEM certificate request: {exc}") from None
    if not csr.is_signature_valid:
        raise CsrError("the CSR's signature does not verify")
    cn = [a.value for a in csr.subject.get_attributes_for_oid(NameOID.COMMON_NAME)]
    orgs = [a.value for a in csr.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)]
    return (str(cn[0]) if cn else ""), [str(o) for o in orgs]


def sign_client_csr(pki: Pki, request_pem: bytes, seconds: int = LEAF_DAYS * 86400) -> bytes:
    """A client certificate for the CSR's subject, signed by the cluster CA (PEM)."""
    ca, ca_key = _load_ca(pki)
    csr = x509.load_pem_x509_csr(request_pem)
    now = _now()
    cert = (x509.CertificateBuilder().subject_name(csr.subject).issuer_name(ca.subject)
            .public_key(csr.public_key()).serial_number(x509.random_serial_number())
            .not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(seconds=seconds))
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]),
                           critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .sign(ca_key, hashes.SHA256()))
    return cert.public_bytes(serialization.Encoding.PEM)


def ca_cert_hash(cert_pem: bytes) -> str:
    """kubeadm's CA pin: sha256 of the DER SubjectPublicKeyInfo."""
    cert = x509.load_pem_x509_certificate(cert_pem)
    spki = cert.public_key().public_bytes(serialization.Encoding.DER,
                                          serialization.PublicFormat.SubjectPublicKeyInfo)
    return "sha256:" + hashlib.sha256(spki).hexdigest()
