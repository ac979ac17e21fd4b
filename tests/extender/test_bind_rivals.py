"""Bind waits while another pod on the node that kubelet has not admitted yet asks for as many
vcuda-core but a different amount of memory: kubelet's Allocate tells containers apart only by
that count, so with both waiting the device plugin could swap their limits (docs/design.md).

Through the real interfaces: kube-scheduler's exact bind JSON over HTTP, the simulated API through
the official client; the device plugin's confirmation is its ``gpu-assigned=true`` PATCH."""

from __future__ import annotations

import threading
import time
from typing import Any

import pytest
from extender_support import GIB_UNITS, NAMES, binding_args, filter_args, get, node, pod, post
from simkube.waiting import wait_for

from jupyter_vgpu.core import contract


@pytest.fixture
def one_node(cluster):
    cluster.add_node(node("gpu-a", count=2, memory_gib=16))
    return cluster


def start(cluster, rival_wait: float):
    extender = cluster.start_extender()
    extender.decisions.rival_wait = rival_wait
    return extender


def bind_in_background(cluster, created: dict[str, Any], node_name: str = "gpu-a") -> tuple[threading.Thread,
                                                                                           dict[str, Any]]:
    """POST the bind on a thread; ``answer`` gets (status, body) and the second it came, or the
    connection's ``error``."""
    answer: dict[str, Any] = {}
    url = cluster.url

    def run() -> None:
        try:
            status, body = post(f"{url}/bind", binding_args(created, node_name), timeout=60)
        except OSError as error:  # urllib's URLError too
            answer.update(error=repr(error), at=time.monotonic())
            return
        answer.update(status=status, body=body, at=time.monotonic())

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread, answer


def confirm(cluster, name: str) -> float:
    """What the device plugin writes once kubelet has admitted every container of the pod;
    returns when it was sent (a waiting bind may answer before the PATCH's reply arrives)."""
    sent = time.monotonic()
    cluster.core.patch_namespaced_pod(name, "default", {"metadata": {"annotations": {NAMES.gpu_assigned: "true"}}},
                                      _preload_content=False)
    return sent


def node_name(cluster, name: str) -> str:
    return cluster.read_pod(name)["spec"].get("nodeName") or ""


def small_bound_large_made(cluster) -> tuple[dict[str, Any], dict[str, Any]]:
    """Pod "small" (10 cores, 1 GiB) bound to gpu-a, not admitted yet; pod "large" (10 cores, 10 GiB), its rival, made."""
    small = cluster.add_pod(pod("small", cores=10, memory_units=1 * GIB_UNITS))
    large = cluster.add_pod(pod("large", cores=10, memory_units=10 * GIB_UNITS))
    assert post(f"{cluster.url}/bind", binding_args(small, "gpu-a")) == (200, {"Error": ""})
    return small, large


def test_same_cores_other_memory_waits_until_the_first_is_admitted(one_node):
    cluster = one_node
    start(cluster, rival_wait=20)
    small, large = small_bound_large_made(cluster)

    thread, answer = bind_in_background(cluster, large)
    thread.join(1.0)
    assert answer == {} and node_name(cluster, "large") == ""  # waiting, nothing written
    assert large["metadata"]["uid"] not in cluster.extender.ledger.claims()["gpu-a"]

    confirmed_at = confirm(cluster, "small")
    thread.join(20)
    assert answer["status"] == 200 and answer["body"] == {"Error": ""}
    assert answer["at"] >= confirmed_at
    assert node_name(cluster, "large") == "gpu-a"


def test_identical_requests_do_not_wait(one_node):
    cluster = one_node
    start(cluster, rival_wait=20)
    first = cluster.add_pod(pod("first", cores=10, memory_units=4 * GIB_UNITS))
    second = cluster.add_pod(pod("second", cores=10, memory_units=4 * GIB_UNITS))
    other = cluster.add_pod(pod("other-cores", cores=20, memory_units=10 * GIB_UNITS))
    started = time.monotonic()
    for created in (first, second, other):  # none confirmed; none a rival of another
        assert post(f"{cluster.url}/bind", binding_args(created, "gpu-a")) == (200, {"Error": ""})
    assert time.monotonic() - started < 5
    assert {node_name(cluster, name) for name in ("first", "second", "other-cores")} == {"gpu-a"}


def test_timeout_names_the_other_pod_and_claims_nothing(one_node):
    cluster = one_node
    start(cluster, rival_wait=0.5)
    small, large = small_bound_large_made(cluster)

    status, body = post(f"{cluster.url}/bind", binding_args(large, "gpu-a"))
    assert status == 200
    error = body["Error"]
    assert "pod default/large not bound to node gpu-a" in error
    assert "pod default/small there asks for 10 vcuda-core with 4 vcuda-memory" in error
    assert "this pod asks for 10 vcuda-core with 40 vcuda-memory" in error
    assert f"{NAMES.gpu_assigned} is not true" in error
    after = cluster.read_pod("large")
    assert not after["spec"].get("nodeName")
    assert not any(key.startswith(NAMES.predicate_gpu_idx_prefix) or key == NAMES.predicate_node
                   for key in after["metadata"].get("annotations") or {})
    assert large["metadata"]["uid"] not in cluster.extender.ledger.claims()["gpu-a"]


def test_deleting_the_waited_on_pod_releases_the_wait(one_node):
    cluster = one_node
    start(cluster, rival_wait=20)
    small, large = small_bound_large_made(cluster)

    thread, answer = bind_in_background(cluster, large)
    thread.join(1.0)
    assert answer == {}
    deleted_at = time.monotonic()
    cluster.core.delete_namespaced_pod("small", "default", _preload_content=False)
    thread.join(20)
    assert answer["body"] == {"Error": ""} and answer["at"] >= deleted_at
    assert node_name(cluster, "large") == "gpu-a"


def test_a_restarted_extender_knows_the_unadmitted_pods_from_their_annotations(one_node):
    cluster = one_node
    start(cluster, rival_wait=20)
    small = cluster.add_pod(pod("small", cores=10, memory_units=1 * GIB_UNITS))
    admitted = cluster.add_pod(pod("admitted", cores=10, memory_units=2 * GIB_UNITS))
    large = cluster.add_pod(pod("large", cores=10, memory_units=10 * GIB_UNITS))
    assert post(f"{cluster.url}/bind", binding_args(small, "gpu-a")) == (200, {"Error": ""})
    cluster.stop_extender()
    # bound by someone else meanwhile, and already admitted (gpu-assigned=true): no rival
    cluster.core.create_namespaced_pod_binding("admitted", "default", {
        "apiVersion": "v1", "kind": "Binding",
        "metadata": {"name": "admitted", "namespace": "default", "annotations": {
            NAMES.predicate_node: "gpu-a", NAMES.predicate_gpu_idx(0): "1", NAMES.gpu_assigned: "true"}},
        "target": {"apiVersion": "v1", "kind": "Node", "name": "gpu-a"}}, _preload_content=False)

    start(cluster, rival_wait=0.5)
    status, body = post(f"{cluster.url}/bind", binding_args(large, "gpu-a"))
    assert "pod default/small there asks for 10 vcuda-core with 4 vcuda-memory" in body["Error"]
    assert node_name(cluster, "large") == ""
    assert admitted["metadata"]["uid"] in cluster.extender.ledger.claims()["gpu-a"]


def test_two_binds_racing_to_one_node_bind_one_and_the_other_waits(one_node):
    """The rivals are checked with the claim under the node's bind lock: whichever bind takes it
    first binds, the other sees its claim and waits (here until its short bound runs out)."""
    cluster = one_node
    start(cluster, rival_wait=1.0)
    small = cluster.add_pod(pod("small", cores=10, memory_units=1 * GIB_UNITS))
    large = cluster.add_pod(pod("large", cores=10, memory_units=10 * GIB_UNITS))
    threads = [bind_in_background(cluster, created) for created in (small, large)]
    for thread, _ in threads:
        thread.join(20)
    errors = sorted(answer["body"]["Error"] for _, answer in threads)
    assert errors[0] == "" and "not bound to node gpu-a" in errors[1]
    bound = {name for name in ("small", "large") if node_name(cluster, name) == "gpu-a"}
    assert len(bound) == 1
    (other,) = {"small", "large"} - bound
    assert f"pod default/{other} not bound" in errors[1] and f"pod default/{bound.pop()} there" in errors[1]


def test_many_binds_wait_at_once_holding_no_bind_worker(cluster):
    """Twelve binds wait at once on four nodes, more than the server's 8 bind workers: a waiting
    bind holds none (it waits on the server's loop), so a bind to another node is served
    meanwhile, and each binds once the pod it waits for on its node is admitted."""
    nodes = [f"gpu-{i}" for i in range(4)]
    for name in [*nodes, "gpu-other"]:
        cluster.add_node(node(name, count=4, memory_gib=16))
    start(cluster, rival_wait=25)
    for name in nodes:
        small = cluster.add_pod(pod(f"small-{name}", cores=10, memory_units=1 * GIB_UNITS))
        assert post(f"{cluster.url}/bind", binding_args(small, name)) == (200, {"Error": ""})
    binds = {name: [bind_in_background(cluster, cluster.add_pod(pod(f"large-{name}-{k}", cores=10,
                                                                     memory_units=10 * GIB_UNITS)), name)
                    for k in range(3)] for name in nodes}
    time.sleep(1.5)
    assert [answer for waits in binds.values() for _, answer in waits if answer] == []  # all twelve wait
    wait_for(lambda: cluster.extender.rival_waits.waiting == 12, timeout=20, what="twelve binds waiting")

    unrelated = cluster.add_pod(pod("unrelated", cores=30, memory_units=4 * GIB_UNITS))
    started = time.monotonic()
    assert post(f"{cluster.url}/bind", binding_args(unrelated, "gpu-other"), timeout=10) == (200, {"Error": ""})
    assert time.monotonic() - started < 5 and node_name(cluster, "unrelated") == "gpu-other"

    for i, name in enumerate(nodes):
        confirmed_at = confirm(cluster, f"small-{name}")
        for k, (thread, answer) in enumerate(binds[name]):
            thread.join(20)
            assert answer.get("body") == {"Error": ""} and answer["at"] >= confirmed_at, answer
            assert node_name(cluster, f"large-{name}-{k}") == name
        # the other nodes' binds still wait: their pods are not admitted yet
        assert [answer for later in nodes[i + 1:] for _, answer in binds[later] if answer] == []
    assert cluster.extender.rival_waits.waiting == 0

    _, text = get(f"{cluster.extender.base_url}/metrics")
    counted = {outcome: f'{contract.METRIC_EXTENDER_DECISIONS}{{outcome="{outcome}",verb="bind"}}'
               for outcome in ("bound", "refused")}
    assert f'{counted["bound"]} 17.0' in text.decode()  # one decision per request: 4 + 12 + 1
    assert counted["refused"] not in text.decode()
    # every bind that waited is counted with its outcome (12 larges waited for a small each)
    assert f'{contract.METRIC_EXTENDER_RIVAL_WAIT_SECONDS}_count{{outcome="settled"}} 12.0' in text.decode()


def test_stop_ends_waiting_binds_at_once_with_a_refusal(one_node):
    cluster = one_node
    start(cluster, rival_wait=20)
    small = cluster.add_pod(pod("small", cores=10, memory_units=1 * GIB_UNITS))
    assert post(f"{cluster.url}/bind", binding_args(small, "gpu-a")) == (200, {"Error": ""})
    larges = [cluster.add_pod(pod(f"large-{k}", cores=10, memory_units=10 * GIB_UNITS)) for k in range(3)]
    binds = [bind_in_background(cluster, large) for large in larges]
    time.sleep(1.0)
    assert [answer for _, answer in binds if answer] == []
    wait_for(lambda: cluster.extender.rival_waits.waiting == 3, timeout=20, what="three binds waiting")

    started = time.monotonic()
    cluster.stop_extender()
    assert time.monotonic() - started < 5  # not the 20 s the binds would have waited
    for thread, answer in binds:
        thread.join(5)
        assert answer.get("status") == 200, answer
        assert answer["body"] == {"Error": "the extender is stopping; try again"}
    for k in range(3):
        after = cluster.read_pod(f"large-{k}")
        assert not after["spec"].get("nodeName")
        assert NAMES.predicate_node not in (after["metadata"].get("annotations") or {})


def test_beyond_the_waiting_bound_a_bind_is_refused_at_once(one_node):
    cluster = one_node
    start(cluster, rival_wait=20)
    cluster.extender.rival_waits.limit = 2  # 1,000 by default: a bound on memory, not on threads
    small = cluster.add_pod(pod("small", cores=10, memory_units=1 * GIB_UNITS))
    assert post(f"{cluster.url}/bind", binding_args(small, "gpu-a")) == (200, {"Error": ""})
    binds = [bind_in_background(cluster, cluster.add_pod(pod(f"large-{k}", cores=10, memory_units=10 * GIB_UNITS)))
             for k in range(2)]
    wait_for(lambda: cluster.extender.rival_waits.waiting == 2, timeout=20, what="two binds waiting")

    third = cluster.add_pod(pod("large-2", cores=10, memory_units=10 * GIB_UNITS))
    started = time.monotonic()
    status, body = post(f"{cluster.url}/bind", binding_args(third, "gpu-a"))
    assert status == 200 and time.monotonic() - started < 5
    assert "pod default/large-2 not bound to node gpu-a: pod default/small there asks for 10 vcuda-core" in body["Error"]
    assert "kubelet has not admitted it yet, and 2 binds are waiting already" in body["Error"]
    assert node_name(cluster, "large-2") == ""

    confirm(cluster, "small")
    for thread, answer in binds:
        thread.join(20)
        assert answer.get("body") == {"Error": ""}, answer


def two_nodes_small_bound(cluster) -> tuple[dict[str, Any], dict[str, Any]]:
    """gpu-a and gpu-b alike; "small" (10 cores, 1 GiB) bound to gpu-a and not admitted yet; its
    rival "large" (10 cores, 10 GiB) made."""
    cluster.add_node(node("gpu-a", count=2, memory_gib=16))
    cluster.add_node(node("gpu-b", count=2, memory_gib=16))
    start(cluster, rival_wait=20)
    return small_bound_large_made(cluster)


def filtered(cluster, created: dict[str, Any]) -> list[str]:
    status, body = post(f"{cluster.url}/filter", filter_args(created, ["gpu-a", "gpu-b"]))
    assert status == 200 and not body.get("Error"), body
    return body["NodeNames"]


@pytest.mark.parametrize("policy", ["binpack", "fgd-filter"])
def test_filter_steers_a_rival_away_from_a_node_where_its_bind_would_wait(cluster, policy):
    cluster.policy = policy
    small, large = two_nodes_small_bound(cluster)
    # binpack alone would put large beside small on gpu-a, where its bind would wait for small's admission
    assert filtered(cluster, large) == ["gpu-b"]
    started = time.monotonic()
    assert post(f"{cluster.url}/bind", binding_args(large, "gpu-b")) == (200, {"Error": ""})
    assert time.monotonic() - started < 5 and node_name(cluster, "large") == "gpu-b"


def test_filter_keeps_a_node_with_a_rival_when_it_is_the_only_one_that_fits(cluster):
    small, large = two_nodes_small_bound(cluster)
    # gpu-b fills up with pods of another size: only gpu-a fits large, and the bind there may wait
    for i in range(2):
        filler = cluster.add_pod(pod(f"filler-{i}", cores=100, memory_units=None))
        assert post(f"{cluster.url}/bind", binding_args(filler, "gpu-b")) == (200, {"Error": ""})
    assert filtered(cluster, large) == ["gpu-a"]


def test_identical_and_admitted_pods_steer_nothing(cluster):
    small, large = two_nodes_small_bound(cluster)
    twin = cluster.add_pod(pod("twin", cores=10, memory_units=1 * GIB_UNITS))
    assert filtered(cluster, twin) == ["gpu-a", "gpu-b"]  # the same answer as small's: no wait
    confirm(cluster, "small")
    wait_for(lambda: not cluster.extender.ledger.awaiting_admission, timeout=10, what="small admitted in the ledger")
    assert filtered(cluster, large) == ["gpu-a", "gpu-b"]


def test_a_rival_kubelet_started_is_admitted_even_if_never_marked(one_node):
    """The node daemon may be down, or its PATCH refused (a pod carrying ~256 KiB of its own
    annotations): a pod kubelet runs made its Allocate calls, marked ``gpu-assigned`` or not."""
    cluster = one_node
    start(cluster, rival_wait=20)
    small, large = small_bound_large_made(cluster)
    cluster.core.patch_namespaced_pod_status("small", "default", {"status": {"phase": "Running", "containerStatuses": [
        {"name": "notebook", "ready": True, "restartCount": 0, "image": "x", "imageID": "",
         "state": {"running": {"startedAt": "2026-12-07T00:00:00Z"}}}]}}, _preload_content=False)
    wait_for(lambda: not cluster.extender.ledger.awaiting_admission, timeout=10, what="small admitted in the ledger")
    started = time.monotonic()
    assert post(f"{cluster.url}/bind", binding_args(large, "gpu-a")) == (200, {"Error": ""})
    assert time.monotonic() - started < 5 and node_name(cluster, "large") == "gpu-a"
    assert cluster.read_pod("small")["metadata"]["annotations"][NAMES.gpu_assigned] == "false"  # never marked


def test_filter_prefers_other_nodes_while_a_nodes_kubelet_has_a_backlog_to_admit(cluster):
    """kubelet admits one pod at a time: with ``admission_backlog`` of our pods still to admit on a
    node, another node that fits is preferred, until the backlog drains."""
    cluster.add_node(node("gpu-a", count=2, memory_gib=16))
    cluster.add_node(node("gpu-b", count=2, memory_gib=16))
    start(cluster, rival_wait=20)
    assert cluster.extender.decisions.admission_backlog == 4  # the default
    for i in range(4):  # identical requests: no rivals, a backlog only
        queued = cluster.add_pod(pod(f"queued-{i}", cores=10, memory_units=1 * GIB_UNITS))
        assert post(f"{cluster.url}/bind", binding_args(queued, "gpu-a")) == (200, {"Error": ""})
    fifth = cluster.add_pod(pod("fifth", cores=10, memory_units=1 * GIB_UNITS))
    assert filtered(cluster, fifth) == ["gpu-b"]
    confirm(cluster, "queued-0")
    wait_for(lambda: len(cluster.extender.ledger.node("gpu-a").unserved) == 3, timeout=10,
             what="queued-0 admitted in the ledger")
    assert filtered(cluster, fifth) == ["gpu-a", "gpu-b"]
    cluster.extender.decisions.admission_backlog = 0  # no limit
    sixth = cluster.add_pod(pod("sixth", cores=10, memory_units=1 * GIB_UNITS))
    assert post(f"{cluster.url}/bind", binding_args(sixth, "gpu-a")) == (200, {"Error": ""})
    assert filtered(cluster, fifth) == ["gpu-a", "gpu-b"]
