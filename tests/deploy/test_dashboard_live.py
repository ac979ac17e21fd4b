"""The Grafana dashboard against what a node daemon really serves.

A simulated cluster runs one notebook pod; its node daemon's /metrics is scraped (scrape port,
bearer token, as the ServiceMonitor does) and every
series the dashboard queries must be there with the labels the dashboard uses.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import tempfile
import urllib.request

import pytest
from deploy_support import DEPLOY
from prometheus_client.parser import text_string_to_metric_families
from simkube.waiting import wait_for


@pytest.mark.slow
def test_every_dashboard_series_is_served_with_its_labels(topology_fixtures):
    from vgpu_plugin.demo.cluster import NodeSpec, SimCluster

    dashboard = json.loads((DEPLOY / "components" / "monitoring" / "dashboard.json").read_text())
    targets = [t for p in dashboard["panels"] for t in p["targets"]]
    wanted: dict[str, set[str]] = {}
    for target in targets:
        legend = set(re.findall(r"\{\{(\w+)\}\}", target.get("legendFormat", "")))
        for name in re.findall(r"\bvgpu_[a-z_]+\b", target["expr"]):
            wanted.setdefault(name, set()).update(legend)

    workdir = tempfile.mkdtemp(prefix="vgdash-", dir="/tmp")
    try:
        with SimCluster([NodeSpec("gpu-a", "a100-sxm-4gpu-nv4.txt")], workdir=workdir,
                        fixtures_dir=topology_fixtures, metrics_period=0.2) as cluster:
            cluster.create_notebook_pod("alice", cores=25, memory="8GiB")
            cluster.wait_for_pod("default", "alice")
            served: dict[str, set[str]] = {}

            def all_served() -> bool:
                request = urllib.request.Request(cluster.node("gpu-a").scrape_url + "/metrics",
                                                 headers={"Authorization": f"Bearer {cluster.scrape_token}"})
                with urllib.request.urlopen(request, timeout=10) as response:
                    text = response.read().decode()
                for family in text_string_to_metric_families(text):
                    for sample in family.samples:
                        served.setdefault(sample.name, set()).update(sample.labels)
                return set(wanted) <= set(served)

            with contextlib.suppress(TimeoutError):  # the assertions below name what is missing
                wait_for(all_served, timeout=30, interval=0.3, what="every series the dashboard queries")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    missing = set(wanted) - set(served)
    assert not missing, f"the dashboard queries series the daemon does not serve: {sorted(missing)}"
    for name, labels in wanted.items():
        assert labels <= served[name], f"{name}: the dashboard uses labels {labels - served[name]} it does not have"
