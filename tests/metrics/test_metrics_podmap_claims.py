"""The node's pod map reads allocations through core.claims, like the extender and the device plugin."""

from __future__ import annotations

from dataclasses import dataclass

from vgpu_plugin.metrics.podmap import PodIndex

from jupyter_vgpu.core import contract as c

N = c.DEFAULT_NAMES
NODE = "gpu-1"


@dataclass(frozen=True)
class FakeCard:
    index: int
    uuid: str
    memory_mib: int


CARDS = {i: FakeCard(i, f"GPU-{i}", 40960) for i in range(4)}


def pod(uid: str, annotations: dict[str, str], cores: str = "25", memory: str | None = "16") -> dict:
    limits = {N.core_resource: cores, **({N.memory_resource: memory} if memory else {})}
    return {"metadata": {"name": uid, "namespace": "hub", "uid": uid, "annotations": annotations},
            "spec": {"nodeName": NODE, "containers": [{"name": "nb", "resources": {"limits": limits}}]},
            "status": {"phase": "Running"}}


def record(card: int, cores: int, units: int, allocation_id: str) -> str:
    return c.PodAllocation(NODE, (c.ContainerAllocation(0, "nb", (c.CardShare(card, f"GPU-{card}", cores, units),),
                                                        allocation_id),)).to_json()


def shares(index: PodIndex) -> dict[str, list[tuple[int, int, int]]]:
    return {h.pod.uid: [(h.share.index, h.share.cores, h.memory_mib)] for h in index.holdings()}


def test_a_record_asking_more_than_the_pod_holds_nothing() -> None:
    index = PodIndex.build([pod("greedy", {N.allocation: record(1, 100, 160, "id-g")})], NODE, cards=CARDS)
    assert shares(index) == {}
    assert index.by_allocation_id("id-g") is None  # no token reads for a record that is not believed
    entry = index.by_uid("greedy")
    assert entry is not None and "asks for 25 %" in (entry.problem or "")


def test_keys_win_over_a_record_naming_other_cards() -> None:
    annotations = {N.predicate_gpu_idx(0): "2", N.allocation: record(3, 25, 16, "id-m")}
    index = PodIndex.build([pod("moved", annotations)], NODE, cards=CARDS)
    assert shares(index) == {"moved": [(2, 25, 16 * 256)]}
    assert index.by_allocation_id("id-m") is None


def test_an_agreeing_record_gives_the_token_and_a_whole_card_all_its_memory() -> None:
    share = pod("share", {N.predicate_gpu_idx(0): "2", N.allocation: record(2, 25, 16, "id-s")})
    whole = pod("whole", {N.predicate_gpu_idx(0): "1"}, cores="100", memory=None)
    index = PodIndex.build([share, whole], NODE, cards=CARDS)
    assert shares(index) == {"share": [(2, 25, 16 * 256)], "whole": [(1, 100, 40960)]}
    found = index.by_allocation_id("id-s")
    assert found is not None and found[0].uid == "share"
    allocation = index.by_uid("whole").allocation
    assert allocation is not None and allocation.containers[0].cards[0].uuid == "GPU-1"
    assert allocation.containers[0].cards[0].memory_units == 160
