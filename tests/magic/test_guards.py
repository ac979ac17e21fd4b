"""Guard rails: stand-in framework modules where the real ones are absent, the real ones where installed.

The stand-ins are real packages on sys.path (written to a temp dir) that record the calls
the rails make, so the import hook is exercised exactly as with the real framework.
"""

from __future__ import annotations

import importlib
import os
import sys
import textwrap

import pytest

from jupyter_vgpu import guards
from jupyter_vgpu.core import contract
from jupyter_vgpu.guards import GuardRails


def share(memory_mib=10240, total=40960, cores=25):
    return {"cores": cores, "memoryMib": memory_mib,
            "cards": [{"index": 2, "uuid": "GPU-2", "cores": cores, "memoryMib": memory_mib, "memoryTotalMib": total}]}


FAKE_TORCH = '''
calls = []
class _Cuda:
    available = {available}
    def is_available(self):
        return self.available
    def device_count(self):
        return 2
    def set_per_process_memory_fraction(self, fraction, device=None):
        calls.append((fraction, device))
cuda = _Cuda()
'''

FAKE_TF = '''
calls = []
class LogicalDeviceConfiguration:
    def __init__(self, memory_limit=None):
        self.memory_limit = memory_limit
class _Config:
    LogicalDeviceConfiguration = LogicalDeviceConfiguration
    def list_physical_devices(self, kind):
        return ["/physical_device:GPU:0"] if kind == "GPU" else []
    def set_logical_device_configuration(self, device, configs):
        calls.append((device, [c.memory_limit for c in configs]))
config = _Config()
'''


@pytest.fixture
def fake_modules(tmp_path, monkeypatch):
    """Write stand-in packages; forget them (and the rails' hooks) afterwards."""
    def write(name, source):
        package = tmp_path / name
        package.mkdir()
        (package / "__init__.py").write_text(textwrap.dedent(source))
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in ("torch", "tensorflow", "cupy", "jax"):
        monkeypatch.delitem(sys.modules, name, raising=False)
    importlib.invalidate_caches()
    yield write
    for name in ("torch", "tensorflow", "cupy", "jax"):
        sys.modules.pop(name, None)
    guards._finder.callbacks.clear()
    if guards._finder in sys.meta_path:
        sys.meta_path.remove(guards._finder)


def rails_for(allocation, modules=None):
    return GuardRails(allocation, environ={}, modules=modules)


def test_torch_fraction_set_by_the_import_hook(fake_modules):
    fake_modules("torch", FAKE_TORCH.format(available=True))
    rails = rails_for(share())
    rails.apply()
    assert {g.framework: g.state for g in rails.status()}["torch"] == "armed"
    import torch  # noqa: PLC0415 - the import is the event under test

    assert torch.calls == [(0.25, 0), (0.25, 1)]
    torch_guard = next(g for g in rails.status() if g.framework == "torch")
    assert torch_guard.state == "in force" and "set_per_process_memory_fraction(0.25) on 2 device(s)" in torch_guard.detail
    assert torch.__spec__.loader is not None and torch.__file__.endswith("__init__.py")  # an ordinary package


def test_torch_already_imported_is_limited_at_once(fake_modules):
    fake_modules("torch", FAKE_TORCH.format(available=True))
    import torch  # noqa: PLC0415

    rails = GuardRails(share(memory_mib=4096), environ={})
    rails.apply()
    assert torch.calls == [(0.1, 0), (0.1, 1)]


def test_torch_without_cuda_is_reported_not_faked(fake_modules):
    fake_modules("torch", FAKE_TORCH.format(available=False))
    rails = rails_for(share())
    rails.apply()
    import torch  # noqa: PLC0415

    assert torch.calls == []
    assert "torch      not applied  torch sees no CUDA device" in rails.status_text()


def test_tensorflow_logical_device_limit(fake_modules):
    fake_modules("tensorflow", FAKE_TF)
    environ: dict[str, str] = {}
    rails = GuardRails(share(), environ=environ)
    rails.apply()
    import tensorflow  # noqa: PLC0415

    assert tensorflow.calls == [("/physical_device:GPU:0", [10240])]
    assert environ[contract.ENV_TF_FORCE_GROWTH] == "true"
    assert "tensorflow in force" in rails.status_text()


def test_env_rails_for_jax_and_cupy(fake_modules):
    environ: dict[str, str] = {}
    rails = GuardRails(share(memory_mib=10240, total=40960), environ=environ, modules={})
    rails.apply()
    assert environ[contract.ENV_XLA_MEM_FRACTION] == "0.250"
    assert environ[contract.ENV_CUPY_MEMORY_LIMIT] == str(10240 * 1024 * 1024)
    assert "jax        in force     XLA_PYTHON_CLIENT_MEM_FRACTION=0.250" in rails.status_text()


def test_cupy_already_imported_gets_a_pool_limit(fake_modules):
    fake_modules("cupy", '''
limits = []
class _Pool:
    def set_limit(self, size=None, fraction=None):
        limits.append(size)
_pool = _Pool()
def get_default_memory_pool():
    return _pool
''')
    import cupy  # noqa: PLC0415

    GuardRails(share(memory_mib=2048), environ={}).apply()
    assert cupy.limits == [2048 * 1024 * 1024]


def test_a_looser_user_setting_is_kept_and_called_out(fake_modules):
    environ = {contract.ENV_XLA_MEM_FRACTION: "0.9"}
    rails = GuardRails(share(), environ=environ, modules={})
    rails.apply()
    assert environ[contract.ENV_XLA_MEM_FRACTION] == "0.9"
    assert "jax        yours        XLA_PYTHON_CLIENT_MEM_FRACTION=0.9 is above your share (0.25)" in rails.status_text()


def test_whole_cards_and_no_vgpu_need_no_rails(fake_modules):
    environ: dict[str, str] = {}
    for allocation in (None, share(memory_mib=40960, total=40960, cores=100)):
        rails = GuardRails(allocation, environ=environ, modules={})
        rails.apply()
        assert {g.state for g in rails.status()} == {"not needed"}
    assert environ == {} and guards._finder not in sys.meta_path


def test_on_a_mig_slice_the_rails_say_the_hardware_holds_the_memory(fake_modules):
    """A slice's memory is the whole (MIG) device: nothing to hold back, and the reason is the slice, not
    "no vGPU, or whole cards"; whole cards and no vGPU each say their own reason."""
    slice_ = {"cores": 28, "memoryMib": 10240, "enforcement": "mig", "cards": [
        {"index": 0, "uuid": "MIG-1", "cores": 28, "memoryMib": 10240, "memoryTotalMib": 10240,
         "migProfile": "2g.10gb"}]}
    environ: dict[str, str] = {}
    rails = GuardRails(slice_, environ=environ, modules={})
    rails.apply()
    assert {g.state for g in rails.status()} == {"not needed"} and environ == {}
    assert ("torch      not needed   your MIG slice 2g.10gb is isolated in hardware: its memory (10 GiB) is all "
            "yours and no framework can use more") in rails.status_text().splitlines()
    whole = GuardRails(share(memory_mib=40960, total=40960, cores=100), environ={}, modules={})
    whole.apply()
    assert {g.detail for g in whole.status()} == {"whole cards: all of each card's memory is yours"}
    nothing = GuardRails(None, environ={}, modules={})
    nothing.apply()
    assert {g.detail for g in nothing.status()} == {"no vGPU in this session"}


def test_unknown_card_size_limits_cupy_but_not_fractions(fake_modules):
    rails = GuardRails(share(total=None), environ={}, modules={})
    rails.apply()
    states = {g.framework: g.state for g in rails.status()}
    assert states == {"torch": "not applied", "jax": "not applied", "cupy": "in force", "tensorflow": "armed"}


def test_real_torch_when_installed(tmp_path):
    """With the real PyTorch: the hook runs on a real import in a fresh interpreter."""
    pytest.importorskip("torch", reason="PyTorch is not installed in this environment (no GPU, no CPU wheel)")
    import subprocess

    script = (
        "from jupyter_vgpu.guards import GuardRails\n"
        "r = GuardRails({'cores': 25, 'memoryMib': 10240, 'cards': [{'memoryMib': 10240, 'memoryTotalMib': 40960}]})\n"
        "r.apply()\n"
        "import torch\n"
        "print(r.status_text())\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                         env=dict(os.environ)).stdout
    import torch  # noqa: PLC0415

    expected = "in force" if torch.cuda.is_available() else "torch sees no CUDA device"
    assert expected in out
