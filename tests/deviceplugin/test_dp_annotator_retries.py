"""The node daemon's annotation writes when the API server keeps refusing them: each pod is
retried about once a second, never once per reconcile pass on top (on a real cluster the
admission policy refused every such PATCH, and the retries grew to several a second per pod
and kept growing); once the API server takes the write, the pod is marked. The daemon over
gRPC with the kubelet stand-in, the simulated API through the official client."""

from __future__ import annotations

import threading
import time

from deviceplugin_support import (
    CORE,
    MEMORY,
    NAMES,
    all_ids,
    annotations,
    make_node,
    place_pod,
    wait_registered,
)
from simkube.waiting import wait_for

from jupyter_vgpu.core.contract import Request

POD = "jupyter-carol"
PATH = f"/api/v1/namespaces/default/pods/{POD}"


def patches(kube, since: int) -> int:
    return sum(1 for r in list(kube.emulator)[since:]
               if str(getattr(r.method, "value", r.method)) == "PATCH" and r.url.path == PATH)


def test_a_refused_annotation_is_retried_once_a_second_and_lands_when_allowed(daemons, peer, gpus, core_v1, kube):
    make_node(core_v1)
    refusing = threading.Event()
    refusing.set()
    kube.emulator["patch", PATH][lambda request: refusing.is_set()] << 422
    daemon = daemons(gpus)  # reconcile every 0.3 s, gpu-assigned 1 s after Allocate
    wait_registered(peer)
    assert daemon.wait_ready(10)
    place_pod(core_v1, gpus, POD, [(Request(30, 12), (0,))])
    wait_for(lambda: (daemon.informer.get("default", POD) or {}).get("spec", {}).get("nodeName"),
             timeout=20, what="the pod in the daemon's view")
    peer.admit(CORE, 30, all_ids("core"))
    peer.admit(MEMORY, 12, all_ids("memory"))
    time.sleep(2)  # refused writes queued by Allocate and the first reconcile passes
    since = len(list(kube.emulator))
    time.sleep(6)  # twenty reconcile passes find the pod unmarked
    tries = patches(kube, since)
    assert 3 <= tries <= 10, f"{tries} PATCHes in 6 s"
    refusing.clear()
    wait_for(lambda: annotations(core_v1, POD).get(NAMES.gpu_assigned) == "true", timeout=10,
             what="the pod marked once the API server takes the write")
