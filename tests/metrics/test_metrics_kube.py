"""End to end with the pod cache the node daemon uses: pods created through the official
client on the simulated API server, watched by the Informer, served by the metrics server."""

from __future__ import annotations

import json
import secrets
import urllib.error
import urllib.request
from typing import Any

from metrics_support import NODE, SCRAPE_TOKEN, FakeNode, cgroup_text, token_of, wait_for_samples
from prometheus_client.parser import text_string_to_metric_families
from simkube.waiting import wait_for
from vgpu_plugin.informer import Informer
from vgpu_plugin.metrics import MetricsServer
from vgpu_plugin.tokens import TokenMinter, new_allocation_id

from jupyter_vgpu.core import contract as c


def create_pod(core_v1: Any, fake_node: FakeNode, name: str, node: str, card: int) -> tuple[str, str]:
    """A notebook pod bound to ``node`` holding 25 % of ``card``, running; (uid, container ID)."""
    allocation = c.PodAllocation(node, (c.ContainerAllocation(0, "notebook", (
        c.CardShare(card, fake_node.card_uuid(card), 25, 16),), allocation_id=new_allocation_id()),))
    body = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": "default",
                     "annotations": c.predicate_annotations(allocation)},
        "spec": {"nodeName": node, "containers": [{
            "name": "notebook", "image": "jupyter/base-notebook",
            "resources": {"limits": c.request_limits(c.Request(25, 16))}}]},
    }
    created = core_v1.create_namespaced_pod("default", body)
    container_id = secrets.token_hex(32)
    core_v1.patch_namespaced_pod_status(name, "default", {"status": {
        "phase": "Running",
        "containerStatuses": [{"name": "notebook", "ready": True, "restartCount": 0, "image": "x", "imageID": "x",
                               "containerID": f"containerd://{container_id}"}],
    }})
    return created.metadata.uid, container_id


def gm_total(server: MetricsServer) -> dict[str, float]:
    request = urllib.request.Request(server.scrape_url + "/metric", headers={"Authorization": f"Bearer {SCRAPE_TOKEN}"})
    with urllib.request.urlopen(request, timeout=30) as response:
        text = response.read().decode()
    return {
        s.labels["pod_name"]: s.value
        for family in text_string_to_metric_families(text) if family.name == c.METRIC_GM_CONTAINER_UTILIZATION
        for s in family.samples if s.labels["gpu"] == "total"
    }


def test_informer_fed_server_maps_processes_and_follows_pod_lifecycle(kube: Any, core_v1: Any,
                                                                        fake_node: FakeNode) -> None:
    minter = TokenMinter(secrets.token_bytes(32))
    informer = Informer(core_v1.list_pod_for_all_namespaces, field_selector=f"spec.nodeName={NODE}").start()
    server = MetricsServer(NODE, fake_node.gpus, informer, minter, address="127.0.0.1", port=0, period=0.05,
                           scrape_token=SCRAPE_TOKEN,
                           proc_root=fake_node.proc_root)
    try:
        assert informer.wait_synced(30)
        server.start()
        uid, container_id = create_pod(core_v1, fake_node, "jupyter-alice", NODE, 2)
        create_pod(core_v1, fake_node, "jupyter-elsewhere", "gpu-node-2", 2)
        pid = 4242
        fake_node.write_cgroup(pid, cgroup_text(uid, container_id, "containerd"))
        fake_node.gpus.start_process(pid, 2, memory_limit_mib=4096, cores_limit=25)
        fake_node.gpus.set_usage(pid, 2500, 17)

        wait_for(lambda: gm_total(server).get("jupyter-alice") == 17, timeout=60, what="alice's utilisation in /metric")
        assert "jupyter-elsewhere" not in gm_total(server)

        token = token_of(minter, core_v1.read_namespaced_pod("jupyter-alice", "default").to_dict(), 0)
        request = urllib.request.Request(server.url + "/api/v1/usage",
                                         headers={"Authorization": f"Bearer {token}"})
        with urllib.request.urlopen(request, timeout=30) as response:
            usage = json.loads(response.read())
        assert usage["limits"] == {"cores": 25, "memoryMib": 4096}
        assert (usage["current"]["memoryUsedMib"], usage["current"]["utilizationPercent"]) == (2500, 17)

        core_v1.delete_namespaced_pod("jupyter-alice", "default")
        wait_for(lambda: "jupyter-alice" not in gm_total(server), timeout=60, what="alice gone from /metric")
        wait_for_samples(server.sampler, 1)
        try:
            urllib.request.urlopen(request, timeout=30)
            raise AssertionError("a deleted pod's token still reads data")
        except urllib.error.HTTPError as error:
            assert error.code == 403
    finally:
        server.stop()
        informer.stop()
