"""``VGPUSettings``: where the notebook's facts come from and how it asks for a share.

One ``Configurable`` read by both the server extension and ``%vgpu`` (each makes one with
``parent=self``), so ``c.VGPUSettings.<name>`` configures both; ``c.VGPUExtension.VGPUSettings.<name>``
or ``c.VGPUMagics.VGPUSettings.<name>`` only one. The source and the requester are chosen
as jupyter-server chooses its managers: a ``Type`` setting names the class.

The settings used to be traits of ``VGPUExtension`` and ``VGPUMagics``; ``SettingsAliases``
keeps those names working (with a deprecation warning) by forwarding them here.
"""

from __future__ import annotations

import os
from typing import Any

from traitlets import Any as AnyTrait
from traitlets import Enum, Float, Int, TraitError, Type, Unicode, default
from traitlets.config import Configurable, LoggingConfigurable

from jupyter_vgpu.core import contract
from jupyter_vgpu.requesters.base import Requester, RequesterSettings
from jupyter_vgpu.requesters.hub import HubRequester
from jupyter_vgpu.requesters.registry import REQUESTERS, make_tracker
from jupyter_vgpu.requesters.tracker import RequestTracker
from jupyter_vgpu.sources.base import FactSource, SourceSettings
from jupyter_vgpu.sources.local_nvml import backend_factory
from jupyter_vgpu.sources.registry import SOURCES, make_source


class VGPUSettings(LoggingConfigurable):
    """Fact source and share requester settings, shared by the server extension and the kernel."""

    source = Enum(
        ("auto", *SOURCES), default_value="auto", config=True,
        help="Where the GPU facts come from: 'auto' detects this project's node API (VGPU_* env), "
             "a TKEStack gpu-manager container (/etc/vcuda), local NVIDIA GPUs (NVML), or none. "
             "In a kernel, 'auto' also honours $JUPYTER_VGPU_SOURCE (set by the server extension).",
    )
    source_class = Type(
        None, klass=FactSource, allow_none=True, config=True,
        help="A FactSource subclass (or its import string) to read the facts from instead of the "
             "named source; built with these settings.",
    )
    metrics_url = Unicode(
        "", config=True,
        help="Base URL of the node metrics server (default: $VGPU_METRICS_URL).",
    )
    token = Unicode(
        "", config=True,
        help="Read token for the node metrics server (default: $VGPU_TOKEN).",
    )
    gpu_manager_metric_url = Unicode(
        "", config=True,
        help="gpu-manager's Prometheus /metric URL (default: http://$HOST_IP:5678/metric).",
    )
    vcuda_config_dir = Unicode(
        contract.GM_VCUDA_CONFIG_DIR, config=True,
        help="Where gpu-manager mounts vcuda.config into the container.",
    )
    local_backend = Unicode(
        "nvml", config=True,
        help="GPU backend of the 'local-nvml' source: 'nvml', or 'simulated:<path to an "
             "`nvidia-smi topo -m` capture>' to try the views on a machine without GPUs.",
    )
    timeout = Float(5.0, config=True, help="Seconds to wait for the node metrics server or gpu-manager.")
    history_limit = Int(3600, config=True, help="Usage points kept by sources whose peer keeps no history.")
    requester_class = Type(
        HubRequester, klass=Requester, allow_none=True, config=True,
        help="The Requester class (or its import string) that carries out share requests: "
             "HubRequester restarts the server through JupyterHub; the simulated cluster's demo sets "
             "'vgpu_plugin.demo.requester.KubeRecreateRequester'; None turns requests off. "
             "In a kernel the default is the server extension's choice ($JUPYTER_VGPU_REQUESTER).",
    )
    kubeconfig = Unicode(
        "", config=True,
        help="kubeconfig for a requester that goes through the Kubernetes API "
             "(default: $JUPYTER_VGPU_KUBECONFIG).",
    )
    request_timeout = Float(300.0, config=True, help="Seconds a share request may stay pending.")

    @default("kubeconfig")
    def _kubeconfig_default(self) -> str:
        return os.environ.get(contract.ENV_NOTEBOOK_KUBECONFIG, "")

    @default("requester_class")
    def _requester_class_default(self) -> Any:
        passed_on = os.environ.get(contract.ENV_NOTEBOOK_REQUESTER, "")
        if passed_on == "none":
            return None
        return passed_on or HubRequester

    def source_settings(self) -> SourceSettings:
        """What the adapters read; ValueError for a bad ``local_backend``."""
        return SourceSettings(
            source=self.source, metrics_url=self.metrics_url, token=self.token,
            gpu_manager_metric_url=self.gpu_manager_metric_url, vcuda_config_dir=self.vcuda_config_dir,
            timeout=self.timeout, history_limit=self.history_limit,
            backend_factory=backend_factory(self.local_backend),
        )

    def make_source(self) -> FactSource:
        """The configured source; ValueError says what is wrong with the settings."""
        if self.source_class is not None:
            return self.source_class.from_settings(self.source_settings())
        return make_source(self.source_settings())

    def make_tracker(self) -> RequestTracker:
        """A tracker over the configured requester; a bad class name fails every request with why."""
        try:
            requester_class: Any = self.requester_class
        except (TraitError, ImportError) as error:
            return RequestTracker(None, f"jupyter-vgpu is misconfigured: requester_class: {error}")
        settings = RequesterSettings(environ=os.environ, timeout=self.request_timeout, kubeconfig=self.kubeconfig)
        return make_tracker(requester_class, settings)

    def pass_on_to_kernels(self) -> None:
        """Kernels started by this server read the facts and ask for shares the same way."""
        if self.source != "auto":
            os.environ[contract.ENV_NOTEBOOK_SOURCE] = self.source
        if self.trait_has_value("requester_class"):
            chosen = self.requester_class
            os.environ[contract.ENV_NOTEBOOK_REQUESTER] = (
                "none" if chosen is None else f"{chosen.__module__}.{chosen.__qualname__}")


def _deprecated(name: str) -> Any:
    return AnyTrait(None, allow_none=True, config=True, help=f"Deprecated: use c.VGPUSettings.{name}.")


class SettingsAliases(Configurable):
    """The former names (``c.VGPUExtension.source``, ``c.VGPUMagics.token``...), forwarded to
    ``VGPUSettings`` with a warning; a name set on ``VGPUSettings`` itself wins."""

    source = _deprecated("source")
    metrics_url = _deprecated("metrics_url")
    token = _deprecated("token")
    gpu_manager_metric_url = _deprecated("gpu_manager_metric_url")
    vcuda_config_dir = _deprecated("vcuda_config_dir")
    local_backend = _deprecated("local_backend")
    timeout = _deprecated("timeout")
    history_limit = _deprecated("history_limit")
    kubeconfig = _deprecated("kubeconfig")
    request_timeout = _deprecated("request_timeout")
    requester = AnyTrait(
        None, allow_none=True, config=True,
        help="Deprecated: use c.VGPUSettings.requester_class ('jupyterhub' is HubRequester, 'none' is None).",
    )

    def make_vgpu_settings(self) -> VGPUSettings:
        settings = VGPUSettings(parent=self)
        owner = type(self).__name__
        for name in SettingsAliases.class_own_traits(config=True):
            value = getattr(self, name)
            target = "requester_class" if name == "requester" else name
            if value is None or settings.trait_has_value(target):
                continue
            if name == "requester":
                if value not in REQUESTERS:
                    settings.log.error("c.%s.requester = %r is no longer built in: set c.VGPUSettings.requester_class "
                                       "to the requester's class (the simulated cluster's is "
                                       "'vgpu_plugin.demo.requester.KubeRecreateRequester')", owner, value)
                    continue
                value = REQUESTERS[value]
            elif isinstance(value, str):
                value = settings.traits()[target].from_string(value)  # from the command line
            settings.log.warning("c.%s.%s is deprecated: use c.VGPUSettings.%s", owner, name, target)
            setattr(settings, target, value)
        return settings
