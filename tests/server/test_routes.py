"""Every route of the server extension through a real jupyter-server (pytest-jupyter).

pytest-jupyter's default base URL is "/a%40b/" (an escaped '@'), so every request here
also checks that the routes work under a base URL with escapes.
"""

from __future__ import annotations

import asyncio
import json

import pytest
import tornado.httpclient
import tornado.websocket
from server_api_support import check_response, check_schema
from server_peers_support import ALLOCATION, TOKEN, as_json, closed_port_url
from simkube.waiting import wait_for

from jupyter_vgpu.core import contract
from jupyter_vgpu.data import TOPOLOGY_DIR
from jupyter_vgpu.requesters.hub import NOT_UNDER_HUB
from jupyter_vgpu.sources.gpu_manager import VcudaConfig, encode_vcuda_config

ROUTES = ("allocation", "topology", "usage", "requests")


def get(run, jp_fetch, *parts, **params):
    return as_json(run(jp_fetch("vgpu", "api", *parts, params=params or None)))


def test_base_url_has_escapes(run, jp_fetch, jp_base_url):
    assert "%40" in jp_base_url  # the rest of this module runs under it
    response = run(jp_fetch("vgpu", "api", "allocation"))
    assert response.effective_url.split("?")[0].endswith("/a%40b/vgpu/api/allocation")


def test_no_vgpu_is_a_helpful_empty_state(run, jp_fetch):
    allocation = get(run, jp_fetch, "allocation")
    assert allocation["state"] == "none" and allocation["source"] == "none"
    assert allocation["allocation"] is None
    assert "%vgpu request" in allocation["message"] and "GPU profile" in allocation["message"]
    assert get(run, jp_fetch, "topology")["state"] == "none"
    usage = get(run, jp_fetch, "usage")
    assert usage["state"] == "none" and usage["current"] is None and usage["history"] == []


def test_unauthenticated_requests_are_refused(run, jp_fetch, jp_base_url, jp_http_port):
    base = f"http://127.0.0.1:{jp_http_port}{jp_base_url}vgpu/api/"

    async def fetch(path, method):
        body = json.dumps({"cores": 25, "memory": "4GiB"}) if method == "POST" else None
        return await tornado.httpclient.AsyncHTTPClient().fetch(base + path, method=method, body=body,
                                                                raise_error=False)

    for path, method in [(r, "GET") for r in ROUTES] + [("requests", "POST"), ("requests/r1-x", "GET")]:
        response = run(fetch(path, method))
        assert response.code == 403, (path, method, response.code)
        check_response(path, method, 403, as_json(response))
    with pytest.raises(tornado.httpclient.HTTPClientError) as refused:
        run(tornado.websocket.websocket_connect(f"ws://127.0.0.1:{jp_http_port}{jp_base_url}vgpu/api/usage/stream"))
    assert refused.value.code == 403


# --- node API (the real node metrics server over simulated GPUs) ------------------------------


@pytest.fixture
def node_env(monkeypatch, real_node):
    real_node.add_notebook("jupyter-eve", card=2, cores=50, memory_units=40)  # a neighbour on the same card
    env = real_node.add_notebook("jupyter-alice", card=2, cores=25, memory_units=40)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    return env


def wait_live(run, jp_fetch):
    return wait_for(lambda: (u := get(run, jp_fetch, "usage", history="60"))["state"] == "live" and u["current"]
                    and u["current"]["memoryUsedMib"] > 0 and u, timeout=60, interval=0.1, what="live usage")


class TestNodeAPI:
    @pytest.fixture
    def vgpu_config(self, node_env):
        return {"source": "auto"}

    @pytest.fixture
    def vgpu_extension_config(self):
        return {"stream_interval": 0.2}

    def test_allocation_is_what_the_device_plugin_gave(self, run, jp_fetch, node_env):
        answer = get(run, jp_fetch, "allocation")
        assert answer["state"] == "allocated" and answer["source"] == "node-api" and answer["message"] is None
        allocation = answer["allocation"]
        assert (allocation["pod"], allocation["namespace"], allocation["node"]) == ("jupyter-alice", "jupyter", "gpu-node-1")
        assert (allocation["cores"], allocation["memoryMib"], allocation["enforcement"]) == (25, 10240, "hami-core")
        [card] = allocation["cards"]
        assert (card["index"], card["uuid"], card["memoryTotalMib"]) == (2, node_env[contract.ENV_DEVICE_UUIDS], 40960)

    def test_topology_shows_neighbours_only_as_counts(self, run, jp_fetch):
        wait_live(run, jp_fetch)
        answer = get(run, jp_fetch, "topology")
        assert answer["state"] == "available"
        topology = answer["topology"]
        assert len(topology["links"]) == 4 and topology["tree"]["level"] == "ROOT"
        card = next(g for g in topology["gpus"] if g["index"] == 2)
        assert card["mine"] and card["allocatedCores"] == 75 and card["tenants"] == 1
        assert "jupyter-eve" not in json.dumps(topology)

    def test_usage_changes_over_time(self, run, jp_fetch):
        first = wait_live(run, jp_fetch)
        assert first["limits"] == {"cores": 25, "memoryMib": 10240} and first["periodSeconds"] == 0.2

        def changed():
            later = get(run, jp_fetch, "usage", history="60")
            return later if later["current"]["t"] > first["current"]["t"] and (
                later["current"]["memoryUsedMib"], later["current"]["utilizationPercent"]) != (
                first["current"]["memoryUsedMib"], first["current"]["utilizationPercent"]) else None

        later = wait_for(changed, timeout=60, interval=0.2, what="usage to change")
        assert later["history"] and 0 < later["current"]["memoryUsedMib"] <= 10240

    def test_stale_samples_are_a_state(self, run, jp_fetch, real_node):
        wait_live(run, jp_fetch)
        real_node.server.sampler.stop()
        usage = wait_for(lambda: (u := get(run, jp_fetch, "usage"))["state"] == "stale" and u, timeout=60,
                         interval=0.2, what="stale usage")
        assert usage["message"]

    def test_bad_history_is_a_400(self, run, jp_fetch):
        with pytest.raises(tornado.httpclient.HTTPClientError) as error:
            run(jp_fetch("vgpu", "api", "usage", params={"history": "lots"}))
        assert error.value.code == 400

    def test_usage_stream_sends_samples(self, run, jp_fetch, jp_ws_fetch):
        wait_live(run, jp_fetch)

        async def two_messages():
            ws = await jp_ws_fetch("vgpu", "api", "usage", "stream")
            first = json.loads(await asyncio.wait_for(ws.read_message(), 30))
            second = first
            while second["current"]["t"] == first["current"]["t"]:
                second = json.loads(await asyncio.wait_for(ws.read_message(), 30))
            ws.close()
            return first, second

        first, second = run(two_messages())
        check_schema("UsageStreamMessage", first)
        check_schema("UsageStreamMessage", second)
        assert first["state"] == "live" and first["limits"] == {"cores": 25, "memoryMib": 10240}
        assert second["current"]["t"] > first["current"]["t"]


class TestSlowNodeAPI:
    @pytest.fixture
    def vgpu_config(self, monkeypatch, peers):
        monkeypatch.setenv(contract.ENV_METRICS_URL, peers["url"])
        monkeypatch.setenv(contract.ENV_TOKEN, TOKEN)
        peers["delay"] = 2.0
        return {"source": "node-api"}

    def test_slow_node_api_does_not_block_the_server(self, run, jp_fetch):
        async def both():
            slow = asyncio.ensure_future(jp_fetch("vgpu", "api", "allocation"))
            await asyncio.sleep(0.2)
            await jp_fetch("api", "status")  # another route answers while the adapter waits
            answered_first = not slow.done()
            return answered_first, as_json(await slow)

        answered_first, allocation = run(both())
        assert answered_first, "the server waited for the slow node API before answering another route"
        assert allocation["allocation"] == ALLOCATION


class TestNodeAPICutOff:
    @pytest.fixture
    def vgpu_config(self, monkeypatch, peers):
        monkeypatch.setenv(contract.ENV_METRICS_URL, peers["url"])
        monkeypatch.setenv(contract.ENV_TOKEN, TOKEN)
        peers["cut"] = True
        return {"source": "node-api"}

    def test_a_peer_dying_mid_answer_is_unreachable(self, run, jp_fetch):
        for route in ("allocation", "usage", "topology"):
            answer = get(run, jp_fetch, route)
            assert answer["state"] == "unreachable" and "is unreachable" in answer["message"], answer


class TestNodeAPIUnreachable:
    @pytest.fixture
    def vgpu_config(self, node_env, monkeypatch):
        monkeypatch.setenv(contract.ENV_METRICS_URL, closed_port_url())
        return {"source": "node-api", "timeout": 2.0}

    def test_unreachable_is_a_state_not_an_error(self, run, jp_fetch, node_env):
        allocation = get(run, jp_fetch, "allocation")
        assert allocation["state"] == "unreachable" and "unreachable" in allocation["message"]
        # what the device plugin put in the environment is still shown
        assert allocation["allocation"]["cores"] == 25
        assert allocation["allocation"]["cards"][0]["uuid"] == node_env[contract.ENV_DEVICE_UUIDS]
        usage = get(run, jp_fetch, "usage")
        assert usage["state"] == "unreachable" and usage["limits"] == {"cores": 25, "memoryMib": 10240}
        assert get(run, jp_fetch, "topology")["state"] == "unreachable"


class TestNodeAPIRefusesToken:
    @pytest.fixture
    def vgpu_config(self, node_env, monkeypatch, real_node):
        monkeypatch.setenv(contract.ENV_TOKEN, real_node.minter.mint("an-allocation-that-is-gone"))
        return {"source": "auto"}

    def test_refused_token_says_so(self, run, jp_fetch):
        allocation = get(run, jp_fetch, "allocation")
        assert allocation["state"] == "unreachable" and "refused this pod's read token (HTTP 403" in allocation["message"]


# --- gpu-manager (its /metric served by the real metrics server's gpu-manager endpoint) -----------


class TestGpuManager:
    @pytest.fixture
    def real_node(self, tmp_path):
        """gpu-manager serves /metric to anyone; the stand-in's scrape port does so with tokens off."""
        from server_node_support import RealNode

        node = RealNode(tmp_path, require_token=False).start()
        yield node
        node.stop()

    @pytest.fixture
    def vgpu_config(self, real_node, tmp_path, monkeypatch):
        real_node.add_notebook("jupyter-bob", card=3, cores=30, memory_units=32)
        config_dir = tmp_path / "vcuda" / "0123abcd"
        config_dir.mkdir(parents=True)
        (config_dir / contract.GM_VCUDA_CONFIG_NAME).write_bytes(encode_vcuda_config(VcudaConfig(
            pod_uid="uid-9", container_name="notebook", bus_id="0000:3B:00.0",
            memory_bytes=8 * 1024**3, utilization=30, hard_limit=True)))
        monkeypatch.setenv("HOSTNAME", "jupyter-bob")
        monkeypatch.setenv("POD_NAMESPACE", "jupyter")
        monkeypatch.setenv(contract.ENV_NVIDIA_VISIBLE_DEVICES, "3")
        return {"source": "auto", "vcuda_config_dir": str(tmp_path / "vcuda"),
                "gpu_manager_metric_url": real_node.server.scrape_url + "/metric"}

    def test_gpu_manager_limits_and_usage(self, run, jp_fetch):
        allocation = get(run, jp_fetch, "allocation")
        assert allocation["state"] == "allocated" and allocation["source"] == "gpu-manager"
        body = allocation["allocation"]
        assert (body["cores"], body["memoryMib"], body["pod"], body["container"]) == (30, 8192, "jupyter-bob", "notebook")
        assert body["cards"][0]["index"] == 3 and body["cards"][0]["busId"] == "0000:3B:00.0"
        usage = wait_for(lambda: (u := get(run, jp_fetch, "usage", history="60"))["state"] == "live"
                         and u["current"]["memoryUsedMib"] and u, timeout=60, interval=0.2, what="live usage")
        assert 0 < usage["current"]["memoryUsedMib"] <= 8192 and 0 < usage["current"]["utilizationPercent"] <= 30
        assert usage["limits"] == {"cores": 30, "memoryMib": 8192} and usage["history"]
        assert get(run, jp_fetch, "topology")["state"] == "none"


# --- a workstation (local GPUs through the simulated backend) --------------------------------


class TestLocalGPUs:
    @pytest.fixture
    def vgpu_config(self, monkeypatch):
        monkeypatch.setenv(contract.ENV_NVIDIA_VISIBLE_DEVICES, "1,2")
        return {"source": "auto", "local_backend": f"simulated:{TOPOLOGY_DIR / 'a100-sxm-4gpu-nv4.txt'}"}

    def test_visible_cards_topology_usage(self, run, jp_fetch):
        allocation = get(run, jp_fetch, "allocation")
        assert allocation["source"] == "local-nvml" and allocation["state"] == "allocated"
        assert [c["index"] for c in allocation["allocation"]["cards"]] == [1, 2]
        topology = get(run, jp_fetch, "topology")["topology"]
        assert [g["mine"] for g in topology["gpus"]] == [False, True, True, False]
        assert topology["tree"]["level"] == "ROOT" and len(topology["links"]) == 4
        usage = get(run, jp_fetch, "usage")
        assert usage["state"] == "live" and usage["limits"] == {"cores": 200, "memoryMib": 2 * 40960}
        assert [c["index"] for c in usage["current"]["cards"]] == [1, 2]


# --- share requests ----------------------------------------------------------------------------


def test_requests_validate_and_explain(run, jp_fetch):
    def post(body):
        return run(jp_fetch("vgpu", "api", "requests", method="POST", body=json.dumps(body), raise_error=False))

    for body, words in [({"cores": 25}, "needs vcuda-memory"), ({"cores": 150, "memory": 4}, "did you mean 100 or 200"),
                        ({"cores": 25, "memory": "3.3GiB"}, "multiple of 256 MiB"), ({"memory": 4}, "cores"),
                        ({"cores": -1, "memory": 4}, "negative"), ({"cores": 25, "memory": [4]}, "use a size")]:
        response = post(body)
        assert response.code == 400, body
        assert words in as_json(response)["message"], (body, as_json(response))
    assert post("not json").code == 400
    none_yet = run(jp_fetch("vgpu", "api", "requests"))  # no request yet is a state, not an error
    assert none_yet.code == 204 and none_yet.body == b""

    accepted = post({"cores": 25, "memory": "4GiB"})
    assert accepted.code == 202 and accepted.headers["Location"].endswith(as_json(accepted)["id"])
    request_id = as_json(accepted)["id"]
    assert as_json(accepted)["memoryUnits"] == 16
    final = get(run, jp_fetch, "requests", request_id)
    assert final["state"] == "failed" and final["message"] == NOT_UNDER_HUB
    assert get(run, jp_fetch, "requests")["id"] == request_id
    with pytest.raises(tornado.httpclient.HTTPClientError) as unknown:
        run(jp_fetch("vgpu", "api", "requests", "r99-nothing"))
    assert unknown.value.code == 404


class TestMisconfigured:
    @pytest.fixture
    def vgpu_config(self):
        return {"source": "local-nvml", "local_backend": "cuda-magic"}

    def test_a_bad_setting_is_shown_not_fatal(self, run, jp_fetch):
        answer = get(run, jp_fetch, "allocation")
        assert answer["state"] == "none" and "jupyter-vgpu is misconfigured: local backend 'cuda-magic'" in answer["message"]
