"""kubelet's device-plugin directory: its socket, ours, and its checkpoint."""

from __future__ import annotations

import os
import socket
import stat

from ..deviceplugin.checkpoint import CheckpointError, read_checkpoint
from ..deviceplugin.devices import CHECKPOINT_FILE, KUBELET_SOCKET, SOCKETS
from .report import FAIL, OK, WARN, Finding
from .setup import NodeSetup

ROOT_DIR_REMEDY = ("kubelet's root directory may differ (k0s: /var/lib/k0s/kubelet, some distributions "
                   "/var/snap/microk8s/common/var/lib/kubelet): point the DaemonSet's device-plugins hostPath "
                   "and --plugin-dir at <root-dir>/device-plugins")


def _answers(path: str) -> bool:
    """Whether something accepts connections on the unix socket."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(2)
        try:
            probe.connect(path)
        except OSError:
            return False
    return True


def _is_socket(path: str) -> bool:
    try:
        return stat.S_ISSOCK(os.stat(path).st_mode)
    except OSError:
        return False


def check_plugin_dir(setup: NodeSetup) -> list[Finding]:
    directory = setup.plugin_dir
    if not os.path.isdir(directory):
        return [Finding("kubelet-socket", FAIL, f"{directory} does not exist", ROOT_DIR_REMEDY)]
    kubelet = os.path.join(directory, KUBELET_SOCKET)
    findings = []
    if not _is_socket(kubelet):
        findings.append(Finding("kubelet-socket", FAIL, f"no {KUBELET_SOCKET} in {directory}: kubelet's device "
                                                        "plugin registration is not here", ROOT_DIR_REMEDY))
    elif not _answers(kubelet):
        findings.append(Finding("kubelet-socket", FAIL, f"{kubelet} does not accept connections (kubelet stopped?)",
                                "check `systemctl status kubelet` on the node"))
    else:
        findings.append(Finding("kubelet-socket", OK, f"{kubelet} accepts connections"))
    ours = {kind: os.path.join(directory, name) for kind, name in SOCKETS.items()}
    silent = [path for path in ours.values() if not (_is_socket(path) and _answers(path))]
    if silent:
        findings.append(Finding("plugin-sockets", WARN, f"the node daemon is not serving {', '.join(silent)}",
                                "is the vgpu-node pod running on this node? kubectl -n vgpu-system get pods -o wide; "
                                "the node needs the label vgpu.jupyter.org/node=true"))
    else:
        findings.append(Finding("plugin-sockets", OK, f"serving {', '.join(sorted(SOCKETS.values()))}"))
    return findings


def check_checkpoint(setup: NodeSetup) -> Finding:
    path = os.path.join(setup.plugin_dir, CHECKPOINT_FILE)
    if not os.path.exists(path):
        return Finding("checkpoint", WARN, f"no {path} yet",
                       "kubelet writes it once a device plugin registers; if pods already got devices, "
                       + ROOT_DIR_REMEDY)
    try:
        entries = read_checkpoint(path)
    except OSError as error:
        return Finding("checkpoint", FAIL, f"cannot read {path}: {error}",
                       "the node daemon runs as root to read it; check the pod's securityContext")
    except (CheckpointError, UnicodeDecodeError) as error:
        return Finding("checkpoint", FAIL, f"{path} is not in kubelet's format: {error}",
                       "report it with your kubelet version; the daemon then cannot reconcile allocations")
    ours = [e for e in entries if e.resource in setup.names.resources]
    pods = {e.pod_uid for e in ours}
    return Finding("checkpoint", OK, f"readable: {len(entries)} entries, {len(ours)} for vGPU resources "
                                     f"({len(pods)} pod(s))")
