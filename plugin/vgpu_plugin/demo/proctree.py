"""CPU time and resident memory of a process and everything it started, read from /proc.

The kubelet stand-in feeds this to the simulated GPU backend's "measured" pattern, so the
notebook pod's card shows what its lab and kernels actually do.
"""

from __future__ import annotations

import os

_TICKS = os.sysconf("SC_CLK_TCK")
_PAGE = os.sysconf("SC_PAGE_SIZE")


def _stat(proc: str, pid: int) -> tuple[int, float] | None:
    """(parent pid, CPU seconds in user + system) of one process; None when it is gone."""
    try:
        with open(f"{proc}/{pid}/stat", encoding="ascii", errors="replace") as handle:
            fields = handle.read().rsplit(")", 1)[1].split()  # the name may hold spaces and parentheses
    except (OSError, IndexError):
        return None
    try:
        return int(fields[1]), (int(fields[11]) + int(fields[12])) / _TICKS
    except (IndexError, ValueError):
        return None


def _rss(proc: str, pid: int) -> int:
    try:
        with open(f"{proc}/{pid}/statm", encoding="ascii") as handle:
            return int(handle.read().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        return 0


class ProcessTree:
    """``usage()`` of ``pid`` and its descendants: (CPU seconds, resident bytes), None once it exits."""

    def __init__(self, pid: int, proc: str = "/proc") -> None:
        self.pid, self.proc = pid, proc

    def members(self) -> dict[int, float]:
        """Every live process of the tree and its CPU seconds."""
        parents: dict[int, list[tuple[int, float]]] = {}
        root: float | None = None
        for entry in os.listdir(self.proc):
            if not entry.isdigit():
                continue
            stat = _stat(self.proc, int(entry))
            if stat is None:
                continue
            if int(entry) == self.pid:
                root = stat[1]
            parents.setdefault(stat[0], []).append((int(entry), stat[1]))
        if root is None:
            return {}
        found, todo = {self.pid: root}, [self.pid]
        while todo:
            for child, cpu in parents.get(todo.pop(), []):
                if child not in found:
                    found[child] = cpu
                    todo.append(child)
        return found

    def usage(self) -> tuple[float, int] | None:
        members = self.members()
        if not members:
            return None
        return sum(members.values()), sum(_rss(self.proc, pid) for pid in members)
