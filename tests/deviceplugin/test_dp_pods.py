"""deviceplugin.pods reads a pod's claim through core.claims: the keys and the requests win."""

from __future__ import annotations

from vgpu_plugin.deviceplugin.pods import parse_pod

from jupyter_vgpu.core import contract as c

N = c.DEFAULT_NAMES
NODE = "gpu-1"


def placed(annotations: dict[str, str], cores: str = "25", memory: str = "16") -> dict:
    base = {N.predicate_node: NODE, N.predicate_time: "7", N.gpu_assigned: "false"}
    return {"metadata": {"name": "nb", "namespace": "hub", "uid": "u1", "annotations": {**base, **annotations}},
            "spec": {"nodeName": NODE, "containers": [
                {"name": "notebook", "resources": {"limits": {N.core_resource: cores, N.memory_resource: memory}}}]},
            "status": {"phase": "Pending"}}


def record(node: str, card: int, cores: int, units: int) -> str:
    return c.PodAllocation(node, (c.ContainerAllocation(0, "notebook", (c.CardShare(card, "GPU-x", cores, units),)),),
                           policy="spread").to_json()


def test_an_agreeing_record_is_kept_beside_the_keys() -> None:
    view = parse_pod(placed({N.predicate_gpu_idx(0): "2", N.allocation: record(NODE, 2, 25, 16)}), NODE, N)
    assert view is not None and view.problem is None and view.policy == "spread"
    (wanted,) = view.containers
    assert wanted.cards == (2,) and wanted.record is not None and wanted.record.cards[0].uuid == "GPU-x"


def test_a_record_that_disagrees_is_ignored_and_the_keys_are_served() -> None:
    for forged in (record(NODE, 5, 25, 16), record(NODE, 2, 100, 64)):
        view = parse_pod(placed({N.predicate_gpu_idx(0): "2", N.allocation: forged}), NODE, N)
        assert view is not None and view.problem is None
        (wanted,) = view.containers
        assert wanted.cards == (2,) and wanted.record is None
        assert (wanted.request.cores, wanted.request.memory_units) == (25, 16)


def test_claims_that_cannot_be_served_say_why() -> None:
    cases = [
        ({N.predicate_gpu_idx(0): "2", N.allocation: record("gpu-9", 2, 25, 16)}, "names node gpu-9"),
        ({N.predicate_gpu_idx(0): "2,3"}, "a share sits on one card"),
        ({N.allocation: record(NODE, 2, 25, 16)}, "no tencent.com/predicate-gpu-idx-0 annotation"),
        ({N.predicate_node: "gpu-2", N.predicate_gpu_idx(0): "2"}, "not placed by the vGPU scheduler extender"),
    ]
    for given, words in cases:
        view = parse_pod(placed(given), NODE, N)
        assert view is not None and words in (view.problem or ""), (given, view)
        assert view.containers == []


def test_finished_and_foreign_pods_are_not_ours() -> None:
    done = placed({N.predicate_gpu_idx(0): "2"})
    done["status"]["phase"] = "Succeeded"
    assert parse_pod(done, NODE, N) is None
    assert parse_pod(placed({N.predicate_gpu_idx(0): "2"}), "gpu-2", N) is None
    plain = placed({})
    plain["spec"]["containers"][0]["resources"] = {}
    assert parse_pod(plain, NODE, N) is None
