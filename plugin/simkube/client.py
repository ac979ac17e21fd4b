"""The official client pointed at a simulated API server: one place that builds it, for the
server's own ``api_client()`` and for a process that has only the url, token and certificate
(a control plane spawned beside the server)."""

from __future__ import annotations

from typing import Any

__all__ = ["api_client"]


def api_client(url: str, token: str, ca_pem: bytes) -> Any:
    """A fresh official-client ``ApiClient`` for the API at ``url``, sending ``token`` and
    trusting only the server's certificate ``ca_pem``."""
    import kubernetes.client

    configuration = kubernetes.client.Configuration()
    configuration.host = url
    configuration.api_key = {"authorization": f"Bearer {token}"}  # as load_kube_config sets it
    configuration.ca_cert_data = ca_pem.decode()
    return kubernetes.client.ApiClient(configuration)
