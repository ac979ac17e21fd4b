"""The extender through real HTTP, with kube-scheduler's exact JSON, against the simulated API."""

from __future__ import annotations

import http.client
import json
import urllib.parse

import pytest
from extender_support import (
    GIB_UNITS,
    NAMES,
    binding_args,
    filter_args,
    get,
    node,
    pod,
    post,
)
from simkube.waiting import wait_for

from jupyter_vgpu.core import contract


@pytest.fixture
def two_nodes(cluster):
    cluster.add_node(node("gpu-a", count=2, memory_gib=16))
    cluster.add_node(node("gpu-b", count=4, memory_gib=16))
    cluster.add_node({"apiVersion": "v1", "kind": "Node", "metadata": {"name": "cpu-only"},
                      "status": {"capacity": {"cpu": "8"}, "allocatable": {"cpu": "8"}}})
    cluster.start_extender()
    return cluster


def test_filter_node_cache_mode_passes_names_and_explains_failures(two_nodes):
    cluster = two_nodes
    created = cluster.add_pod(pod("nb-1", cores=50, memory_units=20 * GIB_UNITS))  # 20 GiB > 16 GiB cards
    status, result = post(f"{cluster.url}/filter", filter_args(created, ["gpu-a", "gpu-b", "cpu-only"]))
    assert status == 200
    assert set(result) == {"Nodes", "NodeNames", "FailedNodes", "FailedAndUnresolvableNodes", "Error"}
    assert result["Error"] == "" and result["Nodes"] is None
    assert result["NodeNames"] == []
    # nothing can ever fit: every node is unresolvable, with a reason naming the card size
    assert set(result["FailedAndUnresolvableNodes"]) == {"gpu-a", "gpu-b", "cpu-only"}
    assert "16 GiB" in result["FailedAndUnresolvableNodes"]["gpu-a"]
    assert "no vGPU cards" in result["FailedAndUnresolvableNodes"]["cpu-only"]

    fits = cluster.add_pod(pod("nb-2", cores=50, memory_units=8 * GIB_UNITS))
    status, result = post(f"{cluster.url}/filter", filter_args(fits, ["gpu-a", "gpu-b", "cpu-only"]))
    assert status == 200 and result["Error"] == ""
    assert result["NodeNames"] == ["gpu-a", "gpu-b"]
    # cpu-only is refused, but with a node passing kube-scheduler reads no reason
    assert result["FailedNodes"] == {} and result["FailedAndUnresolvableNodes"] == {}


def test_filter_gives_reasons_only_when_no_node_passes(two_nodes):
    """kube-scheduler reads FailedNodes and FailedAndUnresolvableNodes only when no node is left
    (its FailedScheduling message, preemption): with none passing, every node's reason is there,
    refused now or for good; with one passing, both are empty. The metrics count every refusal."""
    cluster = two_nodes
    holder = cluster.add_pod(pod("holder", cores=200, memory_units=None))
    assert post(f"{cluster.url}/bind", binding_args(holder, "gpu-b"))[1] == {"Error": ""}
    names = ["gpu-a", "gpu-b", "cpu-only"]
    three = cluster.add_pod(pod("three", cores=300, memory_units=None))
    status, result = post(f"{cluster.url}/filter", filter_args(three, names))
    assert status == 200 and result["Error"] == "" and result["NodeNames"] == []
    assert list(result["FailedNodes"]) == ["gpu-b"]  # 2 of its 4 cards are held: it may fit later
    assert "3 whole cards" in result["FailedNodes"]["gpu-b"], result
    assert list(result["FailedAndUnresolvableNodes"]) == ["gpu-a", "cpu-only"]  # 2 cards, none
    assert "3 whole cards" in result["FailedAndUnresolvableNodes"]["gpu-a"], result
    assert "no vGPU cards" in result["FailedAndUnresolvableNodes"]["cpu-only"]

    two = cluster.add_pod(pod("two", cores=200, memory_units=None))
    status, result = post(f"{cluster.url}/filter", filter_args(two, names))
    assert status == 200 and result["Error"] == "" and result["NodeNames"] == ["gpu-a", "gpu-b"]
    assert result["FailedNodes"] == {} and result["FailedAndUnresolvableNodes"] == {}

    status, text = get(f"{cluster.extender.base_url}/metrics")
    counted = {outcome: f'{contract.METRIC_EXTENDER_DECISIONS}{{outcome="{outcome}",verb="filter"}} {count}'
               for outcome, count in (("fits", 2.0), ("unfit", 1.0), ("unresolvable", 3.0))}
    assert all(line in text.decode() for line in counted.values()), text.decode()


def test_filter_full_node_mode_echoes_node_objects(two_nodes):
    cluster = two_nodes
    created = cluster.add_pod(pod("nb", cores=10, memory_units=2 * GIB_UNITS))
    nodes = json.loads(cluster.core.list_node(_preload_content=False).data)
    args = {"Pod": created, "Nodes": nodes, "NodeNames": None}
    status, result = post(f"{cluster.url}/filter", args)
    assert status == 200 and result["Error"] == ""
    assert result["NodeNames"] is None
    assert [n["metadata"]["name"] for n in result["Nodes"]["items"]] == ["gpu-a", "gpu-b"]
    # the objects come back as sent
    sent = {n["metadata"]["name"]: n for n in nodes["items"]}
    assert result["Nodes"]["items"][0] == sent["gpu-a"]


def test_keys_are_matched_case_insensitively_like_go(two_nodes):
    cluster = two_nodes
    created = cluster.add_pod(pod("nb", cores=10, memory_units=2 * GIB_UNITS))
    status, result = post(f"{cluster.url}/filter", {"pod": created, "nodenames": ["gpu-a"]})
    assert status == 200 and result["NodeNames"] == ["gpu-a"]
    status, result = post(f"{cluster.url}/prioritize", {"POD": created, "NODENAMES": ["gpu-a", "gpu-b"]})
    assert status == 200 and [p["Host"] for p in result] == ["gpu-a", "gpu-b"]


def test_bind_annotates_binds_and_is_idempotent(two_nodes):
    cluster = two_nodes
    created = cluster.add_pod(pod("nb", cores=25, memory_units=4 * GIB_UNITS))
    status, result = post(f"{cluster.url}/bind", binding_args(created, "gpu-b"))
    assert (status, result) == (200, {"Error": ""})
    bound = cluster.read_pod("nb")
    assert bound["spec"]["nodeName"] == "gpu-b"
    annotations = bound["metadata"]["annotations"]
    allocation = contract.PodAllocation.from_json(annotations[NAMES.allocation])
    assert allocation.node == "gpu-b"
    (container,) = allocation.containers
    (share,) = container.cards
    assert (share.cores, share.memory_units) == (25, 4 * GIB_UNITS)
    assert share.uuid == f"GPU-gpu-b-{share.index}"
    assert annotations[NAMES.predicate_gpu_idx(0)] == str(share.index)
    assert annotations[NAMES.predicate_node] == "gpu-b"
    assert annotations[NAMES.gpu_assigned] == "false"
    claims = cluster.extender.ledger.claims()
    assert claims == {"gpu-b": {created["metadata"]["uid"]: [(0, share.index, 25, 4 * GIB_UNITS)]}}

    # kube-scheduler retrying the same bind: success, and still one allocation
    status, result = post(f"{cluster.url}/bind", binding_args(created, "gpu-b"))
    assert (status, result) == (200, {"Error": ""})
    assert cluster.extender.ledger.claims() == claims
    assert cluster.read_pod("nb")["metadata"]["annotations"][NAMES.allocation] == annotations[NAMES.allocation]
    # but not to another node
    status, result = post(f"{cluster.url}/bind", binding_args(created, "gpu-a"))
    assert status == 200 and "already bound to node gpu-b" in result["Error"]


def test_prioritize_prefers_fuller_node_with_binpack_and_emptier_with_spread(two_nodes):
    cluster = two_nodes
    first = cluster.add_pod(pod("first", cores=50, memory_units=8 * GIB_UNITS))
    assert post(f"{cluster.url}/bind", binding_args(first, "gpu-a"))[1] == {"Error": ""}
    uid = first["metadata"]["uid"]
    cluster.wait_ledger(lambda ledger: ledger.holding(uid) and not ledger.holding(uid).assumed,
                        "the watch to confirm the bind")
    second = cluster.add_pod(pod("second", cores=25, memory_units=4 * GIB_UNITS))
    status, scores = post(f"{cluster.url}/prioritize", filter_args(second, ["gpu-a", "gpu-b"]))
    assert status == 200
    by_host = {p["Host"]: p["Score"] for p in scores}
    assert all(0 <= s <= 10 for s in by_host.values())
    assert by_host["gpu-a"] > by_host["gpu-b"]
    spread = cluster.add_pod(pod("third", cores=25, memory_units=4 * GIB_UNITS,
                                 annotations={NAMES.policy: "spread"}))
    status, scores = post(f"{cluster.url}/prioritize", filter_args(spread, ["gpu-a", "gpu-b"]))
    by_host = {p["Host"]: p["Score"] for p in scores}
    assert by_host["gpu-b"] > by_host["gpu-a"]


def test_healthz_metrics_inspect(two_nodes):
    cluster = two_nodes
    created = cluster.add_pod(pod("nb", cores=30, memory_units=6 * GIB_UNITS))
    post(f"{cluster.url}/filter", filter_args(created, ["gpu-a", "gpu-b"]))
    assert post(f"{cluster.url}/bind", binding_args(created, "gpu-a"))[1] == {"Error": ""}
    base = cluster.extender.base_url
    assert get(f"{base}/healthz") == (200, b"ok")
    status, text = get(f"{base}/metrics")
    assert status == 200
    text = text.decode()
    assert f'{contract.METRIC_EXTENDER_DECISIONS}{{outcome="fits",verb="filter"}} 2.0' in text
    assert f'{contract.METRIC_EXTENDER_DECISIONS}{{outcome="bound",verb="bind"}} 1.0' in text
    assert f'{contract.METRIC_EXTENDER_REQUEST_SECONDS}_count{{verb="filter"}} 1.0' in text
    status, body = get(f"{base}/inspect?node=gpu-a")
    report = json.loads(body)
    (entry,) = report["nodes"]
    assert entry["name"] == "gpu-a" and entry["source"] == "inventory"
    held = [card for card in entry["cards"] if card["holders"]]
    (card,) = held
    assert card["cores"] == {"capacity": 100, "held": 30, "free": 70}
    assert card["memoryMib"] == {"capacity": 16384, "held": 6144, "free": 10240}
    assert card["holders"][0]["pod"] == "nb" and card["holders"][0]["cores"] == 30
    wait_for(lambda: json.loads(get(f"{base}/inspect")[1])["ledger"]["assumed"] == 0, timeout=20, what="confirmation")


def test_each_verb_replies_json_on_one_connection_and_counts_its_seconds(two_nodes):
    """The three POST verbs (answered by the front, front.py) on one keep-alive connection, as
    kube-scheduler's client keeps it: JSON with its Content-Type and length; each request counted
    once in the request-seconds histogram; other methods on the same paths still 405 as JSON."""
    cluster = two_nodes
    created = cluster.add_pod(pod("nb", cores=30, memory_units=6 * GIB_UNITS))
    url = urllib.parse.urlsplit(cluster.url)
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=10)
    replies = {}
    for verb, args in (("filter", filter_args(created, ["gpu-a", "gpu-b"])),
                       ("prioritize", filter_args(created, ["gpu-a", "gpu-b"])),
                       ("bind", binding_args(created, "gpu-a")), ("filter", b"{not json")):
        conn.request("POST", f"{url.path}/{verb}", json.dumps(args).encode() if isinstance(args, dict) else args,
                     {"Content-Type": "application/json"})
        response = conn.getresponse()
        body = response.read()
        assert response.getheader("Content-Type") == "application/json"
        assert response.getheader("Content-Length") == str(len(body)) and response.getheader("Date")
        replies.setdefault(verb, []).append((response.status, json.loads(body)))
    assert replies["filter"][0] == (200, {"Nodes": None, "NodeNames": ["gpu-a", "gpu-b"], "FailedNodes": {},
                                          "FailedAndUnresolvableNodes": {}, "Error": ""})
    assert replies["filter"][1][0] == 400 and "not JSON" in replies["filter"][1][1]["Error"]
    assert replies["filter"][1][1]["NodeNames"] is None
    assert [host["Host"] for host in replies["prioritize"][0][1]] == ["gpu-a", "gpu-b"]
    assert replies["bind"] == [(200, {"Error": ""})]
    conn.request("GET", f"{url.path}/prioritize")
    response = conn.getresponse()
    assert response.status == 405 and json.loads(response.read())["Error"] == "Method Not Allowed"
    text = get(f"{cluster.extender.base_url}/metrics")[1].decode()
    for verb, count in (("filter", 2.0), ("prioritize", 1.0), ("bind", 1.0)):
        assert f'{contract.METRIC_EXTENDER_REQUEST_SECONDS}_count{{verb="{verb}"}} {count}' in text, verb
    assert f'{contract.METRIC_EXTENDER_DECISIONS}{{outcome="bad-request",verb="filter"}} 1.0' in text


def test_not_ready_until_pods_and_nodes_are_listed(cluster):
    cluster.add_node(node("gpu-a", count=1))
    cluster.kube.emulator["get", "/api/v1/pods"] << 500  # the pod list keeps failing
    from vgpu_plugin.extender.server import Extender

    extender = Extender(port=0, api_client=cluster.kube.api_client()).start()
    try:
        assert get(f"{extender.base_url}/healthz")[0] == 503
        created = cluster.add_pod(pod("nb", cores=10, memory_units=GIB_UNITS))
        status, reply = post(f"{extender.url}/filter", filter_args(created, ["gpu-a"]))
        assert status == 200 and "still listing nodes and pods" in reply["Error"]
        status, reply = post(f"{extender.url}/bind", binding_args(created, "gpu-a"))
        assert "still listing" in reply["Error"] and not cluster.read_pod("nb")["spec"].get("nodeName")
    finally:
        extender.stop()


def test_multi_card_pods_prefer_the_better_linked_node_and_cards(cluster, topology_fixtures):
    text = (topology_fixtures / "a100-pcie-4gpu-2numa.txt").read_text()  # 0-1 and 2-3 share a NUMA node
    cluster.add_node(node("near", topology_text=text))
    cluster.add_node(node("far", topology_text=text))
    cluster.start_extender()
    ledger = cluster.extender.ledger
    from vgpu_plugin.extender.ledger import Holding

    def hold(node_name, card):
        share = (contract.ContainerAllocation(0, "c", (contract.CardShare(card, "", 10, 4),)),)
        ledger.put(Holding(f"{node_name}-{card}", "default", f"{node_name}-{card}", node_name, share))

    hold("near", 2), hold("near", 3)   # free: 0 and 1, linked through their NUMA node
    hold("far", 1), hold("far", 3)     # free: 0 and 2, across the NUMA interconnect
    pair = cluster.add_pod(pod("pair", cores=200, memory_units=None))
    status, scores = post(f"{cluster.url}/prioritize", filter_args(pair, ["near", "far"]))
    by_host = {p["Host"]: p["Score"] for p in scores}
    assert by_host["near"] > by_host["far"] > 0
    assert post(f"{cluster.url}/bind", binding_args(pair, "near"))[1] == {"Error": ""}
    allocation = contract.PodAllocation.from_json(cluster.read_pod("pair")["metadata"]["annotations"][NAMES.allocation])
    assert [s.index for s in allocation.containers[0].cards] == [0, 1]
    assert all(s.cores == 100 and s.memory_units == 16 * GIB_UNITS for s in allocation.containers[0].cards)


def test_metrics_listener_serves_only_metrics_health_and_the_queue(cluster):
    cluster.add_node(node("gpu-a", count=1))
    cluster.start_extender(metrics_port=0, metrics_address="127.0.0.1")
    metrics = f"http://127.0.0.1:{cluster.extender.metrics_port}"
    assert cluster.extender.metrics_port != cluster.extender.port
    assert get(f"{metrics}/healthz") == (200, b"ok")
    status, text = get(f"{metrics}/metrics")
    assert status == 200 and contract.METRIC_EXTENDER_NODES.encode() in text
    created = cluster.add_pod(pod("nb", cores=10, memory_units=GIB_UNITS))
    assert post(f"{metrics}/scheduler/bind", binding_args(created, "gpu-a"))[0] == 404
    assert get(f"{metrics}/inspect")[0] == 404
    assert get(f"{metrics}/queue")[0] == 401  # the queue is there, for the queue token only
    assert not cluster.read_pod("nb")["spec"].get("nodeName")
