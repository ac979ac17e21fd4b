"""deploy/examples/smoke-test.yaml: valid objects (kubernetes-validate, offline) that ask
vgpu-scheduler for a share as a notebook would, run as a non-root user, and run the script
the ConfigMap carries (its node-API half runs against the metrics server in
tests/metrics/test_smoke_script.py)."""

from __future__ import annotations

import ast

import kubernetes_validate
import yaml
from deploy_support import DEPLOY
from test_manifests import K8S_VERSION

from jupyter_vgpu.core import contract

MANIFEST = DEPLOY / "examples" / "smoke-test.yaml"


def objects() -> dict[str, dict]:
    return {d["kind"]: d for d in yaml.safe_load_all(MANIFEST.read_text()) if d}


def test_objects_validate():
    found = objects()
    assert set(found) == {"ConfigMap", "Job"}
    for obj in found.values():
        kubernetes_validate.validate(obj, K8S_VERSION, strict=True)


def test_job_asks_vgpu_scheduler_for_a_share_as_a_non_root_user():
    job = objects()["Job"]
    pod = job["spec"]["template"]["spec"]
    assert pod["schedulerName"] == contract.SCHEDULER_NAME and pod["restartPolicy"] == "Never"
    assert job["spec"]["backoffLimit"] == 0 and job["spec"]["activeDeadlineSeconds"] > 0
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] != 0
    (container,) = pod["containers"]
    request = contract.parse_container_request(container["resources"]["limits"], container["resources"].get("requests"))
    assert request == contract.Request(25, 16) and request.is_share
    assert ":" in container["image"].rsplit("/", 1)[-1], "the PyTorch image is pinned to a tag"


def test_job_runs_the_configmaps_script():
    found = objects()
    pod = found["Job"]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    (mount,) = container["volumeMounts"]
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    assert volume["configMap"]["name"] == found["ConfigMap"]["metadata"]["name"]
    script_path = container["command"][-1]
    key = script_path.removeprefix(mount["mountPath"] + "/")
    source = found["ConfigMap"]["data"][key]
    tree = ast.parse(source)  # a syntax error fails here, not on the cluster
    top_imports = {alias.name for node in tree.body if isinstance(node, ast.Import) for alias in node.names}
    assert "torch" not in top_imports  # imported in run(), after the environment checks


def test_script_reads_the_environment_the_device_plugin_sets():
    source = objects()["ConfigMap"]["data"]["smoke.py"]
    needed = next(node.value for node in ast.parse(source).body
                  if isinstance(node, ast.Assign) and node.targets[0].id == "NEEDED")
    names = {element.value for element in needed.elts}
    assert names <= set(contract.VGPU_ENV_NAMES)
    assert {contract.ENV_METRICS_URL, contract.ENV_TOKEN, contract.ENV_MEMORY_MIB} <= names
