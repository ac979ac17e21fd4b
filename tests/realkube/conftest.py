"""The real-Kubernetes tier: one real cluster for the session (``vgpu_plugin.realkube``):
etcd, kube-apiserver, kube-controller-manager, kube-scheduler as vgpu-scheduler with our
extender, and three kubelets on Kubernetes' fake CRI runtime with our node daemons.

The Kubernetes programs come from ``hack/kube/build.sh``: scripts/test.sh builds them before
pytest starts (a cold build takes minutes); so does the collection hook below when pytest is
run directly, outside any test's timeout.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
from realkube_support import GPU_A, GPU_B, MIG, MIG_LAYOUT

from jupyter_vgpu.core import contract as c


def pytest_collection_finish(session: pytest.Session) -> None:
    if any("tests/realkube/" in item.nodeid for item in session.items) and not os.environ.get("VGPU_KUBE_BIN_DIR"):
        from vgpu_plugin.realkube.binaries import kube_bin_dir

        os.environ["VGPU_KUBE_BIN_DIR"] = str(kube_bin_dir())


@pytest.fixture(scope="session")
def real(topology_fixtures: Any) -> Iterator[Any]:
    from vgpu_plugin.demo.node import NodeSpec
    from vgpu_plugin.realkube.cluster import RealCluster

    nodes = [NodeSpec(GPU_A, "a100-sxm-4gpu-nv4.txt", seed=1, labels={"pool": "a100"}),
             NodeSpec(GPU_B, "p40-7gpu-pix-phb.txt", model="Tesla P40", memory_mib=24576, seed=2,
                      labels={"pool": "p40"}),
             NodeSpec(MIG, "a100-sxm-4gpu-nv4.txt", seed=3, mig={0: MIG_LAYOUT}, labels={"pool": "mig"})]
    # gpu-b's daemon names its cards as CDI devices too (--cdi), as on a node whose runtime injects by CDI
    with RealCluster(nodes, fixtures_dir=topology_fixtures, metrics_period=0.5, ready_timeout=120,
                     daemon_args={GPU_B: ["--cdi", "true"]}) as cluster:
        yield cluster


@pytest.fixture
def pods(real: Any) -> Iterator[list[tuple[str, str]]]:
    """(namespace, name) of the pods a test makes; deleted after it, and their cards freed."""
    made: list[tuple[str, str]] = []
    yield made
    for namespace, name in made:
        real.kubectl("delete", "pod", "-n", namespace, name, "--ignore-not-found", "--wait=false")
    for namespace, name in made:
        real.wait_for(lambda ns=namespace, n=name: real.read_pod(ns, n) is None, timeout=60,
                      what=f"pod {namespace}/{name} to be deleted")


@pytest.fixture(scope="session")
def names() -> c.Names:
    return c.DEFAULT_NAMES
