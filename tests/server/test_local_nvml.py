"""The local-nvml source over the real NVMLBackend code, fed by tests/gpu's pynvml stand-in
(this machine has no GPU), and with a driver that fails to load."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "gpu"))

import fake_pynvml  # noqa: E402

from jupyter_vgpu.core import contract  # noqa: E402
from jupyter_vgpu.gpu.nvml import NVMLBackend  # noqa: E402
from jupyter_vgpu.sources.base import SourceSettings  # noqa: E402
from jupyter_vgpu.sources.local_nvml import LocalGPUSource  # noqa: E402


def source(module, environ):
    return LocalGPUSource(SourceSettings(source="local-nvml", environ=environ,
                                         backend_factory=lambda: NVMLBackend(library=module)))


def test_visible_cards_by_uuid_with_topology_and_usage():
    cards = fake_pynvml.default_cards()
    cards[1].used_mib, cards[1].utilization, cards[1].processes = 5000, 40, {77: 5000}
    facts = source(fake_pynvml.make_module(cards=cards), {contract.ENV_NVIDIA_VISIBLE_DEVICES: cards[1].uuid})
    allocation = facts.allocation()["allocation"]
    assert [(c["index"], c["uuid"]) for c in allocation["cards"]] == [(1, cards[1].uuid)]
    topology = facts.topology()["topology"]
    assert [g["mine"] for g in topology["gpus"]] == [False, True, False, False]
    assert topology["links"][0][1].startswith("NV") and topology["gpus"][1]["tenants"] == 1
    usage = facts.usage()
    assert usage["state"] == "live" and usage["current"]["memoryUsedMib"] == 5000
    assert usage["current"]["utilizationPercent"] == 40


@pytest.mark.parametrize("error", [fake_pynvml.NVML_ERROR_DRIVER_NOT_LOADED, fake_pynvml.NVML_ERROR_LIBRARY_NOT_FOUND])
def test_no_driver_is_an_empty_state(error):
    facts = source(fake_pynvml.make_module(init_error=error), {})
    for answer in (facts.allocation(), facts.topology(), facts.usage()):
        assert answer["state"] == "none" and answer["message"].startswith("no local NVIDIA GPU:")
