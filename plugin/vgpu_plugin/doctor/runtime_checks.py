"""Which container runtime gives pods the GPUs: containerd's configuration and RuntimeClass.

Where nvidia is not containerd's default runtime (k3s/RKE2, the GPU Operator with the
default left alone) a pod gets the NVIDIA driver only with a RuntimeClass whose handler
is the NVIDIA runtime. The daemon's own pod says which class it runs with.
"""

from __future__ import annotations

import glob
import os
from typing import Any

from .report import FAIL, OK, WARN, Finding
from .setup import NodeSetup

# where containerd's CRI configuration lives: plain containerd, k3s, RKE2
CONTAINERD_CONFIGS = (
    "/etc/containerd/config.toml",
    "/var/lib/rancher/k3s/agent/etc/containerd/config.toml",
    "/var/lib/rancher/rke2/agent/etc/containerd/config.toml",
)
# the CRI plugin's table: containerd 1.x config version 2, containerd 2.x version 3
_CRI_TABLES = ("io.containerd.grpc.v1.cri", "io.containerd.cri.v1.runtime")
CLASS_REMEDY = ("add deploy/components/runtime-class to your overlay (runtimeClassName: nvidia) and set "
                "c.VGPUHub.runtime_class_name = 'nvidia', or make nvidia containerd's default runtime "
                "(nvidia-ctk runtime configure --runtime=containerd --set-as-default)")


def _toml(text: str) -> dict[str, Any]:
    try:
        import tomllib
    except ImportError:
        raise ValueError("reading it needs Python 3.11 or later (tomllib)") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise ValueError(f"not valid TOML: {error}") from None


def _cri_settings(data: dict[str, Any]) -> tuple[str | None, dict[str, str]]:
    """(default runtime name or None when unset, {handler: binary}) of one parsed file."""
    plugins = data.get("plugins") or {}
    for table in _CRI_TABLES:
        containerd = (plugins.get(table) or {}).get("containerd")
        if isinstance(containerd, dict):
            runtimes = containerd.get("runtimes") or {}
            binaries = {name: str(((spec or {}).get("options") or {}).get("BinaryName", "runc"))
                        for name, spec in runtimes.items() if isinstance(spec, dict)}
            return containerd.get("default_runtime_name"), binaries
    return None, {}


def containerd_runtimes(text: str, read_import: Any = None) -> tuple[str | None, dict[str, str]]:
    """(default runtime name, {handler: binary}) from a containerd config.toml.

    Files named by its ``imports`` (nvidia-ctk's drop-in, /etc/containerd/conf.d/*.toml)
    are merged in order, later ones winning, as containerd does; ``read_import(pattern)``
    returns their texts. The default runtime is runc unless a file sets another.
    """
    data = _toml(text)
    default, runtimes = _cri_settings(data)
    for pattern in data.get("imports") or []:
        for imported in (read_import(str(pattern)) if read_import else []):
            more_default, more = _cri_settings(_toml(imported))
            default = more_default or default
            runtimes.update(more)
    if default is None and not runtimes:
        return None, {}
    return default or "runc", runtimes


def _read_containerd(setup: NodeSetup) -> tuple[str, str | None, dict[str, str]] | None:
    for path in CONTAINERD_CONFIGS:

        def read_import(pattern: str, config: str = path) -> list[str]:
            # relative imports are relative to the importing file's directory
            absolute = pattern if pattern.startswith("/") else os.path.join(os.path.dirname(config), pattern)
            texts = []
            for found in sorted(glob.glob(setup.host(absolute))):
                with open(found, encoding="utf-8") as handle:
                    texts.append(handle.read())
            return texts

        full = setup.host(path)
        try:
            with open(full, encoding="utf-8") as handle:
                text = handle.read()
        except OSError:
            continue
        try:
            default, runtimes = containerd_runtimes(text, read_import)
        except (ValueError, OSError) as error:
            raise ValueError(f"{path}: {error}") from None
        return path, default, runtimes
    return None


def _daemon_class(setup: NodeSetup) -> tuple[str | None, str]:
    """The class the node daemon runs with, and where that came from."""
    if setup.runtime_class is not None:
        return setup.runtime_class or None, "--runtime-class"
    if setup.api is not None and setup.node:
        from .cluster_checks import api_errors, daemon_pod

        try:
            pod = daemon_pod(setup)
        except api_errors() as error:
            return None, f"default; the node daemon's pod could not be read: {error}"
        if pod is not None:
            return pod.spec.runtime_class_name, f"pod {pod.metadata.namespace}/{pod.metadata.name}"
    return None, "default"


def _handler(setup: NodeSetup, name: str) -> tuple[str | None, Finding | None]:
    """The RuntimeClass's handler; a failing Finding when the class does not exist."""
    if setup.api is None:
        return name, None  # the usual convention: handler named like the class
    from kubernetes import client

    from .cluster_checks import api_errors

    try:
        runtime_class: Any = client.NodeV1Api(setup.api).read_runtime_class(name)
    except api_errors() as error:
        if getattr(error, "status", None) == 404:
            return None, Finding("runtime", FAIL, f"RuntimeClass {name} does not exist: pods naming it are "
                                                  "refused", f"create RuntimeClass {name} with handler nvidia (the "
                                                  "runtime's name in containerd's config; docs/admin.md), or "
                                                  "install the GPU Operator, which creates it")
        return name, None
    return runtime_class.handler, None


def check_runtime(setup: NodeSetup) -> Finding:
    name, source = _daemon_class(setup)
    handler = None
    if name:
        handler, missing = _handler(setup, name)
        if missing is not None:
            return missing
    used = (f"RuntimeClass {name} (handler {handler}, from {source})" if name else
            "the default runtime" + ("" if source == "default" else f" ({source})"))
    try:
        config = _read_containerd(setup)
    except ValueError as error:
        return Finding("runtime", WARN, f"{used}; cannot read containerd's configuration: {error}",
                       "check it with `containerd config dump`")
    if config is None:
        # in a pod without containerd's config: the driver being there is the runtime's doing
        if setup.gpus.available():
            return Finding("runtime", OK, f"{used}: the NVIDIA runtime injected the driver")
        return Finding("runtime", FAIL, f"{used}: no NVIDIA driver in this container", CLASS_REMEDY)
    path, default, runtimes = config
    if not runtimes and default is None:
        return Finding("runtime", WARN, f"{path} has no CRI runtimes table: cannot tell which runtime pods get",
                       "check containerd's configuration (containerd config dump)")
    wanted = handler if name else default
    binary = runtimes.get(wanted or "")
    if binary is None and wanted != "runc":
        return Finding("runtime", FAIL, f"{used}: containerd ({path}) has no runtime {wanted!r} "
                                        f"(it has {', '.join(sorted(runtimes)) or 'none'})",
                       "configure it: nvidia-ctk runtime configure --runtime=containerd, restart containerd")
    if "nvidia" not in (binary or ""):
        return Finding("runtime", FAIL, f"{used}: containerd's runtime {wanted!r} is {binary or 'runc'}, "
                                        "not the NVIDIA runtime: pods get no driver and no GPU", CLASS_REMEDY)
    return Finding("runtime", OK, f"{used}: containerd runtime {wanted!r} is {binary}")
