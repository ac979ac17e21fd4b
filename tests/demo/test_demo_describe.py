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


def test_isolated_demo_adds_a_mig_node_and_describes_the_slice() -> None:
    from vgpu_plugin.demo.lab import MIG_NODE, demo_nodes
    from vgpu_plugin.demo.main import demo_parser

    assert demo_parser().parse_args(["--isolated"]).isolated and not demo_parser().parse_args([]).isolated
    assert MIG_NODE not in [n.name for n in demo_nodes()]
    (mig,) = [n for n in demo_nodes(mig=True) if n.name == MIG_NODE]
    assert list(mig.mig[0]) == ["2g.10gb", "2g.10gb", "2g.10gb", "1g.5gb"]
    demo = Demo(DemoOptions(isolated=True), say=lambda _: None)
    device = "MIG-0a1b2c3d-4e5f-6071-8293-a4b5c6d7e8f9"
    allocation = c.PodAllocation(MIG_NODE, (c.ContainerAllocation(0, "nb", (c.CardShare(0, "GPU-0", 25, 16, device),)),))
    pod = notebook(c.predicate_annotations(allocation, N))
    pod["spec"]["nodeName"] = MIG_NODE
    # before the cluster runs, the slice's profile and size are not known: the device and what was asked
    assert demo.describe_notebook(pod) == (f"pod default/notebook on node {MIG_NODE}: MIG slice {device} on GPU 0 "
                                           "(isolated; asked 25 % and 4 GiB)")
