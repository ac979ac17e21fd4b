"""The demo's one-line description of the notebook pod reads the pod's claim (core.claims)."""

from __future__ import annotations

from vgpu_plugin.demo.lab import Demo, DemoOptions

from jupyter_vgpu.core import contract as c

N = c.DEFAULT_NAMES


def notebook(annotations: dict[str, str]) -> dict:
    limits = {N.core_resource: "25", N.memory_resource: "16"}
    return {"metadata": {"name": "notebook", "namespace": "default", "annotations": annotations},
            "spec": {"nodeName": "dgx-a100", "containers": [{"name": "nb", "resources": {"limits": limits}}]},
            "status": {"phase": "Running"}}


def test_the_notebook_is_described_from_its_claim() -> None:
    demo = Demo(DemoOptions(), say=lambda _: None)
    allocation = c.PodAllocation("dgx-a100", (c.ContainerAllocation(0, "nb", (c.CardShare(3, "GPU-3", 25, 16),)),))
    text = demo.describe_notebook(notebook(c.predicate_annotations(allocation, N)))
    assert text == "pod default/notebook on node dgx-a100: card 3 (25 % of its compute, 4096 MiB)"
    # a malformed record is explained, not a crash of the demo's guide
    text = demo.describe_notebook(notebook({N.allocation: "{not json"}))
    assert text.startswith("pod default/notebook (no vGPU: allocation annotation is not JSON")
