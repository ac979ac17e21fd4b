"""Write docs/configuration.md: every setting of every part, generated from the code.

Daemon flags come from their argparse parsers (each flag's help names its environment
fallback); Jupyter-side settings come from the traitlets classes. Run it after changing a
flag or a trait; tests/docs/test_configuration_reference.py fails when the file is stale.

    .venv/bin/python scripts/gen_configuration.py [--check]
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
OUTPUT = ROOT / "docs" / "configuration.md"

DAEMONS = [
    ("jupyter-vgpu device-plugin", "vgpu_plugin.deviceplugin.main:build_parser",
     "The node daemon (DaemonSet): device plugin, health, node annotation and the metrics endpoint."),
    ("jupyter-vgpu mps-control-daemon", "vgpu_plugin.deviceplugin.mps_daemon:build_parser",
     "NVIDIA's MPS control daemon with server-side ceilings (DaemonSet of overlays/mps)."),
    ("jupyter-vgpu extender", "vgpu_plugin.extender.main:parser",
     "The kube-scheduler extender (sidecar of the vgpu-scheduler Deployment)."),
    ("jupyter-vgpu doctor", "vgpu_plugin.doctor.main:build_parser",
     "Node readiness checks (on the host, or in every node daemon's pod: docs/admin.md, section 7)."),
    ("jupyter-vgpu sim", "vgpu_plugin.demo.main:sim_parser", "The simulated cluster alone."),
    ("jupyter-vgpu demo", "vgpu_plugin.demo.main:demo_parser", "The simulated cluster with JupyterLab on a vGPU notebook pod."),
]

TRAITLETS = [
    ("jupyter_vgpu.settings:VGPUSettings",
     "Where the notebook's GPU facts come from and how it asks for a different share: read by both the "
     "server extension and the kernel (`%vgpu`, widgets), in `jupyter_server_config.py` (or "
     "`--VGPUSettings.<name>=...`) and `ipython_kernel_config.py`. `c.VGPUExtension.VGPUSettings.<name>` or "
     "`c.VGPUMagics.VGPUSettings.<name>` sets one side only. The server extension passes its `source` and "
     "`requester_class` on to the kernels it starts."),
    ("jupyter_vgpu.server.app:VGPUExtension", "Server extension, in `jupyter_server_config.py` (or `--VGPUExtension.<name>=...`)."),
    ("jupyter_vgpu.magic:VGPUMagics", "Kernel side (`%vgpu`, widgets), in `ipython_config.py` / `ipython_kernel_config.py`."),
    ("jupyter_vgpu.hub:VGPUHub", "JupyterHub, in `jupyterhub_config.py` (see docs/admin.md for the KubeSpawner wiring)."),
    ("jupyter_vgpu.reclaimer.service:VGPUReclaimer",
     "The GPU reclaimer service (`jupyter-vgpu reclaimer`, started by the Hub through "
     "`jupyter_vgpu.reclaimer.hubconfig.configure_reclaimer(c, args=[...])`): `--VGPUReclaimer.<name>=...` "
     "or a `--VGPUReclaimer.config_file`."),
]


def _load(target: str):  # type: ignore[no-untyped-def]
    module, name = target.split(":")
    return getattr(importlib.import_module(module), name)


def _cell(text: object) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


def _parser_table(parser: argparse.ArgumentParser) -> list[str]:
    rows = ["| flag | meaning |", "|---|---|"]
    for action in parser._actions:  # argparse keeps no public list of actions
        if isinstance(action, argparse._HelpAction) or action.help == argparse.SUPPRESS:
            continue
        flags = ", ".join(f"`{s}`" for s in action.option_strings) or f"`{action.dest}`"
        if action.choices:
            flags += " (" + "\\|".join(str(c) for c in action.choices) + ")"
        rows.append(f"| {flags} | {_cell(action.help or '')} |")
    return rows


def _traits_table(cls) -> list[str]:  # type: ignore[no-untyped-def]
    rows = ["| setting | default | meaning |", "|---|---|---|"]
    # own traits only: what an ExtensionApp inherits (log_level, ...) is jupyter-server's to document
    for name, trait in sorted(cls.class_own_traits(config=True).items()):
        default = repr(trait.default_value).replace("'", '"')
        rows.append(f"| `c.{cls.__name__}.{name}` | `{_cell(default)}` | {_cell(trait.help)} |")
    return rows


def _former_names() -> list[str]:
    """The settings that moved to VGPUSettings: the old names still work, with a warning."""
    from jupyter_vgpu.settings import SettingsAliases

    rows = ["## Former names", "",
            "These used to be settings of `VGPUExtension` and `VGPUMagics`; they still work, log a deprecation "
            "warning, and lose to the same setting on `VGPUSettings`.", "",
            "| former setting | now |", "|---|---|"]
    for name in sorted(SettingsAliases.class_own_traits(config=True)):
        now = "`c.VGPUSettings.requester_class`" if name == "requester" else f"`c.VGPUSettings.{name}`"
        rows.append(f"| `c.VGPUExtension.{name}`, `c.VGPUMagics.{name}` | {now} |")
    return rows + [""]


def render() -> str:
    # Defaults that read the environment must not leak this machine's settings into the doc.
    saved = {k: v for k, v in os.environ.items() if k.startswith(("VGPU_", "JUPYTER_VGPU_")) or k in ("KUBECONFIG", "NODE_NAME")}
    for key in saved:
        del os.environ[key]
    try:
        lines = [
            "# Configuration reference",
            "",
            "Every setting of every part, in one place. Generated from the code by",
            "`scripts/gen_configuration.py`; do not edit by hand (a test checks it is current).",
            "",
            "Daemons take flags; every flag falls back to the environment variable named in its",
            "description (`[$NAME]`), which is how the manifests in `deploy/` configure them.",
            "The Jupyter side is configured through traitlets.",
            "",
        ]
        for command, target, what in DAEMONS:
            lines += [f"## `{command}`", "", what, ""] + _parser_table(_load(target)()) + [""]
        for target, what in TRAITLETS:
            cls = _load(target)
            lines += [f"## `{cls.__name__}`", "", what, ""] + _traits_table(cls) + [""]
        lines += _former_names()
        from jupyter_vgpu.core import contract

        lines += [
            "## What a vGPU container is told (set by the device plugin's Allocate)",
            "",
            "| variable | meaning |",
            "|---|---|",
        ]
        meanings = {
            contract.ENV_CORES: "vcuda-core units held (1 = 1 % of one card; 100 per whole card)",
            contract.ENV_MEMORY_MIB: "device memory held, MiB",
            contract.ENV_DEVICE_UUIDS: "UUIDs of the card(s), comma-separated",
            contract.ENV_DEVICE_INDICES: "node-local indices of the card(s)",
            contract.ENV_DEVICE_MODEL: "card model",
            contract.ENV_NODE: "node name",
            contract.ENV_POD_NAME: "pod name (only when the device plugin is certain which pod it served)",
            contract.ENV_POD_NAMESPACE: "pod namespace (same condition)",
            contract.ENV_POD_UID: "pod UID (same condition)",
            contract.ENV_CONTAINER: "container name (same condition)",
            contract.ENV_METRICS_URL: "base URL of the node metrics endpoint",
            contract.ENV_TOKEN: "read token for this allocation on the node API",
            contract.ENV_ENFORCEMENT: "enforcement backend: hami-core, mps or none; mig on a MIG slice",
            contract.ENV_MIG_PROFILE: "the MIG profile of the slice held (\"2g.10gb\"); unset off MIG",
        }
        lines += [f"| `{name}` | {meanings[name]} |" for name in contract.VGPU_ENV_NAMES]
        return "\n".join(lines) + "\n"
    finally:
        os.environ.update(saved)


def main(argv: list[str] | None = None) -> int:
    check = "--check" in (argv if argv is not None else sys.argv[1:])
    text = render()
    if check:
        if not OUTPUT.exists() or OUTPUT.read_text() != text:
            print(f"{OUTPUT.relative_to(ROOT)} is stale: run .venv/bin/python scripts/gen_configuration.py", file=sys.stderr)
            return 1
        return 0
    OUTPUT.write_text(text)
    print(f"wrote {OUTPUT.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
