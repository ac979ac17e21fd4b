"""The fact sources by the names users configure, and ``auto``: the first that fits."""

from __future__ import annotations

from jupyter_vgpu.core import contract
from jupyter_vgpu.sources.base import FactSource, NoVGPUSource, SourceSettings
from jupyter_vgpu.sources.gpu_manager import GpuManagerSource
from jupyter_vgpu.sources.local_nvml import LocalGPUSource
from jupyter_vgpu.sources.node_api import NodeAPISource

# in detection order: this project's node API, a gpu-manager container, local NVIDIA GPUs, none
SOURCES: dict[str, type[FactSource]] = {
    NodeAPISource.name: NodeAPISource,
    GpuManagerSource.name: GpuManagerSource,
    LocalGPUSource.name: LocalGPUSource,
    NoVGPUSource.name: NoVGPUSource,
}


def detect(settings: SourceSettings) -> str:
    """The name of the first source that serves this environment ('none' when nothing does)."""
    return next((name for name, source in SOURCES.items() if source.detected(settings)), NoVGPUSource.name)


def make_source(settings: SourceSettings) -> FactSource:
    """The configured source; ``auto`` (also from $JUPYTER_VGPU_SOURCE) detects one."""
    name = settings.source or "auto"
    if name == "auto":
        name = settings.environ.get(contract.ENV_NOTEBOOK_SOURCE) or "auto"
    if name == "auto":
        name = detect(settings)
    source = SOURCES.get(name)
    if source is None:
        raise ValueError(f"unknown vGPU fact source {name!r}; choose one of auto, {', '.join(SOURCES)}")
    return source.from_settings(settings)
