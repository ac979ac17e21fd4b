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


# The NVIDIA Container Toolkit's config.toml: where the runtime reads it (/etc, its default)
# and where the GPU Operator's toolkit container writes it (<installDir>/toolkit/.config)
TOOLKIT_CONFIGS = (
    "/etc/nvidia-container-runtime/config.toml",
    "/usr/local/nvidia/toolkit/.config/nvidia-container-runtime/config.toml",
)
ENVVAR_KEY = "accept-nvidia-visible-devices-envvar-when-unprivileged"  # the toolkit's default: true
MOUNTS_KEY = "accept-nvidia-visible-devices-as-volume-mounts"  # the toolkit's default: false
ENVVAR_REMEDY = (f"set {ENVVAR_KEY} = false in the toolkit's config.toml (GPU Operator: toolkit.env "
                 "ACCEPT_NVIDIA_VISIBLE_DEVICES_ENVVAR_WHEN_UNPRIVILEGED=false) and run the device plugin "
                 "with --cdi=true (VGPU_CDI), so that vGPU pods get their cards as CDI devices "
                 "(docs/security.md, \"Cards outside the scheduler\")")


def _read_toolkit_config(setup: NodeSetup) -> tuple[str, str] | None:
    """(path as on the host, text) of the first toolkit config.toml found, or None."""
    for path in (setup.toolkit_config,) if setup.toolkit_config else TOOLKIT_CONFIGS:
        try:
            with open(setup.host(path), encoding="utf-8") as handle:
                return path, handle.read()
        except FileNotFoundError:
            continue
    return None


def check_toolkit_config(setup: NodeSetup) -> Finding:
    """Whether a pod that asks for no GPU can still select cards by NVIDIA_VISIBLE_DEVICES (an image's
    ENV NVIDIA_VISIBLE_DEVICES=all gets every card, outside the scheduler)."""
    where = setup.toolkit_config or " or ".join(TOOLKIT_CONFIGS)
    try:
        found = _read_toolkit_config(setup)
    except OSError as error:
        return Finding("toolkit-config", WARN, f"cannot read the NVIDIA Container Toolkit's config: {error}",
                       "run the doctor on the host as root")
    if found is None:
        return Finding("toolkit-config", WARN,
                       f"not available: no {where} under {setup.host_root}; cannot tell whether unprivileged pods "
                       "may select GPUs by NVIDIA_VISIBLE_DEVICES (without the file the toolkit accepts it)",
                       "run the doctor on the host (the vgpu-node pod does not mount the host's /etc), or pass "
                       "--host-root / --toolkit-config")
    path, text = found
    try:
        data = _toml(text)
    except ValueError as error:
        return Finding("toolkit-config", WARN, f"{path}: {error}",
                       "fix the file: the NVIDIA runtime cannot load it either")
    accepts = data.get(ENVVAR_KEY, True)
    if accepts is not False:
        how = f"= {str(accepts).lower()}" if ENVVAR_KEY in data else "is not set (the toolkit's default is true)"
        return Finding("toolkit-config", WARN,
                       f"{path}: {ENVVAR_KEY} {how}: any pod whose image or spec sets NVIDIA_VISIBLE_DEVICES=all "
                       "gets every card on this node, outside the scheduler and the vGPU limits", ENVVAR_REMEDY)
    detail = f"{path}: {ENVVAR_KEY} = false: unprivileged pods cannot select GPUs by NVIDIA_VISIBLE_DEVICES"
    if setup.cdi:
        return Finding("toolkit-config", OK, detail + "; the device plugin names cards as CDI devices (--cdi)")
    mounts = data.get(MOUNTS_KEY, False) is True
    return Finding("toolkit-config", WARN,
                   detail + ", the way the device plugin hands a vGPU pod its cards unless it runs with --cdi"
                   + (f" ({MOUNTS_KEY} does not help: it passes no device list as volume mounts)" if mounts else "")
                   + ": vGPU pods get no GPU",
                   "run the device plugin with --cdi=true (VGPU_CDI; the doctor reads it too) on a containerd with "
                   "CDI enabled and a CDI spec naming the cards by UUID (nvidia-ctk cdi generate)")


# containerd's and CRI-O's default CDI spec directories; NVIDIA's tools write to either
CDI_SPEC_DIRS = ("/etc/cdi", "/var/run/cdi")
CDI_KIND = "nvidia.com/gpu"
CDI_REMEDY = ("generate the spec with the cards named by UUID: nvidia-ctk cdi generate --device-name-strategy=uuid "
              "--output=/var/run/cdi/nvidia.yaml (the GPU Operator writes its own: `nvidia-ctk cdi list` must show "
              "nvidia.com/gpu=GPU-...), or run the device plugin without --cdi")


def _cdi_device_names(setup: NodeSetup) -> tuple[dict[str, str], list[str]] | None:
    """Device name -> the spec file naming it, for every nvidia.com/gpu spec in the CDI dirs, and the
    files that could not be read; None when neither directory exists where the doctor runs."""
    import yaml

    dirs = [setup.host(d) for d in CDI_SPEC_DIRS if os.path.isdir(setup.host(d))]
    if not dirs:
        return None
    names: dict[str, str] = {}
    unreadable: list[str] = []
    for directory in dirs:
        for path in sorted(glob.glob(os.path.join(directory, "*"))):
            if not path.endswith((".yaml", ".yml", ".json")):
                continue
            try:
                with open(path, encoding="utf-8") as handle:
                    spec = yaml.safe_load(handle)  # JSON is YAML
            except (OSError, ValueError, yaml.YAMLError):
                unreadable.append(path)
                continue
            if isinstance(spec, dict) and spec.get("kind") == CDI_KIND:
                for device in spec.get("devices") or []:
                    if isinstance(device, dict) and isinstance(device.get("name"), str):
                        names.setdefault(device["name"], path)
    return names, unreadable


def check_injection(setup: NodeSetup) -> Finding:
    """How a vGPU container gets its cards: NVIDIA_VISIBLE_DEVICES for NVIDIA's runtime hook, or
    (--cdi) CDI devices nvidia.com/gpu=<UUID>, which resolve only if the node's CDI spec names
    every card and MIG slice by its UUID."""
    if not setup.cdi:
        return Finding("injection", OK, "cards reach a vGPU container through NVIDIA_VISIBLE_DEVICES and NVIDIA's "
                                        "runtime hook (the device plugin's --cdi is off)")
    found = _cdi_device_names(setup)
    where = " or ".join(CDI_SPEC_DIRS)
    if found is None:
        return Finding("injection", WARN, f"not available: --cdi is on, and neither {where} exists under "
                                          f"{setup.host_root} to check that the node's CDI spec names the cards",
                       "run the doctor on the host (the vgpu-node pod does not mount them), or pass --host-root")
    names, unreadable = found
    bad = f" ({len(unreadable)} unreadable: {', '.join(unreadable[:3])})" if unreadable else ""
    if not names:
        return Finding("injection", FAIL, f"--cdi is on but no CDI spec of kind {CDI_KIND} is in {where}{bad}: "
                                          "a vGPU pod's container cannot be created", CDI_REMEDY)
    cards = setup.gpus.inventory()
    wanted = [card.uuid for card in cards] + [s.uuid for card in cards for s in getattr(card, "slices", ()) or ()]
    missing = [uuid for uuid in wanted if uuid not in names]
    if missing:
        shown = ", ".join(sorted(names)[:3])
        return Finding("injection", FAIL, f"--cdi is on but the CDI spec names no device {', '.join(missing[:3])}"
                                          f"{' and more' if len(missing) > 3 else ''} (it names {shown}"
                                          f"{', ...' if len(names) > 3 else ''}){bad}: the device plugin asks for "
                                          f"{CDI_KIND}=<UUID>, so those cards reach no container", CDI_REMEDY)
    files = sorted(set(names.values()))
    return Finding("injection", OK, f"cards reach a vGPU container as CDI devices: all {len(wanted)} named by UUID "
                                    f"in {', '.join(files)}{bad}")
