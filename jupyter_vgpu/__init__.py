"""jupyter-vgpu: fractional GPUs for Jupyter notebooks on Kubernetes."""

__version__ = "0.1.0"


def _jupyter_labextension_paths() -> list[dict[str, str]]:
    """The prebuilt lab extension shipped in the package (built from ../labextension)."""
    return [{"src": "labextension", "dest": "jupyter-vgpu"}]


def _jupyter_server_extension_points() -> list[dict[str, object]]:
    from jupyter_vgpu.server.app import VGPUExtension

    return [{"module": "jupyter_vgpu.server.app", "app": VGPUExtension}]


def load_ipython_extension(ipython: object) -> None:
    """`%load_ext jupyter_vgpu`: the %vgpu magic and the framework guard rails."""
    from jupyter_vgpu.magic import load_ipython_extension as load

    load(ipython)


def unload_ipython_extension(ipython: object) -> None:
    from jupyter_vgpu.magic import unload_ipython_extension as unload

    unload(ipython)
