"""``jupyter-vgpu`` (and ``jupyter vgpu``): one command, many subcommands.

Each subcommand lives in its own module and is imported only when it runs, so
``jupyter-vgpu topo`` never imports grpc, kubernetes or NVML.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence

# name -> (module:function taking argv and returning an exit code, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "topo": ("jupyter_vgpu.core.cli_topo:topo_main", "show a node's GPU topology from `nvidia-smi topo -m` text"),
    "place": ("jupyter_vgpu.cli:place_main", "choose card(s) for a request on a topology"),
    "device-plugin": ("vgpu_plugin.deviceplugin.main:main", "run the node daemon (kubelet device plugin + metrics)"),
    "mps-control-daemon": ("vgpu_plugin.deviceplugin.mps_daemon:main",
                           "run NVIDIA's MPS control daemon with server-side per-client ceilings"),
    "extender": ("vgpu_plugin.extender.main:main", "run the kube-scheduler extender"),
    "doctor": ("vgpu_plugin.doctor.main:main", "check this node is ready for vGPU notebooks (ok / warn / fail)"),
    "reclaimer": ("jupyter_vgpu.reclaimer.service:main",
                  "run the JupyterHub service that reclaims idle GPU shares"),
    "sim": ("vgpu_plugin.demo.main:sim_main", "run the simulated cluster alone"),
    "demo": ("vgpu_plugin.demo.main:demo_main", "simulated cluster + JupyterLab on a vGPU notebook pod"),
}


def place_main(argv: Sequence[str]) -> int:
    """``jupyter-vgpu place``: the core's command, told the card memory of the captures bundled with
    the package (``nvidia-smi topo -m`` does not say it; the core reads no data of ours)."""
    from jupyter_vgpu.core.cli_topo import place_main as place
    from jupyter_vgpu.data import bundled_card_memory_mib

    return place(argv, card_memory_of=bundled_card_memory_mib)


def _usage() -> str:
    width = max(len(name) for name in SUBCOMMANDS)
    lines = ["usage: jupyter-vgpu COMMAND [ARGS...]", "", "commands:"]
    lines += [f"  {name.ljust(width)}  {help_}" for name, (_, help_) in SUBCOMMANDS.items()]
    lines += ["", "Run `jupyter-vgpu COMMAND --help` for a command's options."]
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0
    if args[0] in ("-V", "--version"):
        from jupyter_vgpu import __version__

        print(__version__)
        return 0
    name, rest = args[0], args[1:]
    if name not in SUBCOMMANDS:
        print(f"jupyter-vgpu: unknown command {name!r}\n\n{_usage()}", file=sys.stderr)
        return 2
    target, _ = SUBCOMMANDS[name]
    module_name, function_name = target.split(":")
    try:
        module = importlib.import_module(module_name)
    except ImportError as error:
        print(
            f"jupyter-vgpu {name}: cannot import {module_name} ({error}); "
            f"install the extra it needs, e.g. pip install 'jupyter-vgpu[node]'",
            file=sys.stderr,
        )
        return 2
    result = getattr(module, function_name)(rest)
    return int(result or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
