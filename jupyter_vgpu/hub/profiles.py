"""KubeSpawner profile_list entries for the vGPU shares (one per share, or one share dropdown)."""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

from jupyter_vgpu.core import contract
from jupyter_vgpu.core.contract import Names, Request
from jupyter_vgpu.hub.options import UNLISTED_OPTION, VGPU_PROFILE_SLUG
from jupyter_vgpu.hub.shares import (
    CUSTOM_PROFILE_SLUG,
    SHARE_OPTION,
    SHARE_TEXT_HELP,
    SHARE_TEXT_PATTERN,
    Share,
    parse_share_text,
)


def limits_override(request: Request | None, names: Names) -> dict[str, str | None]:
    """extra_resource_limits for a request; None values delete a key left by an earlier profile."""
    limits: dict[str, str | None] = dict.fromkeys(names.resources)
    if request is not None:
        limits.update(contract.request_limits(request, names))
    return limits


def share_option(shares: Iterable[Share], names: Names, *, custom_share: bool) -> dict[str, Any]:
    """A profile_options entry: a share dropdown, with 'Other…' free text when custom_share."""
    option: dict[str, Any] = {
        "display_name": "GPU share",
        "choices": {
            share.slug: {
                "display_name": share.display_name,
                "kubespawner_override": {"extra_resource_limits": limits_override(share.request, names)},
            }
            for share in shares
        },
    }
    if custom_share:
        option["unlisted_choice"] = {
            "enabled": True,
            "display_name": "Share (e.g. 30% 8GiB, or 2 GPUs)",
            "display_name_in_choices": "Other…",
            "validation_regex": SHARE_TEXT_PATTERN,
            "validation_message": f"Type {SHARE_TEXT_HELP}.",
            "kubespawner_override": {"extra_resource_limits": custom_limits(names)},
        }
    return option


def custom_limits(names: Names) -> Callable[[Any], dict[str, str | None]]:
    """The 'Other…' field's extra_resource_limits, read from the typed text when KubeSpawner loads
    the profile. A plain function of ``names`` only: KubeSpawner deep-copies the profile list on
    every form and spawn, and would copy whatever a bound method drags along."""

    def typed_share_limits(spawner: Any) -> dict[str, str | None]:
        # apply_user_options already refused bad text with a 400
        text = (spawner.user_options or {}).get(UNLISTED_OPTION, "")
        return limits_override(parse_share_text(text), names)

    return typed_share_limits


def profiles(shares: Iterable[Share], names: Names, *, style: str, custom_share: bool) -> list[dict[str, Any]]:
    """KubeSpawner profile_list entries for the shares (``style``: 'profiles' or 'option')."""
    shares = list(shares)
    if style == "option":
        if not shares and not custom_share:
            return []
        return [
            {
                "display_name": "vGPU notebook",
                "slug": VGPU_PROFILE_SLUG,
                "description": "a share of a GPU, or whole GPUs",
                "profile_options": {SHARE_OPTION: share_option(shares, names, custom_share=custom_share)},
            }
        ]
    entries = [
        {
            "display_name": share.display_name,
            "slug": share.slug,
            "description": share.describe(),
            "kubespawner_override": {"extra_resource_limits": limits_override(share.request, names)},
        }
        for share in shares
    ]
    if custom_share:
        entries.append(
            {
                "display_name": "Custom vGPU share",
                "slug": CUSTOM_PROFILE_SLUG,
                "description": f"pick a share or choose 'Other…' and type {SHARE_TEXT_HELP}",
                "profile_options": {SHARE_OPTION: share_option(shares, names, custom_share=custom_share)},
            }
        )
    return entries
