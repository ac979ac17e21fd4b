"""RBAC in deploy/ against the Kubernetes calls the code actually makes.

The calls are collected statically: every attribute under plugin/vgpu_plugin/<component>
that names a method of the official client's API classes (``read_namespaced_pod``,
``create_namespaced_pod_binding``, ``list_node`` handed to an Informer, ...). Each method's
HTTP verb and path come from the client itself, and become (API group, resource, verb). A
list function passed around uncalled feeds an informer, so it needs watch as well. Each
component's own roles must grant every one of those, and nothing else.
"""

from __future__ import annotations

import ast
import functools
import importlib
import inspect
import itertools
import pkgutil
import re
import sys

import kubernetes.client
import kubernetes.client.api
import pytest
from deploy_support import REPO, find, render

PLUGIN = REPO / "plugin" / "vgpu_plugin"
SHARED = ("informer.py", "kubeclient.py", "tokens.py")

# component -> (service account, the packages whose code runs under it, our own roles)
COMPONENTS = {
    "node": ("vgpu-node", ("deviceplugin", "metrics", "doctor"), ("vgpu-node",)),  # doctor: kubectl exec in the pod
    "extender": ("vgpu-scheduler", ("extender",), ("vgpu-extender",)),
}

Need = tuple[str, str, str]  # (api group, resource[/subresource], verb)


@functools.cache
def client_methods() -> dict[str, dict[str, tuple[str, str]]]:
    """method name -> {API class name: (HTTP method, resource path)} for the official client."""
    table: dict[str, dict[str, tuple[str, str]]] = {}
    for module in pkgutil.iter_modules(kubernetes.client.api.__path__):
        api_module = importlib.import_module(f"kubernetes.client.api.{module.name}")
        classes = [(n, c) for n, c in vars(api_module).items()
                   if n.endswith("Api") and inspect.isclass(c) and c.__module__ == api_module.__name__]
        for class_name, cls in classes:
            for name, member in vars(cls).items():
                if not name.startswith("_") or not name.endswith("_serialize"):
                    continue
                found = re.search(r"method='(\w+)',\s*resource_path='([^']+)'", inspect.getsource(member))
                if found:
                    table.setdefault(name[1:-len("_serialize")], {})[class_name] = (found.group(1), found.group(2))
    assert table, "could not read the kubernetes client's methods"
    return table


def rbac_for(http_method: str, path: str, watched: bool) -> list[Need]:
    parts = path.strip("/").split("/")
    if parts[0] == "api":
        group, rest = "", parts[2:]
    elif parts[0] == "apis":
        group, rest = parts[1], parts[3:]
    else:
        return []  # /version and friends: non-resource URLs every authenticated client may read
    if rest[:1] == ["namespaces"] and len(rest) >= 3:
        rest = rest[2:]  # namespaced: namespaces/{namespace}/<resource>/...
    resource = rest[0]
    named = len(rest) >= 2
    if len(rest) >= 3:
        resource = f"{resource}/{rest[2]}"
    verb = {"GET": "get" if named else "list", "POST": "create", "PATCH": "patch", "PUT": "update",
            "DELETE": "delete" if named else "deletecollection"}[http_method]
    needs = [(group, resource, verb)]
    if verb == "list" and watched:
        needs.append((group, resource, "watch"))
    return needs


def code_needs(packages: tuple[str, ...], files: list | None = None) -> dict[Need, list[str]]:
    """(group, resource, verb) -> where in the code it is needed (``files``: these instead)."""
    methods = client_methods()
    needs: dict[Need, list[str]] = {}
    if files is None:
        files = [PLUGIN / f for f in SHARED] + [p for pkg in packages for p in sorted((PLUGIN / pkg).rglob("*.py"))]
    for path in files:
        if path.name.endswith(("_pb2.py", "_pb2_grpc.py")):
            continue
        tree = ast.parse(path.read_text())
        constructed = {n.func.attr if isinstance(n.func, ast.Attribute) else n.func.id
                       for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, (ast.Attribute, ast.Name))}
        called = {id(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
        for node in ast.walk(tree):
            if not isinstance(node, ast.Attribute) or node.attr not in methods:
                continue
            candidates = methods[node.attr]
            receiver = node.value.func if isinstance(node.value, ast.Call) else None
            direct = getattr(receiver, "attr", None) or getattr(receiver, "id", None)
            classes = ([direct] if direct in candidates else
                       [c for c in candidates if c in constructed] or list(candidates))
            assert len(classes) == 1, f"{path.name}:{node.lineno}: {node.attr} is ambiguous between {classes}"
            http_method, resource_path = candidates[classes[0]]
            for need in rbac_for(http_method, resource_path, watched=id(node) not in called):
                needs.setdefault(need, []).append(f"{path.name}:{node.lineno} {node.attr}")
        for http_method, resource_path, lineno in raw_requests(tree):
            for need in rbac_for(http_method, resource_path, watched=False):
                needs.setdefault(need, []).append(f"{path.name}:{lineno} {http_method} {resource_path}")
    return needs


HTTP_METHODS = {"GET", "POST", "PATCH", "PUT", "DELETE"}


def raw_requests(tree: ast.AST) -> list[tuple[str, str, int]]:
    """Calls made through the client's ``ApiClient`` without a generated method (the extender's bind):
    a literal HTTP method followed by a literal API path among one call's arguments."""
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        literals = [arg.value if isinstance(arg, ast.Constant) else None for arg in node.args]
        for method, path in itertools.pairwise(literals):
            if method in HTTP_METHODS and isinstance(path, str) and path.startswith(("/api/", "/apis/")):
                found.append((method, path, node.lineno))
    return found


def granted(objects, role_names: tuple[str, ...], service_account: str) -> set[Need]:
    grants: set[Need] = set()
    for role_name in role_names:
        role = find(objects, "ClusterRole", role_name)
        binding = find(objects, "ClusterRoleBinding", role_name)
        assert binding["roleRef"]["name"] == role_name
        assert {"kind": "ServiceAccount", "name": service_account, "namespace": "vgpu-system"} in binding["subjects"]
        assert len(binding["subjects"]) == 1
        for rule in role["rules"]:
            assert not rule.get("resourceNames"), "name-restricted rules are checked separately"
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    for verb in rule["verbs"]:
                        assert "*" not in (group, resource, verb), f"{role_name} grants a wildcard"
                        grants.add((group, resource, verb))
    return grants


@pytest.mark.parametrize("component", sorted(COMPONENTS))
def test_roles_grant_exactly_what_the_code_calls(component):
    service_account, packages, roles = COMPONENTS[component]
    for package in packages:
        if not (PLUGIN / package).is_dir():
            pytest.fail(f"plugin/vgpu_plugin/{package}/ has not landed yet; cannot check {component} RBAC")
    needs = code_needs(packages)
    assert needs, f"found no Kubernetes calls under {packages}"
    grants = granted(render("base"), roles, service_account)
    missing = {need: where for need, where in needs.items() if need not in grants}
    assert not missing, f"{component}: the code needs more than {roles} grant: {missing}"
    extra = grants - set(needs)
    assert not extra, f"{component}: {roles} grant what no code under {packages} calls: {sorted(extra)}"


def test_scheduler_gets_the_standard_roles_and_only_its_own_lease():
    objects = render("base")
    bound = {(o["kind"], o["roleRef"]["name"], o["metadata"].get("namespace"))
             for o in objects if o["kind"] in ("ClusterRoleBinding", "RoleBinding")
             and any(s["name"] == "vgpu-scheduler" for s in o["subjects"])}
    assert bound == {
        ("ClusterRoleBinding", "system:kube-scheduler", None),
        ("ClusterRoleBinding", "system:volume-scheduler", None),
        ("RoleBinding", "extension-apiserver-authentication-reader", "kube-system"),
        ("RoleBinding", "vgpu-scheduler-lease", "vgpu-system"),
        ("ClusterRoleBinding", "vgpu-extender", None),
    }
    lease = find(objects, "Role", "vgpu-scheduler-lease")
    assert lease["rules"] == [
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
        {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "resourceNames": ["vgpu-scheduler"], "verbs": ["get", "update"]},
    ]


def test_the_scanner_sees_calls_and_informers(tmp_path, monkeypatch):
    """The scanner itself: a called read, a passed-along list (informer: list + watch), a binding,
    a request through the ApiClient with a literal method and path."""
    package = tmp_path / "fake"
    package.mkdir()
    (package / "mod.py").write_text(
        "from kubernetes import client\n"
        "core = client.CoreV1Api()\n"
        "core.read_namespaced_pod('p', 'ns')\n"
        "Informer(core.list_node)\n"
        "core.create_namespaced_pod_binding('p', 'ns', {})\n"
        "client.EventsV1Api().create_namespaced_event('ns', {})\n"
        "self.api.patch_annotations('ns', 'p', {})\n"
        "self._call('x', self._request, 'DELETE', '/api/v1/namespaces/{namespace}/configmaps/{name}', {})\n"
        "log.info('%s %s', 'GET', 'not a path')\n"
    )
    for name in SHARED:
        (tmp_path / name).write_text("")
    monkeypatch.setattr(sys.modules[__name__], "PLUGIN", tmp_path)
    assert set(code_needs(("fake",))) == {
        ("", "pods", "get"), ("", "nodes", "list"), ("", "nodes", "watch"),
        ("", "pods/binding", "create"), ("events.k8s.io", "events", "create"), ("", "configmaps", "delete"),
    }


# --- once the admission policy is in place (deploy/base/admission-policy.yaml) ------------------

WRITE_VERBS = {"patch", "update"}


def _forbidden_writes(resource: str) -> list[tuple[str, str, dict, dict]]:
    """(what, the request's subresource, old, new) changes no account of ours may make, on an
    object bound to / being the node its token names (the node daemon's best case)."""
    from test_admission_policy import changed, cordon, node, pod, set_image

    placed = pod()
    if resource == "pods":
        return [
            ("patch a pod's image", "", placed, changed(placed, spec=set_image)),
            ("add a container to a pod", "", placed, changed(placed, spec=lambda s: s["containers"].append(
                {"name": "miner", "image": "evil/miner"}))),
            ("relabel a pod", "", placed, changed(placed, labels={"app": "other"})),
            ("rewrite a pod's other annotations", "", placed, changed(placed, annotations={"hub.jupyter.org/username": "x"})),
        ]
    if resource == "nodes":
        own = node("gpu-a")
        return [
            ("cordon a node", "", own, changed(own, spec=cordon)),
            ("taint a node", "", own, changed(own, spec=lambda s: s.setdefault("taints", []).append(
                {"key": "evict", "effect": "NoExecute"}))),
            ("relabel a node", "", own, changed(own, labels={"node-role.kubernetes.io/control-plane": ""})),
            ("rewrite a node's other annotations", "", own, changed(own, annotations={"volumes.kubernetes.io/x": "1"})),
        ]
    return []


@pytest.mark.parametrize("component", sorted(COMPONENTS))
def test_no_account_can_patch_pod_specs_or_arbitrary_node_fields(component):
    """Every pod or node write the component's roles grant is confined by the admission policy:
    evaluated on the policy's CEL, each change beyond the vGPU annotations is denied."""
    from deploy_admission_support import PolicyEvaluator
    from test_admission_policy import policy_objects, request

    service_account, _, roles = COMPONENTS[component]
    objects = render("base")
    writes = {(group, resource) for group, resource, verb in granted(objects, roles, service_account)
              if verb in WRITE_VERBS}
    assert writes, f"{component} writes nothing? then this test has nothing to prove"
    policy, _, params = policy_objects(objects)
    evaluator = PolicyEvaluator(policy, params)
    user = f"system:serviceaccount:vgpu-system:{service_account}"
    assert user in params["data"].values(), f"the policy does not know {user}"
    for group, resource in sorted(writes):
        probes = _forbidden_writes(resource)
        assert group == "" and probes, f"{component} may write {group}/{resource}: the policy does not confine it"
        for what, sub, old, new in probes:
            req = request(user, "UPDATE", resource, sub=sub, node_claim="gpu-a")
            assert evaluator.matches(req), f"the policy does not see {component}'s {resource} updates"
            verdict = evaluator.admit(req, new, old)
            assert not verdict.allowed, f"{component} ({user}) could {what}"
            assert not any(m.startswith("evaluation error") for m in verdict.denied), verdict.denied


def test_the_reclaimers_roles_grant_exactly_what_its_code_calls():
    """The GPU reclaimer runs in the Hub's pod as the Hub's service account: deploy/z2jh/reclaimer
    grants it what jupyter_vgpu/reclaimer calls (node daemon pods in vgpu-system, Events on
    notebook pods in the Hub's namespace), and nothing else."""
    needs = code_needs((), sorted((REPO / "jupyter_vgpu" / "reclaimer").glob("*.py")))
    assert needs, "found no Kubernetes calls in jupyter_vgpu/reclaimer"
    objects = render("z2jh/reclaimer")
    grants: dict[Need, str] = {}
    for role in [o for o in objects if o["kind"] == "Role"]:
        binding = find(objects, "RoleBinding", role["metadata"]["name"])
        assert binding["metadata"]["namespace"] == role["metadata"]["namespace"]
        assert binding["roleRef"] == {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role",
                                      "name": role["metadata"]["name"]}
        assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "hub", "namespace": "jhub"}]
        for rule in role["rules"]:
            for group in rule["apiGroups"]:
                for resource in rule["resources"]:
                    for verb in rule["verbs"]:
                        grants[(group, resource, verb)] = role["metadata"]["namespace"]
    assert set(grants) == set(needs), (sorted(grants), needs)
    assert grants[("", "pods", "list")] == "vgpu-system"  # the node daemons, nowhere else
    assert grants[("", "events", "create")] == "jhub"  # the notebooks' namespace
    assert not any(o["kind"].startswith("Cluster") for o in objects)
