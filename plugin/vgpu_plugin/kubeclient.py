"""An official-client ``ApiClient`` from wherever the configuration is.

Order: an explicit kubeconfig path, ``$KUBECONFIG`` (a ``:``-separated list is
merged, as kubectl does), the in-cluster service account, ``~/.kube/config``.

The official client calls the loader's credential hook before every request; the hook
re-applies the whole kubeconfig each time (host, certificates, proxy settings: ~0.1 ms
and a scan of the environment), though it only ever fetches a new token once the old
one is within 5 minutes of expiring (an in-cluster token: once a minute). ``load``
runs it at most once a second.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

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
    if configuration.refresh_api_key_hook is not None:
        configuration.refresh_api_key_hook = refresh_at_most_every(configuration.refresh_api_key_hook, 1.0)
    return client.ApiClient(configuration)


def refresh_at_most_every(hook: Callable[[Any], None], seconds: float,
                          clock: Callable[[], float] = time.monotonic) -> Callable[[Any], None]:
    """``hook`` (a client configuration's ``refresh_api_key_hook``) run at most once per ``seconds``.

    Safe for the loaders' hooks: kubeconfig credentials are renewed 5 minutes before they
    expire and in-cluster tokens re-read every minute, so a second's delay never sends an
    expired one. A hook that installs a new hook on the configuration when it runs (the
    kubeconfig loader's does) is followed: the new one is the one run next time, still at
    most once per ``seconds``. Threads may race to run it twice, as they ran it on every call before.
    """
    current = [hook]
    last: list[float] = []

    def refresh(configuration: Any) -> None:
        now = clock()
        if last and now - last[0] < seconds:
            return
        last[:] = [now]
        current[0](configuration)
        installed = getattr(configuration, "refresh_api_key_hook", refresh)
        if installed is not refresh and installed is not None:
            current[0] = installed
            configuration.refresh_api_key_hook = refresh

    return refresh
