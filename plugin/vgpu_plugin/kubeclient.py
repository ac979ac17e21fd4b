"""An official-client ``ApiClient`` from wherever the configuration is.

Order: an explicit kubeconfig path, ``$KUBECONFIG`` (a ``:``-separated list is
merged, as kubectl does), the in-cluster service account, ``~/.kube/config``.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import kubernetes.client


class KubeConfigError(RuntimeError):
    """No usable Kubernetes configuration was found."""


def load(kubeconfig: str | None = None) -> kubernetes.client.ApiClient:
    from kubernetes import client, config

    configuration = client.Configuration()
    path = kubeconfig or os.environ.get("KUBECONFIG")
    default = os.path.expanduser("~/.kube/config")
    try:
        if path:
            config.load_kube_config(config_file=path, client_configuration=configuration)
        elif os.environ.get("KUBERNETES_SERVICE_HOST"):
            config.load_incluster_config(client_configuration=configuration)
        elif os.path.exists(default):
            config.load_kube_config(config_file=default, client_configuration=configuration)
        else:
            raise KubeConfigError(
                "no Kubernetes configuration: pass --kubeconfig, set KUBECONFIG, run inside a pod "
                "(in-cluster service account) or create ~/.kube/config")
    except config.ConfigException as error:
        where = path or ("the in-cluster service account" if os.environ.get("KUBERNETES_SERVICE_HOST") else default)
        raise KubeConfigError(f"cannot load the Kubernetes configuration from {where}: {error}") from error
    return client.ApiClient(configuration)
