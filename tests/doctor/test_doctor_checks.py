"""`jupyter-vgpu doctor`'s checks on a simulated node: all ok when healthy, and each fault
an admin meets on a first real deployment reported as warn or fail with its remedy."""

from __future__ import annotations

import json
import os

import kubernetes.client
import pytest
from doctor_support import CONTAINERD_NVIDIA_DEFAULT, NAMESPACE, NODE, sim_node
from vgpu_plugin.doctor.checks import run_checks
from vgpu_plugin.doctor.cluster_checks import judge_scheduler
from vgpu_plugin.doctor.report import FAIL, OK, WARN, exit_code
from vgpu_plugin.extender.version_skew import SCHEDULER_TAG_UNSET

ALL_CHECKS = {"driver", "cards", "mig", "device-nodes", "runtime", "toolkit-config", "injection", "notebook-runtime",
              "kubelet-socket", "plugin-sockets", "checkpoint", "hami-core", "hami-dirs", "cgroups", "process-visibility", "node-annotation",
              "nvidia-plugin", "scheduler-version"}


def by_check(setup):
    findings = run_checks(setup)
    table = {f.check: f for f in findings}
    assert len(table) == len(findings), [f.check for f in findings]
    return table


def test_healthy_node_is_all_ok(healthy):
    findings = by_check(healthy.setup)
    assert set(findings) == ALL_CHECKS
    assert {name: f.status for name, f in findings.items() if f.status != OK} == {}
    assert exit_code(list(findings.values())) == 0
    assert findings["driver"].detail == "driver 550.54.15"
    assert findings["cards"].detail.startswith("4 card(s)")
    assert "RuntimeClass nvidia (handler nvidia, from pod vgpu-system/vgpu-node-x7k2p)" in findings["runtime"].detail
    assert "/usr/bin/nvidia-container-runtime" in findings["runtime"].detail
    assert f"pid 4242 -> pod jhub/jupyter-ann ({healthy.pod_uid})" in findings["cgroups"].detail
    assert "cgroup v2, systemd driver, containerd" in findings["cgroups"].detail
    assert (f"NVML lists pid 4242 on card 0, of pod jhub/jupyter-ann ({healthy.pod_uid})"
            in findings["process-visibility"].detail)
    assert "2 for vGPU resources (1 pod(s))" in findings["checkpoint"].detail
    assert "kube-scheduler v1.32.4 with API server v1.32.0-vgpu-sim" in findings["scheduler-version"].detail


def test_no_driver(healthy):
    healthy.setup.gpus = sim_node(driver_problem="no NVIDIA driver: the NVML library (libnvidia-ml.so.1) is not installed")
    findings = by_check(healthy.setup)
    assert findings["driver"].status == FAIL and "libnvidia-ml.so.1" in findings["driver"].detail
    assert "RuntimeClass" in findings["driver"].remedy
    assert findings["cards"].status == FAIL and exit_code(list(findings.values())) == 1


@pytest.mark.parametrize(("driver", "status", "remedy"), [
    ("418.87.01", FAIL, "upgrade the driver to R525"),
    ("470.239.06", WARN, "upgrade the driver to R525"),
    ("525.60.13", OK, ""),
])
def test_old_driver(healthy, driver, status, remedy):
    healthy.setup.gpus = sim_node(driver=driver)
    finding = by_check(healthy.setup)["driver"]
    assert finding.status == status and finding.detail.startswith(f"driver {driver}")
    assert remedy in finding.remedy


def test_mig_on(healthy):
    healthy.setup.gpus = sim_node(mig=frozenset({1}))
    finding = by_check(healthy.setup)["mig"]
    assert finding.status == WARN and "card(s) [1]: kept out of sharing" in finding.detail
    assert "nvidia-smi -i 1 -mig 0" in finding.remedy
    healthy.setup.gpus = sim_node(mig=frozenset({0, 1, 2, 3}))
    assert by_check(healthy.setup)["mig"].status == FAIL


def test_missing_runtime_class(healthy):
    kubernetes.client.NodeV1Api(healthy.setup.api).delete_runtime_class("nvidia")
    finding = by_check(healthy.setup)["runtime"]
    assert finding.status == FAIL and "RuntimeClass nvidia does not exist" in finding.detail
    assert "handler nvidia" in finding.remedy


def test_no_runtime_class_and_runc_by_default(healthy):
    """k3s / GPU Operator without a default: the daemon's pod names no class, containerd defaults to runc."""
    healthy.setup.runtime_class = ""
    finding = by_check(healthy.setup)["runtime"]
    assert finding.status == FAIL and "runtime 'runc' is runc" in finding.detail
    assert "deploy/components/runtime-class" in finding.remedy and "c.VGPUHub.runtime_class_name" in finding.remedy


def test_runtime_class_without_a_containerd_handler(healthy):
    config = healthy.root / "etc/containerd/config.toml"
    config.write_text(config.read_text().replace("runtimes.nvidia", "runtimes.nvidia-cdi"))
    finding = by_check(healthy.setup)["runtime"]
    assert finding.status == FAIL and "has no runtime 'nvidia'" in finding.detail
    assert "nvidia-ctk runtime configure" in finding.remedy


def test_nvidia_ctk_drop_in_configuration_is_read(healthy):
    """nvidia-ctk --drop-in: config.toml imports conf.d/*.toml, where the nvidia runtime and the default live."""
    config = healthy.root / "etc/containerd/config.toml"
    config.write_text('version = 2\nimports = ["/etc/containerd/conf.d/*.toml"]\n')
    drop_in = healthy.root / "etc/containerd/conf.d"
    drop_in.mkdir()
    (drop_in / "99-nvidia.toml").write_text(CONTAINERD_NVIDIA_DEFAULT.replace('"runc"', '"nvidia"', 1))
    healthy.setup.runtime_class = ""  # rely on the default runtime
    finding = by_check(healthy.setup)["runtime"]
    assert finding.status == OK and "runtime 'nvidia' is /usr/bin/nvidia-container-runtime" in finding.detail


def test_in_a_pod_without_containerds_config_the_injected_driver_is_the_evidence(healthy):
    os.remove(healthy.root / "etc/containerd/config.toml")
    assert by_check(healthy.setup)["runtime"].status == OK
    healthy.setup.gpus = sim_node(driver_problem="no NVIDIA driver: the kernel driver is not loaded")
    assert by_check(healthy.setup)["runtime"].status == FAIL


def test_notebooks_without_the_daemons_runtime_class(healthy):
    limits = {"tencent.com/vcuda-core": "50"}
    healthy.core.create_namespaced_pod("jhub", {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "jupyter-bo"},
                                                "spec": {"nodeName": NODE, "containers": [{
                                                    "name": "notebook", "image": "x", "resources": {"limits": limits}}]}})
    finding = by_check(healthy.setup)["notebook-runtime"]
    assert finding.status == WARN and "jhub/jupyter-bo" in finding.detail
    assert "c.VGPUHub.runtime_class_name = 'nvidia'" in finding.remedy


@pytest.mark.parametrize("which", ["cache", "lock"])
def test_unwritable_hami_dirs(healthy, which):
    path = healthy.root / ("usr/local/vgpu/containers/a1b2c3d4e5f6" if which == "cache" else "tmp/vgpulock")
    path.chmod(0o755)  # what os.makedirs(mode=0o777) gives under umask 022
    finding = by_check(healthy.setup)["hami-dirs"]
    assert finding.status == FAIL and str(path) in finding.detail and "0755" in finding.detail
    assert "chmod 1777" in finding.remedy


def test_hami_library_missing_or_not_preloaded(healthy):
    preload = healthy.root / "usr/local/vgpu/ld.so.preload"
    preload.chmod(0o600)
    finding = by_check(healthy.setup)["hami-core"]
    assert finding.status == FAIL and "not readable by uid" in finding.detail and "chmod 0644" in finding.remedy
    preload.chmod(0o644)
    preload.write_text("/usr/lib/libvgpu.so\n")
    finding = by_check(healthy.setup)["hami-core"]
    assert finding.status == FAIL and "does not name /usr/local/vgpu/libvgpu.so" in finding.detail
    os.remove(healthy.root / "usr/local/vgpu/libvgpu.so")
    finding = by_check(healthy.setup)["hami-core"]
    assert finding.status == FAIL and "libvgpu.so is missing" in finding.detail and "docs/admin.md" in finding.remedy


def test_no_kubelet_socket(healthy):
    healthy.close_socket("kubelet.sock")
    finding = by_check(healthy.setup)["kubelet-socket"]
    assert finding.status == FAIL and "does not accept connections" in finding.detail  # a stale socket file
    os.remove(os.path.join(healthy.setup.plugin_dir, "kubelet.sock"))
    finding = by_check(healthy.setup)["kubelet-socket"]
    assert finding.status == FAIL and "no kubelet.sock" in finding.detail
    assert "--plugin-dir" in finding.remedy


def test_daemon_not_serving(healthy):
    healthy.close_socket("vgpu-core.sock")
    finding = by_check(healthy.setup)["plugin-sockets"]
    assert finding.status == WARN and "vgpu-core.sock" in finding.detail


def test_corrupt_checkpoint(healthy):
    with open(os.path.join(healthy.setup.plugin_dir, "kubelet_internal_checkpoint"), "w") as handle:
        handle.write("{not json")
    finding = by_check(healthy.setup)["checkpoint"]
    assert finding.status == FAIL and "not in kubelet's format" in finding.detail


@pytest.mark.parametrize(("tag", "status", "words"), [
    ("v1.29.0", FAIL, "3 minor versions older"),  # beyond the one minor the policy allows: a failure
    ("v1.30.6", FAIL, "2 minor versions older"),
    ("v1.33.0", FAIL, "newer than the API server"),
    ("v1.31.9", OK, "one minor older"),
])
def test_skewed_scheduler(healthy, tag, status, words):
    """The simulated API server is v1.32.0: kube-scheduler may be 1.32 or 1.31, nothing else."""
    healthy.core.patch_namespaced_pod("vgpu-scheduler-5c9d", NAMESPACE, {"spec": {"containers": [
        {"name": "kube-scheduler", "image": f"registry.k8s.io/kube-scheduler:{tag}"}]}})
    finding = by_check(healthy.setup)["scheduler-version"]
    assert finding.status == status and words in finding.detail, finding
    if status == FAIL:
        # 1.32 has no deploy/components/scheduler-1.32: the remedy is an images: entry of that minor
        assert "newTag: v1.32.<patch>" in finding.remedy and "1.35, 1.36, 1.37" in finding.remedy
        assert exit_code([finding]) == 1


def test_scheduler_without_a_version_component_fails(healthy):
    """deploy/base alone: the kube-scheduler tag no registry has, and the component to add."""
    healthy.core.patch_namespaced_pod("vgpu-scheduler-5c9d", NAMESPACE, {"spec": {"containers": [
        {"name": "kube-scheduler", "image": f"registry.k8s.io/kube-scheduler:{SCHEDULER_TAG_UNSET}"}]}})
    finding = by_check(healthy.setup)["scheduler-version"]
    assert finding.status == FAIL and "has no version" in finding.detail
    assert "deploy/components/scheduler-<minor>" in finding.detail


def test_one_failing_scheduler_pod_fails_the_check(healthy):
    """During a rollout two pods: the worst verdict is the check's."""
    healthy.core.create_namespaced_pod(NAMESPACE, {"apiVersion": "v1", "kind": "Pod", "metadata": {
        "name": "vgpu-scheduler-new", "namespace": NAMESPACE, "labels": {"app.kubernetes.io/name": "vgpu-scheduler"}},
        "spec": {"containers": [{"name": "kube-scheduler", "image": "registry.k8s.io/kube-scheduler:v1.34.1"}]}})
    finding = by_check(healthy.setup)["scheduler-version"]
    assert finding.status == FAIL and "v1.34.1" in finding.detail


@pytest.mark.parametrize(("server", "image", "status", "words"), [
    ("v1.37.2", "registry.k8s.io/kube-scheduler:v1.37.2", OK, "within the version-skew policy"),
    ("v1.37.0-gke.1200", "registry.k8s.io/kube-scheduler:v1.37.2", OK, "within"),  # patches do not count
    ("v1.37.2", "registry.k8s.io/kube-scheduler:v1.36.5", OK, "one minor older"),
    ("v1.37.2", "registry.k8s.io/kube-scheduler:v1.35.6", FAIL, "2 minor versions older"),
    ("v1.36.5", "registry.k8s.io/kube-scheduler:v1.37.2", FAIL, "newer than the API server"),
    ("v1.36.5", "registry.k8s.io/kube-scheduler:v2.0.0", FAIL, "newer than the API server"),
    ("v1.35.6+k3s1", "mirror.example.org:5000/kube-scheduler:v1.35.6@sha256:" + "1" * 64, OK, "within"),
    ("v1.37.2", "registry.k8s.io/kube-scheduler@sha256:" + "0" * 64, WARN, "cannot tell the version"),
    ("garbage", "registry.k8s.io/kube-scheduler:v1.37.2", WARN, "cannot read the API server's version"),
    ("v1.37.2", f"registry.k8s.io/kube-scheduler:{SCHEDULER_TAG_UNSET}", FAIL, "has no version"),
])
def test_scheduler_verdicts_follow_the_skew_policy(server, image, status, words):
    finding = judge_scheduler(server, image)
    assert finding.status == status and words in finding.detail, finding


@pytest.mark.parametrize("server", ["v1.35.6", "v1.36.5", "v1.37.2"])
def test_remedy_names_the_component_of_the_api_servers_minor(server):
    """A minor deploy/ ships a scheduler for: the component to add, not a tag to look up."""
    minor = server[1:].rsplit(".", 1)[0]
    for image in ("registry.k8s.io/kube-scheduler:v1.38.0", f"registry.k8s.io/kube-scheduler:{SCHEDULER_TAG_UNSET}"):
        finding = judge_scheduler(server, image)
        assert finding.status == FAIL and f"deploy/components/scheduler-{minor} " in finding.remedy, finding


def test_no_scheduler_deployed(healthy):
    healthy.core.delete_namespaced_pod("vgpu-scheduler-5c9d", NAMESPACE)
    assert by_check(healthy.setup)["scheduler-version"].status == FAIL


def test_node_annotation_missing_or_reporting_a_problem(healthy):
    key = healthy.setup.names.node_inventory
    healthy.core.patch_node(NODE, {"metadata": {"annotations": {key: None}}})
    finding = by_check(healthy.setup)["node-annotation"]
    assert finding.status == FAIL and f"has no {key} annotation" in finding.detail
    problem = json.dumps({"version": 1, "node": NODE, "cards": [], "problem": "no NVIDIA driver: x"})
    healthy.core.patch_node(NODE, {"metadata": {"annotations": {key: problem}}})
    finding = by_check(healthy.setup)["node-annotation"]
    assert finding.status == FAIL and "no NVIDIA driver" in finding.detail


def test_proc_root_without_pods(healthy):
    """The container's own /proc instead of the host's: nothing maps to a pod."""
    os.remove(healthy.root / "proc/4242/cgroup")
    finding = by_check(healthy.setup)["cgroups"]
    assert finding.status == FAIL and "none of 2 processes maps to a pod" in finding.detail
    assert "--proc-root" in finding.remedy


def test_a_daemon_outside_the_host_pid_namespace_is_told_to_run_with_host_pid(healthy):
    """The driver hides other namespaces' processes; the card's memory in use gives it away."""
    healthy.setup.gpus = healthy.setup.gpus.seen_from("vgpu-node container")
    finding = by_check(healthy.setup)["process-visibility"]
    assert finding.status == FAIL and "card 0: 4000 MiB" in finding.detail
    assert "not in the host's PID namespace" in finding.detail and "hostPID: true" in finding.remedy


def test_process_visibility_is_skipped_without_a_pods_gpu_process(healthy):
    gpus = healthy.setup.gpus
    gpus.stop_process(4242)
    finding = by_check(healthy.setup)["process-visibility"]
    assert finding.status == WARN and finding.detail == "skipped: no GPU process runs on this node"
    assert "run it again while a notebook uses its GPU" in finding.remedy
    gpus.start_process(311, 1, memory_limit_mib=2048, cores_limit=100)  # the host's MPS server
    gpus.set_usage(311, 2000, 0)
    finding = by_check(healthy.setup)["process-visibility"]
    assert finding.status == WARN and "1 GPU process(es), none of another pod" in finding.detail
    # memory in use on a card no vGPU share holds is not evidence either way
    assert "card 1" not in finding.detail


def test_mps_node(healthy):
    healthy.setup.enforcement = "mps"
    findings = by_check(healthy.setup)
    assert findings["mps-daemon"].status == OK and "pid 311" in findings["mps-daemon"].detail
    assert findings["mps-dirs"].status == OK
    assert "hami-core" not in findings


def test_mps_faults(healthy):
    healthy.setup.enforcement = "mps"
    os.remove(healthy.root / "proc/311/comm")
    os.remove(healthy.root / "run/nvidia-mps/control")
    (healthy.root / "run/nvidia-mps/shm").chmod(0o700)
    findings = by_check(healthy.setup)
    assert findings["mps-daemon"].status == FAIL and "nvidia-cuda-mps-control -d" in findings["mps-daemon"].remedy
    assert findings["mps-dirs"].status == FAIL
    assert "no control pipe" in findings["mps-dirs"].detail and "shm not usable" in findings["mps-dirs"].detail
    healthy.setup.mps_shm_dir = None
    assert by_check(healthy.setup)["mps-shm"].status == WARN


def test_a_crashing_check_is_a_failure_and_the_rest_still_run(healthy):
    healthy.setup.mig_mode = lambda index: 1 // 0
    findings = by_check(healthy.setup)
    assert findings["mig"].status == FAIL and "ZeroDivisionError" in findings["mig"].detail
    assert findings["scheduler-version"].status == OK


def test_without_the_api_the_cluster_checks_say_they_were_skipped(healthy):
    healthy.setup.api = None
    findings = by_check(healthy.setup)
    assert findings["node-annotation"].status == WARN and "skipped" in findings["node-annotation"].detail
    assert "notebook-runtime" not in findings
    # no pod to read the class from: the default runtime, which is runc in this containerd config
    assert findings["runtime"].status == FAIL and "the default runtime" in findings["runtime"].detail
    healthy.setup.runtime_class = "nvidia"  # --runtime-class; the handler is assumed to be named alike
    finding = by_check(healthy.setup)["runtime"]
    assert finding.status == OK and "from --runtime-class" in finding.detail


def test_an_unreachable_api_is_a_warning_per_check_not_a_crash(healthy):
    import kubernetes.client

    configuration = kubernetes.client.Configuration()
    configuration.host = "http://127.0.0.1:9"  # nothing listens
    configuration.retries = 0
    healthy.setup.api = kubernetes.client.ApiClient(configuration)
    findings = by_check(healthy.setup)
    assert not [f for f in findings.values() if "the check itself failed" in f.detail]
    for name in ("node-annotation", "scheduler-version", "notebook-runtime"):
        assert findings[name].status == WARN and "cannot" in findings[name].detail, findings[name]
    assert "the node daemon's pod could not be read" in findings["runtime"].detail
    assert findings["cgroups"].status == OK  # the process still maps to a pod uid
