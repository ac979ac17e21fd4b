"""JupyterHub integration for KubeSpawner: vGPU profiles, the pod hook, user_options checks.

In ``jupyterhub_config.py`` (or Zero to JupyterHub's ``hub.extraConfig``)::

    from jupyter_vgpu.hub import VGPUHub
    c.VGPUHub.group_limits = {"gpu-users": {"cores": 100, "memory": "40GiB"}}
    VGPUHub(config=c).configure(c)

``configure`` appends the vGPU shares to ``c.KubeSpawner.profile_list`` (only those within
the user's limit are offered), and chains, after any hook the admin already set:

- ``apply_user_options``: checks a chosen share, a typed custom share and a runtime request
  (``user_options`` keys ``vgpu_cores`` / ``vgpu_memory_units``, sent by ``%vgpu request``)
  before anything starts, answering HTTP 400 with a sentence the user can act on;
- a Hub endpoint (jupyter_vgpu.hub.restart) that restarts a server with a new share, which
  is how ``%vgpu request`` works under JupyterHub;
- ``modify_pod_hook``: applies a runtime request to the notebook container, checks the final
  request against the user's limit, and, for pods that ask for a vGPU only, sets the vGPU
  scheduler (Zero to JupyterHub points every user pod at its own user-scheduler) and the
  ``VGPU_REQUESTED_*`` / ``VGPU_MAX_*`` hints.

Nothing here imports kubernetes at module import; the Hub imports this module, the notebook
side never does.
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from traitlets import Bool, Dict, Enum, List, Unicode, default
from traitlets.config import Config, Configurable

from jupyter_vgpu.core import contract
from jupyter_vgpu.core.contract import (
    CORES_PER_CARD,
    MEMORY_UNIT_MIB,
    Names,
    Request,
    RequestError,
    format_mib,
)
from jupyter_vgpu.hub.restart import RESTART_SCOPE, restart_handlers

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

SERVER_ROLE_SCOPES = (
    "users:activity!user",
    "access:servers!server",
    f"{RESTART_SCOPE}!server",
)
"""The single-user server role: JupyterHub's default two scopes plus asking the Hub to restart
this one server with a new share (jupyter_vgpu.hub.restart). Not start/stop scopes: a server
cannot restart itself through the REST API, since stopping it revokes its token."""


# --- shares ---------------------------------------------------------------------------------


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
            cores = contract.parse_count(spec["cores"], "cores")
            memory = spec.get("memory")
            units = contract.parse_memory_size(memory) if memory not in (None, "", 0) else 0
            request = Request(cores, units)
        except RequestError as error:
            raise ValueError(f"vGPU share {slug!r}: {error}") from None
        isolated = spec.get("isolated", False)
        if not isinstance(isolated, bool) or (isolated and not request.is_share):
            raise ValueError(f"vGPU share {slug!r}: 'isolated' is true or false, and only for a share of one card")
        return cls(slug, str(spec["display_name"]), request, str(spec.get("description", "")), isolated)

    def describe(self) -> str:
        text = self.description or _describe(self.request)
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


def _describe(request: Request) -> str:
    if request.is_share:
        return f"{request.cores} % of one GPU's compute and {format_mib(request.memory_mib)} of its memory"
    return request.describe()


def parse_share_text(text: str) -> Request:
    """A Request from what someone typed: '30% 8GiB', '30 8 GiB', '30, 8192MiB', '1 GPU', '2 GPUs'."""
    if not isinstance(text, str) or not text.strip():
        raise RequestError(f"empty vGPU share: type {SHARE_TEXT_HELP}")
    cleaned = text.strip()
    whole = re.fullmatch(r"(\d+)\s*(?:gpus?|cards?)", cleaned, re.IGNORECASE)
    if whole:
        cards = int(whole.group(1))
        if cards < 1:
            raise RequestError(f"{text!r} asks for no GPU; choose a profile without one instead")
        return Request(cards * CORES_PER_CARD)
    share = re.fullmatch(r"(\d+)\s*(%?)\s*(?:,|/)?\s*(\d+(?:\.\d+)?\s*[A-Za-z]+)", cleaned)
    if not share:
        raise RequestError(f"vGPU share {text!r} not understood: type {SHARE_TEXT_HELP}")
    cores = int(share.group(1))
    memory_text = share.group(3).replace(" ", "")
    memory_text = re.sub(r"(?i)([gm])b$", r"\1iB", memory_text)  # "8GB" means GiB here
    units = contract.parse_memory_size(memory_text)
    if cores >= CORES_PER_CARD:
        raise RequestError(
            f"vGPU share {text!r}: a share is 1-99 % of one card; for whole cards type e.g. '1 GPU'"
        )
    return Request(cores, units)


# --- limits ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Limit:
    """A ceiling on one request: cores (100 per whole card) and memory units; None is no ceiling.

    A whole-card request that does not declare memory is held to the cores ceiling only (its
    memory is whatever the card has)."""

    cores: int | None = None
    memory_units: int | None = None
    source: str = "the default limit"

    @classmethod
    def from_spec(cls, spec: Mapping[str, Any] | None, source: str) -> Limit:
        if spec is None:
            return cls(None, None, source)
        if not isinstance(spec, Mapping):
            raise ValueError(f"{source}: expected {{'cores': 50, 'memory': '20GiB'}}, got {spec!r}")
        unknown = set(spec) - {"cores", "memory"}
        if unknown:
            raise ValueError(f"{source}: unknown keys {sorted(unknown)} (use 'cores' and 'memory')")
        try:
            cores = None if spec.get("cores") is None else contract.parse_count(spec["cores"], "cores")
            memory = spec.get("memory")
            units = None if memory is None else contract.parse_memory_size(memory)
        except RequestError as error:
            raise ValueError(f"{source}: {error}") from None
        return cls(cores, units, source)

    def allows(self, request: Request) -> bool:
        if self.cores is not None and request.cores > self.cores:
            return False
        return self.memory_units is None or request.memory_units <= self.memory_units

    def check(self, request: Request) -> None:
        if not self.allows(request):
            raise RequestError(
                f"{_describe(request)} is more than {self.source} allows ({self.describe()}); "
                f"ask for less or ask your hub admin to raise the limit"
            )

    def describe(self) -> str:
        parts = []
        if self.cores is not None:
            whole, rest = divmod(self.cores, CORES_PER_CARD)
            plural = "s" if whole > 1 else ""
            parts.append(f"{self.cores} % of one GPU" if not whole else
                         f"{whole} whole GPU{plural}" if not rest else f"{self.cores / CORES_PER_CARD:g} GPUs of compute")
        if self.memory_units is not None:
            parts.append(f"{format_mib(self.memory_units * MEMORY_UNIT_MIB)} of GPU memory")
        return " and ".join(parts) or "no limit"

    def merged(self, other: Limit) -> Limit:
        """The more generous of two limits, dimension by dimension (None is unlimited)."""
        def pick(a: int | None, b: int | None) -> int | None:
            return None if a is None or b is None else max(a, b)

        return Limit(pick(self.cores, other.cores), pick(self.memory_units, other.memory_units), f"{self.source} or {other.source}")


# --- the hub-side configurable ----------------------------------------------------------------


class VGPUHub(Configurable):
    """vGPU shares, limits and hooks for KubeSpawner. Configure as ``c.VGPUHub.<trait>``."""

    resource_domain = Unicode(contract.DEFAULT_RESOURCE_DOMAIN, help="Domain of the vcuda-core/vcuda-memory resources.").tag(config=True)

    scheduler_name = Unicode(contract.SCHEDULER_NAME, help="schedulerName set on pods that ask for a vGPU (only on those).").tag(config=True)

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
        None, allow_none=True, help="Ceiling for users with no user or group limit, e.g. {'cores': 50, 'memory': '20GiB'}; None: no ceiling."
    ).tag(config=True)

    user_limits = Dict(help="Per-user ceilings: {'alice': {'cores': 200}}. A user's own entry wins over groups.").tag(config=True)

    group_limits = Dict(help="Per-group ceilings; a user in several groups gets the most generous.").tag(config=True)

    allow_runtime_requests = Bool(
        True,
        help="Honour user_options vgpu_cores/vgpu_memory_units (sent by %vgpu request) and grant "
        "single-user servers the scopes to restart themselves.",
    ).tag(config=True)

    @property
    def names(self) -> Names:
        return Names(domain=self.resource_domain)

    def share_list(self) -> list[Share]:
        shares = [Share.from_spec(spec) for spec in self.shares]
        slugs = [s.slug for s in shares]
        duplicates = sorted({s for s in slugs if slugs.count(s) > 1})
        if duplicates:
            raise ValueError(f"vGPU shares: duplicate slugs {duplicates}")
        return shares

    # -- limits -------------------------------------------------------------------------

    def limit_for(self, user: Any) -> Limit:
        name = getattr(user, "name", None)
        if name in self.user_limits:
            return Limit.from_spec(self.user_limits[name], f"user {name}'s limit")
        groups = sorted(g.name if hasattr(g, "name") else str(g) for g in (getattr(user, "groups", None) or []))
        limit: Limit | None = None
        for group in groups:
            if group in self.group_limits:
                this = Limit.from_spec(self.group_limits[group], f"group {group}'s limit")
                limit = this if limit is None else limit.merged(this)
        if limit is not None:
            return limit
        return Limit.from_spec(self.default_limit, "the default limit")

    # -- profiles -----------------------------------------------------------------------

    def limits_override(self, request: Request | None) -> dict[str, str | None]:
        """extra_resource_limits for a request; None values delete a key left by an earlier profile."""
        names = self.names
        limits: dict[str, str | None] = dict.fromkeys(names.resources)
        if request is not None:
            limits.update(contract.request_limits(request, names))
        return limits

    def profiles(self, shares: Iterable[Share] | None = None) -> list[dict[str, Any]]:
        """KubeSpawner profile_list entries for shares (all configured shares by default)."""
        shares = list(self.share_list() if shares is None else shares)
        if self.profile_style == "option":
            if not shares and not self.custom_share:
                return []
            return [
                {
                    "display_name": "vGPU notebook",
                    "slug": "vgpu",
                    "description": "a share of a GPU, or whole GPUs",
                    "profile_options": {SHARE_OPTION: self.share_option(shares)},
                }
            ]
        entries = [
            {
                "display_name": share.display_name,
                "slug": share.slug,
                "description": share.describe(),
                "kubespawner_override": {"extra_resource_limits": self.limits_override(share.request)},
            }
            for share in shares
        ]
        if self.custom_share:
            entries.append(
                {
                    "display_name": "Custom vGPU share",
                    "slug": CUSTOM_PROFILE_SLUG,
                    "description": f"pick a share or choose 'Other…' and type {SHARE_TEXT_HELP}",
                    "profile_options": {SHARE_OPTION: self.share_option(shares)},
                }
            )
        return entries

    def share_option(self, shares: Iterable[Share] | None = None) -> dict[str, Any]:
        """A profile_options entry: a share dropdown, with 'Other…' free text when custom_share."""
        shares = list(self.share_list() if shares is None else shares)
        option: dict[str, Any] = {
            "display_name": "GPU share",
            "choices": {
                share.slug: {
                    "display_name": share.display_name,
                    "kubespawner_override": {"extra_resource_limits": self.limits_override(share.request)},
                }
                for share in shares
            },
        }
        if self.custom_share:
            option["unlisted_choice"] = {
                "enabled": True,
                "display_name": "Share (e.g. 30% 8GiB, or 2 GPUs)",
                "display_name_in_choices": "Other…",
                "validation_regex": SHARE_TEXT_PATTERN,
                "validation_message": f"Type {SHARE_TEXT_HELP}.",
                "kubespawner_override": {"extra_resource_limits": self._custom_limits()},
            }
        return option

    def _custom_limits(self) -> Callable[[Any], dict[str, str | None]]:
        # a plain function, not a bound method: KubeSpawner deep-copies the profile list on
        # every form and spawn, and would copy this whole configurable along with a method
        def custom_limits(spawner: Any) -> dict[str, str | None]:
            # apply_user_options already refused bad text with a 400; KubeSpawner calls this
            # while loading the profile
            text = (spawner.user_options or {}).get(f"{SHARE_OPTION}--unlisted-choice", "")
            return self.limits_override(parse_share_text(text))

        return custom_limits

    def profile_list_for(self, spawner: Any) -> list[dict[str, Any]]:
        """The vGPU entries this spawner's user may pick (shares above their limit are left out)."""
        limit = self.limit_for(spawner.user)
        return self.profiles([s for s in self.share_list() if limit.allows(s.request)])

    # -- user_options -------------------------------------------------------------------

    def requested(self, user_options: Mapping[str, Any] | None) -> Request | None | bool:
        """The share user_options ask for: a Request, None for 'release the GPU', or False
        when they say nothing about vGPU (a CPU profile, or the admin's own profiles).
        Raises RequestError with the reason when they are malformed."""
        options = dict(user_options or {})
        if self.allow_runtime_requests and (
            contract.HUB_OPTION_CORES in options or contract.HUB_OPTION_MEMORY_UNITS in options
        ):
            return runtime_request(options)
        unlisted = options.get(f"{SHARE_OPTION}--unlisted-choice")
        if unlisted:
            if not self.custom_share:
                raise RequestError("custom vGPU shares are not enabled on this hub; pick a listed share")
            return parse_share_text(str(unlisted))
        shares = {s.slug: s for s in self.share_list()}
        chosen = options.get(SHARE_OPTION)
        if chosen and options.get("profile") in ("vgpu", CUSTOM_PROFILE_SLUG):
            if chosen not in shares:
                raise RequestError(f"no vGPU share {chosen!r}; choose one of {', '.join(shares)}")
            return shares[chosen].request
        profile = options.get("profile")
        if profile in shares:
            return shares[profile].request
        return False

    def check_user_options(self, user: Any, user_options: Mapping[str, Any]) -> Request | None:
        """The share user_options ask for (None: no GPU); RequestError when malformed or over the limit."""
        request = self.requested(user_options)
        if not isinstance(request, Request):
            return None
        self.limit_for(user).check(request)
        return request

    def chosen_share(self, user_options: Mapping[str, Any] | None) -> Share | None:
        """The configured share the spawn form picked (a profile, or a choice in the share dropdown), or None."""
        options = user_options or {}
        by_slug = {share.slug: share for share in self.share_list()}
        for picked in (options.get(SHARE_OPTION), options.get("profile")):
            if isinstance(picked, str) and picked in by_slug:
                return by_slug[picked]
        return None

    def apply_user_options(self, spawner: Any, user_options: Mapping[str, Any]) -> None:
        """Refuse, before anything starts, a share that is malformed or above the user's limit."""
        try:
            self.check_user_options(spawner.user, user_options)
        except RequestError as error:
            raise _http_400(str(error)) from None

    # -- the pod ------------------------------------------------------------------------

    def modify_pod(self, spawner: Any, pod: Any) -> Any:
        """Apply a runtime request, check the final request, route vGPU pods to the vGPU scheduler."""
        names = self.names
        containers = list(pod.spec.containers or [])
        if not containers:
            return pod
        notebook = containers[0]  # KubeSpawner's "notebook" container comes first
        if self.allow_runtime_requests and _is_runtime(spawner.user_options):
            _set_vgpu_limits(notebook, self.limits_override(runtime_request(spawner.user_options)))
        requests: dict[int, Request] = {}
        for index, container in enumerate(containers):
            resources = container.resources
            try:
                request = contract.parse_container_request(
                    getattr(resources, "limits", None), getattr(resources, "requests", None), names
                )
            except RequestError as error:
                raise RequestError(f"container {container.name!r}: {error}") from None
            if request is not None:
                requests[index] = request
        if not requests:
            return pod
        share = self.chosen_share(spawner.user_options)
        if share is not None and share.isolated and not (self.allow_runtime_requests and _is_runtime(spawner.user_options)):
            pod.metadata.annotations = {**(pod.metadata.annotations or {}), names.isolation: "mig"}
        limit = self.limit_for(spawner.user)
        for request in requests.values():
            limit.check(request)
        pod.spec.scheduler_name = self.scheduler_name
        request = requests.get(0)
        if request is not None:
            hints = {
                contract.ENV_HUB_REQUESTED_CORES: str(request.cores),
                contract.ENV_HUB_REQUESTED_MEMORY_MIB: str(request.memory_mib),
            }
            if limit.cores is not None:
                hints[contract.ENV_HUB_MAX_CORES] = str(limit.cores)
            if limit.memory_units is not None:
                hints[contract.ENV_HUB_MAX_MEMORY_MIB] = str(limit.memory_units * MEMORY_UNIT_MIB)
            _set_env(notebook, hints)
        return pod

    def chain_modify_pod_hook(self, admin_hook: Callable[..., Any] | None = None) -> Callable[..., Any]:
        """A modify_pod_hook running the admin's hook (sync or async) first, then ours."""

        async def modify_pod_hook(spawner: Any, pod: Any) -> Any:
            if admin_hook is not None:
                result = admin_hook(spawner, pod)
                pod = (await result) if inspect.isawaitable(result) else result
            return self.modify_pod(spawner, pod)

        return modify_pod_hook

    def chain_apply_user_options(self, admin_hook: Any = None) -> Callable[..., Any]:
        """An apply_user_options hook running ours first, then the admin's (callable or dict form)."""

        async def apply_user_options(spawner: Any, user_options: dict[str, Any]) -> None:
            self.apply_user_options(spawner, user_options)
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
            hub = c.JupyterHub
            hub.custom_scopes = {**hub.get("custom_scopes", {}), RESTART_SCOPE: {
                "description": "Restart a server with a new vGPU share (jupyter-vgpu)."}}
            roles = [dict(r) for r in hub.get("load_roles", []) if r.get("name") != "server"]
            # a token never holds more than its owner: users get the scope on their own
            # servers, servers on themselves
            users = next((r for r in roles if r.get("name") == "user"), None)
            if users is None:
                roles.append({"name": "user", "scopes": ["self", f"{RESTART_SCOPE}!user"]})
            else:
                users["scopes"] = [*users.get("scopes", ["self"]), f"{RESTART_SCOPE}!user"]
            roles.append(server_role())
            hub.load_roles = roles
            hub.extra_handlers = list(hub.get("extra_handlers", [])) + restart_handlers(self)


def server_role() -> dict[str, Any]:
    """``c.JupyterHub.load_roles`` entry for single-user servers that may restart themselves."""
    return {
        "name": "server",
        "description": "single-user server that may restart itself with a new vGPU share (jupyter-vgpu)",
        "scopes": list(SERVER_ROLE_SCOPES),
    }


def runtime_request(options: Mapping[str, Any]) -> Request | None:
    """The share in ``vgpu_cores``/``vgpu_memory_units``; None when cores is 0 (release the GPU)."""
    cores = contract.parse_count(options.get(contract.HUB_OPTION_CORES, 0), contract.HUB_OPTION_CORES)
    units = contract.parse_count(options.get(contract.HUB_OPTION_MEMORY_UNITS, 0), contract.HUB_OPTION_MEMORY_UNITS)
    if cores == 0 and units == 0:
        return None
    contract.validate_request(cores, units, contract.HUB_OPTION_CORES, contract.HUB_OPTION_MEMORY_UNITS)
    return Request(cores, units)


def _is_runtime(options: Mapping[str, Any] | None) -> bool:
    options = options or {}
    return contract.HUB_OPTION_CORES in options or contract.HUB_OPTION_MEMORY_UNITS in options


def _set_vgpu_limits(container: Any, limits: Mapping[str, str | None]) -> None:
    resources = container.resources
    for field in ("limits", "requests"):
        current = dict(getattr(resources, field, None) or {})
        for key, value in limits.items():
            current.pop(key, None)
            if value is not None and field == "limits":
                current[key] = value
        setattr(resources, field, current or None)


def _set_env(container: Any, values: Mapping[str, str]) -> None:
    from kubernetes_asyncio.client.models import V1EnvVar

    env = [e for e in (container.env or []) if _env_name(e) not in values]
    env.extend(V1EnvVar(name=name, value=value) for name, value in values.items())
    container.env = env


def _env_name(entry: Any) -> str | None:
    return entry.get("name") if isinstance(entry, Mapping) else getattr(entry, "name", None)


def _http_400(message: str) -> Exception:
    from tornado import web

    error = web.HTTPError(400, "%s", message)
    error.jupyterhub_message = message  # type: ignore[attr-defined]  # shown on the spawn form / API
    return error
