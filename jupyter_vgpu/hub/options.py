"""What a server's user_options ask for: a listed share, a typed one, or a runtime request.

user_options are whatever JSON the user sent to the Hub's spawn API (or the form gave); every
key read here is type-checked first and every malformed value is a RequestError.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from jupyter_vgpu.core import contract
from jupyter_vgpu.core.contract import Request, RequestError
from jupyter_vgpu.hub.quantities import checked_count, checked_request, shown
from jupyter_vgpu.hub.shares import CUSTOM_PROFILE_SLUG, SHARE_OPTION, Share, parse_share_text

UNLISTED_OPTION = f"{SHARE_OPTION}--unlisted-choice"
"""The user_options key KubeSpawner gives the free-form 'Other…' share field."""

VGPU_PROFILE_SLUG = "vgpu"
"""The single profile of profile_style 'option'."""


def is_runtime(options: Mapping[str, Any] | None) -> bool:
    """Whether user_options carry a runtime request (``vgpu_cores`` / ``vgpu_memory_units``)."""
    options = options or {}
    return contract.HUB_OPTION_CORES in options or contract.HUB_OPTION_MEMORY_UNITS in options


def runtime_request(options: Mapping[str, Any]) -> Request | None:
    """The share in ``vgpu_cores``/``vgpu_memory_units``; None when cores is 0 (release the GPU)."""
    cores = checked_count(options.get(contract.HUB_OPTION_CORES, 0), contract.HUB_OPTION_CORES)
    units = checked_count(options.get(contract.HUB_OPTION_MEMORY_UNITS, 0), contract.HUB_OPTION_MEMORY_UNITS)
    if cores == 0 and units == 0:
        return None
    return checked_request(cores, units, contract.HUB_OPTION_CORES, contract.HUB_OPTION_MEMORY_UNITS)


def _text_option(options: Mapping[str, Any], key: str) -> str | None:
    value = options.get(key)
    if value is None or isinstance(value, str):
        return value
    raise RequestError(f"user_options {key!r}: expected a name (text), got {shown(value)}")


def _typed_share(unlisted: object) -> Request:
    if not isinstance(unlisted, str):
        raise RequestError(f"user_options {UNLISTED_OPTION!r}: expected text such as '30% 8GiB', got {shown(unlisted)}")
    return parse_share_text(unlisted)


def requested(user_options: object, shares: Iterable[Share], *, custom_share: bool,
              allow_runtime_requests: bool) -> Request | None | bool:
    """The share user_options ask for: a Request, None for 'release the GPU', or False when
    they say nothing about vGPU (a CPU profile, or the admin's own profiles).
    Raises RequestError with the reason when they are malformed."""
    if user_options is None:
        return False
    if not isinstance(user_options, Mapping):
        raise RequestError(f"user_options must be an object of option names and values, got {shown(user_options)}")
    profile = _text_option(user_options, "profile")
    chosen = _text_option(user_options, SHARE_OPTION)
    unlisted = user_options.get(UNLISTED_OPTION)
    # checked even when a runtime request wins: KubeSpawner's 'Other…' override reads the same text
    # when it loads the profile, too late for a 400
    typed = _typed_share(unlisted) if unlisted else None
    if allow_runtime_requests and is_runtime(user_options):
        return runtime_request(user_options)
    if typed is not None:
        if not custom_share:
            raise RequestError("custom vGPU shares are not enabled on this hub; pick a listed share")
        return typed
    by_slug = {s.slug: s for s in shares}
    if profile in (VGPU_PROFILE_SLUG, CUSTOM_PROFILE_SLUG):
        if not chosen:  # the form always sends one; KubeSpawner has no default choice to fall back on
            raise RequestError(f"profile {profile!r} needs a share: choose one of {', '.join(by_slug)}")
        if chosen not in by_slug:
            raise RequestError(f"no vGPU share {shown(chosen)}; choose one of {', '.join(by_slug)}")
        return by_slug[chosen].request
    if profile in by_slug:
        return by_slug[profile].request
    return False
