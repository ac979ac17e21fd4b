"""What a server's user_options ask for: a listed share, a typed one, or a runtime request.

user_options are whatever JSON the user sent to the Hub's spawn API (or the form gave); every
key read here is type-checked first and every malformed value is a RequestError.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from jupyter_vgpu.core import contract
from jupyter_vgpu.core.contract import Request, RequestError
from jupyter_vgpu.hub.quantities import checked_count, checked_request, shown
from jupyter_vgpu.hub.shares import CUSTOM_PROFILE_SLUG, SHARE_OPTION, Share, parse_share_text

UNLISTED_OPTION = f"{SHARE_OPTION}--unlisted-choice"
"""The user_options key KubeSpawner gives the free-form 'Other…' share field."""

VGPU_PROFILE_SLUG = "vgpu"
"""The single profile of profile_style 'option'."""

SHARE_OPTION_PROFILES = (VGPU_PROFILE_SLUG, CUSTOM_PROFILE_SLUG)
"""The profiles with the share dropdown and its 'Other…' field; KubeSpawner reads those
user_options for these profiles only."""


def default_profile(profile_list: Sequence[Mapping[str, Any]] | Mapping[str, Mapping[str, Any]] | None) -> str | None:
    """The slug of the profile KubeSpawner loads when user_options name none: the first marked
    ``default``, else the first (a dict of profiles is read in key order, as KubeSpawner reads it)."""
    if isinstance(profile_list, Mapping):
        profile_list = [profile_list[key] for key in sorted(profile_list)]
    if not profile_list:
        return None
    chosen = next((p for p in profile_list if p.get("default")), profile_list[0])
    slug = chosen.get("slug")
    return slug if isinstance(slug, str) else None


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


def loaded_profile(user_options: Mapping[str, Any], default: str | None) -> str | None:
    """The profile KubeSpawner loads for user_options: the one they name, else ``default``."""
    return _text_option(user_options, "profile") or default


def requested(user_options: object, shares: Iterable[Share], *, custom_share: bool,
              allow_runtime_requests: bool, default: str | None = None) -> Request | None | bool:
    """The share user_options ask for, as KubeSpawner will start them: a Request, None for
    'release the GPU', or False when they say nothing about vGPU (a CPU profile, or the admin's
    own profiles). ``default``: the profile KubeSpawner loads when they name none.
    Raises RequestError with the reason when they are malformed."""
    if user_options is None:
        return False
    if not isinstance(user_options, Mapping):
        raise RequestError(f"user_options must be an object of option names and values, got {shown(user_options)}")
    profile = loaded_profile(user_options, default)
    chosen = _text_option(user_options, SHARE_OPTION)
    # KubeSpawner reads the typed 'Other…' share only in the profiles that have the field
    unlisted = user_options.get(UNLISTED_OPTION) if profile in SHARE_OPTION_PROFILES else None
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
    if profile in SHARE_OPTION_PROFILES:
        if not chosen:  # the form always sends one; KubeSpawner has no default choice to fall back on
            raise RequestError(f"profile {profile!r} needs a share: choose one of {', '.join(by_slug)}")
        if chosen not in by_slug:
            raise RequestError(f"no vGPU share {shown(chosen)}; choose one of {', '.join(by_slug)}")
        return by_slug[chosen].request
    if profile in by_slug:
        return by_slug[profile].request
    return False


def refuse_stray_typed_share(user_options: Mapping[str, Any], default: str | None = None) -> None:
    """RequestError when user_options type an 'Other…' share for a profile without that field:
    KubeSpawner would quietly start that profile's own share instead."""
    profile = loaded_profile(user_options, default)
    if user_options.get(UNLISTED_OPTION) and profile not in SHARE_OPTION_PROFILES:
        raise RequestError(
            f"a typed share ({UNLISTED_OPTION!r}) is only read with profile "
            f"{' or '.join(repr(p) for p in SHARE_OPTION_PROFILES)}; "
            f"{f'profile {profile!r}' if profile else 'a server with no profile'} would not use it: "
            f"drop the typed share or choose one of those profiles"
        )
