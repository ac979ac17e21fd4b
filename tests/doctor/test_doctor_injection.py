"""`doctor`'s injection check: how a vGPU container gets its cards, and, with the device
plugin's --cdi, whether the node's CDI spec names every card by the UUID the plugin asks for."""

from __future__ import annotations

import dataclasses

from doctor_support import cdi_spec
from vgpu_plugin.doctor.checks import run_checks
from vgpu_plugin.doctor.report import FAIL, OK, WARN

SPEC = "var/run/cdi/nvidia.yaml"


def finding(setup, name):
    (found,) = [f for f in run_checks(setup) if f.check == name]
    return found


def test_cdi_with_every_card_named_by_uuid_is_ok(healthy):
    result = finding(healthy.setup, "injection")
    assert result.status == OK, result
    assert "as CDI devices: all 4 named by UUID" in result.detail and SPEC in result.detail


def test_without_cdi_the_runtime_hook_injects(healthy):
    result = finding(dataclasses.replace(healthy.setup, cdi=False), "injection")
    assert result.status == OK and "NVIDIA_VISIBLE_DEVICES" in result.detail, result


def test_a_spec_naming_cards_by_index_fails(healthy):
    (healthy.root / SPEC).write_text(cdi_spec(["0", "1", "2", "3", "all"]))
    result = finding(healthy.setup, "injection")
    assert result.status == FAIL, result
    assert "names no device GPU-" in result.detail and "--device-name-strategy=uuid" in result.remedy


def test_a_spec_missing_one_card_fails_naming_it(healthy):
    uuids = [card.uuid for card in healthy.setup.gpus.inventory()]
    (healthy.root / SPEC).write_text(cdi_spec(uuids[:3]))
    result = finding(healthy.setup, "injection")
    assert result.status == FAIL and f"names no device {uuids[3]} (it names" in result.detail, result


def test_no_spec_at_all_fails_and_an_unreadable_one_is_named(healthy):
    (healthy.root / SPEC).write_text("kind: [unclosed\n")
    result = finding(healthy.setup, "injection")
    assert result.status == FAIL and "no CDI spec of kind nvidia.com/gpu" in result.detail, result
    assert "1 unreadable" in result.detail and SPEC in result.detail


def test_without_the_spec_directories_it_is_not_available(healthy):
    (healthy.root / SPEC).unlink()
    (healthy.root / "var/run/cdi").rmdir()
    result = finding(healthy.setup, "injection")
    assert result.status == WARN and result.detail.startswith("not available"), result
