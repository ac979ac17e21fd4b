"""The base's ValidatingAdmissionPolicy (deploy/base/admission-policy.yaml), its CEL rules
evaluated on allowed and forbidden AdmissionRequests (issue 12, item 4): only the stack's
accounts write the vGPU annotations; the node daemon only on pods bound to its node and only
those keys; on its own Node only the inventory annotation and GPU label."""

from __future__ import annotations

import copy
import os
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from deploy_admission_support import PolicyEvaluator
from deploy_support import DEPLOY, find, render

from jupyter_vgpu.core import contract

NAMES = contract.DEFAULT_NAMES
K8S_VERSION = "1.32.0"
NODE_CLAIM = "authentication.kubernetes.io/node-name"

SCHEDULER = "system:serviceaccount:vgpu-system:vgpu-scheduler"
NODE_DAEMON = "system:serviceaccount:vgpu-system:vgpu-node"
GPU_ADMISSION = "system:serviceaccount:kube-system:gpu-admission"
HUB = "system:serviceaccount:jhub:hub"
CONTROLLER = "system:serviceaccount:kube-system:replicaset-controller"
TENANT = "alice@example.org"

PROTECTED = {
    NAMES.predicate_node: "gpu-a",
    NAMES.predicate_gpu_idx(0): "2",
    NAMES.predicate_time: "1700000000000000000",
    NAMES.gpu_assigned: "false",
    NAMES.allocation: '{"node":"gpu-a","containers":[]}',
    NAMES.mig_slice(0): "MIG-0a1b2c3d-4e5f-6071-8293-a4b5c6d7e8f9",
}


def policy_objects(objects=None) -> tuple[dict, dict, dict]:
    objects = objects or render("base")
    binding = find(objects, "ValidatingAdmissionPolicyBinding", "vgpu-trusted-annotations")
    policy = find(objects, "ValidatingAdmissionPolicy", binding["spec"]["policyName"])
    ref = binding["spec"]["paramRef"]
    params = find(objects, "ConfigMap", ref["name"])
    assert params["metadata"]["namespace"] == ref["namespace"]
    return policy, binding, params


@pytest.fixture(scope="module")
def evaluator() -> PolicyEvaluator:
    policy, _, params = policy_objects()
    return PolicyEvaluator(policy, params)


def request(user: str, operation: str, resource: str, *, sub: str = "", node_claim: str | None = None) -> dict:
    """An AdmissionRequest as kube-apiserver hands it to CEL: empty fields left out (a pod's
    own update has no subResource; a user without claims no extra), as tests/realkube showed."""
    made = {
        "uid": "0b7e-test", "operation": operation,
        "resource": {"group": "", "version": "v1", "resource": resource},
        "kind": {"group": "", "version": "v1", "kind": "Pod" if resource == "pods" else "Node"},
        "userInfo": {"username": user, "groups": ["system:authenticated"]},
    }
    if sub:
        made["subResource"] = sub
    if node_claim:
        made["userInfo"]["extra"] = {NODE_CLAIM: [node_claim]}
    return made


def pod(annotations: dict | None = None, node: str | None = "gpu-a", labels: dict | None = None) -> dict:
    body = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "jupyter-alice", "namespace": "jhub", "uid": "u-1",
                     "labels": {"component": "singleuser-server", **(labels or {})},
                     "annotations": {"hub.jupyter.org/username": "alice", **(annotations or {})}},
        "spec": {"schedulerName": contract.SCHEDULER_NAME,
                 "containers": [{"name": "notebook", "image": "jupyter/base-notebook:2024",
                                 "resources": {"limits": {NAMES.core_resource: "25"}}}]},
    }
    if node:
        body["spec"]["nodeName"] = node
    return body


def node(name: str = "gpu-a", annotations: dict | None = None, labels: dict | None = None) -> dict:
    return {
        "apiVersion": "v1", "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/hostname": name, "vgpu.jupyter.org/node": "true",
                                              **(labels or {})},
                     "annotations": dict(annotations or {})},
        "spec": {"podCIDR": "10.244.1.0/24"},
    }


def changed(obj: dict, **edits) -> dict:
    """A copy with metadata annotations/labels merged (None removes a key) and spec edits."""
    new = copy.deepcopy(obj)
    for part in ("annotations", "labels"):
        for key, value in (edits.get(part) or {}).items():
            if value is None:
                new["metadata"][part].pop(key, None)
            else:
                new["metadata"][part][key] = value
    if "spec" in edits:
        edits["spec"](new["spec"])
    return new


def refused(verdict) -> bool:
    """Denied by a rule, not by an expression that failed to evaluate."""
    assert not any(m.startswith("evaluation error") for m in verdict.denied), verdict.denied
    return not verdict.allowed


def set_image(spec: dict) -> None:
    spec["containers"][0]["image"] = "evil/miner:latest"


def cordon(spec: dict) -> None:
    spec["unschedulable"] = True


# --- anyone but the stack -------------------------------------------------------------------------


@pytest.mark.parametrize("user", [TENANT, HUB, CONTROLLER])
@pytest.mark.parametrize("key", sorted(PROTECTED) + [NAMES.share_request, NAMES.predicate_gpu_idx(3)])
def test_nobody_else_creates_a_pod_carrying_a_vgpu_key(evaluator, user, key):
    value = PROTECTED.get(key, "x")
    verdict = evaluator.admit(request(user, "CREATE", "pods"), pod({key: value}, node=None), None)
    assert refused(verdict)
    assert any(key in message and "only jupyter-vgpu" in message for message in verdict.denied), verdict.denied


def test_an_unscheduled_pod_cannot_claim_cards_nor_be_marked_assigned(evaluator):
    """Issue 12 item 2's forged pods: a predicate-node + allocation record, or gpu-assigned=true."""
    forged = pod({NAMES.predicate_node: "gpu-a", NAMES.allocation: PROTECTED[NAMES.allocation],
                  NAMES.predicate_gpu_idx(0): "0"}, node=None)
    forged["spec"]["schedulerName"] = "default-scheduler"
    assert not evaluator.admit(request(TENANT, "CREATE", "pods"), forged, None).allowed
    assigned = pod({NAMES.gpu_assigned: "true"}, node=None)
    assert not evaluator.admit(request(TENANT, "CREATE", "pods"), assigned, None).allowed


def test_ordinary_pods_and_edits_are_untouched(evaluator):
    plain = pod({NAMES.policy: "spread", NAMES.isolation: "mig"}, node=None)  # asking for isolation is the user's
    assert evaluator.admit(request(HUB, "CREATE", "pods"), plain, None).allowed
    placed = pod(PROTECTED)
    relabelled = changed(placed, labels={"team": "b"}, annotations={"hub.jupyter.org/note": "x"})
    assert evaluator.admit(request(HUB, "UPDATE", "pods"), relabelled, placed).allowed
    # kubelet's status writes carry the annotations unchanged
    assert evaluator.admit(request("system:node:gpu-a", "UPDATE", "pods", sub="status"), placed, placed).allowed


@pytest.mark.parametrize("edit", [
    {NAMES.predicate_gpu_idx(0): "5"},           # move the claim to another card
    {NAMES.mig_slice(0): "MIG-ffffffff-0000-0000-0000-000000000000"},   # move it to another MIG slice
    {NAMES.gpu_assigned: "true"},                # pretend to have been served
    {NAMES.allocation: None},                    # drop the record
    {NAMES.predicate_node: "gpu-b"},
])
def test_nobody_else_changes_or_removes_a_vgpu_key(evaluator, edit):
    placed = pod(PROTECTED)
    for user, sub in ((TENANT, ""), (HUB, ""), ("system:node:gpu-a", "status")):
        verdict = evaluator.admit(request(user, "UPDATE", "pods", sub=sub), changed(placed, annotations=edit), placed)
        assert refused(verdict), (user, edit)


def test_a_binding_cannot_smuggle_vgpu_keys(evaluator):
    binding = {"apiVersion": "v1", "kind": "Binding",
               "metadata": {"name": "jupyter-alice", "namespace": "jhub", "annotations": {NAMES.gpu_assigned: "true"}},
               "target": {"kind": "Node", "name": "gpu-a"}}
    assert not evaluator.admit(request("system:serviceaccount:kube-system:other-scheduler", "CREATE", "pods",
                                       sub="binding"), binding, None).allowed
    plain = {**binding, "metadata": {"name": "jupyter-alice", "namespace": "jhub"}}
    assert evaluator.admit(request(SCHEDULER, "CREATE", "pods", sub="binding"), plain, None).allowed


def test_the_extender_binds_with_its_claim_in_the_binding(evaluator):
    """The extender's bind is one Binding whose annotations the API server copies onto the pod."""
    claim = {NAMES.predicate_node: "gpu-a", NAMES.predicate_gpu_idx(0): "1", NAMES.gpu_assigned: "false"}
    binding = {"apiVersion": "v1", "kind": "Binding",
               "metadata": {"name": "jupyter-alice", "namespace": "jhub", "annotations": claim},
               "target": {"kind": "Node", "name": "gpu-a"}}
    assert evaluator.admit(request(SCHEDULER, "CREATE", "pods", sub="binding"), binding, None).allowed
    assert not evaluator.admit(request(TENANT, "CREATE", "pods", sub="binding"), binding, None).allowed


# --- vGPU pods go through the extender (issue 32, item 2) -------------------------------------------

BYPASS = "only the vGPU scheduler extender places vGPU pods"


def preset_node(spec: dict) -> None:
    spec["nodeName"] = "gpu-a"


def other_scheduler(spec: dict) -> None:
    spec["schedulerName"] = "default-scheduler"  # what the API server defaults a missing one to


def memory_requests_only(spec: dict) -> None:
    spec["schedulerName"] = "tenant-scheduler"
    spec["containers"][0]["resources"] = {"requests": {NAMES.memory_resource: "4"}}


def in_init_container(spec: dict) -> None:
    spec["nodeName"] = "gpu-a"
    spec["initContainers"] = [{"name": "warm", "image": "busybox",
                               "resources": {"limits": {NAMES.core_resource: "100"}}}]
    spec["containers"][0]["resources"] = {}


@pytest.mark.parametrize("user", [TENANT, HUB, CONTROLLER, "system:node:gpu-a"])
@pytest.mark.parametrize("bypass", [preset_node, other_scheduler, memory_requests_only, in_init_container])
def test_a_pod_asking_for_vgpu_must_go_through_the_extender(evaluator, user, bypass):
    """A pod bound by ``nodeName`` or placed by another scheduler never meets the extender: its
    cores would count as 0 in the ledger and the card be offered again. Refused at creation."""
    verdict = evaluator.admit(request(user, "CREATE", "pods"), changed(pod(node=None), spec=bypass), None)
    assert refused(verdict)
    assert any(BYPASS in m and NAMES.core_resource in m and contract.SCHEDULER_NAME in m
               for m in verdict.denied), verdict.denied


def test_the_extenders_path_and_pods_asking_no_vgpu_pass(evaluator, tmp_path: Path):
    """The Hub's notebook (vgpu-scheduler, no node) passes; so do pods asking no vGPU, bound or
    not, another domain's resources, kube-scheduler's Binding and kubelet's status writes of a
    bound vGPU pod, and the stack's own accounts; gpu-admission's once configured."""
    assert evaluator.admit(request(HUB, "CREATE", "pods"), pod(node=None), None).allowed
    plain = changed(pod(node=None), spec=preset_node)
    plain["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "1", "cpu": "1"}}
    assert evaluator.admit(request(TENANT, "CREATE", "pods"), plain, None).allowed
    binding = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "jupyter-alice", "namespace": "jhub"},
               "target": {"kind": "Node", "name": "gpu-a"}}
    assert evaluator.admit(request("system:kube-scheduler", "CREATE", "pods", sub="binding"), binding, None).allowed
    bound = pod(PROTECTED)
    status = copy.deepcopy(bound)
    status["metadata"]["annotations"]["example.org/probe"] = "x"
    assert evaluator.admit(request("system:node:gpu-a", "UPDATE", "pods", sub="status"), status, bound).allowed
    bypass = changed(pod(node=None), spec=preset_node)
    assert evaluator.admit(request(SCHEDULER, "CREATE", "pods"), bypass, None).allowed
    assert refused(evaluator.admit(request(GPU_ADMISSION, "CREATE", "pods"), bypass, None))
    configured = PolicyEvaluator(*policy_objects(with_gpu_admission(tmp_path))[::2])
    assert configured.admit(request(GPU_ADMISSION, "CREATE", "pods"), bypass, None).allowed


def test_the_scheduler_name_and_resource_domain_come_from_the_params():
    policy, _, params = policy_objects()
    renamed = copy.deepcopy(params)
    renamed["data"].update(schedulerName="gpu-sched", resourceDomain="example.com")
    evaluator = PolicyEvaluator(policy, renamed)
    ours = pod(node=None)
    assert evaluator.admit(request(HUB, "CREATE", "pods"), ours, None).allowed  # tencent.com is not vGPU there
    ours["spec"]["containers"][0]["resources"] = {"limits": {"example.com/vcuda-core": "25"}}
    assert refused(evaluator.admit(request(HUB, "CREATE", "pods"), ours, None))
    ours["spec"]["schedulerName"] = "gpu-sched"
    assert evaluator.admit(request(HUB, "CREATE", "pods"), ours, None).allowed


# --- the scheduler (extender) ---------------------------------------------------------------------


def test_the_scheduler_writes_and_undoes_its_claim(evaluator):
    pending = pod(node=None)
    claimed = changed(pending, annotations=PROTECTED)
    assert evaluator.admit(request(SCHEDULER, "UPDATE", "pods"), claimed, pending).allowed
    undone = changed(claimed, annotations=dict.fromkeys(PROTECTED))
    assert evaluator.admit(request(SCHEDULER, "UPDATE", "pods"), undone, claimed).allowed
    conditions = changed(pending)
    conditions["status"] = {"conditions": [{"type": "PodScheduled", "status": "False"}]}
    assert evaluator.admit(request(SCHEDULER, "UPDATE", "pods", sub="status"), conditions, pending).allowed


@pytest.mark.parametrize("edit", [
    {"spec": set_image},
    {"labels": {"team": "b"}},
    {"annotations": {"hub.jupyter.org/username": "mallory"}},
])
def test_the_scheduler_changes_nothing_else_on_a_pod(evaluator, edit):
    pending = pod(node=None)
    verdict = evaluator.admit(request(SCHEDULER, "UPDATE", "pods"), changed(pending, **edit), pending)
    assert refused(verdict) and "scheduler" in verdict.denied[0]


# --- the node daemon -------------------------------------------------------------------------------


def test_the_node_daemon_marks_pods_on_its_node_served(evaluator):
    placed = pod(PROTECTED)
    served = changed(placed, annotations={NAMES.gpu_assigned: "true", NAMES.allocation: '{"node":"gpu-a"}'})
    assert evaluator.admit(request(NODE_DAEMON, "UPDATE", "pods", node_claim="gpu-a"), served, placed).allowed


@pytest.mark.parametrize("case", ["other node", "unbound", "image", "label", "other annotation", "create",
                                  "no node claim", "status"])
def test_the_node_daemon_is_confined_to_vgpu_keys_of_its_own_pods(evaluator, case):
    placed = pod(PROTECTED, node="gpu-b" if case == "other node" else None if case == "unbound" else "gpu-a")
    edit = {"annotations": {NAMES.gpu_assigned: "true"}}
    edit.update({"image": {"spec": set_image}, "label": {"labels": {"team": "b"}},
                 "other annotation": {"annotations": {"hub.jupyter.org/username": "mallory"}}}.get(case, {}))
    claim = None if case == "no node claim" else "gpu-a"
    if case == "create":
        verdict = evaluator.admit(request(NODE_DAEMON, "CREATE", "pods", node_claim=claim), placed, None)
    else:
        verdict = evaluator.admit(request(NODE_DAEMON, "UPDATE", "pods", sub="status" if case == "status" else "",
                                          node_claim=claim), changed(placed, **edit), placed)
    assert refused(verdict), case


def test_the_node_daemon_publishes_its_own_inventory(evaluator):
    before = node()
    after = changed(before, annotations={NAMES.node_inventory: '{"cards":[]}'}, labels={NAMES.node_label_gpu: "true"})
    assert evaluator.admit(request(NODE_DAEMON, "UPDATE", "nodes", node_claim="gpu-a"), after, before).allowed
    gone = changed(after, labels={NAMES.node_label_gpu: None})
    assert evaluator.admit(request(NODE_DAEMON, "UPDATE", "nodes", node_claim="gpu-a"), gone, after).allowed


@pytest.mark.parametrize("case", ["other node", "cordon", "other label", "other annotation", "no node claim"])
def test_the_node_daemon_changes_nothing_else_on_nodes(evaluator, case):
    before = node("gpu-b" if case == "other node" else "gpu-a")
    edit = {"annotations": {NAMES.node_inventory: "{}"}}
    edit.update({"cordon": {"spec": cordon},
                 "other label": {"labels": {"node-role.kubernetes.io/control-plane": ""}},
                 "other annotation": {"annotations": {"node.alpha.kubernetes.io/ttl": "0"}}}.get(case, {}))
    claim = None if case == "no node claim" else "gpu-a"
    verdict = evaluator.admit(request(NODE_DAEMON, "UPDATE", "nodes", node_claim=claim), changed(before, **edit), before)
    assert refused(verdict), case


def with_gpu_admission(tmp_path: Path) -> tuple[dict, ...]:
    """deploy/base rendered with gpu-admission's account configured as trusted."""
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [os.path.relpath(DEPLOY / "base", tmp_path)],
        "patches": [{"target": {"kind": "ConfigMap", "name": "vgpu-trusted-writers"},
                     "patch": yaml.safe_dump([{"op": "replace", "path": "/data/admissionAccount",
                                               "value": GPU_ADMISSION}])}],
    }))
    return render(str(tmp_path))


# --- configuration ----------------------------------------------------------------------------------


def test_gpu_admission_is_trusted_only_when_configured(evaluator, tmp_path: Path):
    pending = pod(node=None)
    claimed = changed(pending, annotations={NAMES.predicate_gpu_idx(0): "1", NAMES.predicate_node: "gpu-a"})
    assert not evaluator.admit(request(GPU_ADMISSION, "UPDATE", "pods"), claimed, pending).allowed
    policy, _, params = policy_objects(with_gpu_admission(tmp_path))
    configured = PolicyEvaluator(policy, params)
    assert configured.admit(request(GPU_ADMISSION, "UPDATE", "pods"), claimed, pending).allowed
    assert not configured.admit(request(GPU_ADMISSION, "UPDATE", "pods"),
                                changed(claimed, spec=set_image), pending).allowed


@pytest.mark.parametrize("lost", ["resourceDomain", "projectDomain", "schedulerName", "schedulerAccount",
                                  "nodeAccount", "admissionAccount", "data"])
def test_params_missing_a_key_keep_the_cluster_working_and_the_keys_protected(lost):
    """An admin who deletes a key breaks no pod write that touches no vGPU key, and opens none:
    a lost domain is the default one, a lost account is trusted by nobody."""
    policy, _, params = policy_objects()
    broken = copy.deepcopy(params)
    if lost == "data":
        del broken["data"]
    else:
        del broken["data"][lost]
    evaluator = PolicyEvaluator(policy, broken)
    placed = pod(PROTECTED)
    relabelled = changed(placed, labels={"team": "b"}, annotations={"hub.jupyter.org/note": "x"})
    assert evaluator.admit(request(HUB, "UPDATE", "pods"), relabelled, placed).allowed
    assert evaluator.admit(request(HUB, "CREATE", "pods"), pod(node=None), None).allowed
    assert refused(evaluator.admit(request(TENANT, "UPDATE", "pods"),
                                   changed(placed, annotations={NAMES.gpu_assigned: "true"}), placed))
    served = changed(placed, annotations={NAMES.gpu_assigned: "true"})
    node_verdict = evaluator.admit(request(NODE_DAEMON, "UPDATE", "pods", node_claim="gpu-a"), served, placed)
    assert node_verdict.allowed == (lost not in ("nodeAccount", "data")), node_verdict.denied


def test_an_update_that_changes_no_metadata_or_spec_skips_the_policy(evaluator):
    """kubelet's status updates (most pod writes in a cluster) never evaluate a rule, so a
    broken rule or params cannot fail them; any change of annotations, labels or spec does."""
    placed = pod(PROTECTED)
    status = copy.deepcopy(placed)
    status["status"] = {"phase": "Running"}
    broken = PolicyEvaluator({**policy_objects()[0], "spec": {
        **policy_objects()[0]["spec"], "validations": [{"expression": "1 / 0 == 1", "message": "broken"}]}}, None)
    assert broken.admit(request("system:node:gpu-a", "UPDATE", "pods", sub="status"), status, placed).allowed
    for edit in ({"labels": {"team": "b"}}, {"annotations": {"x": "y"}}, {"spec": set_image}):
        assert not broken.admit(request(HUB, "UPDATE", "pods"), changed(placed, **edit), placed).allowed, edit
    assert not broken.admit(request(HUB, "CREATE", "pods"), pod(node=None), None).allowed


def test_the_legacy_bindings_resource_cannot_smuggle_vgpu_keys(evaluator):
    """POST /api/v1/namespaces/<ns>/bindings makes the same Binding as pods/binding."""
    binding = {"apiVersion": "v1", "kind": "Binding",
               "metadata": {"name": "jupyter-alice", "namespace": "jhub", "annotations": {NAMES.gpu_assigned: "true"}},
               "target": {"kind": "Node", "name": "gpu-a"}}
    assert refused(evaluator.admit(request(TENANT, "CREATE", "bindings"), binding, None))
    plain = {**binding, "metadata": {"name": "jupyter-alice", "namespace": "jhub"}}
    assert evaluator.admit(request(TENANT, "CREATE", "bindings"), plain, None).allowed


def test_the_params_name_the_accounts_and_domains_the_manifests_use():
    objects = render("base")
    policy, binding, params = policy_objects(objects)
    data = params["data"]
    assert (data["resourceDomain"], data["projectDomain"]) == (NAMES.domain, NAMES.project_domain)
    for key, name in (("schedulerAccount", "vgpu-scheduler"), ("nodeAccount", "vgpu-node")):
        account = find(objects, "ServiceAccount", name)["metadata"]
        assert data[key] == f"system:serviceaccount:{account['namespace']}:{account['name']}"
    assert binding["spec"]["validationActions"] == ["Deny"] and policy["spec"]["failurePolicy"] == "Fail"
    assert policy["spec"]["paramKind"] == {"apiVersion": "v1", "kind": "ConfigMap"}
    for obj in (policy, binding, params):
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def test_the_policy_is_in_every_kustomization():
    from deploy_support import KUSTOMIZATIONS

    for kustomization in KUSTOMIZATIONS:
        policy_objects(render(kustomization))
