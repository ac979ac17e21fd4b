"""Choosing how a share request is carried out (JupyterHub, Kubernetes, or not at all)."""

from __future__ import annotations

from collections.abc import Mapping

from jupyter_vgpu.core import contract
from jupyter_vgpu.server.requests import HubRequester, RequestTracker

NO_REQUESTER = (
    "this server cannot ask for a different share by itself: it is not running under JupyterHub "
    f"(no JUPYTERHUB_API_TOKEN) and has no kubeconfig (${contract.ENV_NOTEBOOK_KUBECONFIG}). "
    "Ask your admin for a vGPU profile, or restart your server with a different one."
)


def make_tracker(kind: str, kubeconfig: str, timeout: float, environ: Mapping[str, str]) -> RequestTracker:
    """A tracker over the requester ``kind`` ('auto', 'jupyterhub', 'kube' or 'none')."""
    kubeconfig = kubeconfig or environ.get(contract.ENV_NOTEBOOK_KUBECONFIG, "")
    if kind in ("auto", "jupyterhub"):
        hub = HubRequester.from_environ(environ, timeout=timeout)
        if hub is not None:
            return RequestTracker(hub)
        if kind == "jupyterhub":
            return RequestTracker(None, "JupyterHub requests are configured but JUPYTERHUB_API_URL, "
                                        "JUPYTERHUB_API_TOKEN or JUPYTERHUB_USER is missing")
    if kind in ("auto", "kube"):
        from jupyter_vgpu.server.kube_request import KubeRecreateRequester

        kube = KubeRecreateRequester.from_environ(kubeconfig, environ, timeout=timeout)
        if kube is not None:
            return RequestTracker(kube)
        if kind == "kube":
            return RequestTracker(None, "Kubernetes requests are configured but there is no kubeconfig "
                                        f"(${contract.ENV_NOTEBOOK_KUBECONFIG}) or pod name "
                                        f"(${contract.ENV_POD_NAME})")
    return RequestTracker(None, NO_REQUESTER)
