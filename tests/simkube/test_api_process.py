"""The simulated API in a process of its own, through the official client and its kubeconfig."""

from __future__ import annotations

import socket

import kubernetes.client
import kubernetes.config
import pytest
from simkube.process import SimKubeAPIProcess
from simkube.tls import HOST


def test_the_api_in_its_own_process_serves_keeps_its_objects_across_a_restart_and_stops(tmp_path):
    api = SimKubeAPIProcess().start()
    try:
        core = kubernetes.client.CoreV1Api(api.api_client())
        core.create_namespaced_config_map("default", {"metadata": {"name": "kept"}})
        port = api.port
        api.restart()
        assert api.port == port
        kubeconfig = api.write_kubeconfig(tmp_path / "kubeconfig")
        from_file = kubernetes.client.CoreV1Api(kubernetes.config.new_client_from_config(config_file=kubeconfig))
        assert [m.metadata.name for m in from_file.list_namespaced_config_map("default").items] == ["kept"]
    finally:
        api.stop()
    assert not api.running
    with pytest.raises(ConnectionRefusedError):
        socket.create_connection((HOST, port), timeout=5).close()
