"""Per-pod usage under MPS on the NVML backend: the clients are attributed to their containers.

Under MPS NVML's compute list holds only the MPS server; the notebooks' processes are listed
by ``nvmlDeviceGetMPSComputeRunningProcesses``. The NVML backend runs over tests/gpu's
stand-in (the installed nvidia-ml-py over a fake libnvidia-ml), the sampler reads a fake proc root.
"""

from __future__ import annotations

import sys
from pathlib import Path

from metrics_support import NODE, FakeNode, cgroup_text
from vgpu_plugin.metrics.sampler import ContainerKey, Sampler

from jupyter_vgpu.gpu.nvml import NVMLBackend

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gpu"))
import fake_pynvml  # noqa: E402


def test_mps_clients_usage_reaches_their_pods(fake_node: FakeNode) -> None:
    pod = fake_node.pod("jupyter-alice", {"notebook": (25, 16, (1,))})
    status = pod["status"]["containerStatuses"][0]
    runtime, _, container_id = status["containerID"].partition("://")
    client, server = 4321, 77
    fake_node.write_cgroup(client, cgroup_text(pod["metadata"]["uid"], container_id, runtime))
    fake_node.write_cgroup(server, "0::/kubepods.slice/kubepods-besteffort.slice/mps-daemon.scope\n")
    cards = fake_pynvml.default_cards()
    cards[1].processes = {server: 3500}     # nvidia-cuda-mps-server, as the compute list shows it
    cards[1].mps_clients = {client: 3000}   # the notebook's process
    backend = NVMLBackend(library=fake_pynvml.make_module(cards=cards, driver="r470"))
    snapshot = Sampler(NODE, backend, fake_node, proc_root=fake_node.proc_root).sample_once()
    usage = snapshot.usage[ContainerKey(pod["metadata"]["uid"], 0)]
    assert (usage.memory_used_mib, usage.pids) == (3000, (client,))
    owners = {p.pid: p.owner for p in snapshot.processes}
    assert owners[client] == "container"
