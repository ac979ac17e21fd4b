"""``jupyter-vgpu device-plugin``: the node daemon's command line (flags with env fallbacks)."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from collections.abc import Sequence

from jupyter_vgpu.core.contract import (
    DEFAULT_RESOURCE_DOMAIN,
    ENFORCEMENT_BACKENDS,
    PROJECT_DOMAIN,
    Names,
)

from .devices import DEFAULT_PLUGIN_DIR

log = logging.getLogger("vgpu_plugin.deviceplugin")


def _bool(text: str) -> bool:
    lowered = str(text).strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off", ""):
        return False
    raise argparse.ArgumentTypeError(f"{text!r} is not true or false")


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"{value} must be positive")
    return value


def mig_layouts(text: str) -> dict[int, list[str]]:
    """``"0=2g.10gb,1g.5gb;2=3g.20gb"`` -> {0: ["2g.10gb", "1g.5gb"], 2: ["3g.20gb"]}; the
    profiles are checked against the card's model when the layout is set."""
    layouts: dict[int, list[str]] = {}
    for part in filter(None, (chunk.strip() for chunk in str(text).split(";"))):
        card, _, profiles = part.partition("=")
        if not card.strip().isdecimal() or not profiles.strip():
            raise argparse.ArgumentTypeError(f"{part!r} is not CARD=PROFILE[,PROFILE...] (e.g. 0=2g.10gb,1g.5gb)")
        if int(card) in layouts:
            raise argparse.ArgumentTypeError(f"card {int(card)} is given twice")
        layouts[int(card)] = [profile.strip() for profile in profiles.split(",")]
    return layouts


def build_parser() -> argparse.ArgumentParser:
    env = os.environ.get
    parser = argparse.ArgumentParser(
        prog="jupyter-vgpu device-plugin",
        description="Node daemon: kubelet device plugin for <domain>/vcuda-core and <domain>/vcuda-memory "
                    "(100 core devices per healthy card, one memory device per 256 MiB), GPU health, the "
                    "node's GPU inventory annotation, and the node metrics endpoint. Every flag falls back "
                    "to the environment variable shown in brackets.")
    parser.add_argument("--node", default=env("NODE_NAME"),
                        help="this node's Kubernetes name; pods bound here are served [$NODE_NAME, required]")
    parser.add_argument("--gpus", default=env("VGPU_GPUS", "nvml"),
                        help="GPU backend: 'nvml' (real cards through the NVIDIA driver) or 'sim:FIXTURE', "
                             "simulated cards from an `nvidia-smi topo -m` file or a bundled capture name "
                             "such as dgx-a100 [$VGPU_GPUS, default nvml]")
    parser.add_argument("--plugin-dir", default=env("VGPU_PLUGIN_DIR", DEFAULT_PLUGIN_DIR),
                        help=f"kubelet's device plugin directory: kubelet.sock and our sockets live here "
                             f"[$VGPU_PLUGIN_DIR, default {DEFAULT_PLUGIN_DIR}]")
    parser.add_argument("--enforcement", choices=ENFORCEMENT_BACKENDS, default=env("VGPU_ENFORCEMENT", "hami-core"),
                        help="how shares are enforced inside containers: hami-core (libvgpu.so limits), mps "
                             "(NVIDIA MPS client limits) or none (scheduling only, framework guard rails) "
                             "[$VGPU_ENFORCEMENT, default hami-core]")
    parser.add_argument("--kubeconfig", default=env("KUBECONFIG"),
                        help="kubeconfig file; without it the in-cluster service account is used [$KUBECONFIG]")
    parser.add_argument("--domain", default=env("VGPU_RESOURCE_DOMAIN", DEFAULT_RESOURCE_DOMAIN),
                        help=f"resource and hand-off annotation domain [$VGPU_RESOURCE_DOMAIN, default "
                             f"{DEFAULT_RESOURCE_DOMAIN}]")
    parser.add_argument("--state-dir", default=env("VGPU_STATE_DIR", "/var/lib/vgpu"),
                        help="host directory for the node's token secret (created 0600 on first start) "
                             "[$VGPU_STATE_DIR, default /var/lib/vgpu]")
    parser.add_argument("--metrics-url", default=env("VGPU_ADVERTISED_METRICS_URL"),
                        help="metrics base URL given to containers as VGPU_METRICS_URL; default "
                             "http://<node InternalIP>:<metrics port> [$VGPU_ADVERTISED_METRICS_URL]")
    parser.add_argument("--no-metrics", action="store_true", default=_bool(env("VGPU_NO_METRICS", "false")),
                        help="do not run the metrics server in this process [$VGPU_NO_METRICS]")
    parser.add_argument("--log-level", default=env("VGPU_LOG_LEVEL", "INFO"),
                        choices=["DEBUG", "INFO", "WARNING", "ERROR"], help="[$VGPU_LOG_LEVEL, default INFO]")
    sim = parser.add_argument_group("simulated GPUs (--gpus sim:FIXTURE)")
    sim.add_argument("--sim-model", default=env("VGPU_SIM_MODEL", "NVIDIA A100-SXM4-40GB"),
                     help="model name of the simulated cards [$VGPU_SIM_MODEL]")
    sim.add_argument("--sim-memory", type=_positive_int, default=env("VGPU_SIM_MEMORY_MIB", "40960"),
                     help="memory of each simulated card in MiB [$VGPU_SIM_MEMORY_MIB, default 40960]")
    sim.add_argument("--sim-seed", type=int, default=env("VGPU_SIM_SEED", "0"),
                     help="seed of the simulated usage patterns [$VGPU_SIM_SEED, default 0]")
    sim.add_argument("--sim-mig", type=mig_layouts, default=env("VGPU_SIM_MIG", ""), metavar="CARD=PROFILE,...;...",
                     help="MIG slices an admin made on simulated cards, e.g. '0=2g.10gb,2g.10gb,1g.5gb' "
                          "[$VGPU_SIM_MIG, default none]")
    enforce = parser.add_argument_group("enforcement details")
    enforce.add_argument("--hami-root", default=env("VGPU_HAMI_ROOT", "/usr/local/vgpu"),
                         help="host directory with HAMi-core's libvgpu.so and ld.so.preload; per-container "
                              "cache directories are made under it [$VGPU_HAMI_ROOT, default /usr/local/vgpu]")
    enforce.add_argument("--hami-lock-dir", default=env("VGPU_HAMI_LOCK_DIR", "/tmp/vgpulock"),
                         help="host directory of HAMi-core's node-wide lock, made root-owned and sticky (1777) "
                              "and mounted at /tmp/vgpulock [$VGPU_HAMI_LOCK_DIR, default /tmp/vgpulock]")
    enforce.add_argument("--mps-pipe-dir", default=env("VGPU_MPS_PIPE_DIR", "/tmp/nvidia-mps"),
                         help="host pipe directory of the MPS control daemon, mounted read-only into clients "
                              "[$VGPU_MPS_PIPE_DIR]")
    enforce.add_argument("--mps-shm-dir", default=env("VGPU_MPS_SHM_DIR", "/run/nvidia-mps/shm"),
                         help="host tmpfs the MPS control daemon uses as its /dev/shm; mounted as each client's "
                              "/dev/shm [$VGPU_MPS_SHM_DIR, default /run/nvidia-mps/shm]")
    enforce.add_argument("--dev-root", default=env("VGPU_DEV_ROOT", "/dev"),
                         help="where the host's /dev is seen by this daemon; --device-specs passes only the "
                              "optional device nodes found there [$VGPU_DEV_ROOT, default /dev]")
    enforce.add_argument("--device-specs", type=_bool, default=env("VGPU_DEVICE_SPECS", "false"), metavar="BOOL",
                         help="also pass /dev/nvidia* device nodes in Allocate, for runtimes without the NVIDIA "
                              "hook [$VGPU_DEVICE_SPECS, default false]")
    enforce.add_argument("--cdi", type=_bool, default=env("VGPU_CDI", "false"), metavar="BOOL",
                         help="name the cards as CDI devices (nvidia.com/gpu=<uuid>) [$VGPU_CDI, default false]")
    try:
        from ..metrics.flags import add_metrics_arguments
    except ImportError:  # a build without the metrics package
        parser.add_argument("--metrics-port", type=int, default=env("VGPU_METRICS_PORT", "5678"))
    else:
        add_metrics_arguments(parser)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(list(sys.argv[1:] if argv is None else argv))
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not args.node:
        parser.error("--node (or $NODE_NAME) is required: the daemon serves the pods bound to this node")
    try:
        daemon = build_daemon(args)
    except (ValueError, OSError) as error:
        print(f"jupyter-vgpu device-plugin: {error}", file=sys.stderr)
        return 2
    stop = threading.Event()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, lambda *_: stop.set())
    daemon.start()
    log.info("node daemon for %s started (GPUs: %s, enforcement: %s, plugin dir: %s)", args.node, args.gpus,
             args.enforcement, args.plugin_dir)
    stop.wait()
    daemon.stop()
    return 0


def build_daemon(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    from jupyter_vgpu.gpu import open_backend

    from .. import kubeclient
    from .daemon import DaemonConfig, NodeDaemon
    from .enforcement import EnforcementConfig

    names = Names(domain=args.domain, project_domain=PROJECT_DOMAIN)
    backend = open_backend(args.gpus, model=args.sim_model, memory_mib=args.sim_memory, seed=args.sim_seed,
                           host=args.node)
    if args.sim_mig:
        from jupyter_vgpu.gpu.simulated import SimulatedGPUs

        if not isinstance(backend, SimulatedGPUs):
            raise ValueError("--sim-mig shapes simulated cards only (--gpus sim:FIXTURE)")
        for card, layout in args.sim_mig.items():
            backend.set_mig_layout(card, layout)
    metrics = None
    if not args.no_metrics:
        try:
            from ..metrics.flags import metrics_options
        except ImportError:
            metrics = {"port": args.metrics_port}
        else:
            metrics = metrics_options(args)
    config = DaemonConfig(
        node=args.node, plugin_dir=args.plugin_dir, names=names, state_dir=args.state_dir,
        enforcement=EnforcementConfig(mode=args.enforcement, hami_root=args.hami_root, hami_lock_dir=args.hami_lock_dir,
                                      mps_pipe_dir=args.mps_pipe_dir, mps_shm_dir=args.mps_shm_dir,
                                      device_specs=args.device_specs, cdi=args.cdi, dev_root=args.dev_root),
        metrics=metrics, metrics_url=args.metrics_url,
    )
    return NodeDaemon(config, backend, kubeclient.load(args.kubeconfig))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
