"""The enforcement backend the daemon is configured for: present, and usable by a notebook
that does not run as root."""

from __future__ import annotations

import os
import stat

from .report import FAIL, OK, WARN, Finding
from .setup import NodeSetup, mode_text, usable_by

# where the device plugin mounts HAMi-core in containers (enforcement.HAMI_CONTAINER_ROOT)
HAMI_CONTAINER_LIBRARY = "/usr/local/vgpu/libvgpu.so"
MPS_DAEMON = "nvidia-cuda-mps-control"


def check_enforcement(setup: NodeSetup) -> list[Finding]:
    if setup.enforcement == "none":
        return [Finding("enforcement", OK, "none: scheduling-only sharing (framework guard rails, not enforced)")]
    if setup.enforcement == "hami-core":
        return _hami(setup)
    if setup.enforcement == "mps":
        return _mps(setup)
    return [Finding("enforcement", FAIL, f"unknown enforcement {setup.enforcement!r}", "use hami-core, mps or none")]


def _who(setup: NodeSetup) -> str:
    return f"uid {setup.notebook_uid} gid {setup.notebook_gid}"


def _hami(setup: NodeSetup) -> list[Finding]:
    root = setup.hami_root
    library = os.path.join(root, "libvgpu.so")
    preload = os.path.join(root, "ld.so.preload")
    install = f"install HAMi-core's libvgpu.so and an ld.so.preload naming {HAMI_CONTAINER_LIBRARY} in {root} (docs/admin.md)"
    if not os.path.isfile(library):
        return [Finding("hami-core", FAIL, f"{library} is missing", install)]
    if not usable_by(library, setup.notebook_uid, setup.notebook_gid, "r"):
        return [Finding("hami-core", FAIL, f"{library} is not readable by {_who(setup)} ({mode_text(library)})",
                        f"chmod 0644 {library}")]
    try:
        with open(preload, encoding="utf-8") as handle:
            names = handle.read().split()
    except OSError:
        return [Finding("hami-core", FAIL, f"{preload} is missing", install)]
    if not usable_by(preload, setup.notebook_uid, setup.notebook_gid, "r"):
        return [Finding("hami-core", FAIL, f"{preload} is not readable by {_who(setup)} ({mode_text(preload)}): "
                                           "the dynamic loader skips it in non-root notebooks", f"chmod 0644 {preload}")]
    if HAMI_CONTAINER_LIBRARY not in names:
        return [Finding("hami-core", FAIL, f"{preload} does not name {HAMI_CONTAINER_LIBRARY}: the library is "
                                           "never loaded", f"echo {HAMI_CONTAINER_LIBRARY} > {preload}")]
    findings = [Finding("hami-core", OK, f"{library} and {preload} in place")]
    # libvgpu.so in every notebook, whatever its uid, creates files in these two
    lock = setup.hami_lock_dir
    if not os.path.isdir(lock):
        findings.append(Finding("hami-dirs", FAIL, f"lock directory {lock} is missing",
                                f"mkdir -m 1777 {lock} (the hami-core overlay's init container does this)"))
        return findings
    unusable = []
    if not usable_by(lock, setup.notebook_uid, setup.notebook_gid, "rwx"):
        unusable.append(f"{lock} ({mode_text(lock)})")
    containers = os.path.join(root, "containers")
    cache_dirs = sorted(os.listdir(containers)) if os.path.isdir(containers) else []
    for name in cache_dirs:
        path = os.path.join(containers, name)
        if os.path.isdir(path) and not usable_by(path, setup.notebook_uid, setup.notebook_gid, "rwx"):
            unusable.append(f"{path} ({mode_text(path)})")
    if unusable:
        findings.append(Finding("hami-dirs", FAIL, f"not writable by a notebook running as {_who(setup)}: "
                                                   + ", ".join(unusable[:4]) + ("…" if len(unusable) > 4 else "")
                                                   + "; libvgpu.so exits in every CUDA process there",
                                f"chmod 1777 {lock}; chmod 0777 the per-container directories under {containers} "
                                "(a node daemon at this version creates them 0777)"))
    else:
        findings.append(Finding("hami-dirs", OK, f"{lock} and {len(cache_dirs)} per-container cache dir(s) "
                                                 f"writable by {_who(setup)}"))
    return findings


def _running(setup: NodeSetup, command: str) -> list[int]:
    pids = []
    try:
        entries = os.listdir(setup.proc_root)
    except OSError:
        return pids
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(os.path.join(setup.proc_root, entry, "comm"), encoding="utf-8", errors="replace") as handle:
                if handle.read().strip() == command[:15]:  # comm is cut at 15 characters
                    pids.append(int(entry))
        except OSError:
            continue
    return sorted(pids)


def _mps(setup: NodeSetup) -> list[Finding]:
    findings = []
    pids = _running(setup, MPS_DAEMON)
    pipe = setup.mps_pipe_dir
    start = f"start it on the node: CUDA_MPS_PIPE_DIRECTORY={pipe} {MPS_DAEMON} -d (docs/admin.md)"
    if not pids:
        findings.append(Finding("mps-daemon", FAIL, f"no {MPS_DAEMON} process in {setup.proc_root}", start))
    else:
        findings.append(Finding("mps-daemon", OK, f"{MPS_DAEMON} running (pid {', '.join(map(str, pids))})"))
    control = os.path.join(pipe, "control")
    if not os.path.isdir(pipe):
        findings.append(Finding("mps-dirs", FAIL, f"pipe directory {pipe} is missing (the DaemonSet pod sees it "
                                                  "only if the overlay mounts it; else run doctor on the host)", start))
        return findings
    try:
        is_fifo = stat.S_ISFIFO(os.stat(control).st_mode)
    except OSError:
        is_fifo = False
    problems = []
    if not is_fifo:
        problems.append(f"no control pipe {control} (the daemon uses another pipe directory?)")
    if not usable_by(pipe, setup.notebook_uid, setup.notebook_gid, "rwx"):
        problems.append(f"{pipe} not usable by {_who(setup)} ({mode_text(pipe)})")
    shm = setup.mps_shm_dir
    if shm is None:
        findings.append(Finding("mps-shm", WARN, "no MPS shm directory configured: clients in pods (private "
                                                 "/dev/shm) may not attach",
                                "run the control daemon with its own shm directory and give it to the node daemon "
                                "(--mps-shm-dir), as NVIDIA's MPS integration does"))
    elif not os.path.isdir(shm):
        problems.append(f"shm directory {shm} is missing")
    elif not usable_by(shm, setup.notebook_uid, setup.notebook_gid, "rwx"):
        problems.append(f"{shm} not usable by {_who(setup)} ({mode_text(shm)})")
    if problems:
        findings.append(Finding("mps-dirs", FAIL, "; ".join(problems),
                                f"{start}; make the directories usable by the notebook user (chmod 1777)"))
    else:
        findings.append(Finding("mps-dirs", OK, f"{pipe} (control pipe)" + (f" and {shm}" if shm else "")
                                                + f" usable by {_who(setup)}"))
    return findings
