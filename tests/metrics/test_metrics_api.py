"""The per-pod JSON API over real HTTP: shapes, tokens, and that nothing about other pods leaks."""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml
from metrics_support import NODE, FakeNode, http_get, put_on_slice, token_of, wait_for_samples
from simkube.waiting import wait_for
from vgpu_plugin.metrics import MetricsServer
from vgpu_plugin.tokens import TokenMinter, new_allocation_id

from jupyter_vgpu.core import contract as c
from jupyter_vgpu.core.contract import PodAllocation

OTHER_POD = "jupyter-mallory-7f3a"
OTHER_NAMESPACE = "secret-team-ns"
OTHER_CONTAINER = "mallory-notebook"


@pytest.fixture
def cluster(fake_node: FakeNode) -> dict[str, Any]:
    """Alice holds a quarter of card 2; Mallory (another team) shares card 2 and holds card 3."""
    alice = fake_node.pod("jupyter-alice", {"notebook": (25, 16, (2,)), "sidecar": (0, 0, ())})
    mallory = fake_node.pod(OTHER_POD, {OTHER_CONTAINER: (50, 40, (2,)), "worker": (100, 0, (3,))},
                            namespace=OTHER_NAMESPACE, runtime="cri-o")
    alice_pid = fake_node.run(alice, "notebook", 2, memory_mib=3000, utilization=20)
    fake_node.run(mallory, OTHER_CONTAINER, 2, memory_mib=8000, utilization=40)
    fake_node.run(mallory, "worker", 3, memory_mib=20000, utilization=95)
    return {"alice": alice, "mallory": mallory, "alice_pid": alice_pid}


@pytest.fixture
def server(fake_node: FakeNode, minter: TokenMinter, cluster: dict[str, Any]) -> Iterator[MetricsServer]:
    server = MetricsServer(NODE, fake_node.gpus, fake_node, minter, address="127.0.0.1", port=0,
                           period=0.05, history_seconds=600, proc_root=fake_node.proc_root,
                           enforcement="hami-core")
    server.start()
    wait_for_samples(server.sampler, 3)
    yield server
    server.stop()


def get(server: MetricsServer, path: str, token: str | None = None,
        header: str | None = None) -> tuple[int, Any, str]:
    return http_get(server.url + path, token, header)


def uid(pod: dict[str, Any]) -> str:
    return pod["metadata"]["uid"]


PATHS = ("/api/v1/allocation", "/api/v1/usage", "/api/v1/topology")


def test_allocation(server: MetricsServer, minter: TokenMinter, cluster: dict[str, Any], fake_node: FakeNode) -> None:
    status, headers, body = get(server, "/api/v1/allocation", token_of(minter, cluster["alice"], 0))
    assert status == 200 and headers["Content-Type"].startswith("application/json")
    assert headers["Cache-Control"] == "no-store"
    assert json.loads(body) == {
        "node": NODE, "namespace": "hub", "pod": "jupyter-alice", "podUid": uid(cluster["alice"]),
        "container": "notebook", "containerIndex": 0, "cores": 25, "memoryMib": 4096,
        "enforcement": "hami-core", "policy": "binpack",
        "cards": [{"index": 2, "uuid": fake_node.card_uuid(2), "model": "NVIDIA A100-SXM4-40GB",
                   "cores": 25, "memoryMib": 4096, "memoryTotalMib": 40960}],
    }


def test_whole_card_allocation_holds_the_card_memory(server: MetricsServer, minter: TokenMinter,
                                                     cluster: dict[str, Any]) -> None:
    status, _, body = get(server, "/api/v1/allocation", token_of(minter, cluster["mallory"], 1))
    assert status == 200
    data = json.loads(body)
    assert (data["container"], data["cores"], data["memoryMib"]) == ("worker", 100, 40960)


def test_usage_against_limits_with_history(server: MetricsServer, minter: TokenMinter, cluster: dict[str, Any],
                                           fake_node: FakeNode) -> None:
    token = token_of(minter, cluster["alice"], 0)
    status, _, body = get(server, "/api/v1/usage?history=600", token)
    assert status == 200
    data = json.loads(body)
    assert data["stale"] is False and data["message"] is None
    assert data["periodSeconds"] == 0.05 and data["historySeconds"] == 600
    assert data["limits"] == {"cores": 25, "memoryMib": 4096}
    current = data["current"]
    assert (current["memoryUsedMib"], current["utilizationPercent"]) == (3000, 20)
    assert current["cards"] == [{"index": 2, "memoryUsedMib": 3000, "utilizationPercent": 20}]
    assert len(data["history"]) >= 3
    assert all(set(p) == {"t", "memoryUsedMib", "utilizationPercent"} for p in data["history"])
    assert data["history"][-1]["t"] <= current["t"]
    times = [p["t"] for p in data["history"]]
    assert times == sorted(times)

    fake_node.gpus.set_usage(cluster["alice_pid"], 3900, 24)
    wait_for_samples(server.sampler, 2)
    data = json.loads(get(server, "/api/v1/usage?history=0.01", token)[2])
    assert (data["current"]["memoryUsedMib"], data["current"]["utilizationPercent"]) == (3900, 24)
    assert len(data["history"]) <= 1


@pytest.mark.parametrize("value", ["soon", "-5", "nan", "inf", ""])
def test_bad_history_parameter_is_a_clear_400(server: MetricsServer, minter: TokenMinter,
                                               cluster: dict[str, Any], value: str) -> None:
    status, _, body = get(server, f"/api/v1/usage?history={value}", token_of(minter, cluster["alice"], 0))
    assert status == 400 and "history=" in json.loads(body)["message"]


def test_topology_shows_others_only_anonymously(server: MetricsServer, minter: TokenMinter,
                                                cluster: dict[str, Any], fake_node: FakeNode) -> None:
    status, _, body = get(server, "/api/v1/topology", token_of(minter, cluster["alice"], 0))
    assert status == 200
    for secret in (OTHER_POD, OTHER_NAMESPACE, OTHER_CONTAINER, uid(cluster["mallory"]), "worker"):
        assert secret not in body
    data = json.loads(body)
    assert data["node"] == NODE and data["stale"] is False
    assert len(data["links"]) == 8 and data["links"][0][0] == "X" and data["links"][0][1] == "NV12"
    assert data["tree"]["level"] == "ROOT"
    gpus = {g["index"]: g for g in data["gpus"]}
    assert set(gpus) == set(range(8))
    assert gpus[2] == {
        "index": 2, "uuid": fake_node.card_uuid(2), "model": "NVIDIA A100-SXM4-40GB", "memoryMib": 40960,
        "numa": gpus[2]["numa"], "healthy": True, "mine": True, "myCores": 25, "myMemoryMib": 4096,
        "allocatedCores": 75, "allocatedMemoryMib": 56 * 256, "tenants": 1,
        "memoryUsedMib": 11000, "utilizationPercent": 60,
    }
    assert gpus[3]["mine"] is False and gpus[3]["tenants"] == 1 and gpus[3]["allocatedCores"] == 100
    assert gpus[0]["tenants"] == 0 and gpus[0]["allocatedCores"] == 0
    assert isinstance(gpus[2]["numa"], int)


def test_every_call_needs_a_token(server: MetricsServer) -> None:
    for path in PATHS:
        status, headers, body = get(server, path)
        assert status == 401 and headers["WWW-Authenticate"].startswith("Bearer")
        assert "VGPU_TOKEN" in json.loads(body)["message"]


def test_wrong_scheme_or_empty_token_is_401(server: MetricsServer, minter: TokenMinter,
                                            cluster: dict[str, Any]) -> None:
    token = token_of(minter, cluster["alice"], 0)
    for header in (f"Basic {token}", "Bearer", "Bearer   ", token):
        assert get(server, "/api/v1/allocation", header=header)[0] == 401


def refused(server: MetricsServer, token: str) -> list[tuple[int, str]]:
    return [get(server, path, token)[::2] for path in PATHS]


def assert_nothing_leaks(responses: list[tuple[int, str]], *pods: dict[str, Any]) -> None:
    for status, body in responses:
        assert status in (401, 403, 404), (status, body)
        for pod in pods:
            for secret in (pod["metadata"]["name"], pod["metadata"]["namespace"], uid(pod)):
                assert secret not in body
        assert set(json.loads(body)) == {"status", "message"}


def test_forged_tokens_are_refused(server: MetricsServer, minter: TokenMinter, cluster: dict[str, Any]) -> None:
    alice, mallory = cluster["alice"], cluster["mallory"]
    genuine = token_of(minter, mallory, 0)
    version, allocation_id, mac = genuine.split(".")
    alices = token_of(minter, alice, 0).split(".")[1]
    forged = [
        f"{version}.{alices}.{mac}",  # someone else's MAC on Alice's allocation id
        f"{version}.{alices}",  # an allocation id (it is in Alice's pod annotations) is not a token
        alices,
        TokenMinter(secrets.token_bytes(32)).mint(alices),  # another node's secret
        genuine[:-2] + ("AA" if not genuine.endswith("AA") else "BB"),
        f"v1.{uid(alice)}.0.{mac}",  # the old (pod UID, index) format is not accepted
        "v3." + genuine.split(".", 1)[1],
        "garbage",
        genuine + ".extra",
        genuine.replace(mac, mac[:-1] + "\u00e9"),  # not ASCII
    ]
    for token in forged:
        responses = refused(server, token)
        assert {status for status, _ in responses} == {403}, token
        assert_nothing_leaks(responses, alice, mallory)


def test_a_token_reads_only_its_own_container(server: MetricsServer, minter: TokenMinter,
                                              cluster: dict[str, Any]) -> None:
    # each of Mallory's containers reads its own allocation with its own token
    for index, (cards, cores) in enumerate((([2], 50), ([3], 100))):
        status, _, body = get(server, "/api/v1/allocation", token_of(minter, cluster["mallory"], index))
        answer = json.loads(body)
        assert status == 200 and answer["containerIndex"] == index and answer["cores"] == cores
        assert [card["index"] for card in answer["cards"]] == cards
    # Mallory's genuine token shows Mallory's data, never Alice's.
    status, _, body = get(server, "/api/v1/topology", token_of(minter, cluster["mallory"], 0))
    assert status == 200
    assert "jupyter-alice" not in body and uid(cluster["alice"]) not in body
    # a genuine token whose allocation id no container's record holds reads nothing
    responses = refused(server, minter.mint(new_allocation_id()))
    assert {status for status, _ in responses} == {403}
    assert_nothing_leaks(responses, cluster["alice"], cluster["mallory"])


def test_the_record_holding_the_id_decides_not_the_pod_a_token_was_meant_for(
        fake_node: FakeNode, minter: TokenMinter) -> None:
    """Out-of-order admission of identical requests: the answer prepared for Bob (and naming Bob in
    its env) went to Carol's container. While the device plugin rewrites the two records both may
    claim the id for a moment: the token then reads nothing; once they agree, it reads Carol's."""
    bob = fake_node.pod("jupyter-bob", {"notebook": (30, 8, (1,))}, namespace="team-b")
    carol = fake_node.pod("jupyter-carol", {"notebook": (30, 8, (5,))}, namespace="team-c")
    in_carols_container = token_of(minter, bob, 0)  # minted for Bob's answer; kubelet gave it to Carol
    server = MetricsServer(NODE, fake_node.gpus, fake_node, minter, address="127.0.0.1", port=0,
                           period=0.05, proc_root=fake_node.proc_root)
    server.start()
    try:
        def rewrite(pod: dict[str, Any], allocation_id: str, card: int) -> None:
            record = PodAllocation.from_json(pod["metadata"]["annotations"][c.DEFAULT_NAMES.allocation])
            share = replace(record.containers[0].cards[0], index=card, uuid=fake_node.card_uuid(card))
            container = replace(record.containers[0], cards=(share,), allocation_id=allocation_id)
            fresh = {**pod, "metadata": {**pod["metadata"], "annotations": {
                c.DEFAULT_NAMES.allocation: replace(record, containers=(container,)).to_json()}}}
            fake_node.pods[fake_node.pods.index(pod)] = fresh
            pod.clear()
            pod.update(fresh)

        bobs_id = in_carols_container.split(".")[1]
        carols_old_id = token_of(minter, carol, 0).split(".")[1]
        rewrite(carol, bobs_id, 1)  # Carol's record first: now both claim the id
        wait_for_samples(server.sampler, 2)
        responses = refused(server, in_carols_container)
        assert {status for status, _ in responses} == {403}
        assert_nothing_leaks(responses, bob, carol)
        rewrite(bob, carols_old_id, 5)
        wait_for_samples(server.sampler, 2)
        status, _, body = get(server, "/api/v1/allocation", in_carols_container)
        answer = json.loads(body)
        assert status == 200 and (answer["namespace"], answer["pod"], answer["podUid"]) == (
            "team-c", "jupyter-carol", uid(carol))
        assert [card["index"] for card in answer["cards"]] == [1]
        assert "jupyter-bob" not in body and uid(bob) not in body and "team-b" not in body
    finally:
        server.stop()


def test_token_of_a_pod_that_is_gone_is_refused(server: MetricsServer, minter: TokenMinter,
                                                cluster: dict[str, Any], fake_node: FakeNode) -> None:
    token = token_of(minter, cluster["mallory"], 0)
    assert get(server, "/api/v1/usage", token)[0] == 200
    fake_node.pods.remove(cluster["mallory"])
    wait_for_samples(server.sampler, 2)
    responses = refused(server, token)
    assert {status for status, _ in responses} == {403}
    assert_nothing_leaks(responses, cluster["alice"])


def test_new_pod_is_served_before_the_next_sample(fake_node: FakeNode, minter: TokenMinter) -> None:
    server = MetricsServer(NODE, fake_node.gpus, fake_node, minter, address="127.0.0.1", port=0,
                           period=3600, history_seconds=3600, proc_root=fake_node.proc_root)
    server.start()
    try:
        wait_for_samples(server.sampler, 1, since=0)  # the first (and, for an hour, only) sample
        pod = fake_node.pod("late", {"nb": (10, 4, (6,))})  # created after the only sample
        status, _, body = get(server, "/api/v1/allocation", token_of(minter, pod, 0))
        assert status == 200 and json.loads(body)["cards"][0]["index"] == 6
    finally:
        server.stop()


def test_tokens_off_for_debugging(fake_node: FakeNode, minter: TokenMinter, cluster: dict[str, Any]) -> None:
    server = MetricsServer(NODE, fake_node.gpus, fake_node, minter, address="127.0.0.1", port=0,
                           period=0.05, require_token=False, proc_root=fake_node.proc_root)
    server.start()
    try:
        wait_for_samples(server.sampler, 2)
        status, _, body = get(server, "/api/v1/allocation?pod=hub/jupyter-alice&container=notebook")
        assert status == 200 and json.loads(body)["pod"] == "jupyter-alice"
        assert get(server, "/api/v1/allocation?pod=hub/nobody")[0] == 404
        # a superscript two is a digit to str.isdigit, not to int(): a name no container has, not a 500
        assert get(server, "/api/v1/allocation?pod=hub/jupyter-alice&container=%C2%B2")[0] == 404
        # nor is an index longer than int() reads from text (4,300 digits)
        assert get(server, "/api/v1/allocation?pod=hub/jupyter-alice&container=" + "9" * 5000)[0] == 404
        assert get(server, "/api/v1/allocation")[0] == 401  # says who you are one way or the other
        assert get(server, "/api/v1/allocation", "forged")[0] == 403  # a token, when sent, is checked
    finally:
        server.stop()


# --- the OpenAPI document describes what the server really sends ------------------------------

OPENAPI = Path(__file__).resolve().parents[2] / "docs" / "metrics-api.yaml"


def _json_schema(node: Any) -> Any:
    """OpenAPI 3.0 schema -> JSON Schema: nullable becomes a null alternative, objects with
    listed properties are closed (so an undocumented field fails the test)."""
    if isinstance(node, list):
        return [_json_schema(n) for n in node]
    if not isinstance(node, dict):
        return node
    out = {k: _json_schema(v) for k, v in node.items() if k not in ("nullable", "example")}
    if out.get("type") == "object" and "properties" in out:
        out.setdefault("additionalProperties", False)
    if node.get("nullable"):
        return {"anyOf": [{"type": "null"}, out]}
    return out


def _validator(document: dict[str, Any], path: str, status: str) -> Any:
    import jsonschema

    schema = document["paths"][path]["get"]["responses"][status]
    if "$ref" in schema:
        schema = document["components"]["responses"][schema["$ref"].rsplit("/", 1)[1]]
    root = {"components": _json_schema(document["components"]),
            **_json_schema(schema["content"]["application/json"]["schema"])}
    return jsonschema.Draft202012Validator(root)


def test_responses_match_the_openapi_document(server: MetricsServer, minter: TokenMinter,
                                              cluster: dict[str, Any]) -> None:
    document = yaml.safe_load(OPENAPI.read_text())
    assert document["openapi"].startswith("3.")
    token = token_of(minter, cluster["alice"], 0)
    for path, query in (("/api/v1/allocation", ""), ("/api/v1/usage", "?history=600"), ("/api/v1/topology", ""),
                        ("/healthz", ""), ("/readyz", "")):
        status, _, body = get(server, path + query, token)
        assert status == 200
        _validator(document, path, "200").validate(json.loads(body))
    for path in PATHS:
        status, _, body = get(server, path)
        _validator(document, path, str(status)).validate(json.loads(body))
        status, _, body = get(server, path, "forged")
        _validator(document, path, str(status)).validate(json.loads(body))


def test_the_topology_shows_a_mig_cards_slices_and_whose_they_are(fake_node: FakeNode, minter: TokenMinter) -> None:
    made = fake_node.gpus.set_mig_layout(5, ["2g.10gb", "2g.10gb", "2g.10gb", "1g.5gb"])
    carol = fake_node.pod("jupyter-carol", {"notebook": (20, 32, (5,))})
    dave = fake_node.pod("jupyter-dave", {"notebook": (10, 16, (5,))})
    put_on_slice(carol, made[0].uuid)
    put_on_slice(dave, made[3].uuid)
    server = MetricsServer(NODE, fake_node.gpus, fake_node, minter, address="127.0.0.1", port=0, period=0.05,
                           history_seconds=60, proc_root=fake_node.proc_root, enforcement="hami-core")
    server.start()
    try:
        wait_for_samples(server.sampler, 2)
        status, _, body = get(server, "/api/v1/topology", token_of(minter, carol, 0))
        _, _, dave_body = get(server, "/api/v1/topology", token_of(minter, dave, 0))
        _, _, usage = get(server, "/api/v1/usage", token_of(minter, carol, 0))
    finally:
        server.stop()
    # NVML measures no compute per MIG device: the usage says so rather than showing a 0
    current = json.loads(usage)["current"]
    assert current["utilizationMeasured"] is False
    assert status == 200
    data = json.loads(body)
    _validator(yaml.safe_load(OPENAPI.read_text()), "/api/v1/topology", "200").validate(data)
    card = next(g for g in data["gpus"] if g["index"] == 5)
    assert [(s["profile"], s["cores"], s["memoryMib"], s["state"]) for s in card["migSlices"]] == [
        ("2g.10gb", 28, 10240, "mine"), ("2g.10gb", 28, 10240, "free"), ("2g.10gb", 28, 10240, "free"),
        ("1g.5gb", 14, 5120, "held")]
    # accounting at the slices' real size: 28 + 14, not the 20 + 10 asked; the other holder is a count
    assert (card["mine"], card["myCores"], card["myMemoryMib"], card["tenants"]) == (True, 28, 10240, 1)
    assert card["healthy"]  # a card in MIG mode is kept out of time-sharing, not broken
    assert card["utilizationPercent"] is None  # no whole-card utilisation in MIG mode: not a 0
    assert (card["allocatedCores"], card["allocatedMemoryMib"]) == (42, 15360)
    assert made[3].uuid not in body and "jupyter-dave" not in body  # other tenants stay anonymous
    assert all("migSlices" not in g for g in data["gpus"] if g["index"] != 5)  # whole cards as before
    theirs = next(g for g in json.loads(dave_body)["gpus"] if g["index"] == 5)
    assert [s["state"] for s in theirs["migSlices"]] == ["held", "free", "free", "mine"]


def test_a_failed_slice_is_unavailable_and_a_lost_mig_card_unhealthy(fake_node: FakeNode, minter: TokenMinter) -> None:
    made = fake_node.gpus.set_mig_layout(5, ["2g.10gb", "2g.10gb", "2g.10gb", "1g.5gb"])
    carol = fake_node.pod("jupyter-carol", {"notebook": (20, 32, (5,))})
    put_on_slice(carol, made[0].uuid)
    fake_node.gpus.fail_slice(made[2].uuid)
    server = MetricsServer(NODE, fake_node.gpus, fake_node, minter, address="127.0.0.1", port=0, period=0.05,
                           history_seconds=60, proc_root=fake_node.proc_root, enforcement="hami-core")
    server.start()
    try:
        wait_for_samples(server.sampler, 2)
        card = next(g for g in json.loads(get(server, "/api/v1/topology", token_of(minter, carol, 0))[2])["gpus"]
                    if g["index"] == 5)
        assert [s["state"] for s in card["migSlices"]] == ["mine", "free", "unavailable", "free"] and card["healthy"]
        fake_node.gpus.lose_card(5)
        wait_for(lambda: not next(g for g in json.loads(get(server, "/api/v1/topology", token_of(minter, carol, 0))[2])
                                  ["gpus"] if g["index"] == 5)["healthy"], timeout=30, what="the lost card")
    finally:
        server.stop()


def test_a_container_on_a_mig_slice_sees_the_slice(fake_node: FakeNode, minter: TokenMinter) -> None:
    made = fake_node.gpus.set_mig_layout(5, ["2g.10gb", "2g.10gb", "2g.10gb", "1g.5gb"])
    carol = fake_node.pod("jupyter-carol", {"notebook": (20, 32, (5,))})
    record = PodAllocation.from_json(carol["metadata"]["annotations"][c.DEFAULT_NAMES.allocation])
    (container,) = record.containers
    on_slice = replace(container, cards=(replace(container.cards[0], mig_device=made[0].uuid),))
    carol["metadata"]["annotations"][c.DEFAULT_NAMES.allocation] = replace(record, containers=(on_slice,)).to_json()
    carol["metadata"]["annotations"][c.DEFAULT_NAMES.mig_slice(0)] = made[0].uuid
    server = MetricsServer(NODE, fake_node.gpus, fake_node, minter, address="127.0.0.1", port=0, period=0.05,
                           history_seconds=60, proc_root=fake_node.proc_root, enforcement="hami-core")
    server.start()
    try:
        wait_for_samples(server.sampler, 2)
        status, _, body = get(server, "/api/v1/allocation", token_of(minter, carol, 0))
        usage_status, _, usage = get(server, "/api/v1/usage", token_of(minter, carol, 0))
    finally:
        server.stop()
    # the usage's limits (the panel's "your share" line) are the whole slice, not the 20 % asked
    assert usage_status == 200 and json.loads(usage)["limits"] == {"cores": 28, "memoryMib": 10240}
    assert status == 200
    data = json.loads(body)
    assert data["enforcement"] == c.ENFORCEMENT_MIG and (data["cores"], data["memoryMib"]) == (28, 10240)
    assert data["cards"] == [{"index": 5, "uuid": made[0].uuid, "model": "NVIDIA A100-SXM4-40GB", "cores": 28,
                              "memoryMib": 10240, "memoryTotalMib": 10240, "migProfile": "2g.10gb"}]
    _validator(yaml.safe_load(OPENAPI.read_text()), "/api/v1/allocation", "200").validate(data)
