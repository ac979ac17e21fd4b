"""The fragment policy through the real extender: CPU/memory headroom from the informer, the
task mix learned from the pods it is asked about, and the policy selectable by flag."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest
from extender_support import GIB_UNITS, NAMES, binding_args, filter_args, node, pod, post
from simkube.waiting import wait_for
from vgpu_plugin.extender.headroom import pod_cpu_memory, quantity

EXE = shutil.which("jupyter-vgpu", path=os.path.dirname(sys.executable)) or shutil.which("jupyter-vgpu")


@pytest.fixture
def cpu_starved(cluster):
    """Two identical GPU nodes; a CPU-only pod has taken 7 of gpu-a's 8 cores."""
    cluster.add_node(node("gpu-a", count=2, cpu="8", memory="64Gi"))
    cluster.add_node(node("gpu-b", count=2, cpu="8", memory="64Gi"))
    cluster.policy = "fragment"
    cluster.start_extender()
    busy = pod("cpu-job", cores=None, memory_units=None)
    busy["spec"]["containers"][0]["resources"] = {"requests": {"cpu": "7", "memory": "8Gi"}}
    busy["spec"]["nodeName"] = "gpu-a"
    cluster.add_pod(busy)
    hosts = cluster.extender.decisions.hosts
    wait_for(lambda: hosts.headroom("gpu-a") is not None and hosts.headroom("gpu-a").cpu_milli == 1000,
             timeout=20, what="the informer to count the CPU-only pod")
    return cluster


def test_headroom_comes_from_allocatable_minus_bound_pods(cpu_starved):
    hosts = cpu_starved.extender.decisions.hosts
    assert (hosts.headroom("gpu-a").cpu_milli, hosts.headroom("gpu-a").memory_mib) == (1000, 56 * 1024)
    assert (hosts.headroom("gpu-b").cpu_milli, hosts.headroom("gpu-b").memory_mib) == (8000, 64 * 1024)
    assert hosts.headroom("no-such-node") is None


def test_fragment_prefers_the_node_whose_cards_it_would_not_strand(cpu_starved):
    """A notebook asking 1 CPU on gpu-a would leave it no CPU: its other card is stranded.
    binpack cannot tell the nodes apart; fragment prefers gpu-b, and bind follows."""
    cluster = cpu_starved
    first = cluster.add_pod(pod("nb-1", cores=25, memory_units=4 * GIB_UNITS))
    status, scores = post(f"{cluster.url}/prioritize", filter_args(first, ["gpu-a", "gpu-b"]))
    assert status == 200
    by_host = {p["Host"]: p["Score"] for p in scores}
    assert 1 <= by_host["gpu-a"] < by_host["gpu-b"] <= 10
    binpack = cluster.add_pod(pod("nb-2", cores=25, memory_units=4 * GIB_UNITS,
                                  annotations={NAMES.policy: "binpack"}))
    status, scores = post(f"{cluster.url}/prioritize", filter_args(binpack, ["gpu-a", "gpu-b"]))
    assert len({p["Score"] for p in scores}) == 1
    assert post(f"{cluster.url}/bind", binding_args(first, "gpu-b"))[1] == {"Error": ""}
    assert cluster.read_pod("nb-1")["spec"]["nodeName"] == "gpu-b"


def test_the_mix_counts_each_pod_once_and_stays_bounded(cpu_starved):
    cluster = cpu_starved
    decisions = cluster.extender.decisions
    created = cluster.add_pod(pod("nb-1", cores=40, memory_units=4 * GIB_UNITS))
    for _ in range(3):
        assert post(f"{cluster.url}/prioritize", filter_args(created, ["gpu-a", "gpu-b"]))[0] == 200
    shapes = dict(decisions.mix.mix().shapes)
    assert len(shapes) == 1 and next(iter(shapes)).cores == 40
    for i in range(decisions.mix.capacity + 5):
        other = cluster.add_pod(pod(f"nb-x{i}", cores=1 + i, memory_units=GIB_UNITS))
        assert post(f"{cluster.url}/prioritize", filter_args(other, ["gpu-b"]))[0] == 200
    assert len(decisions.mix) <= decisions.mix.capacity


def test_bad_quantities_count_as_nothing():
    assert quantity("500m") == quantity("0.5") and quantity("1Gi") == 2**30 and quantity("2k") == 2000
    for bad in ("", "lots", "-1", "1Xi", None, True, "1" * 80, "nan", "inf"):
        assert quantity(bad) is None
    hostile = {"spec": {"containers": [{"resources": {"requests": {"cpu": "lots", "memory": ["x"]}}},
                                       {"resources": "nope"}, "not a container"],
                        "initContainers": [{"resources": {"requests": {"cpu": "3"}}}],
                        "overhead": {"memory": "1Mi"}}}
    assert pod_cpu_memory(hostile) == (3000, 1)
    assert pod_cpu_memory({"spec": "nope"}) == (0, 0)


def test_policy_flag_accepts_fragment():
    out = subprocess.run([EXE, "extender", "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and "fragment" in out.stdout
