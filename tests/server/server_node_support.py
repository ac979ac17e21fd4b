"""A real node metrics server (vgpu_plugin.metrics) over simulated GPUs, for notebook-side tests.

``RealNode.add_notebook`` creates a pod the way the scheduler and device plugin leave it
(allocation annotation, container ID, a process in its cgroup on the card) and returns
the ``VGPU_*`` environment the device plugin's Allocate gives that container, with a
read token minted by the node's own minter.
"""

from __future__ import annotations

import secrets
import uuid
from pathlib import Path
from typing import Any

import pytest
from vgpu_plugin.metrics.server import MetricsServer
from vgpu_plugin.tokens import TokenMinter, new_allocation_id

from jupyter_vgpu.core import contract
from jupyter_vgpu.data import TOPOLOGY_DIR
from jupyter_vgpu.gpu.simulated import SimulatedGPUs


class RealNode:
    def __init__(self, tmp: Path, fixture: str = "a100-sxm-4gpu-nv4.txt", node: str = "gpu-node-1",
                 period: float = 0.2, require_token: bool = True) -> None:
        self.node = node
        self.gpus = SimulatedGPUs.from_fixture(TOPOLOGY_DIR / fixture, host=node)
        self.proc_root = tmp / "proc"
        self.proc_root.mkdir(parents=True, exist_ok=True)
        self.pods: list[dict[str, Any]] = []
        self.minter = TokenMinter(secrets.token_bytes(32))
        self.server = MetricsServer(node, self.gpus, self, self.minter, address="127.0.0.1", port=0,
                                    period=period, proc_root=str(self.proc_root), enforcement="hami-core",
                                    require_token=require_token)
        self._pid = 4000

    def items(self) -> list[dict[str, Any]]:  # the metrics server's pod source
        return list(self.pods)

    def start(self) -> RealNode:
        self.server.start()
        return self

    def stop(self) -> None:
        self.server.stop()
        self.gpus.close()

    def add_notebook(self, name: str, card: int, cores: int, memory_units: int, *, namespace: str = "jupyter",
                     container: str = "notebook", pattern: str = "training", mig_device: str = "") -> dict[str, str]:
        """A notebook pod holding a share of ``card`` (on its MIG slice ``mig_device`` when given, as
        the extender's bind writes it), with a process running on it."""
        uid = str(uuid.uuid4())
        container_id = secrets.token_hex(32)
        card_uuid = self.gpus.inventory()[card].uuid
        allocation_id = new_allocation_id()  # what the device plugin records once kubelet confirms Allocate
        allocation = contract.PodAllocation(self.node, (contract.ContainerAllocation(
            0, container, (contract.CardShare(card, card_uuid, cores, memory_units, mig_device),), allocation_id),))
        annotations = {contract.DEFAULT_NAMES.allocation: allocation.to_json()}
        if mig_device:
            annotations[contract.DEFAULT_NAMES.mig_slice(0)] = mig_device
        self.pods.append({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "namespace": namespace, "uid": uid,
                         "annotations": annotations},
            "spec": {"nodeName": self.node, "schedulerName": contract.SCHEDULER_NAME, "containers": [
                {"name": container, "resources": {"limits": contract.request_limits(contract.Request(cores, memory_units))}}]},
            "status": {"phase": "Running", "containerStatuses": [
                {"name": container, "ready": True, "containerID": f"containerd://{container_id}"}]},
        })
        pid, self._pid = self._pid, self._pid + 1
        slice_uid = uid.replace("-", "_")
        (self.proc_root / str(pid)).mkdir()
        (self.proc_root / str(pid) / "cgroup").write_text(
            f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{slice_uid}.slice/"
            f"cri-containerd-{container_id}.scope\n")
        memory_mib = memory_units * contract.MEMORY_UNIT_MIB
        self.gpus.start_process(pid, card, memory_limit_mib=memory_mib, cores_limit=cores, pattern=pattern,
                                mig_device=mig_device or None)
        card_total = self.gpus.inventory()[card].memory_mib
        return {  # as the device plugin's Allocate sets them (deviceplugin/enforcement.py)
            contract.ENV_NVIDIA_VISIBLE_DEVICES: card_uuid,
            contract.ENV_CORES: str(cores),
            contract.ENV_MEMORY_MIB: str(memory_mib),
            contract.ENV_DEVICE_UUIDS: card_uuid,
            contract.ENV_DEVICE_INDICES: str(card),
            contract.ENV_DEVICE_MODEL: self.gpus.inventory()[card].model,
            contract.ENV_NODE: self.node,
            contract.ENV_POD_NAME: name,
            contract.ENV_POD_NAMESPACE: namespace,
            contract.ENV_POD_UID: uid,
            contract.ENV_CONTAINER: container,
            contract.ENV_METRICS_URL: self.server.url,
            contract.ENV_TOKEN: self.minter.mint(allocation_id),
            contract.ENV_ENFORCEMENT: "hami-core",
            contract.ENV_XLA_MEM_FRACTION: f"{min(1.0, memory_mib / card_total):.3f}",
            contract.ENV_CUPY_MEMORY_LIMIT: str(memory_mib * 1024 * 1024),
        }


@pytest.fixture
def real_node(tmp_path):
    """The real node metrics server over simulated GPUs, for tests/server and tests/magic."""
    node = RealNode(tmp_path).start()
    yield node
    node.stop()
