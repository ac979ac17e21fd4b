"""The end-to-end area: every real component wired by SimCluster (see docs/internals.md)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from e2e_support import DGX, P40


@pytest.fixture(scope="module")
def cluster(topology_fixtures: Any) -> Iterator[Any]:
    """A DGX A100 (8 cards, NV12 everywhere) and a PCIe box of 7 P40s (PIX groups 0-2 and 3-6)."""
    from vgpu_plugin.demo.cluster import NodeSpec, SimCluster

    nodes = [NodeSpec(DGX, "dgx-a100.txt", model="NVIDIA A100-SXM4-40GB", memory_mib=40960, seed=1),
             NodeSpec(P40, "p40-7gpu-pix-phb.txt", model="Tesla P40", memory_mib=24576, seed=2)]
    with SimCluster(nodes, fixtures_dir=topology_fixtures, metrics_period=0.5) as sim:
        yield sim
