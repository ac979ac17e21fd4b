"""The vGPU shares a Hub offers: configured sizes, and what people type in the free-form field."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from jupyter_vgpu.core.contract import CORES_PER_CARD, Request, RequestError, format_mib
from jupyter_vgpu.hub.quantities import checked_count, checked_memory_size, checked_request

SHARE_OPTION = "vgpu-share"
"""The profile_options key of the share dropdown (and its free-form "Other…" field)."""

CUSTOM_PROFILE_SLUG = "vgpu-custom"

SHARE_TEXT_PATTERN = (
    r"^\s*(?:\d+\s*(?:GPUs?|gpus?|cards?)"
    r"|\d+\s*%?\s*(?:,|/)?\s*\d+(?:\.\d+)?\s*(?:GiB|MiB|Gi|Mi|G|M|gib|mib|gb|mb|GB|MB))\s*$"
)
"""What the free-form share field accepts: '30% 8GiB', '30, 8 GiB', '2 GPUs'. The HTML form
checks it (KubeSpawner's validation_regex); parse_share_text gives the precise reason."""

SHARE_TEXT_HELP = "a share like '30% 8GiB' (percent of one card's compute, then memory) or whole cards like '2 GPUs'"

MAX_SHARE_TEXT = 64
"""Longest share text read at all; the form's regex is checked in the browser only."""


@dataclass(frozen=True)
class Share:
    """One offered vGPU size: a slug, the label people see, and the request it makes."""

    slug: str
    display_name: str
    request: Request
    description: str = ""
    isolated: bool = False
    """Placed only on a hardware-isolated MIG slice (the pod asks with ``Names.isolation``)."""

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any]) -> Share:
        """From config: ``{"slug", "display_name", "cores", "memory": "20GiB" | units, "description", "isolated"}``."""
        if not isinstance(spec, Mapping):
            raise ValueError(f"vGPU share {spec!r}: expected {{'slug', 'display_name', 'cores', 'memory'}}")
        unknown = set(spec) - {"slug", "display_name", "cores", "memory", "description", "isolated"}
        if unknown:
            raise ValueError(f"vGPU share {dict(spec)!r}: unknown keys {sorted(unknown)}")
        for key in ("slug", "display_name", "cores"):
            if key not in spec:
                raise ValueError(f"vGPU share {dict(spec)!r} needs {key!r}")
        slug = str(spec["slug"])
        if not re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", slug):
            raise ValueError(f"vGPU share slug {slug!r}: use lowercase letters, digits and '-'")
        try:
            cores = checked_count(spec["cores"], "cores")
            memory = spec.get("memory")
            units = checked_memory_size(memory) if memory not in (None, "", 0) else 0
            request = checked_request(cores, units)
        except RequestError as error:
            raise ValueError(f"vGPU share {slug!r}: {error}") from None
        isolated = spec.get("isolated", False)
        if not isinstance(isolated, bool) or (isolated and not request.is_share):
            raise ValueError(f"vGPU share {slug!r}: 'isolated' is true or false, and only for a share of one card")
        return cls(slug, str(spec["display_name"]), request, str(spec.get("description", "")), isolated)

    def describe(self) -> str:
        text = self.description or describe_request(self.request)
        return f"{text}, on a hardware-isolated MIG slice" if self.isolated and not self.description else text


DEFAULT_SHARE_SPECS: tuple[dict[str, Any], ...] = (
    {"slug": "vgpu-quarter", "display_name": "¼ GPU · 20 GiB", "cores": 25, "memory": "20GiB"},
    {"slug": "vgpu-half", "display_name": "½ GPU · 40 GiB", "cores": 50, "memory": "40GiB"},
    {"slug": "vgpu-one", "display_name": "1 GPU", "cores": 100},
    {
        "slug": "vgpu-two",
        "display_name": "2 GPUs (NVLink)",
        "cores": 200,
        "description": "two whole cards; the scheduler picks the best-linked pair on the node (NVLink where it has it)",
    },
)


def share_list(specs: list[dict[str, Any]]) -> list[Share]:
    """The configured shares, refusing duplicate slugs."""
    shares = [Share.from_spec(spec) for spec in specs]
    slugs = [s.slug for s in shares]
    duplicates = sorted({s for s in slugs if slugs.count(s) > 1})
    if duplicates:
        raise ValueError(f"vGPU shares: duplicate slugs {duplicates}")
    return shares


def describe_request(request: Request) -> str:
    if request.is_share:
        return f"{request.cores} % of one GPU's compute and {format_mib(request.memory_mib)} of its memory"
    return request.describe()


def parse_share_text(text: str) -> Request:
    """A Request from what someone typed: '30% 8GiB', '30 8 GiB', '30, 8192MiB', '1 GPU', '2 GPUs'."""
    if not isinstance(text, str) or not text.strip():
        raise RequestError(f"empty vGPU share: type {SHARE_TEXT_HELP}")
    cleaned = text.strip()
    if len(cleaned) > MAX_SHARE_TEXT:
        raise RequestError(f"a vGPU share of {len(cleaned)} characters is not a share: type {SHARE_TEXT_HELP}")
    if not re.match(SHARE_TEXT_PATTERN, text):
        # KubeSpawner refuses text the form's pattern rejects only later, at start: refuse it here
        raise RequestError(f"vGPU share {text!r} not understood: type {SHARE_TEXT_HELP}")
    whole = re.fullmatch(r"(\d+)\s*(?:gpus?|cards?)", cleaned, re.IGNORECASE)
    if whole:
        cards = int(whole.group(1))
        if cards < 1:
            raise RequestError(f"{text!r} asks for no GPU; choose a profile without one instead")
        return checked_request(checked_count(cards * CORES_PER_CARD, "GPUs"), 0)
    share = re.fullmatch(r"(\d+)\s*(%?)\s*(?:,|/)?\s*(\d+(?:\.\d+)?\s*[A-Za-z]+)", cleaned)
    if not share:
        raise RequestError(f"vGPU share {text!r} not understood: type {SHARE_TEXT_HELP}")
    cores = int(share.group(1))
    memory_text = share.group(3).replace(" ", "")
    memory_text = re.sub(r"(?i)([gm])b$", r"\1iB", memory_text)  # "8GB" means GiB here
    units = checked_memory_size(memory_text)
    if cores >= CORES_PER_CARD:
        raise RequestError(
            f"vGPU share {text!r}: a share is 1-99 % of one card; for whole cards type e.g. '1 GPU'"
        )
    return checked_request(cores, units)
