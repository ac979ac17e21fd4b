"""Issue 17: the extender's GET /queue is read-only, behind a bearer token, cheap to call, and its
one-pod view names no other pod — over real HTTP on both listeners (loopback and metrics)."""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request

from extender_support import GIB_UNITS, get, node, pod, post
from simkube.waiting import wait_for

TOKEN = "the-queue-token-0123456789"


def method(url: str, verb: str) -> int:
    request = urllib.request.Request(url, data=b"{}" if verb == "POST" else None, method=verb,
                                     headers={"Authorization": f"Bearer {TOKEN}"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status
    except urllib.error.HTTPError as error:
        return error.code


def pending(name: str, cores: int = 50, gib: int = 20, priority: int = 0) -> dict:
    obj = pod(name, cores=cores, memory_units=gib * GIB_UNITS)
    obj["spec"]["priority"] = priority
    return obj


def queue_of(url: str, count: int) -> dict:
    def listed():
        status, body = get(url + "/queue", token=TOKEN)
        report = json.loads(body) if status == 200 else {}
        return report if len(report.get("pending", ())) == count else None

    return wait_for(listed, timeout=20, what="the extender's pod cache")


def test_the_queue_is_refused_without_the_token_on_both_listeners(cluster) -> None:
    cluster.add_node(node("gpu-a", count=1, memory_gib=16))
    extender = cluster.start_extender(queue_token=TOKEN, metrics_port=0, metrics_address="127.0.0.1")
    cluster.add_pod(pending("alice-nb"))
    for base in (extender.base_url, f"http://127.0.0.1:{extender.metrics_port}"):
        full = queue_of(base, 1)
        assert full["pending"][0]["pod"] == "alice-nb"
        for token, status in ((None, 401), ("", 401), ("wrong-token-0123456789", 403)):
            got, body = get(base + "/queue", token=token)
            assert got == status, (base, token, got, body)
            assert b"alice" not in body and "Error" in json.loads(body)
        status, body = get(base + "/queue?namespace=default&pod=alice-nb", token="wrong-token-0123456789")
        assert status == 403 and b"alice" not in body
        # read-only: nothing but GET, even with the token
        assert post(base + "/queue", {})[0] == 401
        assert method(base + "/queue", "POST") == method(base + "/queue", "DELETE") == 405
    # the metrics listener still serves neither bind nor /inspect
    assert get(f"http://127.0.0.1:{extender.metrics_port}/inspect")[0] == 404


def test_without_a_configured_token_the_queue_is_closed(cluster) -> None:
    cluster.add_node(node("gpu-a", count=1))
    extender = cluster.start_extender()
    cluster.add_pod(pending("alice-nb"))
    status, body = get(extender.base_url + "/queue", token=TOKEN)
    assert status == 401 and b"no queue token configured" in body


def test_the_one_pod_view_names_no_other_pod(cluster) -> None:
    cluster.add_node(node("gpu-a", count=1, memory_gib=16))
    extender = cluster.start_extender(queue_token=TOKEN)
    for name, priority in (("bob-nb", 2), ("carol-nb", 1), ("alice-nb", 0)):  # alice is third in the queue
        cluster.add_pod(pending(name, priority=priority))
    queue_of(extender.base_url, 3)
    status, body = get(extender.base_url + "/queue?namespace=default&pod=alice-nb", token=TOKEN)
    assert status == 200
    mine = json.loads(body)
    assert mine["waiting"] == 3 and len(mine["pending"]) == 1
    entry = mine["pending"][0]
    assert entry["pod"] == "alice-nb" and entry["position"] == 3
    assert entry["why"] == "no card on any node has 50 % and 20 GiB free"
    assert entry["alternative"]["text"] == "a 50 % share with 16 GiB fits on 1 node"
    assert b"bob" not in body and b"carol" not in body
    assert [n["name"] for n in mine["nodes"]] == ["gpu-a"]
    # a pod that is not waiting: nothing about it, nothing about others
    status, body = get(extender.base_url + "/queue?namespace=default&pod=dave-nb", token=TOKEN)
    assert status == 200 and json.loads(body)["pending"] == [] and b"bob" not in body
    for query in ("namespace=default", "pod=alice-nb", "namespace=default&pod=Alice_NB", "namespace=&pod=x",
                  "namespace=default&pod=" + "a" * 300):
        status, body = get(extender.base_url + "/queue?" + query, token=TOKEN)
        assert status == 400, query
        assert b"bob" not in body


def test_the_queue_is_computed_once_per_interval_however_often_it_is_asked(cluster) -> None:
    cluster.add_node(node("gpu-a", count=1, memory_gib=16))
    extender = cluster.start_extender(queue_token=TOKEN, queue_max_age=3600, queue_notice_interval=None)
    cluster.add_pod(pending("alice-nb"))
    cluster.wait_ledger(lambda _: extender.view.pods.get("default", "alice-nb"), "the pod in the extender's cache")
    for _ in range(20):
        assert get(extender.base_url + "/queue", token=TOKEN)[0] == 200
        assert get(extender.base_url + "/queue?namespace=default&pod=alice-nb", token=TOKEN)[0] == 200
    assert extender.queue.computed == 1


def test_the_token_file_is_reread_when_the_secret_changes(cluster, tmp_path) -> None:
    cluster.add_node(node("gpu-a", count=1))
    path = tmp_path / "token"
    path.write_text(TOKEN + "\n")
    extender = cluster.start_extender(queue_token_file=str(path))
    assert get(extender.base_url + "/queue", token=TOKEN)[0] == 200
    rotated = "a-rotated-queue-token-9876543210"
    path.write_text(rotated)
    os.utime(path, (1, 1))  # a new mtime even within the filesystem's timestamp granularity
    assert get(extender.base_url + "/queue", token=TOKEN)[0] == 403
    assert get(extender.base_url + "/queue", token=rotated)[0] == 200
