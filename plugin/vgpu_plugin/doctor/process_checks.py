"""Whether NVML shows this process other pods' GPU processes (what per-notebook usage needs).

The driver reports a process to an NVML caller only if the process's PID exists in the caller's
PID namespace (open-gpu-kernel-modules, gpu_rmapi.c), so a node daemon without ``hostPID``
lists no notebook's process: every usage figure reads 0 and the reclaimer sees nothing. A card's
memory (``nvmlDeviceGetMemoryInfo``) is the same from every namespace, which is how a blind
caller is told from an idle node.
"""

from __future__ import annotations

import os
from typing import Any

from ..deviceplugin.checkpoint import CheckpointError, read_checkpoint
from ..deviceplugin.devices import CHECKPOINT_FILE, cards_in
from ..metrics.cgroup import read_process_identity
from .report import FAIL, OK, WARN, Finding
from .setup import NodeSetup

NAME = "process-visibility"
BUSY_MEMORY_MIB = 1024
"""Card memory in use above what an idle card reports (the driver's reservation, a few hundred MiB,
counts as used): something runs there."""
HOST_PID_REMEDY = ("run the node daemon with hostPID: true (deploy/base/node-daemonset.yaml does) and the doctor "
                   "in that pod or on the host")
RETRY = "run it again while a notebook uses its GPU (e.g. holds a tensor on it)"


def held_cards(setup: NodeSetup) -> set[int]:
    """The cards kubelet's checkpoint says hold vGPU devices of some pod; empty when it cannot say."""
    try:
        entries = read_checkpoint(os.path.join(setup.plugin_dir, CHECKPOINT_FILE))
    except (OSError, CheckpointError, UnicodeDecodeError):
        return set()  # the checkpoint check says why
    return set(cards_in(i for e in entries if e.resource in setup.names.resources for i in e.device_ids))


def check_process_visibility(setup: NodeSetup, pod_names: dict[str, str]) -> Finding:
    gpus = setup.gpus
    if not gpus.available():
        return Finding(NAME, WARN, "skipped: no cards visible", "fix the driver first")
    try:
        sample: Any = gpus.sample()
    except Exception as error:  # a GPUError or an NVMLError: the driver check is where to look
        return Finding(NAME, WARN, f"skipped: cannot read the cards' processes: {error}", "fix the driver first")
    # the doctor and the daemon hold no CUDA context, so any pod NVML names is another pod
    for process in sample.processes:
        identity, _ = read_process_identity(setup.proc_root, int(process.pid))
        if identity is None:
            continue
        name = pod_names.get(identity.pod_uid)
        where = f"pod {name} ({identity.pod_uid})" if name else f"pod {identity.pod_uid}"
        return Finding(NAME, OK, f"NVML lists pid {process.pid} on card {process.card_index}, of {where}: "
                                 "other pods' GPU processes are visible")
    held = held_cards(setup)
    listed = {int(p.card_index) for p in sample.processes}
    blind = {int(c.index): int(c.memory_used_mib) for c in sample.cards
             if c.index in held and c.index not in listed and c.memory_used_mib >= BUSY_MEMORY_MIB}
    if blind:
        used = ", ".join(f"card {index}: {mib} MiB" for index, mib in sorted(blind.items()))
        return Finding(NAME, FAIL, f"memory is in use on cards holding vGPU shares ({used}) but NVML lists no "
                                   "process there: this process is not in the host's PID namespace, so the "
                                   "driver hides the pods' processes and every notebook's usage reads 0",
                       HOST_PID_REMEDY)
    if sample.processes:
        return Finding(NAME, WARN, f"skipped: NVML lists {len(sample.processes)} GPU process(es), none of another "
                                   "pod", RETRY)
    return Finding(NAME, WARN, "skipped: no GPU process runs on this node", RETRY)
