"""deploy/: every kustomization renders, every object is valid, and nothing asks for more
than it needs (no cluster-admin, no privileged mode, only the host paths the daemon uses)."""

from __future__ import annotations

import importlib
import json
import os
import re
from pathlib import Path

import jsonschema
import kubernetes_validate
import pytest
import yaml
from deploy_support import DEPLOY, KUSTOMIZATIONS, container, env_of, find, render
from vgpu_plugin.extender.version_skew import SCHEDULER_MINORS

from jupyter_vgpu.core import contract

# the oldest Kubernetes minor deploy/components has a kube-scheduler for (scheduler-1.35): the
# objects must be valid on every API server an overlay can be deployed to
K8S_VERSION = "{}.{}.0".format(*min(SCHEDULER_MINORS))

# The Prometheus Operator's CRDs are not in kubernetes-validate; ServiceMonitor is checked
# against this minimal schema of the fields we use instead of being skipped.
SERVICE_MONITOR_SCHEMA = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "metadata": {"type": "object", "required": ["name", "namespace"]},
        "spec": {
            "type": "object",
            "required": ["selector", "endpoints"],
            "additionalProperties": False,
            "properties": {
                "selector": {"type": "object", "properties": {"matchLabels": {"type": "object"}}, "additionalProperties": False},
                "namespaceSelector": {"type": "object", "properties": {"matchNames": {"type": "array", "items": {"type": "string"}}}},
                "endpoints": {
                    "type": "array",
                    "minItems": 1,
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "required": ["port"],
                        "properties": {
                            "port": {"type": "string"},
                            "path": {"type": "string"},
                            "interval": {"type": "string", "pattern": "^[0-9]+(ms|s|m|h)$"},
                            "authorization": {"type": "object", "additionalProperties": False,
                                              "required": ["type", "credentials"], "properties": {
                                "type": {"const": "Bearer"},
                                "credentials": {"type": "object", "additionalProperties": False,
                                                "required": ["name", "key"],
                                                "properties": {"name": {"type": "string"}, "key": {"type": "string"}}},
                            }},
                            "relabelings": {"type": "array", "items": {"type": "object", "additionalProperties": False, "properties": {
                                "sourceLabels": {"type": "array", "items": {"type": "string"}},
                                "targetLabel": {"type": "string"}, "action": {"type": "string"},
                                "regex": {"type": "string"}, "replacement": {"type": "string"},
                            }}},
                        },
                    },
                },
            },
        },
    },
}


def with_monitoring(tmp_path: Path, overlay: str) -> str:
    """A throwaway kustomization: a backend overlay plus the monitoring component."""
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [os.path.relpath(DEPLOY / overlay, tmp_path)],
        "components": [os.path.relpath(DEPLOY / "components/monitoring", tmp_path)],
    }))
    return str(tmp_path)


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_every_object_validates(kustomization):
    objects = render(kustomization)
    assert objects
    for obj in objects:
        if obj["kind"] == "ServiceMonitor":
            jsonschema.validate(obj, SERVICE_MONITOR_SCHEMA)
            continue
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


@pytest.mark.parametrize("backend", ["overlays/hami-core", "overlays/mps"])
def test_backend_overlays_combine_with_monitoring(tmp_path, backend):
    objects = render(with_monitoring(tmp_path, backend))
    kinds = {o["kind"] for o in objects}
    assert {"ServiceMonitor", "DaemonSet", "Deployment"} <= kinds
    name = backend.split("/")[1]
    assert env_of(container(objects, "DaemonSet", "vgpu-node", "node"))["VGPU_ENFORCEMENT"] == name


# The privileged containers, as NVIDIA's own: the MPS control daemon sets the cards' compute
# mode and starts each MPS server under its client's uid; its init container mounts the shared
# /dev/shm tmpfs on the host (mount(2) and Bidirectional mount propagation need privileged).
PRIVILEGED = {("vgpu-mps-control-daemon", "mps-control-daemon"), ("vgpu-mps-control-daemon", "mps-shm")}
# The host namespaces a workload joins: the node daemon the host's PID namespace, as the driver
# lists to NVML only the GPU processes whose PID the caller's namespace holds (docs/security.md).
HOST_NAMESPACES = {("vgpu-node", "hostPID")}


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_least_privilege_pods(kustomization):
    objects = render(kustomization)
    for obj in objects:
        if obj["kind"] in ("ClusterRoleBinding", "RoleBinding"):
            assert obj["roleRef"]["name"] not in ("cluster-admin", "admin", "edit"), obj["metadata"]["name"]
        if obj["kind"] not in ("DaemonSet", "Deployment"):
            continue
        pod = obj["spec"]["template"]["spec"]
        where = obj["metadata"]["name"]
        for key in ("hostNetwork", "hostPID", "hostIPC"):
            if (where, key) not in HOST_NAMESPACES:
                assert not pod.get(key), f"{where}: {key}"
        assert pod["serviceAccountName"] != "default"
        for c in pod["containers"] + pod.get("initContainers", []):
            security = c.get("securityContext") or {}
            if (where, c["name"]) in PRIVILEGED:
                assert security.get("privileged") is True and not pod.get("automountServiceAccountToken", True), (
                    f"{where}/{c['name']}: privileged, so it gets no API token")
                continue
            assert not security.get("privileged"), f"{where}/{c['name']} is privileged"
            assert security.get("allowPrivilegeEscalation") is False, f"{where}/{c['name']}"
            assert security.get("readOnlyRootFilesystem") is True, f"{where}/{c['name']}"
            assert security.get("capabilities", {}).get("drop") == ["ALL"], f"{where}/{c['name']}"
            assert not security.get("capabilities", {}).get("add"), f"{where}/{c['name']} adds capabilities"


EXPECTED_HOST_PATHS = {
    # path -> read-only in the container?
    "/var/lib/kubelet/device-plugins": False,   # our sockets, kubelet.sock, kubelet's checkpoint
    "/var/lib/jupyter-vgpu": False,             # the token secret
}
BACKEND_HOST_PATHS = {"base": {}, "overlays/monitoring": {},
                      # libvgpu.so + the per-container cache dirs the daemon creates; HAMi-core's locks
                      "overlays/hami-core": {"/usr/local/vgpu": False, "/tmp/vgpulock": False},
                      "overlays/mps": {}}


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_the_node_daemon_joins_the_host_pid_namespace_and_reads_its_own_proc(kustomization):
    """hostPID: NVML lists it the pods' GPU processes, and its own /proc (the host namespace's) maps
    them to pods; no host /proc mount or proc-root setting is left to disagree with it."""
    objects = render(kustomization)
    pod = find(objects, "DaemonSet", "vgpu-node")["spec"]["template"]["spec"]
    assert pod["hostPID"] is True and not pod.get("hostNetwork") and not pod.get("hostIPC")
    assert "VGPU_METRICS_PROC_ROOT" not in env_of(container(objects, "DaemonSet", "vgpu-node", "node"))


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_node_daemon_mounts_only_what_it_needs(kustomization):
    objects = render(kustomization)
    pod = find(objects, "DaemonSet", "vgpu-node")["spec"]["template"]["spec"]
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts = {m["name"]: m for c in pod["containers"] for m in c.get("volumeMounts", [])}
    host_paths = {v["hostPath"]["path"]: bool(mounts[name].get("readOnly")) for name, v in volumes.items() if "hostPath" in v}
    assert host_paths == {**EXPECTED_HOST_PATHS, **BACKEND_HOST_PATHS[kustomization]}
    scheduler = find(objects, "Deployment", "vgpu-scheduler")["spec"]["template"]["spec"]
    assert not any("hostPath" in v for v in scheduler["volumes"])


def _parser_factory(subcommand: str):
    """The argparse parser builder of a `jupyter-vgpu` subcommand's module."""
    from jupyter_vgpu.cli import SUBCOMMANDS

    module_name = SUBCOMMANDS[subcommand][0].split(":")[0]
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        pytest.fail(f"{module_name} has not landed yet ({error})")
    for name in ("parser", "build_parser", "make_parser"):
        if callable(getattr(module, name, None)):
            return getattr(module, name)
    pytest.fail(f"{module_name} has no parser()/build_parser() to check the manifest's flags against")


def _parse(factory, env: dict[str, str], args: list[str], monkeypatch) -> dict | None:
    """Parsed flags with exactly this VGPU_* environment; None when argparse refuses it."""
    import os as _os

    for key in list(_os.environ):
        if key.startswith("VGPU_"):
            monkeypatch.delenv(key)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    try:
        return vars(factory().parse_args(args))
    except SystemExit:
        return None


def _resolve(value: str, env: dict[str, str]) -> str:
    # Kubernetes expands $(VAR) in args from the container's env; fieldRefs become a stand-in
    return re.sub(r"\$\((\w+)\)", lambda m: env.get(m.group(1)) or "node-1", value)


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
@pytest.mark.parametrize(
    "kind, name, container_name",
    [("DaemonSet", "vgpu-node", "node"), ("Deployment", "vgpu-scheduler", "extender")],
)
def test_env_and_flags_are_ones_the_code_reads(kustomization, kind, name, container_name, monkeypatch):
    """A misspelt flag fails to parse; a misspelt VGPU_* variable would be silently ignored, so
    each one is changed in turn and must change what the daemon's parser gives (or be refused)."""
    c = container(render(kustomization), kind, name, container_name)
    subcommand, *args = c["args"]
    env = {k: v for k, v in env_of(c).items() if k.startswith("VGPU_") and v is not None}
    args = [_resolve(a, env) for a in args]
    factory = _parser_factory(subcommand)
    baseline = _parse(factory, env, args, monkeypatch)
    assert baseline is not None, f"{name}/{container_name}: `jupyter-vgpu {subcommand} {' '.join(args)}` does not parse"
    for variable, value in env.items():
        changed = str(int(value) + 1) if value.isdigit() else value + "-changed"
        assert _parse(factory, {**env, variable: changed}, args, monkeypatch) != baseline, (
            f"{name}/{container_name}: the parser ignores ${variable}")
    if "enforcement" in baseline:
        assert baseline["enforcement"] in contract.ENFORCEMENT_BACKENDS


def test_node_api_is_the_only_host_port_and_the_scrape_port_needs_the_monitors_token():
    from vgpu_plugin.metrics.flags import DEFAULT_SCRAPE_PORT

    objects = render("overlays/monitoring")
    node = container(objects, "DaemonSet", "vgpu-node", "node")
    ports = {p["name"]: p for p in node["ports"]}
    assert set(ports) == {"node-api", "metrics"}
    assert ports["node-api"]["containerPort"] == ports["node-api"]["hostPort"] == contract.DEFAULT_METRICS_PORT
    assert ports["metrics"]["containerPort"] == DEFAULT_SCRAPE_PORT and "hostPort" not in ports["metrics"]
    env = env_of(node)
    assert int(env["VGPU_METRICS_PORT"]) == contract.DEFAULT_METRICS_PORT
    assert int(env["VGPU_METRICS_SCRAPE_PORT"]) == DEFAULT_SCRAPE_PORT
    # both probes on the node API: ready once registered with kubelet, alive while serving
    assert node["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "node-api"}
    assert node["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "node-api"}
    service = find(objects, "Service", "vgpu-node-metrics")
    pod_labels = find(objects, "DaemonSet", "vgpu-node")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert [p["targetPort"] for p in service["spec"]["ports"]] == ["metrics"]
    monitor = find(objects, "ServiceMonitor", "vgpu-node")
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert {e["port"] for e in monitor["spec"]["endpoints"]} <= {p["name"] for p in service["spec"]["ports"]}
    # the monitor sends the token the daemon reads: the same Secret key, mounted where the env says
    pod = find(objects, "DaemonSet", "vgpu-node")["spec"]["template"]["spec"]
    (volume,) = [v for v in pod["volumes"] if "secret" in v]
    (mount,) = [m for m in node["volumeMounts"] if m["name"] == volume["name"]]
    assert mount["readOnly"] is True and volume["secret"]["optional"] is True
    for endpoint in monitor["spec"]["endpoints"]:
        credentials = endpoint["authorization"]["credentials"]
        assert credentials["name"] == volume["secret"]["secretName"]
        assert env["VGPU_METRICS_SCRAPE_TOKEN_FILE"] == f"{mount['mountPath']}/{credentials['key']}"


def _ingress_allowed(policies: list[dict], pod_labels: dict, port_name: str) -> list[list | None]:
    """The ``from`` lists of every ingress rule admitting this port on a pod with these labels
    (None: from anywhere)."""
    sources = []
    for policy in policies:
        selector = policy["spec"]["podSelector"].get("matchLabels") or {}
        if not selector.items() <= pod_labels.items():
            continue
        for rule in policy["spec"].get("ingress") or []:
            ports = [p["port"] for p in rule.get("ports") or []]
            if not ports or port_name in ports:
                sources.append(rule.get("from"))
    return sources


HUB_POD = {"namespaceSelector": {}, "podSelector": {"matchLabels": {"app": "jupyterhub", "component": "hub"}}}
"""Zero to JupyterHub's Hub pod, where the Hub's services (the GPU reclaimer) run."""


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_network_policies_admit_only_whom_each_port_is_for(kustomization):
    objects = render(kustomization)
    policies = [o for o in objects if o["kind"] == "NetworkPolicy"]
    assert all(p["metadata"]["namespace"] == "vgpu-system" for p in policies)
    (deny,) = [p for p in policies if p["spec"]["podSelector"] == {} and not p["spec"].get("ingress")]
    assert deny["spec"]["policyTypes"] == ["Ingress"]
    node_labels = find(objects, "DaemonSet", "vgpu-node")["spec"]["template"]["metadata"]["labels"]
    scheduler_labels = find(objects, "Deployment", "vgpu-scheduler")["spec"]["template"]["metadata"]["labels"]
    named_ports = {
        "vgpu-node": {p["name"] for p in container(objects, "DaemonSet", "vgpu-node", "node")["ports"]},
        "vgpu-scheduler": {p["name"] for c in ("kube-scheduler", "extender")
                           for p in container(objects, "Deployment", "vgpu-scheduler", c).get("ports") or []},
    }
    for policy in policies:
        target = (policy["spec"]["podSelector"].get("matchLabels") or {}).get("app.kubernetes.io/name")
        for rule in policy["spec"].get("ingress") or []:
            assert {p["port"] for p in rule.get("ports") or []} <= named_ports[target], policy["metadata"]["name"]
    assert _ingress_allowed(policies, node_labels, "node-api") == [None]  # notebooks on any node
    sources = _ingress_allowed(policies, node_labels, "metrics")
    assert sorted(sources, key=str) == sorted([
        [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "monitoring"}}}],
        [HUB_POD]], key=str)  # Prometheus, and the GPU reclaimer in the Hub's pod
    # the scheduler pod: the extender's queue port from the Hub's pod, nothing else
    assert _ingress_allowed(policies, scheduler_labels, "queue") == [[HUB_POD]]
    assert _ingress_allowed(policies, scheduler_labels, "any") == []


def test_the_queue_port_is_the_extenders_token_protected_listener():
    objects = render("base")
    extender = container(objects, "Deployment", "vgpu-scheduler", "extender")
    env = env_of(extender)
    (port,) = [p for p in extender["ports"] if p["name"] == "queue"]
    assert env["VGPU_EXTENDER_METRICS_PORT"] == str(port["containerPort"])
    assert env["VGPU_EXTENDER_ADDRESS"] == "127.0.0.1"  # filter/prioritize/bind stay on the loopback
    mounts = {m["name"]: m for m in extender["volumeMounts"]}
    volumes = {v["name"]: v for v in find(objects, "Deployment", "vgpu-scheduler")["spec"]["template"]["spec"]["volumes"]}
    assert volumes["queue-token"]["secret"]["secretName"] == "vgpu-queue-token"
    assert env["VGPU_EXTENDER_QUEUE_TOKEN_FILE"] == mounts["queue-token"]["mountPath"] + "/token"
    assert mounts["queue-token"]["readOnly"] is True
    service = find(objects, "Service", "vgpu-scheduler-queue")
    assert service["spec"]["selector"].items() <= find(objects, "Deployment", "vgpu-scheduler")[
        "spec"]["template"]["metadata"]["labels"].items()
    assert [(p["port"], p["targetPort"]) for p in service["spec"]["ports"]] == [(port["containerPort"], "queue")]


def test_grafana_dashboard_uses_real_metric_names():
    objects = render("overlays/monitoring")
    configmap = find(objects, "ConfigMap", "vgpu-grafana-dashboard")
    assert configmap["metadata"]["labels"]["grafana_dashboard"] == "1"
    dashboard = json.loads(configmap["data"]["jupyter-vgpu.json"])
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    exprs += [v["query"] for v in dashboard["templating"]["list"] if v["type"] == "query"]
    used = {m for e in exprs for m in re.findall(r"\bvgpu_[a-z_]+\b", e)}
    ours = {v for k, v in vars(contract).items() if k.startswith("METRIC_") and isinstance(v, str)}
    assert used and used <= ours, f"not metric names: {used - ours}"
    labels = set(contract.CARD_LABELS) | set(contract.CONTAINER_LABELS)
    legends = {m for p in dashboard["panels"] for t in p["targets"] for m in re.findall(r"\{\{(\w+)\}\}", t.get("legendFormat", ""))}
    joins = {label.strip() for e in exprs for group in re.findall(r"on\(([^)]*)\)", e) for label in group.split(",")}
    assert legends | joins <= labels, f"not metric labels: {(legends | joins) - labels}"
    assert len({p["id"] for p in dashboard["panels"]}) == len(dashboard["panels"])


def _scheduler_config(objects) -> dict:
    (configmap,) = [o for o in objects if o["kind"] == "ConfigMap" and o["metadata"]["name"].startswith("vgpu-scheduler-config")]
    deployment = find(objects, "Deployment", "vgpu-scheduler")
    volumes = {v["name"]: v for v in deployment["spec"]["template"]["spec"]["volumes"]}
    assert volumes["config"]["configMap"]["name"] == configmap["metadata"]["name"]
    assert configmap["metadata"]["namespace"] == "vgpu-system"
    command = container(objects, "Deployment", "vgpu-scheduler", "kube-scheduler")["command"]
    (flag,) = [a for a in command if a.startswith("--config=")]
    mount = [m for m in container(objects, "Deployment", "vgpu-scheduler", "kube-scheduler")["volumeMounts"] if m["name"] == "config"][0]
    key = flag.split("=", 1)[1].removeprefix(mount["mountPath"].rstrip("/") + "/")
    assert key in configmap["data"], f"kube-scheduler reads {flag} but the ConfigMap has {list(configmap['data'])}"
    return yaml.safe_load(configmap["data"][key])


def test_scheduler_config_matches_the_deployment_and_rbac():
    objects = render("base")
    config = _scheduler_config(objects)
    assert config["kind"] == "KubeSchedulerConfiguration"
    assert contract.SCHEDULER_NAME in [p["schedulerName"] for p in config["profiles"]]
    extender_env = env_of(container(objects, "Deployment", "vgpu-scheduler", "extender"))
    urls = [e["urlPrefix"] for p in [config] for e in p.get("extenders", [])]
    assert urls, "the scheduler config calls no extender"
    for url in urls:
        assert re.fullmatch(rf"http://(127\.0\.0\.1|localhost):{extender_env['VGPU_EXTENDER_PORT']}/scheduler/?", url), url
    lease = config.get("leaderElection", {})
    role = find(objects, "Role", "vgpu-scheduler-lease")
    named = [r for r in role["rules"] if r.get("resourceNames")]
    assert lease.get("resourceName") in named[0]["resourceNames"]
    assert lease.get("resourceNamespace") == role["metadata"]["namespace"] == "vgpu-system"


@pytest.mark.parametrize("kustomization", KUSTOMIZATIONS)
def test_priority_classes_and_service_accounts_exist(kustomization):
    objects = render(kustomization)
    classes = {o["metadata"]["name"] for o in objects if o["kind"] == "PriorityClass"}
    accounts = {o["metadata"]["name"] for o in objects if o["kind"] == "ServiceAccount"}
    for obj in objects:
        if obj["kind"] in ("DaemonSet", "Deployment"):
            pod = obj["spec"]["template"]["spec"]
            assert pod["priorityClassName"] in classes
            assert pod["serviceAccountName"] in accounts


def test_mps_clients_and_the_control_daemon_share_pipes_and_shm():
    """NVIDIA's layout: the daemon's /dev/shm is a host directory that every client gets as its
    /dev/shm, and the pipe directory the clients get is the daemon's."""
    objects = render("overlays/mps")
    node = env_of(container(objects, "DaemonSet", "vgpu-node", "node"))
    spec = find(objects, "DaemonSet", "vgpu-mps-control-daemon")["spec"]["template"]["spec"]
    daemon = container(objects, "DaemonSet", "vgpu-mps-control-daemon", "mps-control-daemon")
    volumes = {v["name"]: v["hostPath"]["path"] for v in spec["volumes"]}
    mounted = {m["mountPath"]: volumes[m["name"]] for m in daemon["volumeMounts"]}

    def host_path(container_path: str) -> str:
        for mount_path, host in sorted(mounted.items(), key=lambda item: -len(item[0])):
            if container_path == mount_path or container_path.startswith(mount_path.rstrip("/") + "/"):
                return host + container_path[len(mount_path):]
        raise AssertionError(f"{container_path} is not on a host path")

    daemon_env = env_of(daemon)
    assert mounted["/dev/shm"] == node["VGPU_MPS_SHM_DIR"] != "/dev/shm"
    assert daemon_env["VGPU_MPS_SHM_DIR"] == "/dev/shm"
    assert host_path(daemon_env["VGPU_MPS_PIPE_DIR"]) == node["VGPU_MPS_PIPE_DIR"]
    assert host_path(daemon_env["VGPU_MPS_LOG_DIR"]) != node["VGPU_MPS_PIPE_DIR"], "clients must not see the logs"


def test_mps_control_daemon_flags_are_ones_the_code_reads(monkeypatch):
    daemon = container(render("overlays/mps"), "DaemonSet", "vgpu-mps-control-daemon", "mps-control-daemon")
    subcommand, *args = daemon["args"]
    env = {k: v for k, v in env_of(daemon).items() if k.startswith("VGPU_") and v is not None}
    factory = _parser_factory(subcommand)
    baseline = _parse(factory, env, args, monkeypatch)
    assert baseline is not None
    for variable, value in env.items():
        changed = {"true": "false"}.get(value, str(int(value) - 1) if value.isdigit() else value + "-changed")
        assert _parse(factory, {**env, variable: changed}, args, monkeypatch) != baseline, variable
