"""``jupyter-vgpu sim`` (the simulated cluster alone) and ``jupyter-vgpu demo`` (+ JupyterLab).

Both run until Ctrl-C (or SIGTERM) and then stop every component they started: the pods'
processes, the daemons, the sockets and the work directory.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import signal
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

from jupyter_vgpu.core import contract as c
from jupyter_vgpu.core.placement import POLICIES


def _say(line: str) -> None:
    print(line, flush=True)


def _interrupt_on_sigterm() -> None:
    """SIGTERM stops the command the way Ctrl-C does (jupyter-server-proxy and Binder send it)."""
    def handler(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, handler)
        # started from a script with `&`, SIGINT arrives ignored; Ctrl-C must still stop us
        signal.signal(signal.SIGINT, signal.default_int_handler)


@contextlib.contextmanager
def _uninterrupted() -> Iterator[None]:
    """A second Ctrl-C or SIGTERM during the stop must not leave half of it running (`timeout`
    and process managers send SIGTERM to the process and again to its group)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {signum: signal.signal(signum, signal.SIG_IGN) for signum in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def _logging(level: str) -> None:
    logging.basicConfig(level=getattr(logging, level.upper()), format="%(asctime)s %(levelname)s %(name)s: %(message)s")


def _wait_forever() -> None:
    while True:
        time.sleep(3600)


# --- jupyter-vgpu sim ----------------------------------------------------------------------------


def sim_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="jupyter-vgpu sim",
        description="Run the simulated cluster alone: Kubernetes API, scheduler stand-in + extender, and two GPU "
                    "nodes (a DGX A100 and a PCIe P40 box) with the kubelet stand-in, device plugin and metrics "
                    "server on simulated GPUs. Point kubectl at the printed kubeconfig. Runs until Ctrl-C.")
    p.add_argument("--policy", choices=POLICIES, default="binpack",
                   help="the extender's placement policy (default binpack: on a two-node demo its choice is the "
                        "one a user expects; the deployed default, fgd-filter, pays off on large clusters)")
    p.add_argument("--neighbours", action="store_true", help="start a few pods with simulated GPU work")
    p.add_argument("--run-processes", action="store_true",
                   help="run pods' commands as local processes (as you, with the env Allocate returned); "
                        "anyone who can reach the API on 127.0.0.1 could then run commands as you")
    p.add_argument("--control-plane", choices=("sim", "real"), default="sim",
                   help="sim (default): the simulated API and kube-scheduler stand-in, in seconds, as any user; "
                        "real: etcd, kube-apiserver, kube-controller-manager, kube-scheduler and one kubelet per "
                        "node built from Kubernetes' Go modules (hack/kube/build.sh; needs root and a checkout, "
                        "or $VGPU_KUBE_BIN_DIR), with the same extender and node daemons")
    p.add_argument("--log-level", default="WARNING", help="logging level of the components (default WARNING)")
    return p


def sim_main(argv: Sequence[str] | None = None) -> int:
    args = sim_parser().parse_args(argv)
    _logging(args.log_level)
    _interrupt_on_sigterm()
    from .cluster import ClusterError
    from .lab import DGX_NODE, PCIE_NODE, start_cluster, start_real_cluster
    from .neighbours import default_neighbours, start_neighbours

    cluster: Any = None
    try:
        if args.control_plane == "real":
            if args.run_processes or args.neighbours:
                raise ClusterError("--run-processes and --neighbours need the simulated kubelets (--control-plane "
                                   "sim): the real kubelets run Kubernetes' fake container runtime")
            cluster = start_real_cluster(policy=args.policy)
        else:
            cluster = start_cluster(run_processes=args.run_processes, policy=args.policy)
        if args.neighbours:
            start_neighbours(cluster, default_neighbours(DGX_NODE, PCIE_NODE))
        for line in sim_guide(cluster, real=args.control_plane == "real"):
            _say(line)
        _wait_forever()
    except KeyboardInterrupt:
        _say("jupyter-vgpu sim: stopping")
    except (ClusterError, OSError, ValueError, RuntimeError) as error:
        print(f"jupyter-vgpu sim: {error}", file=sys.stderr)
        return 1
    finally:
        if cluster is not None:
            with _uninterrupted():
                cluster.stop()
    return 0


def sim_guide(cluster: Any, *, real: bool) -> list[str]:
    """What `jupyter-vgpu sim` prints once the cluster is up."""
    if real:
        plane = cluster.control_plane
        lines = [f"jupyter-vgpu sim: the real cluster is up (Kubernetes {cluster.version})",
                 f"  kubeconfig: {cluster.kubeconfig}",
                 f"  API:        {plane.server}   (TLS; an admin's client certificate in the kubeconfig)",
                 f"  extender:   {plane.extender_url}   (ledger: {plane.extender_url}/inspect)",
                 f"  logs:       {cluster.workdir}/*.log, {cluster.workdir}/n*/*.log"]
        kubectl = f"{plane.kube} kubectl"  # the same release as the server
    else:
        lines = ["jupyter-vgpu sim: the simulated cluster is up",
                 f"  kubeconfig: {cluster.kubeconfig}",
                 f"  API:        {cluster.kube.url}   (TLS; token and CA certificate in the kubeconfig)",
                 f"  extender:   {cluster.extender.url}   (ledger: {cluster.extender.base_url}/inspect)"]
        kubectl = "kubectl"
    lines += [f"  node {n.name}: {n.spec.model}, node API {n.metrics_url}, metrics {n.scrape_url}/metrics"
              for n in cluster.nodes.values()]
    lines += [f"  scrape token (Authorization: Bearer ...): {cluster.scrape_token}", "",
              f"  {kubectl} --kubeconfig {cluster.kubeconfig} get nodes,pods -A -o wide",
              "  pods asking for vGPU use schedulerName: " + c.SCHEDULER_NAME
              + f" and limits {c.DEFAULT_NAMES.core_resource} / {c.DEFAULT_NAMES.memory_resource}",
              "", "Press Ctrl-C to stop."]
    return lines


# --- jupyter-vgpu demo ---------------------------------------------------------------------------


def demo_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="jupyter-vgpu demo",
        description="Start the simulated cluster, a few neighbour pods, and a notebook pod holding a vGPU share "
                    "whose process is JupyterLab with the jupyter-vgpu server extension. Prints the lab's URL. "
                    "Ctrl-C stops everything.")
    p.add_argument("--port", type=int, default=None, help="the lab's port (default 8888 or the next free one)")
    p.add_argument("--ip", default="127.0.0.1", help="the lab's address (default 127.0.0.1)")
    p.add_argument("--base-url", default="/", help="the lab's base URL (e.g. behind jupyter-server-proxy)")
    p.add_argument("--no-browser", action="store_true", help="do not open a browser")
    p.add_argument("--token", default=None,
                   help="the lab's token (default: a fresh random one); an empty string turns the lab's "
                        "authentication off - only behind a proxy that authenticates (Binder)")
    p.add_argument("--cores", type=int, default=25,
                   help="the notebook's share of one card's compute in percent, or 100 x whole cards (default 25)")
    p.add_argument("--memory", default="16",
                   help="the notebook's GPU memory: vcuda-memory units of 256 MiB, or a size like 4GiB (default 16)")
    p.add_argument("--notebook-dir", default="",
                   help="the lab's root directory, where your notebooks are kept after the demo stops "
                        "(default: ~/jupyter-vgpu-demo)")
    p.add_argument("--no-neighbours", action="store_true", help="leave the other cards empty")
    p.add_argument("--isolated", action="store_true",
                   help="add a node with a card in MIG mode and put the notebook on a hardware-isolated MIG slice")
    p.add_argument("--policy", choices=POLICIES, default="binpack",
                   help="the extender's placement policy (default binpack: on a two-node demo its choice is the "
                        "one a user expects; the deployed default, fgd-filter, pays off on large clusters)")
    p.add_argument("--control-plane", choices=("sim", "real"), default="sim",
                   help="sim (default): the embedded simulated cluster; real: etcd, kube-apiserver, kube-scheduler "
                        "and kubelets built from Kubernetes' Go modules (hack/kube/build.sh; needs root and Go), "
                        "with the lab run beside them as kubelet configured its container")
    p.add_argument("--log-level", default="WARNING", help="logging level of the components (default WARNING)")
    return p


def demo_main(argv: Sequence[str] | None = None) -> int:
    args = demo_parser().parse_args(argv)
    _logging(args.log_level)
    _interrupt_on_sigterm()
    from .cluster import ClusterError
    from .lab import Demo, DemoOptions, NotebookWatcher, open_browser

    options = DemoOptions(port=args.port, ip=args.ip, base_url=args.base_url, cores=args.cores, memory=args.memory,
                          root_dir=args.notebook_dir, neighbours=not args.no_neighbours, policy=args.policy,
                          token=args.token, isolated=args.isolated, control_plane=args.control_plane)
    if args.token == "":
        print("jupyter-vgpu demo: --token '': the lab asks for no token; anyone who can reach "
              f"{args.ip}:{args.port or 'its port'} can use it", file=sys.stderr)
    try:
        demo = Demo(options, say=_say)
    except c.RequestError as error:
        print(f"jupyter-vgpu demo: {error}", file=sys.stderr)
        return 2
    watcher = None
    started = time.monotonic()
    try:
        _say(f"jupyter-vgpu demo: starting the {'real' if demo.real else 'simulated'} cluster and JupyterLab "
             "(Ctrl-C to stop) ...")
        demo.start()
        for line in demo.guide():
            _say(line)
        _say(f"(ready in {time.monotonic() - started:.1f} s)")
        if not args.no_browser:
            open_browser(demo)  # through a 0600 redirect file: no token on the browser's command line
        watcher = NotebookWatcher(demo, _say)
        watcher.start()
        _wait_forever()
    except KeyboardInterrupt:
        _say("jupyter-vgpu demo: stopping")
    except (ClusterError, OSError) as error:
        print(f"jupyter-vgpu demo: {error}", file=sys.stderr)
        return 1
    finally:
        if watcher is not None:
            watcher.stop()
        with _uninterrupted():
            demo.stop()
    return 0
