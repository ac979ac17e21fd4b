"""``jupyter-vgpu doctor``: check this node and say what to do (flags with env fallbacks,
the same variables as the node daemon's, so it runs as is in the vgpu-node pod)."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Sequence

from jupyter_vgpu.core.contract import (
    DEFAULT_RESOURCE_DOMAIN,
    ENFORCEMENT_BACKENDS,
    PROJECT_DOMAIN,
    Names,
)

from .report import exit_code, render_json, render_text
from .setup import DEFAULT_NAMESPACE, NodeSetup


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None


def _bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off", ""):
        return False
    raise SystemExit(f"jupyter-vgpu doctor: {text!r} is not true or false")


def build_parser() -> argparse.ArgumentParser:
    env = os.environ.get
    p = argparse.ArgumentParser(
        prog="jupyter-vgpu doctor",
        description="Check that this node is ready for vGPU notebooks: driver and NVML, cards, MIG mode, the "
                    "container runtime, whether the NVIDIA Container Toolkit lets unprivileged pods pick cards "
                    "by NVIDIA_VISIBLE_DEVICES, kubelet's device-plugin directory, socket and checkpoint, the "
                    "enforcement backend (usable by a non-root notebook), cgroups, whether NVML shows other pods' GPU "
                    "processes (hostPID), the node annotation, another "
                    "device plugin (NVIDIA's, GKE's) on the same cards and the scheduler's version. One line per check: ok, "
                    "warn or fail with what to do. Exit status 1 when any check fails. Run it on every GPU node, "
                    "on the host or in that node's vgpu-node pod (docs/admin.md, section 7, loops over them); "
                    "flags fall back to the environment variables in brackets, the node daemon's where they "
                    "share a meaning.")
    p.add_argument("--json", action="store_true", default=_bool(env("VGPU_DOCTOR_JSON", "false")),
                   help="print the findings as JSON [$VGPU_DOCTOR_JSON]")
    p.add_argument("--node", default=env("NODE_NAME"), help="this node's Kubernetes name [$NODE_NAME]")
    p.add_argument("--gpus", default=env("VGPU_GPUS", "nvml"), help="GPU backend: nvml or sim:FIXTURE [$VGPU_GPUS]")
    p.add_argument("--plugin-dir", default=env("VGPU_PLUGIN_DIR", "/var/lib/kubelet/device-plugins"),
                   help="kubelet's device-plugin directory [$VGPU_PLUGIN_DIR]")
    p.add_argument("--enforcement", choices=ENFORCEMENT_BACKENDS, default=env("VGPU_ENFORCEMENT", "hami-core"),
                   help="the backend the node daemon is configured for [$VGPU_ENFORCEMENT, default hami-core]")
    p.add_argument("--hami-root", default=env("VGPU_HAMI_ROOT", "/usr/local/vgpu"),
                   help="HAMi-core's directory (libvgpu.so, ld.so.preload, containers/) [$VGPU_HAMI_ROOT]")
    p.add_argument("--hami-lock-dir", default=env("VGPU_DOCTOR_HAMI_LOCK_DIR", "/tmp/vgpulock"),
                   help="HAMi-core's lock directory [$VGPU_DOCTOR_HAMI_LOCK_DIR, default /tmp/vgpulock]")
    p.add_argument("--mps-pipe-dir", default=env("VGPU_MPS_PIPE_DIR", "/tmp/nvidia-mps"),
                   help="the MPS control daemon's pipe directory [$VGPU_MPS_PIPE_DIR]")
    p.add_argument("--mps-shm-dir", default=env("VGPU_MPS_SHM_DIR"),
                   help="the MPS control daemon's shm directory, given to clients as /dev/shm [$VGPU_MPS_SHM_DIR]")
    p.add_argument("--proc-root", default=env("VGPU_METRICS_PROC_ROOT", "/proc"),
                   help="the host's /proc [$VGPU_METRICS_PROC_ROOT, default /proc]")
    p.add_argument("--host-root", default=env("VGPU_DOCTOR_HOST_ROOT", "/"),
                   help="where the host's / is, for containerd's and the NVIDIA Container Toolkit's configuration "
                        "[$VGPU_DOCTOR_HOST_ROOT, default /]")
    p.add_argument("--toolkit-config", default=env("VGPU_DOCTOR_TOOLKIT_CONFIG"),
                   help="the NVIDIA Container Toolkit's config.toml as on the host, read under --host-root; default: "
                        "/etc/nvidia-container-runtime/config.toml, else the GPU Operator's "
                        "/usr/local/nvidia/toolkit/.config/nvidia-container-runtime/config.toml "
                        "[$VGPU_DOCTOR_TOOLKIT_CONFIG]")
    p.add_argument("--cdi", type=_bool, default=_bool(env("VGPU_CDI", "false")), metavar="BOOL",
                   help="the device plugin names cards as CDI devices (its --cdi), for the toolkit check "
                        "[$VGPU_CDI, default false]")
    p.add_argument("--sysfs-root", default=env("VGPU_DOCTOR_SYSFS_ROOT", "/sys"),
                   help="[$VGPU_DOCTOR_SYSFS_ROOT, default /sys]")
    p.add_argument("--dev-root", default=env("VGPU_DOCTOR_DEV_ROOT", "/dev"), help="[$VGPU_DOCTOR_DEV_ROOT, default /dev]")
    p.add_argument("--notebook-uid", type=_int, default=env("VGPU_DOCTOR_NOTEBOOK_UID", "1000"),
                   help="the uid notebooks run as, for the enforcement directories' permissions "
                        "[$VGPU_DOCTOR_NOTEBOOK_UID, default 1000]")
    p.add_argument("--notebook-gid", type=_int, default=env("VGPU_DOCTOR_NOTEBOOK_GID", "100"),
                   help="their gid [$VGPU_DOCTOR_NOTEBOOK_GID, default 100]")
    p.add_argument("--runtime-class", default=env("VGPU_DOCTOR_RUNTIME_CLASS"),
                   help="the RuntimeClass GPU pods use ('' for none); default: the vgpu-node pod's own "
                        "[$VGPU_DOCTOR_RUNTIME_CLASS]")
    p.add_argument("--namespace", default=env("VGPU_DOCTOR_NAMESPACE", DEFAULT_NAMESPACE),
                   help=f"namespace of vgpu-node and vgpu-scheduler [$VGPU_DOCTOR_NAMESPACE, default {DEFAULT_NAMESPACE}]")
    p.add_argument("--domain", default=env("VGPU_RESOURCE_DOMAIN", DEFAULT_RESOURCE_DOMAIN),
                   help="resource domain [$VGPU_RESOURCE_DOMAIN]")
    p.add_argument("--kubeconfig", default=env("KUBECONFIG"),
                   help="kubeconfig; default in-cluster or ~/.kube/config [$KUBECONFIG]")
    p.add_argument("--no-api", action="store_true", default=_bool(env("VGPU_DOCTOR_NO_API", "false")),
                   help="skip the checks that ask the API server [$VGPU_DOCTOR_NO_API]")
    acceptance = p.add_argument_group("GPU acceptance kit (docs/acceptance.md)")
    acceptance.add_argument("--acceptance", action="store_true",
                            default=_bool(env("VGPU_DOCTOR_ACCEPTANCE", "false")),
                            help="instead of the node checks, accept this machine's GPUs without Kubernetes: cards "
                                 "against nvidia-smi, a real CUDA process seen by the metrics sampler, the PyTorch "
                                 "guard rail, MPS limits (--allow-mps), MIG state; pass / fail / n/a, exit status 1 "
                                 "when a check fails; changes no GPU setting [$VGPU_DOCTOR_ACCEPTANCE]")
    acceptance.add_argument("--report-dir", default=env("VGPU_DOCTOR_REPORT_DIR"), metavar="DIR",
                            help="write acceptance.json and acceptance.md here [$VGPU_DOCTOR_REPORT_DIR]")
    acceptance.add_argument("--allow-mps", action="store_true", default=_bool(env("VGPU_DOCTOR_ALLOW_MPS", "false")),
                            help="let the acceptance kit start a private MPS control daemon (its own pipe and log "
                                 "directories, quit at the end) to check a client is held to its pinned-memory "
                                 "limit [$VGPU_DOCTOR_ALLOW_MPS]")
    acceptance.add_argument("--cuda-worker", default=env("VGPU_DOCTOR_CUDA_WORKER"), metavar="COMMAND",
                            help="the command that runs the acceptance kit's CUDA worker, e.g. another Python with "
                                 "PyTorch: '/opt/conda/bin/python -m vgpu_plugin.doctor.acceptance_cuda'; default: "
                                 "this Python [$VGPU_DOCTOR_CUDA_WORKER]")
    p.add_argument("--log-level", default=env("VGPU_LOG_LEVEL", "WARNING"),
                   choices=["DEBUG", "INFO", "WARNING", "ERROR"], help="[$VGPU_LOG_LEVEL, default WARNING]")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    logging.basicConfig(level=args.log_level, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    if args.acceptance:
        from .acceptance import run_from_args

        return run_from_args(args)
    from jupyter_vgpu.gpu import open_backend

    try:
        names = Names(domain=args.domain, project_domain=PROJECT_DOMAIN)
        gpus = open_backend(args.gpus, host=args.node or "")
    except (ValueError, OSError) as error:
        print(f"jupyter-vgpu doctor: {error}", file=sys.stderr)
        return 2
    api = None
    if not args.no_api:
        from .. import kubeclient

        try:
            api = kubeclient.load(args.kubeconfig)
        except kubeclient.KubeConfigError as error:
            print(f"jupyter-vgpu doctor: {error}; the cluster checks are skipped (--no-api to silence this)",
                  file=sys.stderr)
    setup = NodeSetup(
        gpus=gpus, node=args.node, plugin_dir=args.plugin_dir, enforcement=args.enforcement,
        hami_root=args.hami_root, hami_lock_dir=args.hami_lock_dir, mps_pipe_dir=args.mps_pipe_dir,
        mps_shm_dir=args.mps_shm_dir, proc_root=args.proc_root, sysfs_root=args.sysfs_root, dev_root=args.dev_root,
        host_root=args.host_root, toolkit_config=args.toolkit_config, cdi=args.cdi,
        notebook_uid=args.notebook_uid, notebook_gid=args.notebook_gid,
        runtime_class=args.runtime_class, namespace=args.namespace, names=names, api=api,
    )
    from .checks import run_checks

    try:
        findings = run_checks(setup)
    finally:
        gpus.close()
    print(render_json(findings, args.node) if args.json else render_text(findings))
    return exit_code(findings)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
