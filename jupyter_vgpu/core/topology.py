"""A node's GPU topology: link levels, the pairwise link matrix, NUMA nodes and a tree.

Two sources feed it: the text of ``nvidia-smi topo -m`` (as people paste it: tabs or
spaces, NIC rows and columns, affinity columns, old and new legends) and pairwise data
from a GPU backend (NVML). Everything else is derived from the matrix.

The tree groups cards level by level with single linkage over the matrix: at each link
level, cards joined by links at most that costly form one group. Groups at a cheaper
level nest inside groups at a costlier one, so every card has exactly one parent at
every level (a bottom-up build that attaches a card to the first matching group can
lose or split cards; this cannot).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property, lru_cache
from typing import Any

LINK_LEVELS = ("NV#", "PIX", "PXB", "PHB", "NODE", "SYS")
"""Cheapest first. NVn links are cheaper the more links are bonded."""

SELF = "X"

_LEVEL_COST = {"PIX": 100, "PXB": 200, "PHB": 300, "NODE": 400, "SYS": 500}
_ALIASES = {"SOC": "SYS"}  # nvidia-smi before ~2017 called the inter-socket link SOC
_NVLINK = re.compile(r"NV([1-9][0-9]?)")
_MAX_NVLINKS = 49

# nvmlGpuTopologyLevel_t -> nvidia-smi's name. INTERNAL (two GPUs on one board, e.g. K80)
# is shown by nvidia-smi like a single switch.
_NVML_LEVELS = {0: "PIX", 10: "PIX", 20: "PXB", 30: "PHB", 40: "NODE", 50: "SYS"}


class TopologyError(ValueError):
    """Topology input that cannot be understood; the message names the offending line."""


def normalize_link(link: str) -> str:
    """The canonical spelling of a link name ('SOC' -> 'SYS'); ValueError when unknown."""
    name = link.strip().upper()
    name = _ALIASES.get(name, name)
    if name == SELF or name in _LEVEL_COST:
        return name
    match = _NVLINK.fullmatch(name)
    if match and int(match.group(1)) <= _MAX_NVLINKS:
        return name
    raise ValueError(
        f"unknown link {link!r} (expected one of X, NV<n>, PIX, PXB, PHB, NODE, SYS or SOC)"
    )


def link_cost(link: str) -> int:
    """Relative communication cost of a link: 'X' 0 < 'NV12' < 'NV4' < PIX < PXB < PHB < NODE < SYS.

    NVLink costs 1..49 (50 minus the number of bonded links), PCIe levels 100..500.
    """
    name = normalize_link(link)
    if name == SELF:
        return 0
    if name in _LEVEL_COST:
        return _LEVEL_COST[name]
    return 50 - int(name[2:])


def link_level(link: str) -> str:
    """The LINK_LEVELS entry a link belongs to ('NV12' -> 'NV#')."""
    name = normalize_link(link)
    return "NV#" if name.startswith("NV") else name


def nvml_level_to_link(level: int) -> str:
    """nvidia-smi's name for an NVML ``nvmlGpuTopologyLevel_t`` value."""
    try:
        return _NVML_LEVELS[int(level)]
    except (KeyError, TypeError, ValueError):
        raise ValueError(f"unknown NVML topology level {level!r}") from None


@dataclass(frozen=True)
class TopoGPU:
    index: int
    numa: int | None = None
    cpu_affinity: str | None = None


@dataclass(frozen=True)
class TreeNode:
    """A group of cards joined at ``level`` ('ROOT', a link name, or 'GPU' for a leaf)."""

    level: str
    gpus: tuple[int, ...]
    children: tuple[TreeNode, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"level": self.level, "gpus": list(self.gpus), "children": [c.to_dict() for c in self.children]}

    def walk(self) -> Iterable[tuple[int, TreeNode]]:
        """(depth, node) for this node and every node below it, depth first."""
        stack: list[tuple[int, TreeNode]] = [(0, self)]
        while stack:
            depth, node = stack.pop()
            yield depth, node
            stack.extend((depth + 1, child) for child in reversed(node.children))


@dataclass(frozen=True)
class Topology:
    """Cards (indices 0..n-1), their n x n link matrix ('X' on the diagonal) and NUMA nodes."""

    gpus: tuple[TopoGPU, ...]
    links: tuple[tuple[str, ...], ...]

    def __post_init__(self) -> None:
        n = len(self.gpus)
        for position, gpu in enumerate(self.gpus):
            if gpu.index != position:
                raise TopologyError(f"card at position {position} has index {gpu.index}; cards must be 0..{n - 1} in order")
        if len(self.links) != n or any(len(row) != n for row in self.links):
            raise TopologyError(f"link matrix must be {n} x {n} for {n} cards")
        normalized = []
        for a, row in enumerate(self.links):
            out = []
            for b, link in enumerate(row):
                try:
                    name = normalize_link(link)
                except ValueError as error:
                    raise TopologyError(f"GPU{a}-GPU{b}: {error}") from None
                if (a == b) != (name == SELF):
                    raise TopologyError(f"GPU{a}-GPU{b}: {name!r}; 'X' belongs on the diagonal and only there")
                out.append(name)
            normalized.append(tuple(out))
        for a in range(n):
            for b in range(a):
                if normalized[a][b] != normalized[b][a]:
                    raise TopologyError(
                        f"GPU{a}-GPU{b} is {normalized[a][b]} but GPU{b}-GPU{a} is {normalized[b][a]}; "
                        "the link matrix must be symmetric"
                    )
        object.__setattr__(self, "links", tuple(normalized))

    @property
    def count(self) -> int:
        return len(self.gpus)

    @cached_property
    def _costs(self) -> tuple[tuple[int, ...], ...]:
        return tuple(tuple(link_cost(link) for link in row) for row in self.links)

    def cost(self, a: int, b: int) -> int:
        return self._costs[a][b]

    def set_cost(self, indices: Iterable[int]) -> int:
        """Sum of pairwise link costs within a set of cards (0 for one card)."""
        chosen = sorted(set(indices))
        costs = self._costs
        return sum(costs[a][b] for i, a in enumerate(chosen) for b in chosen[i + 1:])

    def numa(self, index: int) -> int | None:
        return self.gpus[index].numa

    @cached_property
    def tree(self) -> TreeNode:
        """ROOT -> one group per link level present (costliest first) -> GPU leaves."""
        n = self.count
        levels = sorted({link for row in self.links for link in row if link != SELF}, key=link_cost)
        # partitions[k] are the groups at levels[k]; single linkage makes them nest
        partitions = [_components(self._costs, link_cost(level)) for level in levels]

        def build(k: int, members: tuple[int, ...]) -> tuple[TreeNode, ...]:
            if k < 0:
                return tuple(TreeNode("GPU", (i,)) for i in members)
            wanted = set(members)
            return tuple(
                TreeNode(levels[k], group, build(k - 1, group))
                for group in partitions[k]
                if group[0] in wanted
            )

        return TreeNode("ROOT", tuple(range(n)), build(len(levels) - 1, tuple(range(n))))

    def to_dict(self) -> dict[str, Any]:
        return {
            "gpus": [{"index": g.index, "numa": g.numa, "cpuAffinity": g.cpu_affinity} for g in self.gpus],
            "links": [list(row) for row in self.links],
            "tree": self.tree.to_dict(),
        }

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), separators=(",", ":"))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Topology:
        """Inverse of to_dict. The tree is derived from the links, so a stored one is ignored."""
        if not isinstance(data, Mapping):
            raise TopologyError("topology must be an object with 'gpus' and 'links'")
        try:
            raw_gpus, raw_links = data["gpus"], data["links"]
        except KeyError as error:
            raise TopologyError(f"topology lacks {error.args[0]!r}") from None
        if not isinstance(raw_gpus, list) or not isinstance(raw_links, list):
            raise TopologyError("topology 'gpus' and 'links' must be lists")
        gpus = []
        for position, item in enumerate(raw_gpus):
            if not isinstance(item, Mapping):
                raise TopologyError(f"gpus[{position}] is not an object")
            index, numa, affinity = item.get("index"), item.get("numa"), item.get("cpuAffinity")
            if not isinstance(index, int) or isinstance(index, bool) or (numa is not None and not _is_int(numa)):
                raise TopologyError(f"gpus[{position}]: index and numa must be integers (numa may be null)")
            if affinity is not None and not isinstance(affinity, str):
                raise TopologyError(f"gpus[{position}]: cpuAffinity must be a string or null")
            gpus.append(TopoGPU(index, numa, affinity))
        rows = []
        for position, row in enumerate(raw_links):
            if not isinstance(row, list) or not all(isinstance(cell, str) for cell in row):
                raise TopologyError(f"links[{position}] is not a list of link names")
            rows.append(tuple(row))
        return _checked(tuple(gpus), tuple(rows)) if cls is Topology else cls(tuple(gpus), tuple(rows))

    @classmethod
    def from_json(cls, text: str) -> Topology:
        try:
            data = json.loads(text)
        except (TypeError, json.JSONDecodeError, RecursionError) as error:  # nested past the reader's depth too
            raise TopologyError(f"topology is not JSON: {error}") from None
        return cls.from_dict(data)

    def render_tree(self) -> str:
        """The tree as indented text, e.g. ``|--PIX:3 (GPU0,1,2)``."""
        lines = []
        for depth, node in self.tree.walk():
            if node.level == "GPU":
                numa = self.gpus[node.gpus[0]].numa
                label = f"GPU{node.gpus[0]}" + (f" (NUMA {numa})" if numa is not None else "")
            else:
                label = f"{node.level}:{len(node.gpus)}"
                if depth:
                    label += " [" + ",".join(str(g) for g in node.gpus) + "]"
            lines.append(("|  " * (depth - 1) + "|--" if depth else "") + label)
        return "\n".join(lines)

    def render_matrix(self) -> str:
        """The link matrix in nvidia-smi's layout, plus a NUMA column."""
        names = [f"GPU{g.index}" for g in self.gpus]
        width = max([6, *(len(name) + 2 for name in names)])
        header = " " * width + "".join(name.ljust(width) for name in names) + "NUMA"
        lines = [header.rstrip()]
        for gpu, row in zip(self.gpus, self.links, strict=True):
            numa = "N/A" if gpu.numa is None else str(gpu.numa)
            lines.append(f"GPU{gpu.index}".ljust(width) + "".join(link.ljust(width) for link in row) + numa)
        return "\n".join(lines)

    def render_legend(self) -> str:
        """What the link names the matrix shows mean, cheapest first (only those it shows)."""
        shown = {link for row in self.links for link in row if link != SELF}
        names = sorted(shown, key=link_cost)
        width = max(len(name) for name in [SELF, *names])
        lines = ["Legend:", f"  {SELF.ljust(width)} = {LINK_LEGEND[SELF]}"]
        for name in names:
            level = link_level(name)
            words = LINK_LEGEND.get(level, name)
            if level == "NV#":
                words = words.replace("#", name[2:], 1)
            lines.append(f"  {name.ljust(width)} = {words}")
        return "\n".join(lines)


LINK_LEGEND = {
    SELF: "the card itself",
    "NV#": "NVLink: a bonded set of # NVLinks (more links, faster)",
    "PIX": "PCIe through at most one PCIe switch",
    "PXB": "PCIe through several PCIe switches, not the host bridge",
    "PHB": "PCIe through a PCIe host bridge (typically the CPU)",
    "NODE": "PCIe and the interconnect between host bridges within one NUMA node",
    "SYS": "PCIe and the link between NUMA nodes (e.g. QPI/UPI): the slowest",
}
"""What each link name of the matrix means (nvidia-smi's legend, in words)."""


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@lru_cache(maxsize=256)
def _checked(gpus: tuple[TopoGPU, ...], links: tuple[tuple[str, ...], ...]) -> Topology:
    """One checked Topology per distinct machine: a cluster's nodes share a handful of them, and
    the extender reads every node's inventory when it starts (5,000 DGX nodes: one check, not
    5,000). Topologies are immutable, so the nodes may share one; refusals raise and are not kept."""
    return Topology(gpus, links)


def _components(costs: Sequence[Sequence[int]], threshold: int) -> list[tuple[int, ...]]:
    """Groups of cards joined by links costing at most ``threshold`` (single linkage).

    Each group is sorted; groups are ordered by their smallest card.
    """
    n = len(costs)
    parent = list(range(n))

    def find(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for a in range(n):
        for b in range(a + 1, n):
            if costs[a][b] <= threshold:
                ra, rb = find(a), find(b)
                if ra != rb:
                    parent[max(ra, rb)] = min(ra, rb)
    groups: dict[int, list[int]] = {}
    for i in range(n):
        groups.setdefault(find(i), []).append(i)
    return sorted((tuple(g) for g in groups.values()), key=lambda g: g[0])


def from_pairwise(count: int, link: Callable[[int, int], str], numa: Sequence[int | None],
                  cpu_affinity: Sequence[str | None] | None = None) -> Topology:
    """A topology from a backend's pairwise query; ``link(a, b)`` is asked once per pair a < b."""
    if count < 0 or len(numa) != count:
        raise TopologyError(f"need one NUMA entry per card: {count} cards, {len(numa)} entries")
    affinity = list(cpu_affinity) if cpu_affinity is not None else [None] * count
    if len(affinity) != count:
        raise TopologyError(f"need one CPU affinity entry per card: {count} cards, {len(affinity)} entries")
    matrix = [[SELF] * count for _ in range(count)]
    for a in range(count):
        for b in range(a + 1, count):
            matrix[a][b] = matrix[b][a] = link(a, b)
    gpus = tuple(TopoGPU(i, numa[i], affinity[i]) for i in range(count))
    return Topology(gpus, tuple(tuple(row) for row in matrix))


# --- nvidia-smi topo -m -------------------------------------------------------------------

# Column titles with spaces in them; once tabs are expanded to spaces they cannot be
# told apart from separators, so they are recognised by name.
_MULTIWORD_COLUMNS = ("CPU Affinity", "NUMA Affinity", "GPU NUMA ID")
_NUMA_COLUMNS = ("NUMA Affinity", "NUMA")
_CPU_COLUMNS = ("CPU Affinity",)
_GPU_NAME = re.compile(r"GPU(\d+)")
_DEVICE_NAME = re.compile(r"(GPU|NIC)\d+|[A-Za-z][A-Za-z0-9]*_\d+")  # GPU3, NIC0, mlx5_0


def parse_nvidia_smi_topo(text: str) -> Topology:
    """Parse the text of ``nvidia-smi topo -m``.

    Accepts tabs or runs of spaces, NIC/mlx rows and columns (ignored), the affinity and
    ``GPU NUMA ID`` columns, trailing empty cells, old (SOC) and new legends, and lines
    before the table (a shell prompt). Raises TopologyError naming the offending line.
    """
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    header_at = next((i for i, line in enumerate(lines) if _header_tokens(line)[:1] == ["GPU0"]), None)
    if header_at is None:
        first = next(((i, line) for i, line in enumerate(lines) if line.strip()), None)
        if first is None:
            raise TopologyError("empty input: expected the output of `nvidia-smi topo -m`")
        raise TopologyError(
            f"line {first[0] + 1}: no header row starting with GPU0 found; expected the output of "
            f"`nvidia-smi topo -m`, got {_excerpt(first[1])}"
        )
    header = _header_tokens(lines[header_at])
    if len(header) > 1 and header[1].upper() == SELF:
        raise TopologyError(
            f"line {header_at + 1}: GPU0's row comes first, but the header row naming the columns "
            f"(GPU0 GPU1 ... CPU Affinity) belongs above it; is the table cut off at the top?"
        )

    rows: list[tuple[int, list[str]]] = []
    for number in range(header_at + 1, len(lines)):
        line = lines[number]
        if not line.strip() or line.strip().startswith("Legend"):
            break
        rows.append((number + 1, line.split()))
    if not rows:
        raise TopologyError(f"line {header_at + 1}: header row has no rows of links after it")

    row_names = [cells[0] for _, cells in rows]
    devices = header[: len(row_names)]
    extras = header[len(row_names):]
    for (number, cells), expected in zip(rows, header, strict=False):
        if cells[0] != expected:
            raise TopologyError(
                f"line {number}: row {cells[0]!r} where the header's column order expects {expected!r}: "
                f"{_excerpt(lines[number - 1])}"
            )
    if len(rows) > len(header):
        number, cells = rows[len(header)]
        raise TopologyError(f"line {number}: row {cells[0]!r} has no column in the header: {_excerpt(lines[number - 1])}")
    missing = [title for title in extras if _DEVICE_NAME.fullmatch(title)]
    if missing:
        raise TopologyError(
            f"line {rows[-1][0] + 1}: the table ends after row {row_names[-1]} but the header also names "
            f"{', '.join(missing)}; is the table cut off?"
        )
    gpu_positions = [p for p, name in enumerate(devices) if _GPU_NAME.fullmatch(name)]
    for order, position in enumerate(gpu_positions):
        if devices[position] != f"GPU{order}":
            raise TopologyError(
                f"line {header_at + 1}: GPU columns must be GPU0, GPU1, ... in order; "
                f"found {devices[position]} where GPU{order} belongs"
            )

    n_dev = len(devices)
    links: list[list[str]] = []
    info: list[dict[str, str]] = []
    for position, ((number, cells), name) in enumerate(zip(rows, devices, strict=True)):
        values = cells[1:]
        if len(values) < n_dev:
            raise TopologyError(
                f"line {number}: {name} has {len(values)} cells, expected {n_dev} links "
                f"(one per column {devices[0]}..{devices[-1]}); is the row cut off? {_excerpt(lines[number - 1])}"
            )
        if len(values) > n_dev + len(extras):
            raise TopologyError(
                f"line {number}: {name} has {len(values)} cells but the header names only "
                f"{n_dev + len(extras)} columns: {_excerpt(lines[number - 1])}"
            )
        row = []
        for column, cell in enumerate(values[:n_dev]):
            try:
                link = normalize_link(cell)
            except ValueError as error:
                raise TopologyError(f"line {number}: {name} column {devices[column]}: {error}") from None
            if (link == SELF) != (column == position):
                raise TopologyError(
                    f"line {number}: {name} column {devices[column]} is {cell!r}; "
                    "'X' belongs on the diagonal and only there"
                )
            row.append(link)
        links.append(row)
        info.append(dict(zip(extras, values[n_dev:], strict=False)))

    gpus = []
    matrix = []
    for gpu_number, position in enumerate(gpu_positions):
        number = rows[position][0]
        columns = info[position]
        numa_text = next((columns[c] for c in _NUMA_COLUMNS if c in columns), None)
        cpu_text = next((columns[c] for c in _CPU_COLUMNS if c in columns), None)
        gpus.append(TopoGPU(gpu_number, _numa(numa_text), cpu_text if cpu_text not in (None, "N/A") else None))
        matrix.append(tuple(links[position][p] for p in gpu_positions))
        for other, other_position in enumerate(gpu_positions[:gpu_number]):
            mine, theirs = links[position][other_position], links[other_position][position]
            if mine != theirs:
                raise TopologyError(
                    f"line {number}: GPU{gpu_number}-GPU{other} is {mine} but line "
                    f"{rows[other_position][0]} says GPU{other}-GPU{gpu_number} is {theirs}"
                )
    return Topology(tuple(gpus), tuple(matrix))


def _header_tokens(line: str) -> list[str]:
    """Column titles of a header line; multi-word titles stay whole."""
    protected = line
    for title in _MULTIWORD_COLUMNS:
        protected = re.sub(r"\s+".join(map(re.escape, title.split())), title.replace(" ", "\0"), protected)
    return [token.replace("\0", " ") for token in protected.split()]


def _numa(text: str | None) -> int | None:
    if text is None or not text.strip().isdigit():
        return None  # "N/A", empty, or a range such as "0-1": no single NUMA node
    return int(text)


def _excerpt(line: str, limit: int = 80) -> str:
    line = line.strip()
    return repr(line if len(line) <= limit else line[: limit - 3] + "...")
