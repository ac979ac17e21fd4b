"""One node of the real cluster: Kubernetes' fake CRI runtime, a real kubelet, and our node
daemon (device plugin + metrics) on simulated GPUs, each a process of its own.

kubelet's device manager listens on a fixed path, ``/var/lib/kubelet/device-plugins/``
(``k8s.io/kubelet/pkg/apis/deviceplugin/v1beta1.DevicePluginPath``), and keeps its
checkpoint there. So that several kubelets share one machine, each runs in a mount
namespace of its own (``unshare --mount``) where that path is a bind mount of its node's own
directory; the node daemon is given that directory as its ``--plugin-dir``, as the
DaemonSet's hostPath gives it kubelet's on a real node.
"""

from __future__ import annotations

import functools
import json
import secrets
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from jupyter_vgpu.core import contract as c

from ..demo.node import NodeSpec, simulated_gpus
from .containers import record_env
from .control_plane import NODE_ACCOUNT, ControlPlane, write_kubeconfig
from .processes import Program, free_port

KUBELET_PLUGIN_DIR = "/var/lib/kubelet/device-plugins"


class RealNode:
    """Its programs start in order (``start_kubelet``, then ``start_daemon`` once the Node
    exists); each can be stopped, killed or restarted alone."""

    def __init__(self, spec: NodeSpec, topology: Path, plane: ControlPlane, workdir: Path, *,
                 enforcement: str, names: c.Names, scrape_token_file: Path, metrics_period: float,
                 daemon_args: Sequence[str] = ()) -> None:
        self.spec, self.topology, self.plane, self.workdir = spec, topology, plane, workdir
        self.enforcement, self.names, self.metrics_period = enforcement, names, metrics_period
        self.scrape_token_file = scrape_token_file
        self.daemon_args = list(daemon_args)
        self.plugin_dir = workdir / "device-plugins"
        self.state_dir = workdir / "state"
        self.containers_dir = workdir / "containers"  # fake-cri's record of each container's config
        for directory in (self.plugin_dir, self.state_dir, self.containers_dir, workdir / "logs"):
            directory.mkdir(parents=True, exist_ok=True)
        self.metrics_port, self.scrape_port = free_port(), free_port()
        self.runtime = Program(f"{self.name}/fake-cri", [
            str(plane.bin_dir / "fake-cri"), f"unix://{workdir / 'cri.sock'}", str(self.containers_dir)],
            workdir / "fake-cri.log")
        self.kubelet = Program(f"{self.name}/kubelet", self._kubelet_argv(), workdir / "kubelet.log")
        self.daemon: Program | None = None

    @property
    def name(self) -> str:
        return self.spec.name

    @functools.cached_property
    def gpus(self) -> Any:
        """The simulated cards this node's daemon serves, built here the same way (a pure function
        of the spec and the capture), for describing them; the daemon's own copy is in its process."""
        return simulated_gpus(self.spec, self.topology)

    @property
    def metrics_url(self) -> str:
        return f"http://127.0.0.1:{self.metrics_port}"

    @property
    def scrape_url(self) -> str:
        return f"http://127.0.0.1:{self.scrape_port}"

    # --- kubelet ------------------------------------------------------------------------------------

    def _kubelet_config(self) -> Path:
        config = {
            "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
            "address": "127.0.0.1", "port": free_port(), "readOnlyPort": 0, "healthzPort": 0,
            "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": False},
                               "x509": {"clientCAFile": str(self.plane.pki.ca)}},
            "authorization": {"mode": "AlwaysAllow"},
            "containerRuntimeEndpoint": f"unix://{self.workdir / 'cri.sock'}",
            # many kubelets on one host: no QoS cgroups of their own to fight over
            "cgroupDriver": "cgroupfs", "cgroupsPerQOS": False, "enforceNodeAllocatable": [],
            "failCgroupV1": False, "failSwapOn": False,
            "podLogsDir": str(self.workdir / "logs"), "resolvConf": "",
            # the host's disk is shared by every node: no node evicts for it
            "evictionHard": {"memory.available": "1Mi", "nodefs.available": "1%", "imagefs.available": "1%"},
            "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
            "registerNode": True, "maxPods": 250,
        }
        path = self.workdir / "kubelet.yaml"
        path.write_text(json.dumps(config, indent=1))
        return path

    def _kubelet_argv(self) -> list[str]:
        identity = self.plane.pki.issue(f"kubelet-{self.name}", user=f"system:node:{self.name}",
                                        groups=["system:nodes"])
        kubeconfig = write_kubeconfig(self.workdir / "kubelet.kubeconfig", self.plane.server, self.plane.pki.ca,
                                      client=identity)
        kubelet = [str(self.plane.bin_dir / "kubelet"), "--config", str(self._kubelet_config()),
                   "--kubeconfig", str(kubeconfig), "--root-dir", str(self.workdir / "root"),
                   "--cert-dir", str(self.workdir / "kubelet-certs"), "--hostname-override", self.name,
                   "--node-ip", "127.0.0.1", "--v", "1"]
        script = (f"mkdir -p {KUBELET_PLUGIN_DIR} && mount --bind {shlex.quote(str(self.plugin_dir))} "
                  f"{KUBELET_PLUGIN_DIR} && exec {shlex.join(kubelet)}")
        return ["unshare", "--mount", "--propagation", "private", "sh", "-c", script]

    def start_kubelet(self) -> None:
        if not self.runtime.alive:
            self.runtime.start()
        self.kubelet.start()

    # --- the node daemon --------------------------------------------------------------------------------

    def _daemon_argv(self) -> list[str]:
        token = self.plane.token(NODE_ACCOUNT, node=self.name)
        kubeconfig = write_kubeconfig(self.workdir / "vgpu-node.kubeconfig", self.plane.server, self.plane.pki.ca,
                                      token=token)
        argv = [sys.executable, "-m", "jupyter_vgpu.cli", "device-plugin", "--node", self.name,
                "--gpus", f"sim:{self.topology}", "--sim-model", self.spec.model,
                "--sim-memory", str(self.spec.memory_mib), "--sim-seed", str(self.spec.seed),
                "--plugin-dir", str(self.plugin_dir), "--state-dir", str(self.state_dir),
                "--kubeconfig", str(kubeconfig), "--domain", self.names.domain, "--enforcement", self.enforcement,
                "--hami-root", str(self.state_dir / "hami"), "--hami-lock-dir", str(self.state_dir / "vgpulock"),
                "--metrics-address", "127.0.0.1", "--metrics-port", str(self.metrics_port),
                "--metrics-scrape-address", "127.0.0.1", "--metrics-scrape-port", str(self.scrape_port),
                "--metrics-scrape-token-file", str(self.scrape_token_file),
                "--metrics-period", f"{self.metrics_period:g}", "--metrics-url", self.metrics_url]
        argv += self.daemon_args
        if self.spec.mig:
            argv += ["--sim-mig", ";".join(f"{card}={','.join(layout)}" for card, layout in self.spec.mig.items())]
        return argv

    def start_daemon(self) -> None:
        self.daemon = Program(f"{self.name}/vgpu-node", self._daemon_argv(), self.workdir / "vgpu-node.log")
        self.daemon.start()

    def programs(self) -> list[Program]:
        return [p for p in (self.daemon, self.kubelet, self.runtime) if p is not None]

    def stop(self) -> None:
        for program in self.programs():
            program.stop()

    # --- what the container runtime was given -----------------------------------------------------------

    def containers(self) -> list[dict[str, Any]]:
        """Every container the kubelet created here and has not removed: its pod and the CRI
        ContainerConfig it sent (``envs``, ``mounts``, ``devices``, ``CDIDevices``, ...)."""
        found = []
        for path in sorted(self.containers_dir.glob("*.json")):
            try:
                found.append(json.loads(path.read_text()))
            except (OSError, ValueError):  # removed or being replaced meanwhile
                continue
        return found

    def container_config(self, namespace: str, pod: str, container: str) -> dict[str, Any]:
        """The CRI ContainerConfig the kubelet created that container with (protojson names)."""
        for record in self.containers():
            config: dict[str, Any] = record["config"]
            if (record["namespace"], record["pod"], config["metadata"]["name"]) == (namespace, pod, container):
                return config
        raise KeyError(f"no container {container} of {namespace}/{pod} on {self.name}")

    def container_env(self, namespace: str, pod: str, container: str) -> dict[str, str]:
        return record_env(self.container_config(namespace, pod, container))


def scrape_token(path: Path) -> str:
    """The token Prometheus would send to every node's scrape port, in a 0600 file."""
    token = secrets.token_hex(16)
    path.write_text(token)
    path.chmod(0o600)
    return token
