"""VGPUSettings: one set of source/requester settings for the server extension and the kernel,
the classes chosen by Type settings, and the former names forwarded with a warning."""

from __future__ import annotations

import logging
import os

import pytest
from traitlets.config import Config

from jupyter_vgpu.core import contract
from jupyter_vgpu.requesters.hub import NOT_UNDER_HUB, HubRequester
from jupyter_vgpu.requesters.registry import TURNED_OFF
from jupyter_vgpu.settings import SettingsAliases, VGPUSettings
from jupyter_vgpu.sources.base import FactSource, NoVGPUSource, SourceSettings, allocation_answer
from jupyter_vgpu.sources.node_api import NodeAPISource


class Owner(SettingsAliases):
    """Stands for VGPUExtension / VGPUMagics: a Configurable that keeps the former names."""


class FixedSource(FactSource):
    """A source from outside jupyter-vgpu, plugged in through source_class."""

    name = "fixed"

    def __init__(self, settings: SourceSettings) -> None:
        self.timeout = settings.timeout

    def allocation(self):
        return allocation_answer("none", self.name, None, "fixed")

    def topology(self):
        return {}

    def usage(self, history_seconds: float = 0):
        return {}


def settings_of(config: dict) -> VGPUSettings:
    return Owner(config=Config(config)).make_vgpu_settings()


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (contract.ENV_NOTEBOOK_SOURCE, contract.ENV_NOTEBOOK_REQUESTER, contract.ENV_NOTEBOOK_KUBECONFIG,
                 "JUPYTERHUB_API_URL", "JUPYTERHUB_API_TOKEN", "JUPYTERHUB_USER"):
        monkeypatch.delenv(name, raising=False)


def test_settings_apply_to_every_owner_and_one_owner_can_differ():
    config = {"VGPUSettings": {"source": "none", "timeout": 2.0}, "Owner": {"VGPUSettings": {"timeout": 7.0}}}
    settings = settings_of(config)
    assert (settings.source, settings.timeout) == ("none", 7.0)
    assert VGPUSettings(config=Config(config)).timeout == 2.0


def test_former_names_are_forwarded_with_a_warning_and_lose_to_the_new_ones(caplog):
    with caplog.at_level(logging.WARNING):
        settings = settings_of({"Owner": {"source": "gpu-manager", "timeout": "3.5", "token": "t"},
                                "VGPUSettings": {"token": "new"}})
    assert (settings.source, settings.timeout, settings.token) == ("gpu-manager", 3.5, "new")  # "3.5": a CLI string
    said = caplog.text
    assert "c.Owner.source is deprecated: use c.VGPUSettings.source" in said
    assert "c.Owner.timeout is deprecated" in said and "c.Owner.token" not in said


def test_former_requester_names(caplog):
    assert settings_of({"Owner": {"requester": "none"}}).requester_class is None
    assert settings_of({"Owner": {"requester": "jupyterhub"}}).requester_class is HubRequester
    with caplog.at_level(logging.ERROR):
        kube = settings_of({"Owner": {"requester": "kube"}})
    assert kube.requester_class is HubRequester
    assert "vgpu_plugin.demo.requester.KubeRecreateRequester" in caplog.text


def test_source_class_plugs_in_a_source_from_an_import_string():
    settings = settings_of({"VGPUSettings": {"source_class": f"{__name__}.FixedSource", "timeout": 9.0}})
    source = settings.make_source()
    assert isinstance(source, FixedSource) and source.timeout == 9.0
    assert settings_of({"VGPUSettings": {"source": "none"}}).make_source().name == NoVGPUSource.name
    with pytest.raises(Exception, match="FactSource"):
        settings_of({"VGPUSettings": {"source_class": "jupyter_vgpu.requesters.hub.HubRequester"}})


def test_the_requester_class_and_why_a_request_cannot_be_made(monkeypatch):
    assert settings_of({}).make_tracker().unavailable_reason == NOT_UNDER_HUB
    assert settings_of({"VGPUSettings": {"requester_class": None}}).make_tracker().unavailable_reason == TURNED_OFF
    monkeypatch.setenv("JUPYTERHUB_API_URL", "http://127.0.0.1:1/hub/api")
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", "t")
    monkeypatch.setenv("JUPYTERHUB_USER", "alice")
    assert isinstance(settings_of({}).make_tracker().requester, HubRequester)
    monkeypatch.setenv(contract.ENV_NOTEBOOK_REQUESTER, "no.such.Requester")
    reason = settings_of({}).make_tracker().unavailable_reason
    assert reason.startswith("jupyter-vgpu is misconfigured: requester_class") and "no.such" in reason
    monkeypatch.setenv(contract.ENV_NOTEBOOK_REQUESTER, "none")
    assert settings_of({}).make_tracker().unavailable_reason == TURNED_OFF


def test_the_server_passes_its_choices_on_to_its_kernels(monkeypatch):
    settings_of({"VGPUSettings": {"source": "node-api", "requester_class": None}}).pass_on_to_kernels()
    assert os.environ[contract.ENV_NOTEBOOK_SOURCE] == "node-api"
    assert os.environ[contract.ENV_NOTEBOOK_REQUESTER] == "none"
    kernel = settings_of({})  # a kernel started by that server
    assert kernel.requester_class is None and isinstance(kernel.make_source(), NodeAPISource)
    settings_of({"VGPUSettings": {"requester_class": f"{HubRequester.__module__}.HubRequester"}}).pass_on_to_kernels()
    assert os.environ[contract.ENV_NOTEBOOK_REQUESTER] == "jupyter_vgpu.requesters.hub.HubRequester"
