"""core.mig: NVIDIA's profile tables, a slice as a resource, the admin's sharing modes, isolation."""

from __future__ import annotations

import json

import pytest

from jupyter_vgpu.core.contract import Names, Request, RequestError
from jupyter_vgpu.core.inventory import Card, NodeInventory
from jupyter_vgpu.core.mig import (
    GEOMETRIES,
    MigSlice,
    Sharing,
    geometry_for,
    parse_sharing,
    read_sharing,
    slices_of,
    wants_isolation,
)

NAMES = Names()


def test_tables_follow_nvidias_fractions() -> None:
    a100 = GEOMETRIES["A100-SXM4-40GB"]
    assert (a100.slices, a100.memory_parts) == (7, 8)
    assert a100.memory_of(a100.profile("2g.10gb")) == 10 * 1024
    assert a100.memory_of(a100.profile("3g.20gb")) == 20 * 1024   # 4/8 of the memory for 3/7 of the compute
    assert a100.profile("1g.5gb").max_instances == 7
    assert GEOMETRIES["A100-SXM4-80GB"].memory_of(GEOMETRIES["A100-SXM4-80GB"].profile("1g.20gb")) == 20 * 1024
    h100 = GEOMETRIES["H100-80GB"]
    assert [p.name for p in h100.profiles][-1] == "7g.80gb"
    a30 = GEOMETRIES["A30-24GB"]
    assert (a30.slices, a30.memory_parts) == (4, 4)
    assert a30.memory_of(a30.profile("2g.12gb")) == 12 * 1024
    for geometry in GEOMETRIES.values():  # every profile's name says its compute slices and memory
        for profile in geometry.profiles:
            slices, gb = profile.name.split("+")[0].split("g.")
            assert int(slices) == profile.slices
            assert geometry.memory_of(profile) == int(gb.removesuffix("gb")) * 1024


@pytest.mark.parametrize(("model", "memory", "expected"), [
    ("NVIDIA A100-SXM4-40GB", 40960, "A100-SXM4-40GB"),
    ("NVIDIA A100 80GB PCIe", 81920, "A100-SXM4-80GB"),
    ("NVIDIA H100 80GB HBM3", 81559, "H100-80GB"),
    ("NVIDIA A30", 24576, "A30-24GB"),
])
def test_geometry_for_real_names(model: str, memory: int, expected: str) -> None:
    found = geometry_for(model, memory)
    assert found is not None and found.model == expected


def test_geometry_for_a_card_without_mig() -> None:
    assert geometry_for("Tesla T4", 15360) is None


def test_slice_sizes_in_vcuda_core_and_units() -> None:
    a100 = GEOMETRIES["A100-SXM4-40GB"]
    two, one = slices_of(a100, ["2g.10gb", "1g.5gb"], "GPU-abc")
    assert (two.cores, two.memory_units) == (28, 40)   # 2/7 of 100 rounded down; 10 GiB / 256 MiB
    assert (one.cores, one.memory_units) == (14, 20)
    assert two.fits(Request(25, 40)) and not two.fits(Request(29, 40)) and not two.fits(Request(25, 41))
    assert not two.fits(Request(100))                   # whole cards never take a slice
    a30 = slices_of(GEOMETRIES["A30-24GB"], ["2g.12gb"], "GPU-x")[0]
    assert a30.cores == 50 and a30.memory_units == 48


def test_a_shared_memory_or_unhealthy_slice_is_never_placeable() -> None:
    base = slices_of(GEOMETRIES["A100-SXM4-40GB"], ["3g.20gb"], "GPU-abc")[0]
    assert base.placeable
    for other in (MigSlice(**{**base.__dict__, "memory_shared": True}), MigSlice(**{**base.__dict__, "healthy": False})):
        assert not other.placeable and not other.fits(Request(1, 1))


@pytest.mark.parametrize("layout", [["7g.40gb", "1g.5gb"], ["2g.10gb"] * 4, ["3g.20gb", "3g.20gb", "1g.5gb"],
                                    ["unknown"], ["1g.5gb+me", "1g.5gb+me"]])
def test_impossible_layouts_are_refused(layout: list[str]) -> None:
    with pytest.raises((ValueError, KeyError)):
        slices_of(GEOMETRIES["A100-SXM4-40GB"], layout, "GPU-abc")


def test_mixed_fixture_layout_fits() -> None:
    layout = slices_of(GEOMETRIES["A100-SXM4-40GB"], {"2g.10gb": 3, "1g.5gb": 1}, "GPU-abc")
    assert [s.profile for s in layout] == ["2g.10gb"] * 3 + ["1g.5gb"]
    assert len({s.uuid for s in layout}) == 4


@pytest.mark.parametrize("bad", [
    {"uuid": "GPU-1", "profile": "1g.5gb", "gi": 1, "ci": 0, "slices": 1, "cardSlices": 7, "memoryMib": 5120},
    {"uuid": "MIG-1", "profile": "1g.5gb; rm", "gi": 1, "ci": 0, "slices": 1, "cardSlices": 7, "memoryMib": 5120},
    {"uuid": "MIG-1", "profile": "1g.5gb", "gi": 1, "ci": 0, "slices": 9, "cardSlices": 7, "memoryMib": 5120},
    {"uuid": "MIG-1", "profile": "1g.5gb", "gi": -1, "ci": 0, "slices": 1, "cardSlices": 7, "memoryMib": 5120},
    {"uuid": "MIG-1", "profile": "1g.5gb", "gi": 1, "ci": 0, "slices": 1, "cardSlices": 7, "memoryMib": 0},
    {"uuid": "MIG-1", "profile": "1g.5gb", "gi": 1, "ci": 0, "slices": 1, "cardSlices": 7},
    {"uuid": "MIG-1", "profile": "1g.5gb", "gi": True, "ci": 0, "slices": 1, "cardSlices": 7, "memoryMib": 5120},
    "MIG-1",
])
def test_malformed_slices_are_refused_with_a_reason(bad: object) -> None:
    with pytest.raises(ValueError, match="slice"):
        MigSlice.from_dict(bad, "slice")


def test_inventory_carries_slices_and_stays_backward_compatible() -> None:
    slices = slices_of(GEOMETRIES["A100-SXM4-40GB"], {"2g.10gb": 3, "1g.5gb": 1}, "GPU-a")
    mig = Card(0, "GPU-a", "NVIDIA A100-SXM4-40GB", 40960, healthy=False, mig=True, unavailable="MIG mode",
               slices=slices)
    plain = Card(1, "GPU-b", "NVIDIA A100-SXM4-40GB", 40960)
    inventory = NodeInventory("n", (mig, plain), None)
    text = inventory.to_json()
    assert NodeInventory.from_json(text) == inventory
    data = json.loads(text)
    assert "slices" not in data["cards"][1]          # a card without MIG is published as before
    del data["cards"][0]["slices"]                   # an older publisher: no slices, still readable
    assert NodeInventory.from_dict(data).cards[0].slices == ()


def test_inventory_rejects_slices_on_a_card_not_in_mig_mode_and_repeated_uuids() -> None:
    slices = slices_of(GEOMETRIES["A100-SXM4-40GB"], ["1g.5gb"], "GPU-a")
    with pytest.raises(ValueError, match="not in MIG mode"):
        Card(0, "GPU-a", "m", 40960, slices=slices)
    with pytest.raises(ValueError, match="repeat"):
        Card(0, "GPU-a", "m", 40960, mig=True, slices=slices * 2)


def test_sharing_modes() -> None:
    default = parse_sharing(None)
    assert default == Sharing()
    assert default.slices_serve(0, isolated=True) and not default.slices_serve(0, isolated=False)
    assert default.time_shares_serve(0, isolated=False) and not default.time_shares_serve(0, isolated=True)
    mixed = parse_sharing("prefer-mig; 0=time-shared, 3=mig")
    assert mixed.prefers_slices
    assert not mixed.slices_serve(0, isolated=True)        # card 0 offers no slices at all
    assert mixed.slices_serve(1, isolated=False)
    assert not mixed.time_shares_serve(3, isolated=False)  # card 3: slices only
    assert not parse_sharing("prefer-time-shared").prefers_slices


@pytest.mark.parametrize("bad", ["shared", "mig; 0", "mig; x=mig", "mig; 0=maybe", "mig; 99999=mig"])
def test_malformed_sharing_is_a_clear_error(bad: str) -> None:
    with pytest.raises(ValueError, match="sharing"):
        parse_sharing(bad)


def test_a_malformed_node_annotation_falls_back_to_the_default_with_a_problem() -> None:
    sharing, problem = read_sharing({NAMES.gpu_sharing: "everything"}, NAMES)
    assert sharing == Sharing() and problem is not None and NAMES.gpu_sharing in problem


def test_isolation_is_validated_user_input() -> None:
    assert wants_isolation({NAMES.isolation: "mig"}, NAMES)
    assert not wants_isolation({NAMES.isolation: "none"}, NAMES)
    assert not wants_isolation({}, NAMES)
    with pytest.raises(RequestError, match="isolation"):
        wants_isolation({NAMES.isolation: "MIG-1234 please"}, NAMES)
