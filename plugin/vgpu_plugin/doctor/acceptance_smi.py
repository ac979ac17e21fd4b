"""What ``nvidia-smi`` says about the cards, asked read-only, to compare with our NVML backend.

Only queries are run: ``nvidia-smi --query-gpu=FIELDS --format=csv,noheader,nounits`` and
``nvidia-smi -L``. Never ``-c`` (compute mode), ``-mig``, ``-pm`` or any other setter.
"""

from __future__ import annotations

import csv
import io
import re
import shutil
import subprocess
from collections.abc import Sequence
from typing import Any

CARD_FIELDS = ("index", "uuid", "name", "memory.total", "driver_version")
MIG_FIELDS = ("index", "uuid", "mig.mode.current", "mig.mode.pending")
_GPU_LINE = re.compile(r"^GPU\s+(\d+):.*\(UUID:\s*(GPU-[^)\s]+)\)")
_MIG_LINE = re.compile(r"^\s+MIG\s+(\S+)\s+Device\s+(\d+):\s*\(UUID:\s*(MIG-[^)\s]+)\)")


class SmiError(RuntimeError):
    """nvidia-smi failed or answered something unreadable."""


def find_smi() -> str | None:
    return shutil.which("nvidia-smi")


def _run(smi: str, args: Sequence[str], timeout: float) -> str:
    try:
        done = subprocess.run([smi, *args], capture_output=True, text=True, timeout=max(1.0, timeout))
    except subprocess.TimeoutExpired:
        raise SmiError(f"{smi} {' '.join(args)} did not answer within {timeout:.0f} s") from None
    except OSError as error:
        raise SmiError(f"cannot run {smi}: {error}") from None
    if done.returncode != 0:
        raise SmiError(f"{smi} {' '.join(args)} failed ({done.returncode}): {(done.stderr or done.stdout).strip()[:400]}")
    return done.stdout


def query(smi: str, fields: Sequence[str], timeout: float) -> list[dict[str, str]]:
    """One row per card, the fields by name (as nvidia-smi printed them, stripped)."""
    text = _run(smi, [f"--query-gpu={','.join(fields)}", "--format=csv,noheader,nounits"], timeout)
    rows = []
    for values in csv.reader(io.StringIO(text), skipinitialspace=True):
        if not values:
            continue
        if len(values) != len(fields):
            raise SmiError(f"nvidia-smi printed {len(values)} values for {len(fields)} fields: {values}")
        rows.append({name: value.strip() for name, value in zip(fields, values, strict=True)})
    return rows


def mig_devices(smi: str, timeout: float) -> dict[str, list[dict[str, Any]]]:
    """GPU UUID -> its MIG devices (profile, device index, UUID) from ``nvidia-smi -L``."""
    found: dict[str, list[dict[str, Any]]] = {}
    current: str | None = None
    for line in _run(smi, ["-L"], timeout).splitlines():
        gpu = _GPU_LINE.match(line)
        if gpu:
            current = gpu.group(2)
            found[current] = []
            continue
        mig = _MIG_LINE.match(line)
        if mig and current is not None:
            found[current].append({"profile": mig.group(1), "device": int(mig.group(2)), "uuid": mig.group(3)})
    return found


def mode_flag(text: str) -> bool | None:
    """nvidia-smi's "Enabled" / "Disabled" / "[N/A]" as True / False / None."""
    lowered = text.strip().lower()
    if lowered == "enabled":
        return True
    if lowered == "disabled":
        return False
    return None


def _memory(text: str) -> int | None:
    try:
        return int(float(text))
    except ValueError:
        return None


def compare_cards(cards: Sequence[Any], rows: Sequence[dict[str, str]], driver: str | None) -> list[str]:
    """Where NVML (through our backend) and nvidia-smi disagree; [] when they agree.

    Compared: the number of cards, each UUID's index, name and total memory (MiB, within one
    MiB of rounding), and the driver version.
    """
    problems = []
    if len(cards) != len(rows):
        problems.append(f"NVML lists {len(cards)} card(s), nvidia-smi {len(rows)}")
    by_uuid = {row["uuid"]: row for row in rows}
    for card in cards:
        row = by_uuid.get(card.uuid)
        if row is None:
            problems.append(f"card {card.index} ({card.uuid}) is not in nvidia-smi's list")
            continue
        if row["index"] != str(card.index):
            problems.append(f"{card.uuid}: index {card.index} in NVML, {row['index']} in nvidia-smi")
        if row["name"] != card.model:
            problems.append(f"card {card.index}: model {card.model!r} in NVML, {row['name']!r} in nvidia-smi")
        memory = _memory(row["memory.total"])
        if memory is None or abs(memory - card.memory_mib) > 1:
            problems.append(f"card {card.index}: {card.memory_mib} MiB in NVML, {row['memory.total']} MiB in nvidia-smi")
    known = {card.uuid for card in cards}
    problems += [f"nvidia-smi lists card {row['index']} ({uuid}), NVML does not" for uuid, row in by_uuid.items()
                 if uuid not in known]
    versions = {row.get("driver_version", "") for row in rows} - {""}
    if driver and versions and versions != {driver}:
        problems.append(f"driver {driver} in NVML, {', '.join(sorted(versions))} in nvidia-smi")
    return problems
