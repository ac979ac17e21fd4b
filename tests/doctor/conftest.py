"""The ``healthy`` fixture: a simulated GPU node where every doctor check passes
(doctor_support.py builds it)."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from doctor_support import (
    NAMESPACE,
    NODE,
    NOTEBOOK_PID_NAMESPACE,
    Node,
    build_cluster,
    build_host,
    listen,
    sim_node,
)
from vgpu_plugin.doctor.setup import NodeSetup


@pytest.fixture
def healthy(kube: Any) -> Iterator[Node]:
    """A GPU node where everything is right (HAMi-core enforcement, nvidia via RuntimeClass)."""
    backend = sim_node()
    core, notebook_uid = build_cluster(kube, backend)
    # a short root: unix socket paths are limited to 107 bytes
    root = Path(tempfile.mkdtemp(prefix="vd-", dir="/tmp"))
    roots = build_host(root, backend, notebook_uid)
    # the notebook's GPU process (pid 4242 of build_host's /proc), in its container's PID namespace
    backend.start_process(4242, 0, memory_limit_mib=10240, cores_limit=25, pid_namespace=NOTEBOOK_PID_NAMESPACE)
    backend.set_usage(4242, 4000, 20)
    plugin_dir = Path(roots["plugin_dir"])
    sockets = {name: listen(plugin_dir / name) for name in ("kubelet.sock", "vgpu-core.sock", "vgpu-memory.sock")}
    # the notebook uid differs from the test runner's, so its access is judged as another user's
    uid = 1000 if os.geteuid() != 1000 else 1001
    setup = NodeSetup(gpus=backend, node=NODE, enforcement="hami-core", notebook_uid=uid, notebook_gid=100,
                      namespace=NAMESPACE, api=kube.api_client(), **roots)
    setup.cdi = True  # the device plugin's --cdi: what the hardened toolkit (build_host) needs
    try:
        yield Node(root, setup, core, sockets, notebook_uid)
    finally:
        for server in sockets.values():
            server.close()
        shutil.rmtree(root, ignore_errors=True)
