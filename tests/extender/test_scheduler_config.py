"""deploy/scheduler/config.yaml: a valid kubescheduler.config.k8s.io/v1 configuration that
wires every verb of this extender, and a validator that catches the typos kube-scheduler would."""

from __future__ import annotations

import copy
import pathlib

import pytest
import yaml
from simkube.scheduler import ConfigError, load_config, parse_config
from vgpu_plugin.demo.cluster import scheduler_config_path
from vgpu_plugin.extender.server import DEFAULT_PORT, DEFAULT_PREFIX

from jupyter_vgpu.core import contract

REPO = pathlib.Path(__file__).resolve().parents[2]
CONFIG = REPO / "deploy" / "scheduler" / "config.yaml"


def raw() -> dict:
    return yaml.safe_load(CONFIG.read_text())


def test_the_deployed_configuration_loads_and_wires_the_extender():
    assert scheduler_config_path() == CONFIG
    config = load_config(CONFIG)
    assert config.profiles == (contract.SCHEDULER_NAME,)
    (ext,) = config.extenders
    assert ext.url_prefix == f"http://127.0.0.1:{DEFAULT_PORT}{DEFAULT_PREFIX}"
    assert (ext.filter_verb, ext.prioritize_verb, ext.bind_verb) == ("filter", "prioritize", "bind")
    assert ext.node_cache_capable is True
    assert ext.weight > 0 and ext.http_timeout == 30.0 and ext.ignorable is False
    names = contract.DEFAULT_NAMES
    assert dict(ext.managed_resources) == {names.core_resource: False, names.memory_resource: False}
    lease = raw()["leaderElection"]
    assert lease["resourceName"] == contract.SCHEDULER_NAME  # deploy/base grants exactly this lease


@pytest.mark.parametrize("mutate, words", [
    (lambda c: c["extenders"][0].update(nodeCacheCapabel=True), "unknown field 'nodeCacheCapabel'"),
    (lambda c: c["extenders"][0].update(urlprefix="http://x"), "did you mean 'urlPrefix'"),
    (lambda c: c.update(schedulerName="vgpu-scheduler"), "unknown field 'schedulerName'"),
    (lambda c: c["profiles"][0].update(plugins={"filters": {}}), "unknown field 'filters'"),
    (lambda c: c["extenders"][0]["managedResources"][0].update(ignoredByScheduler="no"), "expected bool"),
    (lambda c: c["extenders"][0].update(httpTimeout="30 seconds"), "not a duration"),
    (lambda c: c["extenders"][0].update(weight=0), "must be positive"),
    (lambda c: c["extenders"].append(dict(c["extenders"][0])), "only one extender may implement bind"),
    (lambda c: c["extenders"][0]["managedResources"].append({"name": "cpu"}), "not an extended resource"),
    (lambda c: c.update(apiVersion="kubescheduler.config.k8s.io/v1beta3"), "apiVersion/kind"),
    (lambda c: c["extenders"][0].pop("urlPrefix"), "urlPrefix is required"),
])
def test_typos_and_invalid_values_are_refused(mutate, words):
    config = copy.deepcopy(raw())
    mutate(config)
    with pytest.raises(ConfigError, match=None) as caught:
        parse_config(config)
    assert words in str(caught.value)


def test_errors_name_the_file(tmp_path):
    broken = tmp_path / "config.yaml"
    broken.write_text(CONFIG.read_text().replace("nodeCacheCapable", "nodeCachecapable "))
    with pytest.raises(ConfigError) as caught:
        load_config(broken)
    assert str(broken) in str(caught.value) and "nodeCachecapable" in str(caught.value)


def test_extender_url_can_be_pointed_elsewhere():
    config = load_config(CONFIG).with_extender_url("http://127.0.0.1:40123")
    assert config.extenders[0].url("filter") == "http://127.0.0.1:40123/scheduler/filter"
