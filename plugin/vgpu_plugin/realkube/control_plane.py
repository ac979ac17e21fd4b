"""The real control plane on 127.0.0.1: etcd, kube-apiserver (x509 and service-account
authentication, Node and RBAC authorization, NodeRestriction, the ValidatingAdmissionPolicy
of ``deploy/base``), kube-controller-manager (service accounts, the root CA ConfigMap,
namespaces, garbage collection, node lifecycle), and the ``vgpu-scheduler`` pod's two
containers as processes: kube-scheduler with the configuration of ConfigMap
``vgpu-scheduler-config`` (what the pod would mount) and our extender, both with a real token
of the ``vgpu-scheduler`` service account.

``deploy/base`` is applied with kubectl as an admin would, except its two workloads (the
node DaemonSet and the scheduler Deployment), whose programs run here as processes with the
identities those workloads would have. Or ``deploy`` installs the stack another way (the Helm
chart, tests/realkube/test_real_helm.py): its DaemonSet and Deployment may then be stored, and
make no pods, as this control plane runs neither controller.
"""

from __future__ import annotations

import json
import logging
import ssl
import subprocess
import sys
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml
from simkube import waiting

from .pki import PKI, KeyPair
from .processes import Program, free_port

log = logging.getLogger(__name__)

NAMESPACE = "vgpu-system"
SCHEDULER_ACCOUNT = "vgpu-scheduler"
NODE_ACCOUNT = "vgpu-node"
SERVICE_CIDR = "10.96.0.0/16"  # cluster IPs are only allocated here, never routed
SCHEDULER_CONFIG = "vgpu-scheduler-config"
WORKLOADS = ("DaemonSet", "Deployment")  # deploy/base's, run here as processes instead
TOKEN_SECONDS = 24 * 3600
CONTROLLERS = "serviceaccount,serviceaccount-token,root-ca-cert-publisher,namespace,garbagecollector,podgc," \
              "nodelifecycle"


class ControlPlaneError(RuntimeError):
    """A control-plane program did not start or exited; the message has the end of its log."""


def repository() -> Path:
    """The checkout this package runs from: deploy/ lives there."""
    return Path(__file__).resolve().parents[3]


def write_kubeconfig(path: Path, server: str, ca: Path, *, client: KeyPair | None = None,
                     token: str | None = None) -> Path:
    user: dict[str, Any] = {"token": token} if token else {
        "client-certificate": str(client.cert), "client-key": str(client.key)} if client else {}
    config = {"apiVersion": "v1", "kind": "Config", "current-context": "real",
              "clusters": [{"name": "real", "cluster": {"server": server, "certificate-authority": str(ca)}}],
              "users": [{"name": "user", "user": user}],
              "contexts": [{"name": "real", "context": {"cluster": "real", "user": "user"}}]}
    path.write_text(json.dumps(config, indent=1))
    path.chmod(0o600)
    return path


class ControlPlane:
    """Started with ``start()`` (API up, deploy/base applied, or what ``deploy`` installs);
    ``start_scheduler()`` once the nodes are ready, as a cluster brings up its scheduler last."""

    def __init__(self, workdir: Path, bin_dir: Path, *, policy: str, ready_timeout: float = 60.0,
                 extender_args: Sequence[str] = (), deploy: Callable[[ControlPlane], None] | None = None) -> None:
        """``deploy``: installs jupyter-vgpu's objects once the API serves (default ``apply_base``);
        it must leave the ``vgpu-scheduler`` and ``vgpu-node`` service accounts in vgpu-system."""
        self.workdir, self.bin_dir, self.policy, self.ready_timeout = workdir, bin_dir, policy, ready_timeout
        self.extender_args = list(extender_args)
        self.deploy = deploy
        self.kube = str(bin_dir / "kube")
        self.pki = PKI(workdir / "pki")
        self.api_port = free_port()
        self.server = f"https://127.0.0.1:{self.api_port}"
        self.admin = self.pki.issue("admin", user="kubernetes-admin", groups=["system:masters"])
        self.kubeconfig = write_kubeconfig(workdir / "kubeconfig", self.server, self.pki.ca, client=self.admin)
        self.extender_port = free_port()
        self.programs: dict[str, Program] = {}
        self.scheduler_kubeconfig: Path | None = None

    # --- programs -----------------------------------------------------------------------------------

    def _program(self, name: str, argv: list[str]) -> Program:
        program = Program(name, argv, self.workdir / f"{name}.log")
        self.programs[name] = program
        return program.start()

    def start(self) -> ControlPlane:
        etcd_port, peer_port = free_port(), free_port()
        self._program("etcd", [
            self.kube, "etcd", "--name", "real", "--data-dir", str(self.workdir / "etcd"),
            "--listen-client-urls", f"http://127.0.0.1:{etcd_port}",
            "--advertise-client-urls", f"http://127.0.0.1:{etcd_port}",
            "--listen-peer-urls", f"http://127.0.0.1:{peer_port}",
            "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer_port}",
            "--initial-cluster", f"real=http://127.0.0.1:{peer_port}",
            "--unsafe-no-fsync", "--log-level", "warn"])  # a test cluster: speed over durability
        serving = self.pki.issue("apiserver", user="kube-apiserver", server=True)
        self._program("kube-apiserver", [
            self.kube, "kube-apiserver", "--etcd-servers", f"http://127.0.0.1:{etcd_port}",
            "--bind-address", "127.0.0.1", "--advertise-address", "127.0.0.1", "--secure-port", str(self.api_port),
            # kubelet-style loopback addresses are refused as the kubernetes Service's endpoint
            "--endpoint-reconciler-type", "none",
            "--tls-cert-file", str(serving.cert), "--tls-private-key-file", str(serving.key),
            "--client-ca-file", str(self.pki.ca),
            "--service-account-issuer", "https://kubernetes.default.svc",
            "--service-account-key-file", str(self.pki.service_account_key),
            "--service-account-signing-key-file", str(self.pki.service_account_key),
            "--service-cluster-ip-range", SERVICE_CIDR,
            "--authorization-mode", "Node,RBAC", "--enable-admission-plugins", "NodeRestriction",
            "--allow-privileged", "--profiling=false", "--cert-dir", str(self.workdir / "apiserver-certs")])
        self._wait_ready()
        manager = self.pki.issue("kube-controller-manager", user="system:kube-controller-manager")
        manager_config = write_kubeconfig(self.workdir / "kube-controller-manager.kubeconfig", self.server,
                                          self.pki.ca, client=manager)
        self._program("kube-controller-manager", [
            self.kube, "kube-controller-manager", "--kubeconfig", str(manager_config),
            "--authentication-kubeconfig", str(manager_config), "--authorization-kubeconfig", str(manager_config),
            "--leader-elect=false", "--secure-port", "0", "--controllers", CONTROLLERS,
            "--use-service-account-credentials", "--root-ca-file", str(self.pki.ca),
            "--service-account-private-key-file", str(self.pki.service_account_key)])
        if self.deploy is None:
            self.apply_base()
        else:
            self.deploy(self)
        self.scheduler_kubeconfig = write_kubeconfig(
            self.workdir / "vgpu-scheduler.kubeconfig", self.server, self.pki.ca,
            token=self.token(SCHEDULER_ACCOUNT))
        self._start_extender()
        return self

    def _wait_ready(self) -> None:
        context = ssl.create_default_context(cafile=str(self.pki.ca))
        context.load_cert_chain(str(self.admin.cert), str(self.admin.key))

        def ready() -> bool:
            self._check_alive("etcd", "kube-apiserver")
            try:
                with urllib.request.urlopen(f"{self.server}/readyz", context=context, timeout=2) as response:
                    return response.status == 200
            except OSError:
                return False

        self.wait_for(ready, what="kube-apiserver's /readyz")

    def _check_alive(self, *names: str) -> None:
        for name in names:
            ended = self.programs[name].exited()
            if ended:
                raise ControlPlaneError(ended)

    def wait_for(self, condition: Any, *, what: str, timeout: float | None = None) -> Any:
        return waiting.wait_for(condition, timeout=timeout or self.ready_timeout, interval=0.1, what=what,
                                error=ControlPlaneError)

    # --- kubectl, as an admin ---------------------------------------------------------------------

    def kubectl(self, *args: str, input: str | None = None, check: bool = True) -> str:
        result = subprocess.run([self.kube, "kubectl", "--kubeconfig", str(self.kubeconfig), *args], input=input,
                                capture_output=True, text=True, timeout=120)
        if check and result.returncode != 0:
            raise ControlPlaneError(f"kubectl {' '.join(args)}: {result.stderr.strip()}")
        return result.stdout

    def base_objects(self) -> list[dict[str, Any]]:
        """deploy/base rendered by this kubectl's kustomize, without its workloads."""
        rendered = self.kubectl("kustomize", str(repository() / "deploy" / "base"))
        return [doc for doc in yaml.safe_load_all(rendered) if doc and doc.get("kind") not in WORKLOADS]

    def apply_base(self) -> None:
        objects = self.base_objects()
        text = "\n---\n".join(yaml.safe_dump(doc) for doc in objects)

        def applied() -> bool:
            try:
                self.kubectl("apply", "--server-side", "-f", "-", input=text)  # fails unless every object applied
            except ControlPlaneError:  # default RBAC roles may still be installing a moment after /readyz
                return False
            return True

        self.wait_for(applied, what="deploy/base to apply")

    def token(self, account: str, *, node: str | None = None) -> str:
        """A real service-account token of ``vgpu-system/account`` from the TokenRequest API;
        bound to a Node object with ``node`` (the API server then adds the node-name claim the
        admission policy checks, as for a DaemonSet pod's projected token)."""
        spec: dict[str, Any] = {"expirationSeconds": TOKEN_SECONDS}
        if node:
            spec["boundObjectRef"] = {"apiVersion": "v1", "kind": "Node", "name": node}
        request = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest", "spec": spec}
        answer = self.kubectl("create", "--raw", f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/{account}/token",
                              "-f", "-", input=json.dumps(request))
        return str(json.loads(answer)["status"]["token"])

    # --- the vgpu-scheduler pod: the extender and kube-scheduler ----------------------------------

    @property
    def extender_url(self) -> str:
        return f"http://127.0.0.1:{self.extender_port}"

    def _start_extender(self) -> None:
        self._program("extender", [
            sys.executable, "-m", "jupyter_vgpu.cli", "extender", "--address", "127.0.0.1",
            "--port", str(self.extender_port), "--kubeconfig", str(self.scheduler_kubeconfig),
            "--policy", self.policy, "--log-level", "INFO", *self.extender_args])
        self._wait_extender()

    def _wait_extender(self) -> None:
        def healthy() -> bool:
            self._check_alive("extender")
            try:
                with urllib.request.urlopen(f"{self.extender_url}/healthz", timeout=2) as response:
                    return response.status == 200
            except OSError:
                return False

        self.wait_for(healthy, what="the extender's /healthz")

    def restart_extender(self, *, kill: bool = False) -> None:
        self.programs["extender"].restart(kill=kill)
        self._wait_extender()

    def scheduler_config(self) -> Path:
        """The KubeSchedulerConfiguration of ConfigMap vgpu-scheduler-config (deploy/base's, or the
        chart's), with this cluster's extender address and kubeconfig."""
        stored = json.loads(self.kubectl("get", "configmap", "-n", NAMESPACE, SCHEDULER_CONFIG, "-o", "json"))
        config = yaml.safe_load(stored["data"]["config.yaml"])
        for extender in config["extenders"]:
            extender["urlPrefix"] = f"{self.extender_url}/scheduler"
        config["clientConnection"] = {"kubeconfig": str(self.scheduler_kubeconfig)}
        path = self.workdir / "scheduler-config.yaml"
        path.write_text(yaml.safe_dump(config))
        return path

    def start_scheduler(self) -> None:
        config = self.scheduler_config()
        self._program("kube-scheduler", [
            self.kube, "kube-scheduler", "--config", str(config), "--secure-port", "0",
            "--authentication-kubeconfig", str(self.scheduler_kubeconfig),
            "--authorization-kubeconfig", str(self.scheduler_kubeconfig)])
        self._wait_scheduler_leads()

    def _wait_scheduler_leads(self) -> None:
        def leads() -> bool:
            self._check_alive("kube-scheduler")
            lease = self.kubectl("get", "lease", "-n", NAMESPACE, SCHEDULER_ACCOUNT, "-o", "json", check=False)
            return bool(lease) and bool(json.loads(lease)["spec"].get("holderIdentity"))

        self.wait_for(leads, what="kube-scheduler to take the vgpu-scheduler lease")

    def restart_scheduler(self, *, kill: bool = False) -> None:
        self.programs["kube-scheduler"].restart(kill=kill)

    def stop(self) -> None:
        for name in ("kube-scheduler", "extender", "kube-controller-manager", "kube-apiserver", "etcd"):
            program = self.programs.get(name)
            if program is not None:
                program.stop()
