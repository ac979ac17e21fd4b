"""The demo: the simulated cluster, a few neighbours, and JupyterLab as a notebook pod's process.

The notebook pod asks for a share like any Hub profile would; the extender places it, the
device plugin allocates it over gRPC, and the kubelet stand-in runs ``jupyter lab`` with the
env Allocate returned (``VGPU_*``, the node metrics URL and a read token), so the lab's
panel, ``%vgpu`` and the widgets show a real allocation through the whole stack. The pod
also gets a kubeconfig for the simulated API, which is how the server extension carries out
a share request here: it re-creates its own pod with the new limits (see
``vgpu_plugin.demo.requester``); the new pod's lab takes over the same port and token.
"""

from __future__ import annotations

import json
import os
import secrets
import socket
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from jupyter_vgpu.core import claims
from jupyter_vgpu.core import contract as c
from jupyter_vgpu.core.mig import MigSlice

from .cluster import ClusterError, NodeSpec, SimCluster
from .kubelet import MEASURED, SIM_PATTERN_ANNOTATION
from .neighbours import ROLE_LABEL, Neighbour, default_neighbours, start_neighbours
from .notebook import port_free

DGX_NODE = "dgx-a100"
PCIE_NODE = "p40-pcie"
NOTEBOOK_NAMESPACE = "default"
NOTEBOOK_POD = "notebook"
NOTEBOOK_CONTAINER = "notebook"
NOTEBOOK_SELECTOR = f"{ROLE_LABEL}=notebook"


MIG_NODE = "a100-mig"
MIG_LAYOUT = ("2g.10gb", "2g.10gb", "2g.10gb", "1g.5gb")


def demo_nodes(mig: bool = False) -> list[NodeSpec]:
    """A DGX A100 (8 cards, all NVLinked) and a PCIe box of 7 P40s in two PIX groups; with ``mig``, also a
    4-card A100 box whose GPU 0 is in MIG mode with 3 x 2g.10gb + 1 x 1g.5gb."""
    nodes = [
        NodeSpec(DGX_NODE, "dgx-a100.txt", model="NVIDIA A100-SXM4-40GB", memory_mib=40960, seed=1),
        NodeSpec(PCIE_NODE, "p40-7gpu-pix-phb.txt", model="Tesla P40", memory_mib=24576, seed=2),
    ]
    if mig:
        nodes.append(NodeSpec(MIG_NODE, "a100-sxm-4gpu-nv4.txt", model="NVIDIA A100-SXM4-40GB", memory_mib=40960,
                              seed=5, mig={0: MIG_LAYOUT}))
    return nodes


def bundled_topology_dir() -> Path:
    from jupyter_vgpu.data import TOPOLOGY_DIR

    return TOPOLOGY_DIR


DEMO_ENFORCEMENT = "none"
"""The demo's node daemons run with enforcement "none", the backend they really have: nothing
enforces limits on simulated GPUs (no HAMi-core, no MPS server). The share is kept by scheduling,
and the notebook's framework guard rails hold PyTorch, JAX, CuPy and TensorFlow to its memory; the
panel and ``%vgpu`` say so, rather than naming a backend that is not there."""


def start_cluster(*, run_processes: bool, policy: str = "binpack", workdir: str | None = None,
                  metrics_period: float = 1.0, mig: bool = False) -> SimCluster:
    """The demo's nodes on the captures bundled with the package (no checkout needed)."""
    cluster = SimCluster(demo_nodes(mig), workdir=workdir, fixtures_dir=bundled_topology_dir(), policy=policy,
                         enforcement=DEMO_ENFORCEMENT, run_processes=run_processes, metrics_period=metrics_period)
    return cluster.start()


def start_real_cluster(*, policy: str, mig: bool = False) -> Any:
    """The demo's nodes on a real control plane and real kubelets (``realkube``; root only)."""
    from ..realkube.cluster import RealCluster

    return RealCluster(demo_nodes(mig), fixtures_dir=bundled_topology_dir(), policy=policy,
                       enforcement=DEMO_ENFORCEMENT).start()


def pick_port(address: str, wanted: int | None, default: int = 8888, tries: int = 50) -> int:
    """``--port`` must be free; without it, 8888 or the next free one (as `jupyter lab` does)."""
    if wanted:
        if not port_free(address, wanted):
            raise ClusterError(f"port {wanted} on {address} is in use; pick another with --port")
        return wanted
    for port in range(default, default + tries):
        if port_free(address, port):
            return port
    with socket.socket() as sock:
        sock.bind((address, 0))
        return int(sock.getsockname()[1])


def default_notebook_dir() -> str:
    """The demo's notebooks live here, in a directory of their own that outlives the demo."""
    return os.path.join(os.path.expanduser("~"), "jupyter-vgpu-demo")


KEPT_DIR = ".jupyter-vgpu-demo"
"""Beside the notebooks (hidden from the lab's file browser): what the demo keeps between runs, the
lab's settings (theme and all) and its log."""

NEWS_SETTINGS = ("@jupyterlab/apputils-extension", "notification.jupyterlab-settings")
WIDGET_SETTINGS = ("@jupyter-widgets/jupyterlab-manager", "plugin.jupyterlab-settings")
LAB_SETTINGS = {
    # JupyterLab's "get notified about official Jupyter news?" prompt would cover the panel's
    # Request / Release buttons: answered no
    NEWS_SETTINGS: {"fetchNews": "false"},
    # the widgets' state saved with the notebook: reopened in this run, the %vgpu outputs are drawn
    # from it (in a later run the notebook is not trusted, and they read as their text)
    WIDGET_SETTINGS: {"saveState": True},
}
"""The lab settings the demo gives its user, each only until the user sets it otherwise."""


def normalize_base_url(base_url: str) -> str:
    return "/" + base_url.strip("/") + "/" if base_url.strip("/") else "/"


@dataclass
class DemoOptions:
    port: int | None = None
    ip: str = "127.0.0.1"
    base_url: str = "/"
    cores: int = 25
    memory: str = "16"  # vcuda-memory units or a size ("4GiB")
    root_dir: str = ""  # "": default_notebook_dir()
    neighbours: bool = True
    policy: str = "binpack"
    lab_timeout: float = 180.0
    token: str | None = None  # None: a fresh random token; "": none (only behind an authenticating proxy)
    isolated: bool = False  # the notebook asks for a MIG slice (a MIG node is added)
    control_plane: str = "sim"  # "real": realkube's control plane and kubelets; the lab runs beside them


class Demo:
    """Start with ``start()``, stop with ``stop()``; ``url`` is the lab with its token."""

    def __init__(self, options: DemoOptions, say: Callable[[str], None] = print) -> None:
        self.options = options
        self.request = c.Request(options.cores, c.parse_memory_size(options.memory))  # RequestError if invalid
        self.say = say
        self.token = secrets.token_hex(24) if options.token is None else options.token
        self.port = 0
        self.cluster: Any = None  # SimCluster, or realkube.RealCluster
        self.runner: Any = None   # realkube.containers.ContainerRunner: the lab beside a real cluster
        self.base_url = normalize_base_url(options.base_url)
        self.notebook_dir = os.path.abspath(os.path.expanduser(options.root_dir or default_notebook_dir()))
        self.kept_dir = os.path.join(self.notebook_dir, KEPT_DIR)

    # --- lifecycle -------------------------------------------------------------------------

    def start(self) -> Demo:
        import importlib.util

        if importlib.util.find_spec("jupyterlab") is None:
            raise ClusterError("JupyterLab is not installed here: pip install 'jupyter-vgpu[sim]'")
        self.port = pick_port(self.options.ip, self.options.port)
        os.makedirs(self.notebook_dir, exist_ok=True)
        try:
            if self.real:
                from ..realkube.containers import ContainerRunner

                self.cluster = start_real_cluster(policy=self.options.policy, mig=self.options.isolated)
                # the fake runtime runs no container: the lab runs here, as kubelet configured its container
                self.runner = ContainerRunner(self.cluster, NOTEBOOK_NAMESPACE, NOTEBOOK_SELECTOR, self._workdir("logs"))
                self.runner.start()
            else:
                self.cluster = start_cluster(run_processes=True, policy=self.options.policy,
                                             mig=self.options.isolated)
            if self.options.neighbours:
                start_neighbours(self.cluster, self.neighbours())
            self._create_notebook_pod()
            self._wait_for_notebook_pod()
            self._wait_for_lab()
        except BaseException:
            self.stop()
            raise
        return self

    @property
    def real(self) -> bool:
        return self.options.control_plane == "real"

    def stop(self) -> None:
        runner, self.runner = self.runner, None
        if runner is not None:
            runner.stop()
        cluster, self.cluster = self.cluster, None
        if cluster is not None:
            cluster.stop()  # the kubelet stand-ins stop the pods' processes; the work dir goes

    def neighbours(self) -> tuple[Neighbour, ...]:
        return default_neighbours(DGX_NODE, PCIE_NODE)

    @property
    def url(self) -> str:
        lab = f"http://{self.options.ip}:{self.port}{self.base_url}lab"
        return f"{lab}?token={self.token}" if self.token else lab

    @property
    def server_url(self) -> str:
        return f"http://{self.options.ip}:{self.port}{self.base_url}"

    # --- the notebook pod ----------------------------------------------------------------

    def _workdir(self, *parts: str) -> str:
        assert self.cluster is not None
        path = os.path.join(self.cluster.workdir, "jupyter", *parts)
        os.makedirs(path, exist_ok=True)
        return path

    def _kept(self, *parts: str) -> str:
        path = os.path.join(self.kept_dir, *parts)
        os.makedirs(path, exist_ok=True)
        return path

    def lab_settings_dir(self) -> str:
        """The lab's user settings, kept beside the notebooks (a theme chosen stays chosen), with
        ``LAB_SETTINGS`` wherever the user has not set those keys."""
        settings = self._kept("lab-settings")
        for where, defaults in LAB_SETTINGS.items():
            path = os.path.join(settings, *where)
            try:
                with open(path, encoding="utf-8") as handle:
                    current = json.load(handle)
            except (OSError, ValueError):
                current = {}
            current = current if isinstance(current, dict) else {}
            if not set(defaults) <= set(current):
                os.makedirs(os.path.dirname(path), exist_ok=True)
                with open(path, "w", encoding="utf-8") as handle:
                    json.dump({**defaults, **current}, handle, indent=2)
        return settings

    def _lab_environment(self) -> dict[str, str]:
        """Where the lab and its kernels keep their config, data, caches and runtime files: in the
        demo's work dir, so a stop leaves nothing behind, nothing lands in the user's own Jupyter
        directories, and the user's config cannot get in the way. The lab's settings and its log
        are kept beside the notebooks (``KEPT_DIR``). The token goes in the config file (mode
        0600), never on a command line (`ps` shows those)."""
        config = self._workdir("config")
        settings = {
            "ServerApp": {"jpserver_extensions": {"jupyter_vgpu": True}},  # an editable install lacks etc/jupyter/
            "IdentityProvider": {"token": self.token},
            "LabApp": {"news_url": "", "check_for_updates_class": "jupyterlab.NeverCheckForUpdate"},
            # a share request re-creates the notebook pod through the simulated API
            "VGPUSettings": {"requester_class": "vgpu_plugin.demo.requester.KubeRecreateRequester"},
        }
        fd = os.open(os.path.join(config, "jupyter_server_config.json"), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        os.fchmod(fd, 0o600)
        with open(fd, "w", encoding="utf-8") as handle:
            json.dump(settings, handle)
        assert self.cluster is not None
        return {
            c.ENV_NOTEBOOK_KUBECONFIG: self.cluster.kubeconfig,
            **({} if self.real else self.cluster.queue_environment()),
            "JUPYTER_CONFIG_DIR": config,
            "JUPYTER_DATA_DIR": self._workdir("data"),
            "JUPYTER_RUNTIME_DIR": self._workdir("runtime"),
            "JUPYTERLAB_SETTINGS_DIR": self.lab_settings_dir(),
            "JUPYTERLAB_WORKSPACES_DIR": self._workdir("lab-workspaces"),
            "IPYTHONDIR": self._workdir("ipython"),
            "XDG_CACHE_HOME": self._workdir("cache"),
            "MPLCONFIGDIR": self._workdir("matplotlib"),
            "npm_config_cache": self._workdir("npm"),  # JupyterLab asks yarn/npm for their config at start
            "PYTHONUNBUFFERED": "1",
        }

    def _extra_labextensions(self) -> list[str]:
        """The panel from the package when this environment has not installed it (a plain
        editable install without `jupyter labextension develop`)."""
        from jupyter_core.paths import jupyter_path

        if any(os.path.isdir(os.path.join(p, "jupyter-vgpu")) for p in jupyter_path("labextensions")):
            return []
        import jupyter_vgpu

        built = Path(jupyter_vgpu.__file__).parent / "labextension"
        if not (built / "package.json").is_file():
            self.say("demo: the JupyterLab panel is not built (jupyter_vgpu/labextension); "
                     "the lab runs without it - reinstall with `pip install -e .` to build it")
            return []
        extensions = self._workdir("labextensions")
        os.symlink(built, os.path.join(extensions, "jupyter-vgpu"), target_is_directory=True)
        return [f"--LabApp.extra_labextensions_path={extensions}"]

    def lab_command(self) -> list[str]:
        lab = [sys.executable, "-m", "jupyterlab", "--no-browser", f"--ip={self.options.ip}", f"--port={self.port}",
               "--ServerApp.port_retries=0", f"--ServerApp.base_url={self.base_url}",
               f"--ServerApp.root_dir={self.notebook_dir}",
               *self._extra_labextensions()]
        if os.geteuid() == 0:  # containers and CI run as root; jupyter refuses without this
            lab.append("--allow-root")
        return [sys.executable, "-m", "vgpu_plugin.demo.notebook", f"--address={self.options.ip}",
                f"--port={self.port}", f"--log={self.lab_log()}", "--", *lab]

    def _create_notebook_pod(self) -> None:
        assert self.cluster is not None
        body = self.cluster.notebook_pod(
            NOTEBOOK_POD, cores=self.request.cores, memory=self.request.memory_units or None,
            namespace=NOTEBOOK_NAMESPACE, command=self.lab_command(), env=self._lab_environment(),
            labels={ROLE_LABEL: "notebook"},
            # the card follows what the lab and its kernels do: a busy cell moves the charts
            annotations={SIM_PATTERN_ANNOTATION: MEASURED,
                         **({c.DEFAULT_NAMES.isolation: "mig"} if self.options.isolated else {})})
        body["spec"]["containers"][0]["name"] = NOTEBOOK_CONTAINER
        self.cluster.core_v1.create_namespaced_pod(NOTEBOOK_NAMESPACE, body, _preload_content=False)

    def _wait_for_notebook_pod(self, timeout: float = 60.0) -> None:
        """Until the notebook pod runs; a scheduler refusal ends the wait with its reason."""
        assert self.cluster is not None
        core = self.cluster.core_v1
        deadline = time.monotonic() + timeout
        while True:
            pod = self.cluster.read_pod(NOTEBOOK_NAMESPACE, NOTEBOOK_POD) or {}
            status = pod.get("status") or {}
            if status.get("phase") == "Running":
                return
            if status.get("phase") == "Failed":
                raise ClusterError(f"the notebook pod failed: {status.get('message', '')}")
            uid = (pod.get("metadata") or {}).get("uid")
            events = json.loads(core.list_namespaced_event(NOTEBOOK_NAMESPACE, _preload_content=False).data)
            refusals = [e.get("message", "") for e in events.get("items") or []
                        if (e.get("involvedObject") or {}).get("uid") == uid and e.get("reason") == "FailedScheduling"]
            if refusals:
                raise ClusterError(f"the notebook pod's share ({self.request.cores} cores, "
                                   f"{self.request.memory_units} x 256 MiB) cannot be placed: {refusals[-1]}")
            if time.monotonic() > deadline:
                raise ClusterError(f"the notebook pod did not start within {timeout:.0f} s")
            time.sleep(0.1)

    def notebook_pods(self) -> list[dict[str, Any]]:
        """The notebook pod and its successors (a share request re-creates it as <name>-v<n>)."""
        assert self.cluster is not None
        answer = self.cluster.core_v1.list_namespaced_pod(NOTEBOOK_NAMESPACE, label_selector=NOTEBOOK_SELECTOR,
                                                         _preload_content=False)
        return list(json.loads(answer.data).get("items") or [])

    def _lab_process(self) -> tuple[Any, str] | None:
        """(Popen, log path) of the current notebook pod's process, if the kubelet started one."""
        assert self.cluster is not None
        for pod in self.notebook_pods():
            meta = pod["metadata"]
            if self.runner is not None:
                process = self.runner.process(meta["namespace"], meta["name"])
                if process is not None:
                    return process, self.lab_log()
                continue
            node_name = (pod.get("spec") or {}).get("nodeName")
            if not node_name or node_name not in self.cluster.nodes:
                continue
            node = self.cluster.nodes[node_name]
            admitted = node.kubelet.admitted(meta["uid"])
            if admitted and admitted.containers and admitted.containers[0].process is not None:
                return admitted.containers[0].process, self.lab_log()
        return None

    def lab_log(self) -> str:
        """Where the lab writes its output, whichever pod runs it (each pod's lab appends, after a line
        naming the pod): beside the notebooks, so it is still there after Ctrl-C."""
        return os.path.join(self.kept_dir, "logs", "lab.log")

    def _wait_for_lab(self) -> None:
        deadline = time.monotonic() + self.options.lab_timeout
        request = urllib.request.Request(self.server_url + "api/status",
                                         headers={"Authorization": f"token {self.token}"})
        while True:
            running = self._lab_process()
            if running is not None and running[0].poll() is not None:
                raise ClusterError(f"JupyterLab in the notebook pod exited with {running[0].returncode}:\n"
                                   + _tail(running[1]))
            try:
                with urllib.request.urlopen(request, timeout=5) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() > deadline:
                raise ClusterError(f"JupyterLab did not answer at {self.server_url} within "
                                   f"{self.options.lab_timeout:.0f} s" + (f":\n{_tail(running[1])}" if running else ""))
            time.sleep(0.25)

    # --- what to tell the user -----------------------------------------------------------

    def describe_notebook(self, pod: dict[str, Any]) -> str:
        meta = pod.get("metadata") or {}
        claim = claims.pod_claim(pod, c.DEFAULT_NAMES)
        allocation = claim.allocation if claim is not None else None
        if allocation is None:
            why = f": {claim.problem}" if claim is not None and claim.problem else ""
            return f"pod {meta.get('namespace')}/{meta.get('name')} (no vGPU{why})"
        shares = [share for container in allocation.containers for share in container.cards]
        cards = ", ".join(self._describe_slice(allocation.node, s) if s.mig_device else
                          f"card {s.index} ({s.cores} % of its compute, {s.memory_mib} MiB)" for s in shares)
        return f"pod {meta.get('namespace')}/{meta.get('name')} on node {allocation.node}: {cards}"

    def _describe_slice(self, node: str, share: c.CardShare) -> str:
        """'MIG 2g.10gb on GPU 0 (isolated)' as the panel says it, with the slice's real size: the
        holder gets the whole slice, whatever it asked for."""
        asked = f"asked {share.cores} % and {c.format_mib(share.memory_mib)}"
        held = self._slice(node, share.index, share.mig_device)
        if held is None:  # the node's inventory does not (yet) list it
            return f"MIG slice {share.mig_device} on GPU {share.index} (isolated; {asked})"
        return (f"MIG {held.profile} on GPU {share.index} (isolated): the whole slice, {held.cores} % of the card's "
                f"compute and {c.format_mib(held.memory_mib)} ({asked}); device {held.uuid}")

    def _slice(self, node: str, index: int, uuid: str) -> MigSlice | None:
        running = self.cluster.nodes.get(node) if self.cluster is not None else None
        card = next((card for card in running.gpus.inventory() if card.index == index), None) if running else None
        return next((s for s in card.slices if s.uuid == uuid), None) if card is not None else None

    def lab_notes(self) -> list[str]:
        """What the guide says about the lab's charts and limits: what moves them, and what holds the share."""
        if self.real:
            usage = ["  the fake runtime starts no container: your lab runs beside the cluster with the command and",
                     "  environment kubelet gave its container (the device plugin's answer included); no GPU process is",
                     "  simulated there, so the charts show no usage"]
        elif self.options.isolated:
            usage = ["  memory your kernels hold counts as your slice's GPU memory; compute use on a MIG slice is not",
                     "  measured (NVML has none per slice), so a busy cell moves no chart: the panel says so"]
        else:
            usage = ["  your card's usage follows what your notebook does: a busy cell (e.g. `while True: pass`) raises",
                     "  its utilisation (one busy CPU core = your whole compute share); memory your kernels hold counts",
                     "  as GPU memory"]
        if self.options.isolated:
            limits = ["  on a MIG slice the hardware isolates your compute and memory: the panel and %vgpu show the whole",
                      "  slice (its real size), not the share you asked for; the other slices of the card are "
                      "other people's"]
        else:
            limits = [f"  nothing enforces limits on simulated GPUs (enforcement {DEMO_ENFORCEMENT}): your share is kept",
                      "  by scheduling, and the framework guard rails hold PyTorch, JAX, CuPy and TensorFlow to its memory"]
        return usage + limits

    def guide(self) -> list[str]:
        assert self.cluster is not None
        cluster = self.cluster
        notebook = next((p for p in self.notebook_pods() if p["metadata"]["name"] == NOTEBOOK_POD), None)
        nodes = ", ".join(f"{n.name} ({len(n.gpus.inventory())} x {n.spec.model})" for n in cluster.nodes.values())
        what = (f"real Kubernetes {cluster.version} (etcd, kube-apiserver, kube-scheduler with the extender, "
                f"kubelets on Kubernetes' fake container runtime) with simulated GPU nodes" if self.real
                else "a simulated cluster with GPU nodes")
        lines = [
            "",
            f"jupyter-vgpu demo: {what} {nodes}",
            f"  your notebook: {self.describe_notebook(notebook) if notebook else '?'}",
        ]
        if self.options.neighbours:
            lines.append(f"  neighbours: {len(self.neighbours())} pods in namespace 'research' keep other cards busy")
        lines += [
            "",
            "JupyterLab (open the vGPU panel with Alt+Shift+G; in a notebook: %load_ext jupyter_vgpu, then %vgpu):",
            *self.lab_notes(),
            "",
            self.url,
            "",
            f"  your notebooks: {self.notebook_dir}   (kept after Ctrl-C)",
            f"  the lab's log:  {self.lab_log()}   (kept after Ctrl-C)",
            f"  lab settings:   {os.path.join(self.kept_dir, 'lab-settings')}   (your theme and choices, kept)",
            "",
            "Look around:",
            f"  kubectl --kubeconfig {cluster.kubeconfig} get pods -A -o wide",
            f"  curl -s {cluster.extender_url if self.real else cluster.extender.base_url}/inspect"
            "        # the extender's ledger: who holds which card",
        ]
        lines += [f"  curl -s -H 'Authorization: Bearer {cluster.scrape_token}' {n.scrape_url}/metrics"
                  f"   # node {n.name}: Prometheus metrics (scrape token)"
                  for n in cluster.nodes.values() if n.scrape_url]
        lines += ["", "Press Ctrl-C to stop everything.", ""]
        return lines


class NotebookWatcher(threading.Thread):
    """Says when a share request has moved the notebook to a new pod (and card)."""

    def __init__(self, demo: Demo, say: Callable[[str], None], interval: float = 1.0) -> None:
        super().__init__(name="demo-notebook-watcher", daemon=True)
        self.demo, self.say, self.interval = demo, say, interval
        self.stopping = threading.Event()
        self.announced: set[str] = set()

    def run(self) -> None:
        while not self.stopping.wait(self.interval):
            try:
                pods = self.demo.notebook_pods()
            except Exception:  # noqa: BLE001 - the cluster is stopping; nothing to say
                continue
            for pod in pods:
                meta = pod["metadata"]
                annotations = meta.get("annotations") or {}
                running = (pod.get("status") or {}).get("phase") == "Running"
                served = annotations.get(c.DEFAULT_NAMES.gpu_assigned) == "true" or (running and not _wants_gpu(pod))
                if meta["uid"] in self.announced or not served:
                    continue
                self.announced.add(meta["uid"])
                if meta["name"] != NOTEBOOK_POD:
                    self.say(f"demo: your notebook moved to {self.demo.describe_notebook(pod)}; "
                             f"the lab comes back at the same URL in a few seconds (log: {self.demo.lab_log()})")

    def stop(self) -> None:
        self.stopping.set()


def _tail(path: str, lines: int = 40) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return "".join(handle.readlines()[-lines:])
    except OSError:
        return f"(no log at {path})"


def write_redirect(path: str, url: str) -> str:
    """A page (mode 0600) that sends the browser to ``url``: the browser is started with this
    file's URL, so the token in ``url`` never shows on a command line (as `jupyter lab` does)."""
    import html

    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    os.fchmod(fd, 0o600)
    with open(fd, "w", encoding="utf-8") as handle:
        handle.write(f'<!DOCTYPE html><meta charset="utf-8"><meta http-equiv="refresh" content="0;url='
                     f'{html.escape(url, quote=True)}"><title>jupyter-vgpu demo</title>'
                     f'<a href="{html.escape(url, quote=True)}">Open the demo\'s JupyterLab</a>')
    return "file://" + os.path.abspath(path)


def open_browser(demo: Demo) -> None:
    import webbrowser

    assert demo.cluster is not None
    page = write_redirect(os.path.join(demo.cluster.workdir, "jupyter", "open.html"), demo.url)
    threading.Thread(target=webbrowser.open, args=(page,), daemon=True).start()


def _wants_gpu(pod: dict[str, Any]) -> bool:
    resources = c.DEFAULT_NAMES.resources
    return any(name in resources for ctr in (pod.get("spec") or {}).get("containers") or []
               for name in ((ctr.get("resources") or {}).get("limits") or {}))

