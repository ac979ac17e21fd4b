"""The real cluster's certificates: one CA, the API server's serving certificate, a client
certificate per identity (``CN`` the user, ``O`` its groups, as kube-apiserver's x509
authenticator reads them), and the service-account signing key.

Everything is made fresh per cluster, lives in its work directory (keys 0600), and is valid
for a day: enough for any test run or demo, useless after.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

HOSTS = ("127.0.0.1", "localhost")


def _write(path: Path, data: bytes, private: bool = False) -> Path:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600 if private else 0o644)
    with open(fd, "wb") as handle:
        handle.write(data)
    return path


@dataclass(frozen=True)
class KeyPair:
    cert: Path
    key: Path

    @property
    def cert_pem(self) -> bytes:
        return self.cert.read_bytes()

    @property
    def key_pem(self) -> bytes:
        return self.key.read_bytes()


class PKI:
    """A CA in ``directory`` and what it signs."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec, rsa
        from cryptography.x509.oid import NameOID

        self._x509, self._hashes, self._serialization, self._ec = x509, hashes, serialization, ec
        self.directory = Path(directory)
        self.directory.mkdir(parents=True, exist_ok=True)
        self._now = datetime.datetime.now(datetime.timezone.utc)
        self._key = ec.generate_private_key(ec.SECP256R1())
        self._name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "jupyter-vgpu real-cluster CA")])
        public = self._key.public_key()
        ca = (self._builder(self._name, public)
              .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
              .add_extension(self._usage(cert_sign=True), critical=True)
              .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
              .sign(self._key, hashes.SHA256()))
        self.ca = _write(self.directory / "ca.crt", ca.public_bytes(serialization.Encoding.PEM))
        # kube-apiserver signs service-account tokens with this key and checks them with it
        signing = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        self.service_account_key = _write(self.directory / "sa.key", signing.private_bytes(
            serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()), private=True)

    def _builder(self, subject, public):  # type: ignore[no-untyped-def]
        return (self._x509.CertificateBuilder().subject_name(subject).issuer_name(self._name).public_key(public)
                .serial_number(self._x509.random_serial_number())
                .not_valid_before(self._now - datetime.timedelta(hours=1))  # a little clock skew
                .not_valid_after(self._now + datetime.timedelta(days=1)))

    def _usage(self, cert_sign: bool = False):  # type: ignore[no-untyped-def]
        return self._x509.KeyUsage(digital_signature=True, key_cert_sign=cert_sign, crl_sign=cert_sign,
                                   key_encipherment=False, content_commitment=False, data_encipherment=False,
                                   key_agreement=False, encipher_only=False, decipher_only=False)

    def issue(self, name: str, *, user: str, groups: Sequence[str] = (), server: bool = False) -> KeyPair:
        """A key and certificate for ``user`` in ``groups`` (a client), or for 127.0.0.1 and
        localhost (``server``), written as ``<name>.crt`` and ``<name>.key``."""
        x509, NameOID = self._x509, self._x509.oid.NameOID
        key = self._ec.generate_private_key(self._ec.SECP256R1())
        subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, user)]
                            + [x509.NameAttribute(NameOID.ORGANIZATION_NAME, group) for group in groups])
        purpose = x509.oid.ExtendedKeyUsageOID.SERVER_AUTH if server else x509.oid.ExtendedKeyUsageOID.CLIENT_AUTH
        builder = (self._builder(subject, key.public_key())
                   .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
                   .add_extension(self._usage(), critical=True)
                   .add_extension(x509.ExtendedKeyUsage([purpose]), critical=False))
        if server:
            builder = builder.add_extension(x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address(HOSTS[0])), x509.DNSName(HOSTS[1])]), critical=False)
        cert = builder.sign(self._key, self._hashes.SHA256())
        encoding = self._serialization.Encoding.PEM
        return KeyPair(
            _write(self.directory / f"{name}.crt", cert.public_bytes(encoding)),
            _write(self.directory / f"{name}.key", key.private_bytes(
                encoding, self._serialization.PrivateFormat.PKCS8, self._serialization.NoEncryption()), private=True))
