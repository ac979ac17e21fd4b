"""A throwaway TLS identity for the simulated API server on 127.0.0.1.

kubectl (client-go) sends a kubeconfig's bearer token only over TLS, so the simulated
API serves HTTPS with a self-signed certificate made per instance; the kubeconfig
carries it as ``certificate-authority-data`` and clients verify the server with it.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import ssl
import tempfile
from dataclasses import dataclass

HOST = "127.0.0.1"


@dataclass(frozen=True)
class ServerIdentity:
    cert_pem: bytes
    key_pem: bytes

    @classmethod
    def generate(cls, days: int = 365) -> ServerIdentity:
        """A P-256 key and a self-signed certificate for 127.0.0.1/localhost (its own CA)."""
        from cryptography import x509
        from cryptography.hazmat.primitives import hashes, serialization
        from cryptography.hazmat.primitives.asymmetric import ec
        from cryptography.x509.oid import NameOID

        key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "vgpu-sim-apiserver")])
        now = datetime.datetime.now(datetime.timezone.utc)
        public = key.public_key()
        cert = (
            x509.CertificateBuilder()
            .subject_name(name).issuer_name(name).public_key(public)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(hours=1))  # tolerate a little clock skew
            .not_valid_after(now + datetime.timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, content_commitment=False,
                                         key_encipherment=False, data_encipherment=False, key_agreement=False,
                                         crl_sign=False, encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.ExtendedKeyUsage([x509.oid.ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(HOST)),
                                                        x509.DNSName("localhost")]), critical=False)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(public), critical=False)
            .sign(key, hashes.SHA256())
        )
        return cls(cert.public_bytes(serialization.Encoding.PEM),
                   key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                     serialization.NoEncryption()))

    def server_context(self) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        # ssl loads a key only from files: a private directory, gone once loaded.
        with tempfile.TemporaryDirectory(prefix="vgpu-sim-tls-") as private:
            cert, key = os.path.join(private, "cert.pem"), os.path.join(private, "key.pem")
            for path, data in ((cert, self.cert_pem), (key, self.key_pem)):
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
                with open(fd, "wb") as handle:
                    handle.write(data)
            context.load_cert_chain(cert, key)
        return context

    def client_context(self) -> ssl.SSLContext:
        """For raw HTTP clients (urllib, http.client): trusts this server only."""
        return ssl.create_default_context(cadata=self.cert_pem.decode())
