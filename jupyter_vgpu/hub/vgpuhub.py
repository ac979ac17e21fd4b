"""VGPUHub: the Hub-side settings, and the hooks that wire shares, limits and the pod into KubeSpawner."""

from __future__ import annotations

import copy
import inspect
import weakref
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from traitlets import Bool, Dict, Enum, List, Unicode, default, validate
from traitlets.config import Config, Configurable

from jupyter_vgpu.core import contract
from jupyter_vgpu.core.contract import Names, Request, RequestError
from jupyter_vgpu.hub import pod as vgpu_pod
from jupyter_vgpu.hub import profiles as vgpu_profiles
from jupyter_vgpu.hub.limits import Limit, Usage, held_by_other_servers, limit_for
from jupyter_vgpu.hub.options import (
    default_profile,
    is_runtime,
    refuse_stray_typed_share,
    requested,
    runtime_request,
)
from jupyter_vgpu.hub.scopes import custom_scopes, roles_with_restart
from jupyter_vgpu.hub.shares import DEFAULT_SHARE_SPECS, SHARE_OPTION, Share, share_list


class VGPUHub(Configurable):
    """vGPU shares, limits and hooks for KubeSpawner. Configure as ``c.VGPUHub.<trait>``."""

    resource_domain = Unicode(contract.DEFAULT_RESOURCE_DOMAIN, help="Domain of the vcuda-core/vcuda-memory resources.").tag(config=True)

    scheduler_name = Unicode(contract.SCHEDULER_NAME, help="schedulerName set on pods that ask for a vGPU (only on those).").tag(config=True)

    gpu_node_tolerations = List(
        Dict(),
        default_value=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        help="Tolerations added to pods that ask for a vGPU (only to those), so GPU nodes can be tainted "
        "to keep CPU-only pods from stranding their GPUs (docs/admin.md, 'Keep GPUs from being stranded'). "
        "Each is {'key', 'operator', 'value', 'effect'}; [] adds none.",
    ).tag(config=True)

    @validate("gpu_node_tolerations")
    def _valid_tolerations(self, proposal: Any) -> list[dict[str, str]]:
        for toleration in proposal["value"]:
            unknown = set(toleration) - set(vgpu_pod.TOLERATION_FIELDS)
            if unknown or not all(isinstance(v, str) for v in toleration.values()):
                raise ValueError(f"toleration {toleration!r}: string values for {', '.join(vgpu_pod.TOLERATION_FIELDS)} only")
        return list(proposal["value"])

    runtime_class_name = Unicode(
        "",
        help="runtimeClassName set on pods that ask for a vGPU (only on those), e.g. 'nvidia' where "
        "the NVIDIA container runtime is not containerd's default (k3s/RKE2, GPU Operator without "
        "a default runtime); without it such pods get the vGPU env but no GPU. '' leaves the pod's own.",
    ).tag(config=True)

    shares = List(
        Dict(),
        help="Offered shares: [{'slug', 'display_name', 'cores', 'memory': '20GiB', 'description', "
        "'isolated': True (only on a hardware-isolated MIG slice)}].",
    ).tag(config=True)

    @default("shares")
    def _default_shares(self) -> list[dict[str, Any]]:
        return [dict(spec) for spec in DEFAULT_SHARE_SPECS]

    custom_share = Bool(True, help="Offer a free-form 'Other…' share, checked against the user's limit.").tag(config=True)

    profile_style = Enum(
        ["profiles", "option"],
        "profiles",
        help="'profiles': one profile per share (plus 'Custom vGPU share' when custom_share); "
        "'option': one 'vGPU notebook' profile with a share dropdown.",
    ).tag(config=True)

    default_limit = Dict(
        None, allow_none=True, help="Ceiling for users with no user or group limit, e.g. {'cores': 50, 'memory': '20GiB'}; None: no ceiling. "
        "Every limit holds for the sum over a user's running and starting servers (named servers included)."
    ).tag(config=True)

    user_limits = Dict(help="Per-user ceilings on the sum over the user's servers: {'alice': {'cores': 200}}. "
                       "A user's own entry wins over groups.").tag(config=True)

    group_limits = Dict(help="Per-group ceilings on the sum over each member's servers; a user in several "
                        "groups gets the most generous.").tag(config=True)

    allow_runtime_requests = Bool(
        True,
        help="Honour user_options vgpu_cores/vgpu_memory_units (sent by %vgpu request) and grant "
        "single-user servers the scopes to restart themselves.",
    ).tag(config=True)

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        # spawner -> (the user_options its pod was built from, what that pod asks for), set by modify_pod
        self._pods_checked: weakref.WeakKeyDictionary[Any, tuple[dict[str, Any], Usage]] = weakref.WeakKeyDictionary()

    @property
    def names(self) -> Names:
        return Names(domain=self.resource_domain)

    def share_list(self) -> list[Share]:
        return share_list(self.shares)

    # -- limits -------------------------------------------------------------------------

    def limit_for(self, user: Any) -> Limit:
        return limit_for(user, self.user_limits, self.group_limits, self.default_limit)

    async def held_by_other_servers(self, user: Any, server_name: str) -> Usage:
        """What the user's other running or starting servers hold."""
        return await held_by_other_servers(user, server_name, self.holds)

    async def holds(self, spawner: Any) -> Request | Usage | None:
        """What an active server holds: what its pod was checked with while it runs with the
        user_options that pod was built from; else (still starting, or started before the Hub
        did) what those user_options ask for, resolved as KubeSpawner resolves them."""
        options = spawner.user_options or {}
        checked = self._pods_checked.get(spawner)
        if checked is not None and checked[0] == options:
            return checked[1]
        try:
            request = self.requested(options, default=await self.default_profile(spawner, options))
        except RequestError:
            # it was checked when it started; a share since removed from the config is not
            # counted rather than locking the user out of every other server
            return None
        return request if isinstance(request, Request) else None

    # -- profiles -----------------------------------------------------------------------

    def limits_override(self, request: Request | None) -> dict[str, str | None]:
        """extra_resource_limits for a request; None values delete a key left by an earlier profile."""
        return vgpu_profiles.limits_override(request, self.names)

    def profiles(self, shares: Iterable[Share] | None = None) -> list[dict[str, Any]]:
        """KubeSpawner profile_list entries for shares (all configured shares by default)."""
        return vgpu_profiles.profiles(self.share_list() if shares is None else shares, self.names,
                                      style=self.profile_style, custom_share=self.custom_share)

    def share_option(self, shares: Iterable[Share] | None = None) -> dict[str, Any]:
        """A profile_options entry: a share dropdown, with 'Other…' free text when custom_share."""
        return vgpu_profiles.share_option(self.share_list() if shares is None else shares, self.names,
                                          custom_share=self.custom_share)

    def profile_list_for(self, spawner: Any) -> list[dict[str, Any]]:
        """The vGPU entries this spawner's user may pick (shares above their limit are left out).

        Filtered by the limit alone, not by what other servers hold: KubeSpawner looks the
        chosen profile up in this list again at start, after apply_user_options has checked
        the sum with the reason."""
        limit = self.limit_for(spawner.user)
        return self.profiles([s for s in self.share_list() if limit.allows(s.request)])

    # -- user_options -------------------------------------------------------------------

    def requested(self, user_options: Mapping[str, Any] | None, default: str | None = None) -> Request | None | bool:
        """The share user_options ask for: a Request, None for 'release the GPU', or False
        when they say nothing about vGPU (a CPU profile, or the admin's own profiles).
        ``default``: the profile KubeSpawner loads when they name none (``default_profile``).
        Raises RequestError with the reason when they are malformed."""
        return requested(user_options, self.share_list(), custom_share=self.custom_share,
                         allow_runtime_requests=self.allow_runtime_requests, default=default)

    async def default_profile(self, spawner: Any, user_options: object) -> str | None:
        """The profile KubeSpawner loads for ``spawner`` when user_options name none (None when
        they name one, or carry a runtime request, which replaces any profile's share)."""
        if (not isinstance(user_options, Mapping) or user_options.get("profile")
                or (self.allow_runtime_requests and is_runtime(user_options))):
            return None
        profiles = getattr(spawner, "profile_list", None)
        if callable(profiles):
            profiles = profiles(spawner)
            if inspect.isawaitable(profiles):
                profiles = await profiles
        return default_profile(profiles)

    async def check_user_options(self, spawner: Any, user_options: Mapping[str, Any]) -> Request | None:
        """The share user_options ask for when ``spawner`` starts with them (None: no GPU);
        RequestError when malformed, or when it and the user's other servers together are over
        the limit."""
        default = await self.default_profile(spawner, user_options)
        request = self.requested(user_options, default)
        refuse_stray_typed_share(user_options, default)
        if not isinstance(request, Request):
            return None
        self.limit_for(spawner.user).check(request, await self.held_by_other_servers(spawner.user, spawner.name))
        return request

    def chosen_share(self, user_options: Mapping[str, Any] | None) -> Share | None:
        """The configured share the spawn form picked (a profile, or a choice in the share dropdown), or None."""
        options = user_options or {}
        by_slug = {share.slug: share for share in self.share_list()}
        for picked in (options.get(SHARE_OPTION), options.get("profile")):
            if isinstance(picked, str) and picked in by_slug:
                return by_slug[picked]
        return None

    async def apply_user_options(self, spawner: Any, user_options: Mapping[str, Any]) -> None:
        """Refuse, before anything starts, a share that is malformed or above the user's limit."""
        try:
            await self.check_user_options(spawner, user_options)
        except RequestError as error:
            raise http_400(str(error)) from None

    # -- the pod ------------------------------------------------------------------------

    async def modify_pod(self, spawner: Any, pod: Any) -> Any:
        """Apply a runtime request, check the final request, route vGPU pods to the vGPU scheduler,
        and remember what the pod asks for: what this server holds for the others' checks."""
        containers = list(pod.spec.containers or [])
        if containers and self.allow_runtime_requests and is_runtime(spawner.user_options):
            # KubeSpawner's "notebook" container comes first
            vgpu_pod.set_vgpu_limits(containers[0], self.limits_override(runtime_request(spawner.user_options)))
        requests = vgpu_pod.container_requests(pod, self.names)
        options = copy.deepcopy(dict(spawner.user_options or {}))
        if not requests:
            self._pods_checked[spawner] = (options, Usage())
            return pod
        notebook = containers[0]
        share = self.chosen_share(spawner.user_options)
        if share is not None and share.isolated and not (self.allow_runtime_requests and is_runtime(spawner.user_options)):
            pod.metadata.annotations = {**(pod.metadata.annotations or {}), self.names.isolation: "mig"}
        limit = self.limit_for(spawner.user)
        held = await self.held_by_other_servers(spawner.user, spawner.name)
        this_pod = Usage()
        for index, request in sorted(requests.items()):
            limit.check(request, held)
            holder = f"this server's container {containers[index].name!r}"
            held, this_pod = held.plus(request, holder), this_pod.plus(request, holder)
        self._pods_checked[spawner] = (options, this_pod)
        pod.spec.scheduler_name = self.scheduler_name
        if self.runtime_class_name:
            pod.spec.runtime_class_name = self.runtime_class_name
        vgpu_pod.add_tolerations(pod, self.gpu_node_tolerations)
        notebook_request = requests.get(0)
        if notebook_request is not None:
            vgpu_pod.set_env(notebook, vgpu_pod.hint_env(notebook_request, limit))
        return pod

    # -- wiring into the Hub's config ---------------------------------------------------

    def chain_modify_pod_hook(self, admin_hook: Callable[..., Any] | None = None) -> Callable[..., Any]:
        """A modify_pod_hook running the admin's hook (sync or async) first, then ours."""

        async def modify_pod_hook(spawner: Any, pod: Any) -> Any:
            if admin_hook is not None:
                result = admin_hook(spawner, pod)
                pod = (await result) if inspect.isawaitable(result) else result
            return await self.modify_pod(spawner, pod)

        return modify_pod_hook

    def chain_apply_user_options(self, admin_hook: Any = None) -> Callable[..., Any]:
        """An apply_user_options hook running ours first, then the admin's (callable or dict form)."""

        async def apply_user_options(spawner: Any, user_options: dict[str, Any]) -> None:
            await self.apply_user_options(spawner, user_options)
            if callable(admin_hook):
                result = admin_hook(spawner, user_options)
                if inspect.isawaitable(result):
                    await result
            elif isinstance(admin_hook, Mapping):
                for key, trait in admin_hook.items():
                    if key in user_options:
                        spawner.set_trait(trait, spawner.traits()[trait].from_string(str(user_options[key])))

        return apply_user_options

    def chain_profile_list(self, admin_profiles: Any = None) -> Callable[..., Any]:
        """A callable profile_list: the admin's profiles (list, dict or callable), then ours."""

        async def profile_list(spawner: Any) -> list[dict[str, Any]]:
            base = admin_profiles
            if callable(base):
                base = base(spawner)
                if inspect.isawaitable(base):
                    base = await base
            if isinstance(base, Mapping):
                base = list(base.values())
            return [dict(p) for p in (base or [])] + self.profile_list_for(spawner)

        return profile_list

    def configure(self, c: Config) -> None:
        """Wire everything into a JupyterHub config object (``c`` in jupyterhub_config.py)."""
        self.share_list()  # fail at hub start on a bad share, not at a user's spawn
        self.limit_for(None)
        for what, table in (("user", self.user_limits), ("group", self.group_limits)):
            for key, spec in table.items():
                Limit.from_spec(spec, f"{what} {key}'s limit")
        spawner = c.KubeSpawner
        spawner.profile_list = self.chain_profile_list(spawner.get("profile_list"))
        spawner.modify_pod_hook = self.chain_modify_pod_hook(spawner.get("modify_pod_hook"))
        spawner.apply_user_options = self.chain_apply_user_options(spawner.get("apply_user_options"))
        if self.allow_runtime_requests:
            # the restart endpoint runs inside the Hub only: imported here, where the Hub's config is loaded
            from jupyter_vgpu.hub.restart import restart_handlers

            hub = c.JupyterHub
            hub.custom_scopes = custom_scopes(hub.get("custom_scopes", {}))
            hub.load_roles = roles_with_restart(hub.get("load_roles", []))
            hub.extra_handlers = list(hub.get("extra_handlers", [])) + restart_handlers(self)


def http_400(message: str) -> Exception:
    """The HTTP 400 JupyterHub shows on the spawn form and in the API answer."""
    from tornado import web

    error = web.HTTPError(400, "%s", message)
    error.jupyterhub_message = message  # type: ignore[attr-defined]  # shown on the spawn form / API
    return error
