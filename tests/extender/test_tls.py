"""HTTPS with client certificates, for an extender that is not a sidecar on the loopback:
kube-scheduler's enableHTTPS + tlsConfig (as the stand-in speaks it) gets through,
anything without a certificate signed by the client CA does not."""

from __future__ import annotations

import dataclasses
import datetime
import ipaddress
import ssl
import urllib.error
import urllib.request

import pytest
from extender_support import GIB_UNITS, node, pod
from simkube.scheduler import SimScheduler, load_config
from simkube.waiting import wait_for
from vgpu_plugin.demo.cluster import scheduler_config_path
from vgpu_plugin.informer import Informer

x509 = pytest.importorskip("cryptography.x509")  # installed with the hub extra (certipy)
from cryptography.hazmat.primitives import hashes, serialization  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import ec  # noqa: E402
from cryptography.x509.oid import NameOID  # noqa: E402


def _issue(name, issuer_key=None, issuer_name=None, *, ca=False, server=False):
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (x509.CertificateBuilder().subject_name(subject).issuer_name(issuer_name or subject)
               .public_key(key.public_key()).serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5))
               .not_valid_after(now + datetime.timedelta(hours=1))
               .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
    if server:
        builder = builder.add_extension(
            x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]), critical=False)
    cert = builder.sign(issuer_key or key, hashes.SHA256())
    return key, cert


def _write(path, key, cert):
    path.with_suffix(".key").write_bytes(key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()))
    path.with_suffix(".crt").write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    return str(path.with_suffix(".crt")), str(path.with_suffix(".key"))


@pytest.fixture
def pki(tmp_path):
    ca_key, ca_cert = _issue("vgpu test CA", ca=True)
    ca_file, _ = _write(tmp_path / "ca", ca_key, ca_cert)
    server = _write(tmp_path / "server", *_issue("extender", ca_key, ca_cert.subject, server=True))
    client = _write(tmp_path / "client", *_issue("kube-scheduler", ca_key, ca_cert.subject))
    stranger_key, stranger_cert = _issue("stranger")
    stranger = _write(tmp_path / "stranger", stranger_key, stranger_cert)
    return {"ca": ca_file, "server": server, "client": client, "stranger": stranger}


def test_mutual_tls_between_scheduler_and_extender(cluster, pki):
    cluster.add_node(node("gpu-a", count=1))
    extender = cluster.start_extender(tls_cert=pki["server"][0], tls_key=pki["server"][1], client_ca=pki["ca"])
    assert extender.url.startswith("https://127.0.0.1:")

    def get_healthz(context):
        with urllib.request.urlopen(f"{extender.base_url}/healthz", timeout=10, context=context) as response:
            return response.read()

    trusting = ssl.create_default_context(cafile=pki["ca"])
    with pytest.raises((ssl.SSLError, urllib.error.URLError, ConnectionError)):
        get_healthz(trusting)  # no client certificate
    stranger = ssl.create_default_context(cafile=pki["ca"])
    stranger.load_cert_chain(*pki["stranger"])
    with pytest.raises((ssl.SSLError, urllib.error.URLError, ConnectionError)):
        get_healthz(stranger)  # a certificate the client CA did not sign
    with pytest.raises((urllib.error.URLError, ConnectionError)):  # plain HTTP
        urllib.request.urlopen(extender.base_url.replace("https:", "http:") + "/healthz", timeout=10)
    member = ssl.create_default_context(cafile=pki["ca"])
    member.load_cert_chain(*pki["client"])
    assert get_healthz(member) == b"ok"

    config = load_config(scheduler_config_path())
    tls = {"certFile": pki["client"][0], "keyFile": pki["client"][1], "caFile": pki["ca"]}
    config = dataclasses.replace(config, extenders=tuple(
        dataclasses.replace(ext, enable_https=True, tls=tls) for ext in config.extenders))
    with SimScheduler(cluster.kube.api_client(), config, informer=Informer, extender_url=extender.base_url,
                      initial_backoff=0.2):
        cluster.add_pod(pod("nb", cores=20, memory_units=2 * GIB_UNITS))
        wait_for(lambda: cluster.read_pod("nb")["spec"].get("nodeName") == "gpu-a", timeout=20, what="bound over mTLS")


def test_tls_settings_must_come_in_pairs(pki):
    from vgpu_plugin.extender.server import Extender

    with pytest.raises(ValueError, match="both a certificate and its key"):
        Extender(port=0, tls_cert=pki["server"][0])
    with pytest.raises(ValueError, match="needs a server certificate"):
        Extender(port=0, client_ca=pki["ca"])
    with pytest.raises(ValueError, match="cannot load the TLS files"):
        Extender(port=0, tls_cert=pki["server"][0], tls_key=pki["client"][1])  # key does not match
