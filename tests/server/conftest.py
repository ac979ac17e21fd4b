"""Server-extension fixtures: pytest-jupyter's server fixtures and small fake peers.

pytest-jupyter's fixtures and hooks are imported here (not via ``pytest_plugins``, which
pytest only allows in the rootdir conftest) so they apply to this directory only.
"""

from __future__ import annotations

import pytest
from pytest_jupyter.jupyter_server import *  # noqa: F403
from pytest_jupyter.jupyter_server import jp_fetch as raw_jp_fetch  # noqa: F401 - wrapped below
from server_node_support import real_node  # noqa: F401 - the fixture

from jupyter_vgpu.core import contract

_ENV = (*contract.VGPU_ENV_NAMES, contract.ENV_NOTEBOOK_SOURCE, contract.ENV_NOTEBOOK_KUBECONFIG,
        contract.ENV_NOTEBOOK_REQUESTER,
        "JUPYTERHUB_API_URL", "JUPYTERHUB_API_TOKEN", "JUPYTERHUB_USER", "JUPYTERHUB_SERVER_NAME",
        "HOST_IP", "CUDA_VISIBLE_DEVICES", contract.ENV_NVIDIA_VISIBLE_DEVICES)


@pytest.fixture(autouse=True)
def clean_vgpu_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each test states its own environment; nothing leaks from the machine or earlier tests."""
    for name in _ENV:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def run(jp_asyncio_loop):
    """Run a coroutine on the server's loop (pytest-asyncio would run tests on another one)."""
    return jp_asyncio_loop.run_until_complete


@pytest.fixture
def vgpu_config() -> dict:
    """c.VGPUSettings (fact source, requester) for the server under test; tests override this fixture."""
    return {"source": "none"}


@pytest.fixture
def vgpu_extension_config() -> dict:
    """c.VGPUExtension settings (the REST API's own) for the server under test."""
    return {}


@pytest.fixture
def jp_server_config(vgpu_config, vgpu_extension_config):
    from traitlets.config import Config

    return Config({
        "ServerApp": {"jpserver_extensions": {"jupyter_vgpu": True}},
        "VGPUSettings": vgpu_config,
        "VGPUExtension": vgpu_extension_config,
    })


@pytest.fixture
def peers(jp_asyncio_loop):
    """A node API and a gpu-manager /metric on 127.0.0.1; ``peers['url']`` is their base."""
    import asyncio

    from server_peers_support import serve

    asyncio.set_event_loop(jp_asyncio_loop)
    state: dict = {"metric_text": ""}
    server, url = serve(state)
    state["url"] = url
    yield state
    server.stop()




@pytest.fixture
def jp_fetch(raw_jp_fetch):  # noqa: F811 - the fixture wraps the imported one
    """pytest-jupyter's jp_fetch, checking every vgpu/api answer (errors too) against docs/server-api.yaml."""
    import json

    import server_api_support
    import tornado.httpclient

    def check(parts, method, response):
        if parts[:2] == ("vgpu", "api") and response is not None:
            server_api_support.check_response("/".join(parts[2:]), method, response.code, json.loads(response.body or b"null"))

    async def fetch(*parts, **kwargs):
        method = kwargs.get("method", "GET")
        try:
            response = await raw_jp_fetch(*parts, **kwargs)
        except tornado.httpclient.HTTPClientError as error:
            check(parts, method, error.response)
            raise
        check(parts, method, response)
        return response

    return fetch
