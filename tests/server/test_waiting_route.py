"""Issue 17 on the notebook side: a share request the scheduler cannot place waits in the queue;
``GET requests/<id>/waiting`` says its position, why (the extender's words) and what would start
now, naming no other pod; ``POST requests/<id>/switch`` withdraws it and asks for that share,
which starts. The real server extension, the demo's requester, the extender's token-protected
queue, on the simulated cluster."""

from __future__ import annotations

import json

import pytest
import tornado.httpclient
from server_peers_support import as_json
from simkube.waiting import wait_for

from jupyter_vgpu.core import contract

pytestmark = pytest.mark.slow

KUBE_REQUESTER = "vgpu_plugin.demo.requester.KubeRecreateRequester"


@pytest.fixture(scope="module")
def cluster():
    from vgpu_plugin.demo.cluster import NodeSpec, SimCluster

    with SimCluster([NodeSpec("gpu-a", "a100-sxm-4gpu-nv4.txt")], metrics_period=0.5) as sim:
        yield sim


@pytest.fixture
def vgpu_config(cluster, monkeypatch):
    cluster.create_notebook_pod("wendy", cores=25, memory="8GiB")
    pod = cluster.wait_for(lambda: (p := cluster.read_pod("default", "wendy"))["metadata"]["annotations"].get(
        contract.DEFAULT_NAMES.gpu_assigned) == "true" and p, what="wendy's pod served")
    env = dict(cluster.node("gpu-a").kubelet.admitted(pod["metadata"]["uid"]).container("notebook").env)
    # every card keeps at most 30 % free: one 70 % neighbour per card (two never fit on one)
    for card in range(4):
        cluster.create_notebook_pod(f"filler-{card}", cores=70, memory="20GiB")
    for card in range(4):
        cluster.wait_for_pod("default", f"filler-{card}")
    # someone else, waiting ahead of wendy: older, or created in the same second (creationTimestamp has
    # whole seconds) and first by name, so the order does not depend on the clock
    cluster.create_notebook_pod("abel", cores=100)
    for key, value in {**env, contract.ENV_NOTEBOOK_KUBECONFIG: cluster.kubeconfig,
                       **cluster.queue_environment()}.items():
        monkeypatch.setenv(key, value)
    return {"source": "auto", "requester_class": KUBE_REQUESTER}


def test_a_waiting_request_shows_where_it_stands_and_switching_starts_the_other_share(run, jp_fetch, cluster):
    accepted = as_json(run(jp_fetch("vgpu", "api", "requests", method="POST",
                                    body=json.dumps({"cores": 50, "memory": "8GiB"}))))
    request_id = accepted["id"]

    def waiting():
        response = run(jp_fetch("vgpu", "api", "requests", request_id, "waiting"))
        return as_json(response) if response.code == 200 else None

    where = wait_for(waiting, timeout=60, interval=0.2, what="the request to wait in the queue")
    assert where == {
        "position": 2, "waiting": 2, "why": "no card on any node has 50 % and 8 GiB free", "cores": 50,
        "memoryMib": 8192,
        "alternative": {"cores": 30, "memoryMib": 8192, "nodes": 1, "text": "a 30 % share with 8 GiB fits on 1 node"}}
    raw = run(jp_fetch("vgpu", "api", "requests", request_id, "waiting")).body
    assert b"abel" not in raw and b"filler" not in raw  # nobody else is named
    assert as_json(run(jp_fetch("vgpu", "api", "requests", request_id)))["state"] == "pending"  # it waits

    # a switch to something that is not a share is refused; the request keeps waiting
    for body in ({"cores": 30}, {"cores": "lots", "memory": "8GiB"}, [1]):
        with pytest.raises(tornado.httpclient.HTTPClientError) as refused:
            run(jp_fetch("vgpu", "api", "requests", request_id, "switch", method="POST", body=json.dumps(body)))
        assert refused.value.code == 400

    switched = run(jp_fetch("vgpu", "api", "requests", request_id, "switch", method="POST",
                            body=json.dumps({"cores": 30, "memory": 32})))
    assert switched.code == 202
    new = as_json(switched)
    assert (new["cores"], new["memoryUnits"], new["state"]) == (30, 32, "pending")
    assert switched.headers["Location"].endswith(f"/vgpu/api/requests/{new['id']}")
    old = as_json(run(jp_fetch("vgpu", "api", "requests", request_id)))
    assert (old["state"], old["message"]) == ("failed", "withdrawn: you asked for another share instead")

    def settled():
        state = as_json(run(jp_fetch("vgpu", "api", "requests", new["id"])))
        return state if state["state"] != "pending" else None

    final = wait_for(settled, timeout=120, interval=0.2, what="the switched request to settle")
    assert final["state"] == "scheduled", final
    pod = cluster.read_pod("default", final["message"].split()[1])
    record = contract.PodAllocation.from_json(pod["metadata"]["annotations"][contract.DEFAULT_NAMES.allocation])
    [share] = record.containers[0].cards
    assert (share.cores, share.memory_mib) == (30, 8192)
    # no longer waiting, nothing to switch
    assert run(jp_fetch("vgpu", "api", "requests", new["id"], "waiting")).code == 204
    with pytest.raises(tornado.httpclient.HTTPClientError) as refused:
        run(jp_fetch("vgpu", "api", "requests", new["id"], "switch", method="POST",
                     body=json.dumps({"cores": 10, "memory": "1GiB"})))
    assert refused.value.code == 409
