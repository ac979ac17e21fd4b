"""gpu-admission's hand-off keys read back as an allocation (pods placed by gpu-admission)."""

from __future__ import annotations

import pytest

from jupyter_vgpu.core import contract as c

N = c.DEFAULT_NAMES


def pod(annotations, *containers):  # type: ignore[no-untyped-def]
    return {"metadata": {"annotations": annotations},
            "spec": {"nodeName": "gpu-1", "containers": [
                {"name": name, "resources": {"limits": limits}} for name, limits in containers]}}


def test_shares_and_whole_cards_are_read_from_keys_and_requests():  # type: ignore[no-untyped-def]
    p = pod({N.predicate_gpu_idx(0): "3", N.predicate_gpu_idx(2): "0,1"},
            ("nb", {N.core_resource: "25", N.memory_resource: "16"}),
            ("sidecar", {}),
            ("train", {N.core_resource: "200"}))
    allocation = c.allocation_from_predicates(p, N)
    assert allocation is not None and allocation.node == "gpu-1"
    held = {(k.index, k.name): [(s.index, s.cores, s.memory_units) for s in k.cards] for k in allocation.containers}
    assert held == {(0, "nb"): [(3, 25, 16)], (2, "train"): [(0, 100, 0), (1, 100, 0)]}


def test_no_keys_is_no_allocation():  # type: ignore[no-untyped-def]
    assert c.allocation_from_predicates(pod({}, ("nb", {N.core_resource: "25", N.memory_resource: "4"}))) is None


@pytest.mark.parametrize("annotations, limits, message", [
    ({N.predicate_gpu_idx(0): "1,2"}, {N.core_resource: "25", N.memory_resource: "4"}, "a share sits on one card"),
    ({N.predicate_gpu_idx(0): "1"}, {N.core_resource: "200"}, "names 1 cards for 2 whole cards"),
    ({N.predicate_gpu_idx(0): "1"}, {}, "asks for no vGPU"),
    ({N.predicate_gpu_idx(0): "one"}, {N.core_resource: "100"}, "expected card indices"),
])
def test_disagreements_name_the_key(annotations, limits, message):  # type: ignore[no-untyped-def]
    with pytest.raises(ValueError, match=message):
        c.allocation_from_predicates(pod(annotations, ("nb", limits)), N)
