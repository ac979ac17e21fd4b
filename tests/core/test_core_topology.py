"""Topology: the nvidia-smi parser over real captures and pasted variants, the tree, JSON."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from jupyter_vgpu.core.topology import (
    LINK_LEVELS,
    TopoGPU,
    Topology,
    TopologyError,
    TreeNode,
    from_pairwise,
    link_cost,
    link_level,
    nvml_level_to_link,
    parse_nvidia_smi_topo,
)
from jupyter_vgpu.data import TOPOLOGY_DIR


def text_of(name: str) -> str:
    return (TOPOLOGY_DIR / name).read_text()


P40 = "p40-7gpu-pix-phb.txt"
A100_PCIE = "a100-pcie-4gpu-2numa.txt"
A100_SXM = "a100-sxm-4gpu-nv4.txt"
DGX = "dgx-a100.txt"

# what each capture says, read off the files by a person
EXPECTED = {
    P40: {"count": 7, "numa": [0] * 7, "links": {(0, 1): "PIX", (0, 3): "PHB", (3, 6): "PIX", (2, 6): "PHB"},
          "cpu": "0-13,28-41"},
    A100_PCIE: {"count": 4, "numa": [0, 0, 1, 1], "links": {(0, 1): "NODE", (0, 2): "SYS", (2, 3): "NODE"},
                "cpu": "0,2,4,6,8,10"},
    A100_SXM: {"count": 4, "numa": [0, 0, 1, 1], "links": {(0, 1): "NV4", (1, 3): "NV4"}, "cpu": "0-23"},
    DGX: {"count": 8, "numa": [3, 3, 1, 1, 7, 7, 5, 5], "links": {(0, 7): "NV12", (3, 4): "NV12"},
          "cpu": "48-63,176-191"},
}


def leaves_by_level(tree: TreeNode) -> dict[str, list[tuple[int, ...]]]:
    out: dict[str, list[tuple[int, ...]]] = {}
    for _, node in tree.walk():
        out.setdefault(node.level, []).append(node.gpus)
    return out


def shape(node: TreeNode) -> tuple[object, ...]:
    """A tree as nested tuples of (level, gpus, children) for comparison."""
    return (node.level, node.gpus, tuple(shape(c) for c in node.children))


# --- link levels ----------------------------------------------------------------------------


def test_link_costs_follow_the_documented_order() -> None:
    order = ["X", "NV18", "NV12", "NV4", "NV1", "PIX", "PXB", "PHB", "NODE", "SYS"]
    costs = [link_cost(link) for link in order]
    assert costs == sorted(costs) and len(set(costs)) == len(costs)
    assert link_cost("SOC") == link_cost("SYS")  # the old legend's name for SYS
    assert [link_level(x) for x in ("NV4", "PIX", "PXB", "PHB", "NODE", "SYS")] == list(LINK_LEVELS)


@pytest.mark.parametrize("bad", ["", "NV", "NV0", "NVX", "FOO", "PCI", "NV100"])
def test_unknown_link_names_are_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="unknown link"):
        link_cost(bad)


def test_nvml_levels_map_to_nvidia_smi_names() -> None:
    assert [nvml_level_to_link(level) for level in (0, 10, 20, 30, 40, 50)] == [
        "PIX", "PIX", "PXB", "PHB", "NODE", "SYS"]
    with pytest.raises(ValueError, match="unknown NVML topology level 60"):
        nvml_level_to_link(60)


# --- every real capture --------------------------------------------------------------------


def test_every_capture_parses_as_read_by_a_person(fixture_file: Path) -> None:
    topo = parse_nvidia_smi_topo(fixture_file.read_text())
    want = EXPECTED[fixture_file.name]
    assert topo.count == want["count"]
    assert [g.numa for g in topo.gpus] == want["numa"]
    assert topo.gpus[0].cpu_affinity == want["cpu"]
    for (a, b), link in want["links"].items():
        assert topo.links[a][b] == topo.links[b][a] == link
    assert all(topo.links[i][i] == "X" for i in range(topo.count))
    # NIC rows and columns are not cards
    assert all(len(row) == topo.count for row in topo.links)


def test_every_capture_round_trips_through_json(fixture_file: Path) -> None:
    topo = parse_nvidia_smi_topo(fixture_file.read_text())
    data = json.loads(topo.to_json())
    assert set(data) >= {"gpus", "links", "tree"}
    assert data["gpus"][0] == {"index": 0, "numa": topo.gpus[0].numa, "cpuAffinity": topo.gpus[0].cpu_affinity}
    again = Topology.from_json(topo.to_json())
    assert again == topo
    assert shape(again.tree) == shape(topo.tree)
    assert data["tree"] == topo.tree.to_dict()


def test_every_capture_tree_has_one_parent_per_level(fixture_file: Path) -> None:
    topo = parse_nvidia_smi_topo(fixture_file.read_text())
    assert_tree_is_a_proper_hierarchy(topo)


def assert_tree_is_a_proper_hierarchy(topo: Topology) -> None:
    tree = topo.tree
    assert tree.level == "ROOT" and tree.gpus == tuple(range(topo.count))
    for level, groups in leaves_by_level(tree).items():
        cards = sorted(card for group in groups for card in group)
        if level == "ROOT":
            continue
        # each level covers every card exactly once
        assert cards == list(range(topo.count)), (level, groups)
    for _, node in tree.walk():
        if node.children:
            assert sorted(c for child in node.children for c in child.gpus) == sorted(node.gpus)
        else:
            assert node.level == "GPU" and len(node.gpus) == 1
    # single linkage: inside a group every card reaches every other through links no
    # costlier than the group's level, and no cheaper link leaves the group
    for _, node in tree.walk():
        if node.level in ("ROOT", "GPU"):
            continue
        inside = set(node.gpus)
        for a in node.gpus:
            for b in range(topo.count):
                if b not in inside:
                    assert topo.cost(a, b) > link_cost(node.level)


# --- the P40 box of the gpu-manager notes --------------------------------------------------


IDEAL_P40_TREE = TreeNode("ROOT", tuple(range(7)), (
    TreeNode("PHB", tuple(range(7)), (
        TreeNode("PIX", (0, 1, 2), tuple(TreeNode("GPU", (i,)) for i in (0, 1, 2))),
        TreeNode("PIX", (3, 4, 5, 6), tuple(TreeNode("GPU", (i,)) for i in (3, 4, 5, 6))),
    )),
))
# what gpu-manager's buildTree produced for the same box (seed 000): cards 0-2 under a PHB
# group inside the PHB group instead of their PIX switch
BUGGY_P40_TREE = TreeNode("ROOT", tuple(range(7)), (
    TreeNode("PHB", tuple(range(7)), (
        TreeNode("PHB", (0, 1, 2), tuple(TreeNode("GPU", (i,)) for i in (0, 1, 2))),
        TreeNode("PIX", (3, 4, 5, 6), tuple(TreeNode("GPU", (i,)) for i in (3, 4, 5, 6))),
    )),
))


def test_p40_tree_is_the_ideal_one_not_gpu_managers() -> None:
    topo = parse_nvidia_smi_topo(text_of(P40))
    assert topo.tree == IDEAL_P40_TREE
    assert topo.tree != BUGGY_P40_TREE
    assert topo.render_tree().splitlines()[:4] == ["ROOT:7", "|--PHB:7 [0,1,2,3,4,5,6]", "|  |--PIX:3 [0,1,2]",
                                                   "|  |  |--GPU0 (NUMA 0)"]


def test_p40_as_pasted_in_the_notes_tabs_and_spaces_mixed() -> None:
    # the notes' copy pads every cell after a tab with four spaces and has a trailing blank
    pasted = text_of(P40).replace("\t", "\t    ").replace("GPU3\t    PHB", "GPU3\tPHB")
    pasted = pasted.replace("\t    0-13,28-41\t    0\nGPU4", "\t    0-13,28-41\t    0 \nGPU4")
    topo = parse_nvidia_smi_topo(pasted)
    assert topo == parse_nvidia_smi_topo(text_of(P40))
    assert topo.tree == IDEAL_P40_TREE


def test_a100_pcie_tree_splits_by_numa_node() -> None:
    topo = parse_nvidia_smi_topo(text_of(A100_PCIE))
    assert shape(topo.tree) == shape(TreeNode("ROOT", (0, 1, 2, 3), (
        TreeNode("SYS", (0, 1, 2, 3), (
            TreeNode("NODE", (0, 1), (TreeNode("GPU", (0,)), TreeNode("GPU", (1,)))),
            TreeNode("NODE", (2, 3), (TreeNode("GPU", (2,)), TreeNode("GPU", (3,)))),
        )),
    )))


def test_card_without_cheap_peers_still_has_a_parent_at_every_level() -> None:
    # GPU2 has no PIX peer: it still sits in its own PIX group, under the PHB group
    links = (("X", "PIX", "PHB"), ("PIX", "X", "PHB"), ("PHB", "PHB", "X"))
    topo = Topology(tuple(TopoGPU(i, 0) for i in range(3)), links)
    pix = [node.gpus for _, node in topo.tree.walk() if node.level == "PIX"]
    assert pix == [(0, 1), (2,)]
    assert_tree_is_a_proper_hierarchy(topo)


def test_single_card_tree() -> None:
    topo = parse_nvidia_smi_topo("\tGPU0\tCPU Affinity\tNUMA Affinity\nGPU0\t X \t0-11\tN/A\n")
    assert topo.tree == TreeNode("ROOT", (0,), (TreeNode("GPU", (0,)),))
    assert topo.gpus == (TopoGPU(0, None, "0-11"),)


@st.composite
def symmetric_matrices(draw: st.DrawFn) -> Topology:
    n = draw(st.integers(1, 9))
    names = ["NV12", "NV4", "NV1", "PIX", "PXB", "PHB", "NODE", "SYS"]
    rows = [["X"] * n for _ in range(n)]
    for a in range(n):
        for b in range(a + 1, n):
            rows[a][b] = rows[b][a] = draw(st.sampled_from(names))
    numa = draw(st.lists(st.one_of(st.none(), st.integers(0, 3)), min_size=n, max_size=n))
    return Topology(tuple(TopoGPU(i, numa[i]) for i in range(n)), tuple(tuple(r) for r in rows))


@settings(max_examples=150, deadline=None)
@given(symmetric_matrices())
def test_any_matrix_gives_a_tree_with_one_parent_per_level_and_round_trips(topo: Topology) -> None:
    # NVLink meshes need not be trees; the grouping must still be a hierarchy
    assert_tree_is_a_proper_hierarchy(topo)
    assert Topology.from_json(topo.to_json()) == topo
    assert parse_nvidia_smi_topo(render_as_nvidia_smi(topo)) == topo


def render_as_nvidia_smi(topo: Topology) -> str:
    header = "\t" + "\t".join(f"GPU{i}" for i in range(topo.count)) + "\tCPU Affinity\tNUMA Affinity\n"
    rows = "".join(
        f"GPU{g.index}\t" + "\t".join(" X " if c == "X" else c for c in row)
        + f"\t{g.cpu_affinity or 'N/A'}\t{'N/A' if g.numa is None else g.numa}\n"
        for g, row in zip(topo.gpus, topo.links, strict=True)
    )
    return header + rows + "\nLegend:\n\n  X    = Self\n"


# --- what people paste ----------------------------------------------------------------------


def test_tabs_expanded_to_spaces_parse_the_same(fixture_file: Path) -> None:
    text = fixture_file.read_text()
    expected = parse_nvidia_smi_topo(text)
    for tabsize in (4, 8):
        assert parse_nvidia_smi_topo(text.expandtabs(tabsize)) == expected
    single_spaced = "\n".join(" ".join(line.split()) for line in text.splitlines())
    assert parse_nvidia_smi_topo(single_spaced) == expected
    assert parse_nvidia_smi_topo(text.replace("\n", "\r\n")) == expected


def test_prompt_lines_before_and_after_the_table_are_ignored() -> None:
    text = "user@gpu-node:~$ nvidia-smi topo -m\n" + text_of(A100_SXM) + "user@gpu-node:~$ \n"
    assert parse_nvidia_smi_topo(text) == parse_nvidia_smi_topo(text_of(A100_SXM))


def test_old_legend_with_soc_and_no_numa_column() -> None:
    old = """\
\tGPU0\tGPU1\tGPU2\tGPU3\tCPU Affinity
GPU0\t X \tPIX\tSOC\tSOC\t0-9,20-29
GPU1\tPIX\t X \tSOC\tSOC\t0-9,20-29
GPU2\tSOC\tSOC\t X \tPIX\t10-19,30-39
GPU3\tSOC\tSOC\tPIX\t X \t10-19,30-39

Legend:

  X   = Self
  SOC  = Connection traversing PCIe as well as the SMP link between CPU sockets(e.g. QPI)
  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)
  PXB  = Connection traversing multiple PCIe switches (without traversing the PCIe Host Bridge)
  PIX  = Connection traversing a single PCIe switch
  NV#  = Connection traversing a bonded set of # NVLinks
"""
    topo = parse_nvidia_smi_topo(old)
    assert topo.links[0] == ("X", "PIX", "SYS", "SYS")
    assert [g.numa for g in topo.gpus] == [None] * 4
    assert topo.gpus[2].cpu_affinity == "10-19,30-39"
    assert [n.gpus for _, n in topo.tree.walk() if n.level == "PIX"] == [(0, 1), (2, 3)]


NEW_STYLE = """\
\tGPU0\tGPU1\tGPU2\tGPU3\tNIC0\tNIC1\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID
GPU0\t X \tNV18\tNV18\tNV18\tPXB\tSYS\t0-55,112-167\t0\t\tN/A
GPU1\tNV18\t X \tNV18\tNV18\tPXB\tSYS\t0-55,112-167\t0\t\tN/A
GPU2\tNV18\tNV18\t X \tNV18\tSYS\tPXB\t56-111,168-223\t1\t\tN/A
GPU3\tNV18\tNV18\tNV18\t X \tSYS\tPXB\t56-111,168-223\t1\t\tN/A
NIC0\tPXB\tPXB\tSYS\tSYS\t X \tSYS\t\t\t\t
NIC1\tSYS\tSYS\tPXB\tPXB\tSYS\t X \t\t\t\t

Legend:

  X    = Self
  SYS  = Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)
  NODE = Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node
  PHB  = Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)
  PXB  = Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)
  PIX  = Connection traversing at most a single PCIe bridge
  NV#  = Connection traversing a bonded set of # NVLinks

NIC Legend:

  NIC0: mlx5_0
  NIC1: mlx5_1
"""


def test_new_style_nic_columns_gpu_numa_id_and_nic_legend() -> None:
    for text in (NEW_STYLE, NEW_STYLE.expandtabs(8)):
        topo = parse_nvidia_smi_topo(text)
        assert topo.count == 4
        assert topo.links[0] == ("X", "NV18", "NV18", "NV18")
        assert [g.numa for g in topo.gpus] == [0, 0, 1, 1]
        assert topo.gpus[3].cpu_affinity == "56-111,168-223"


def test_numa_column_titled_numa_and_an_indented_paste() -> None:
    text = """\
        GPU0  GPU1  CPU Affinity  NUMA
GPU0     X    NV18  0-51         0
GPU1    NV18   X    52-103       1
Legend:
  NV#  = Connected via # NVLinks
"""
    topo = parse_nvidia_smi_topo(text)
    assert [(g.numa, g.cpu_affinity) for g in topo.gpus] == [(0, "0-51"), (1, "52-103")]
    indented = "\n".join("    " + line for line in text_of(DGX).splitlines())
    assert parse_nvidia_smi_topo(indented) == parse_nvidia_smi_topo(text_of(DGX))


def test_header_starting_with_spaces_and_trailing_empty_cells() -> None:
    text = text_of(A100_PCIE)
    assert text.startswith("     GPU0")
    assert parse_nvidia_smi_topo(text).gpus[2] == TopoGPU(2, 1, "1,3,5,7,9,11")


# --- garbage is refused, naming the line ---------------------------------------------------


def p40_lines() -> list[str]:
    return text_of(P40).splitlines()


def join(lines: list[str]) -> str:
    return "\n".join(lines) + "\n"


def cut_row() -> str:
    lines = p40_lines()
    lines[3] = "\t".join(lines[3].split("\t")[:5])  # GPU2's row stops after four cells
    return join(lines)


def cut_table() -> str:
    return join(p40_lines()[:4])  # header and GPU0..GPU2 only


def extra_cell() -> str:
    lines = p40_lines()
    lines[2] += "\t7\tmore"
    return join(lines)


def unknown_link() -> str:
    lines = p40_lines()
    lines[5] = lines[5].replace("PIX", "PCI", 1)
    return join(lines)


def asymmetric() -> str:
    lines = p40_lines()
    cells = lines[2].split("\t")
    cells[4] = "PIX"  # GPU1-GPU3 PIX, but GPU3-GPU1 says PHB
    lines[2] = "\t".join(cells)
    return join(lines)


def x_off_diagonal() -> str:
    lines = p40_lines()
    cells = lines[3].split("\t")
    cells[1] = " X "
    lines[3] = "\t".join(cells)
    return join(lines)


def no_header() -> str:
    return join(p40_lines()[1:])


def row_without_column() -> str:
    return "\tGPU0\tGPU1\nGPU0\t X \tPIX\nGPU1\tPIX\t X \nGPU2\tPIX\tPIX\t X \n"


def prompt_right_after_rows() -> str:
    return join(p40_lines()[:9] + ["user@gpu-node:~$ "])


def gpu_out_of_order() -> str:
    return text_of(A100_SXM).replace("GPU2", "GPU7")


@pytest.mark.parametrize(("make", "pattern"), [
    (lambda: "", r"empty input"),
    (lambda: "hello world\nthis is not a table\n", r"^line 1: no header row starting with GPU0.*'hello world'"),
    (lambda: "\n\n  {\"gpus\": 3}\n", r"^line 3: no header row"),
    (cut_row, r"^line 4: GPU2 has 4 cells, expected 8 links.*cut off"),
    (cut_table, r"^line 5: the table ends after row GPU2 but the header also names GPU3, GPU4, GPU5, GPU6, mlx4_0"),
    (extra_cell, r"^line 3: GPU1 has 12 cells but the header names only 10 columns"),
    (unknown_link, r"^line 6: GPU4 column GPU3: unknown link 'PCI'"),
    (asymmetric, r"^line 5: GPU3-GPU1 is PHB but line 3 says GPU1-GPU3 is PIX"),
    (x_off_diagonal, r"^line 4: GPU2 column GPU0 is 'X'; 'X' belongs on the diagonal"),
    (no_header, r"^line 1: GPU0's row comes first, but the header row"),
    (row_without_column, r"^line 4: row 'GPU2' has no column in the header"),
    (prompt_right_after_rows, r"^line 10: row 'user@gpu-node:~\$' where the header's column order expects 'CPU Affinity'"),
    (gpu_out_of_order, r"^line 1: GPU columns must be GPU0, GPU1, \.\.\. in order; found GPU7 where GPU2 belongs"),
], ids=["empty", "prose", "json", "cut-row", "cut-table", "extra-cell", "unknown-link", "asymmetric",
        "x-off-diagonal", "no-header", "row-without-column", "prompt-after-rows", "gpu-out-of-order"])
def test_garbage_is_refused_with_the_offending_line(make, pattern: str) -> None:
    with pytest.raises(TopologyError, match=pattern):
        parse_nvidia_smi_topo(make())


def test_cut_off_row_is_refused_in_space_separated_text_too() -> None:
    with pytest.raises(TopologyError, match=r"^line 4: GPU2 has 4 cells"):
        parse_nvidia_smi_topo(cut_row().expandtabs(8))


# --- JSON and pairwise input ----------------------------------------------------------------


@pytest.mark.parametrize(("data", "pattern"), [
    ([], "must be an object"),
    ({"gpus": []}, "lacks 'links'"),
    ({"gpus": [{"index": 0, "numa": "zero"}], "links": [["X"]]}, r"gpus\[0\]: index and numa must be integers"),
    ({"gpus": [{"index": 1}], "links": [["X"]]}, "position 0 has index 1"),
    ({"gpus": [{"index": 0}, {"index": 1}], "links": [["X", "PIX"]]}, "must be 2 x 2"),
    ({"gpus": [{"index": 0}, {"index": 1}], "links": [["X", "PIX"], ["PHB", "X"]]}, "must be symmetric"),
    ({"gpus": [{"index": 0}, {"index": 1}], "links": [["X", "WAT"], ["WAT", "X"]]}, "unknown link 'WAT'"),
    ({"gpus": [{"index": 0}], "links": [[0]]}, r"links\[0\] is not a list of link names"),
])
def test_malformed_json_is_refused(data: object, pattern: str) -> None:
    with pytest.raises(TopologyError, match=pattern):
        Topology.from_json(json.dumps(data))


def test_not_json_is_refused() -> None:
    with pytest.raises(TopologyError, match="not JSON"):
        Topology.from_json("{gpus:")


def test_from_pairwise_with_nvml_levels_matches_the_capture() -> None:
    capture = parse_nvidia_smi_topo(text_of(P40))
    nvml_level = {"PIX": 10, "PHB": 30}
    asked: list[tuple[int, int]] = []

    def link(a: int, b: int) -> str:
        asked.append((a, b))
        return nvml_level_to_link(nvml_level[capture.links[a][b]])

    built = from_pairwise(7, link, [0] * 7, ["0-13,28-41"] * 7)
    assert built == capture
    assert asked == [(a, b) for a in range(7) for b in range(a + 1, 7)]
    with pytest.raises(TopologyError, match="one NUMA entry per card"):
        from_pairwise(2, link, [0])


def test_set_cost_is_the_sum_of_pairwise_costs() -> None:
    topo = parse_nvidia_smi_topo(text_of(P40))
    assert topo.set_cost([0]) == 0
    assert topo.set_cost([0, 1, 2]) == 3 * link_cost("PIX")
    assert topo.set_cost([2, 3]) == link_cost("PHB")
    assert topo.set_cost([3, 4, 5, 6]) < topo.set_cost([0, 1, 2, 3])


def test_render_matrix_lists_links_and_numa() -> None:
    topo = parse_nvidia_smi_topo(text_of(A100_PCIE))
    lines = topo.render_matrix().splitlines()
    assert re.split(r"\s+", lines[0].strip()) == ["GPU0", "GPU1", "GPU2", "GPU3", "NUMA"]
    assert lines[3].split() == ["GPU2", "SYS", "SYS", "X", "NODE", "1"]


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(sorted(TOPOLOGY_DIR.glob("*.txt"))), st.data())
def test_mangled_captures_parse_or_are_refused_cleanly(path: Path, data: st.DataObject) -> None:
    # a paste damaged anywhere either still parses (and then is a valid topology) or is
    # refused with a TopologyError naming a line -- never any other exception
    tokens = re.split(r"(\s+)", path.read_text())
    for _ in range(data.draw(st.integers(1, 4))):
        at = data.draw(st.integers(0, len(tokens) - 1))
        tokens[at] = data.draw(st.sampled_from(["", " ", "\n", "X", "PIX", "NV4", "GPU9", "0-3", "N/A", "\t\t", "??"]))
    try:
        topo = parse_nvidia_smi_topo("".join(tokens))
    except TopologyError as error:
        assert str(error).startswith(("line ", "empty input")), error
    else:
        assert_tree_is_a_proper_hierarchy(topo)


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=300))
def test_arbitrary_text_is_refused_cleanly(text: str) -> None:
    try:
        parse_nvidia_smi_topo(text)
    except TopologyError as error:
        assert str(error).startswith(("line ", "empty input"))
