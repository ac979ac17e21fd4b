"""%vgpu in a real IPython shell; the node side is the real metrics server (tests/server/server_node_support.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "server"))

from server_node_support import real_node  # noqa: E402, F401 - the fixture

from jupyter_vgpu.core import contract  # noqa: E402

_ENV = (*contract.VGPU_ENV_NAMES, contract.ENV_NOTEBOOK_SOURCE, contract.ENV_NOTEBOOK_KUBECONFIG,
        contract.ENV_NOTEBOOK_REQUESTER,
        "JUPYTERHUB_API_URL", "JUPYTERHUB_API_TOKEN", "JUPYTERHUB_USER", "JUPYTERHUB_SERVER_NAME",
        "CUDA_VISIBLE_DEVICES", contract.ENV_NVIDIA_VISIBLE_DEVICES, contract.ENV_XLA_MEM_FRACTION,
        contract.ENV_CUPY_MEMORY_LIMIT, contract.ENV_TF_FORCE_GROWTH, contract.ENV_XLA_PREALLOCATE,
        contract.ENV_HUB_MAX_CORES, contract.ENV_HUB_MAX_MEMORY_MIB)


@pytest.fixture(autouse=True)
def clean_vgpu_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in _ENV:
        monkeypatch.delenv(name, raising=False)




@pytest.fixture
def shell():
    """The IPython shell with a fresh config for VGPUMagics and VGPUSettings; the extension unloaded afterwards."""
    from IPython.core.interactiveshell import InteractiveShell
    from traitlets.config import Config

    ip = InteractiveShell.instance()
    ip.config.VGPUMagics = Config()
    ip.config.VGPUSettings = Config()
    yield ip
    if "jupyter_vgpu" in ip.extension_manager.loaded:
        ip.run_line_magic("unload_ext", "jupyter_vgpu")
    ip.config.VGPUMagics = Config()
    ip.config.VGPUSettings = Config()
