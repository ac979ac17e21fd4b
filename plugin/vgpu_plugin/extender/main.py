"""``jupyter-vgpu extender``: run the kube-scheduler extender until SIGINT/SIGTERM."""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading
from collections.abc import Sequence

from jupyter_vgpu.core import contract, placement

from .decisions import ADMISSION_BACKLOG, RIVAL_WAIT
from .rival_waits import WAITING_BINDS
from .server import DEFAULT_PORT, DEFAULT_PREFIX

ENV_PREFIX = "VGPU_EXTENDER_"
MAX_RIVAL_WAIT = 3600.0  # kube-scheduler gives up on a bind at its extender httpTimeout long before


def _env(name: str, default: str | None = None) -> str | None:
    return os.environ.get(ENV_PREFIX + name, default)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="jupyter-vgpu extender",
        description="kube-scheduler extender for fractional GPUs: filter, prioritize and bind "
                    "pods asking for vcuda-core/vcuda-memory. Every flag falls back to an "
                    f"environment variable {ENV_PREFIX}<FLAG>.",
    )
    # string defaults go through type=int too, so a bad environment value is a clean usage error
    p.add_argument("--port", type=int, default=_env("PORT", str(DEFAULT_PORT)),
                   help=f"TCP port (default {DEFAULT_PORT}; env {ENV_PREFIX}PORT)")
    p.add_argument("--address", default=_env("ADDRESS", "127.0.0.1"),
                   help="address to listen on; the default suits a sidecar of kube-scheduler, which "
                        f"keeps bind off the network (env {ENV_PREFIX}ADDRESS)")
    p.add_argument("--metrics-port", type=int, default=_env("METRICS_PORT"),
                   help="also serve only /metrics, /healthz and /queue (queue token) on this port, on every "
                        f"address, for Prometheus, probes and the Hub (default: off; env {ENV_PREFIX}METRICS_PORT)")
    p.add_argument("--tls-cert", default=_env("TLS_CERT"),
                   help=f"serve HTTPS with this certificate (PEM; env {ENV_PREFIX}TLS_CERT)")
    p.add_argument("--tls-key", default=_env("TLS_KEY"), help=f"its private key (env {ENV_PREFIX}TLS_KEY)")
    p.add_argument("--client-ca", default=_env("CLIENT_CA"),
                   help="require client certificates signed by this CA, as kube-scheduler sends with "
                        f"tlsConfig.certFile/keyFile (env {ENV_PREFIX}CLIENT_CA)")
    p.add_argument("--kubeconfig", default=_env("KUBECONFIG"),
                   help=f"kubeconfig file (default: $KUBECONFIG, in-cluster, ~/.kube/config; env {ENV_PREFIX}KUBECONFIG)")
    p.add_argument("--policy", choices=placement.POLICIES, default=_env("POLICY", "fgd-filter"),
                   help="cluster default for placing shares (default fgd-filter): binpack, spread, fragment (least "
                        "expected fragmentation under the task mix learned from the pods seen, with "
                        "each node's CPU/memory headroom), or fgd-filter (FGD's fragmentation measure "
                        "over the typical pods learned from the pods bound; the filter passes only the "
                        "best node, so kube-scheduler's own scores do not apply); a pod may override it with the "
                        f"{contract.DEFAULT_NAMES.policy} annotation (env {ENV_PREFIX}POLICY)")
    p.add_argument("--prefix", default=_env("PREFIX", DEFAULT_PREFIX),
                   help=f"URL prefix of filter/prioritize/bind (default {DEFAULT_PREFIX}; env {ENV_PREFIX}PREFIX)")
    p.add_argument("--domain", default=_env("DOMAIN", contract.DEFAULT_RESOURCE_DOMAIN),
                   help=f"resource domain (default {contract.DEFAULT_RESOURCE_DOMAIN}; env {ENV_PREFIX}DOMAIN)")
    p.add_argument("--scheduler-names", default=_env("SCHEDULER_NAMES", contract.SCHEDULER_NAME),
                   help="comma-separated kube-scheduler profile names this extender serves; only their "
                        "pods hold cards before they are bound (default "
                        f"{contract.SCHEDULER_NAME}, the profile in deploy/scheduler/config.yaml; "
                        f"env {ENV_PREFIX}SCHEDULER_NAMES)")
    p.add_argument("--pod-name", default=_env("POD_NAME"),
                   help="this extender's pod; with --pod-namespace it checks at start that the "
                        "kube-scheduler container beside it is within the version-skew policy of the API "
                        f"server and logs a warning if not (default: no check; env {ENV_PREFIX}POD_NAME)")
    p.add_argument("--pod-namespace", default=_env("POD_NAMESPACE"),
                   help=f"that pod's namespace (env {ENV_PREFIX}POD_NAMESPACE)")
    p.add_argument("--scheduler-container", default=_env("SCHEDULER_CONTAINER", "kube-scheduler"),
                   help="the kube-scheduler container's name in that pod (default kube-scheduler; "
                        f"env {ENV_PREFIX}SCHEDULER_CONTAINER)")
    p.add_argument("--queue-notices", type=float, default=_env("QUEUE_NOTICES", "5"),
                   help="seconds between Events telling each waiting vGPU pod its position, why it waits and "
                        f"what fits now (0: off; env {ENV_PREFIX}QUEUE_NOTICES)")
    p.add_argument("--queue-token-file", default=_env("QUEUE_TOKEN_FILE"),
                   help="file holding the bearer token GET /queue wants (a mounted Secret key, re-read when it "
                        "changes); without it /queue refuses everyone (env "
                        f"{ENV_PREFIX}QUEUE_TOKEN_FILE)")
    p.add_argument("--rival-wait", type=float, default=_env("RIVAL_WAIT", f"{RIVAL_WAIT:g}"),
                   help="seconds a bind waits while another pod on its node, not yet admitted by kubelet, asks for "
                        "as many vcuda-core but a different amount of memory (kubelet could give each the other's "
                        "limits), before it fails and kube-scheduler retries; keep it under kube-scheduler's "
                        f"extender httpTimeout (default {RIVAL_WAIT:g}; env {ENV_PREFIX}RIVAL_WAIT). A waiting bind holds "
                        f"no bind worker, so binds to other nodes go on; at most {WAITING_BINDS:,} wait at once, "
                        "one more such bind fails at once")
    p.add_argument("--admission-backlog", type=int, default=_env("ADMISSION_BACKLOG", str(ADMISSION_BACKLOG)),
                   help="how many of our pods a node's kubelet may have still to admit before the filter prefers "
                        "other nodes that fit: kubelet admits one pod at a time, so in a burst (a class starting "
                        "its notebooks) the next pod starts sooner elsewhere; outside bursts placement is the "
                        f"policy's alone (0: no limit; default {ADMISSION_BACKLOG}; env {ENV_PREFIX}ADMISSION_BACKLOG)")
    p.add_argument("--log-level", default=_env("LOG_LEVEL", "INFO"),
                   help=f"logging level (env {ENV_PREFIX}LOG_LEVEL)")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if args.policy not in placement.POLICIES:
        print(f"jupyter-vgpu extender: --policy {args.policy!r} must be one of {', '.join(placement.POLICIES)}",
              file=sys.stderr)
        return 2
    try:
        names = contract.Names(domain=args.domain)
    except ValueError as error:
        print(f"jupyter-vgpu extender: --domain: {error}", file=sys.stderr)
        return 2
    if not 0 <= args.rival_wait <= MAX_RIVAL_WAIT:  # NaN and inf too (a wait's timeout must be finite)
        print(f"jupyter-vgpu extender: --rival-wait must be a number of seconds from 0 to {MAX_RIVAL_WAIT:g}",
              file=sys.stderr)
        return 2
    if args.admission_backlog < 0:
        print("jupyter-vgpu extender: --admission-backlog must be 0 (no limit) or a number of pods", file=sys.stderr)
        return 2
    if args.queue_notices < 0:
        print("jupyter-vgpu extender: --queue-notices must be 0 (off) or a number of seconds", file=sys.stderr)
        return 2
    schedulers = tuple(name.strip() for name in args.scheduler_names.split(",") if name.strip())
    if not schedulers:
        print("jupyter-vgpu extender: --scheduler-names names no scheduler", file=sys.stderr)
        return 2
    from .. import kubeclient
    from .server import Extender, server_tls

    try:
        server_tls(args.tls_cert, args.tls_key, args.client_ca)
    except ValueError as error:
        print(f"jupyter-vgpu extender: {error}", file=sys.stderr)
        return 2
    try:
        api_client = kubeclient.load(args.kubeconfig)
    except kubeclient.KubeConfigError as error:
        print(f"jupyter-vgpu extender: {error}", file=sys.stderr)
        return 2
    extender = Extender(port=args.port, address=args.address, prefix=args.prefix, policy=args.policy,
                        names=names, api_client=api_client, metrics_port=args.metrics_port,
                        tls_cert=args.tls_cert, tls_key=args.tls_key, client_ca=args.client_ca,
                        scheduler_names=schedulers, queue_notice_interval=args.queue_notices or None,
                        queue_token_file=args.queue_token_file or None, rival_wait=args.rival_wait,
                        admission_backlog=args.admission_backlog)
    try:
        extender.start()
    except OSError as error:
        where = f"{args.address}:{args.port}" + (f" or :{args.metrics_port}" if args.metrics_port else "")
        print(f"jupyter-vgpu extender: cannot listen on {where}: {error}", file=sys.stderr)
        return 1
    done = threading.Event()
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, lambda *_: done.set())
    print(f"jupyter-vgpu extender: serving {extender.url} (policy {args.policy})", flush=True)
    if args.pod_name and args.pod_namespace:
        from .version_skew import check_in_background

        check_in_background(api_client, args.pod_namespace, args.pod_name, args.scheduler_container)
    done.wait()
    extender.stop()
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
