"""The doctor's NVML accessors (MIG mode, NVML version) through the NVML backend, against the
stand-in pynvml of tests/gpu (it raises NVMLError with .value exactly as nvidia-ml-py does)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from vgpu_plugin.doctor.gpu_checks import check_driver, check_mig, nvml_mig_mode
from vgpu_plugin.doctor.report import FAIL, OK, WARN
from vgpu_plugin.doctor.setup import NodeSetup

from jupyter_vgpu.gpu.nvml import NVMLBackend


def _load_fake_pynvml():
    """tests/gpu/fake_pynvml.py (one module per session, whichever test area imports it first)."""
    if "fake_pynvml" in sys.modules:
        return sys.modules["fake_pynvml"]
    spec = importlib.util.spec_from_file_location("fake_pynvml", Path(__file__).parents[1] / "gpu" / "fake_pynvml.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["fake_pynvml"] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


fake_pynvml = _load_fake_pynvml()

NVML_DEVICE_MIG_DISABLE, NVML_DEVICE_MIG_ENABLE = 0, 1


def library(mig: dict[int, tuple[int, int] | None]):
    """The stand-in with nvmlDeviceGetMigMode ([current, pending]; None: NOT_SUPPORTED) and the NVML version."""
    nv = fake_pynvml.make_module()

    def mig_mode(handle):
        mode = mig.get(handle.index)
        if mode is None:
            raise fake_pynvml.NVMLError(fake_pynvml.NVML_ERROR_NOT_SUPPORTED)
        return list(mode)

    nv.nvmlDeviceGetMigMode = mig_mode
    nv.nvmlSystemGetNVMLVersion = lambda: b"12.550.54.15"
    return nv


def test_mig_mode_is_read_per_card_and_not_supported_means_none():
    backend = NVMLBackend(library=library({0: (1, 1), 1: (0, 0), 3: (0, 1)}))
    assert [nvml_mig_mode(backend, i) for i in range(4)] == [True, False, None, False]  # pending is not current
    backend = NVMLBackend(library=library({0: (1, 1), 1: (0, 0)}))
    finding = check_mig(NodeSetup(gpus=backend))
    assert finding.status == WARN and "card(s) [0]" in finding.detail and "nvidia-smi -i 0 -mig 0" in finding.remedy


def test_driver_line_names_the_nvml_version():
    backend = NVMLBackend(library=library({}))
    finding = check_driver(NodeSetup(gpus=backend))
    assert finding.status == OK and finding.detail == "driver 550.54.15, NVML 12.550.54.15"
    assert check_mig(NodeSetup(gpus=backend)).status == OK


def test_no_driver_through_nvml():
    backend = NVMLBackend(library=fake_pynvml.make_module(init_error=fake_pynvml.NVML_ERROR_LIBRARY_NOT_FOUND))
    finding = check_driver(NodeSetup(gpus=backend))
    assert finding.status == "fail" and "libnvidia-ml.so.1" in finding.detail
    assert nvml_mig_mode(backend, 0) is None


def test_process_visibility_through_nvml_follows_the_callers_pid_namespace(healthy):
    """The real NVML backend over a driver that keeps PID namespaces: from the host's the notebook's
    process is listed and maps to its pod; from the daemon's own container it is hidden while the
    card's memory shows it, and the doctor says to run with hostPID."""
    from vgpu_plugin.doctor.process_checks import check_process_visibility

    nv = fake_pynvml.make_module()
    nv.cards[0].used_mib, nv.cards[0].processes = 4000, {4242: 4000}
    nv.driver.pid_namespaces = {4242: ("notebook container", 17)}
    healthy.setup.gpus = NVMLBackend(library=nv)
    finding = check_process_visibility(healthy.setup, {healthy.pod_uid: "jhub/jupyter-ann"})
    assert finding.status == OK and "pid 4242 on card 0, of pod jhub/jupyter-ann" in finding.detail

    nv.driver.caller_pid_namespace = "vgpu-node container"
    finding = check_process_visibility(healthy.setup, {})
    assert finding.status == FAIL and "card 0: 4000 MiB" in finding.detail and "hostPID" in finding.remedy
