"""The wire contract: every name that crosses a process boundary, spelled once.

Resource names, units, annotation keys, container environment variables and
metric names live here and nowhere else. Parsing and validating a container's
vGPU request lives here too, so the extender, the device plugin, the Hub hook and
the notebook all reject the same things with the same words.

The resource names are TKEStack gpu-manager's (``tencent.com/vcuda-core``,
``tencent.com/vcuda-memory``) so existing pod specs work unchanged; the domain is
a setting. The ``predicate-*`` / ``gpu-assigned`` annotations are gpu-admission's,
so our extender works with gpu-manager nodes and our device plugin works behind
gpu-admission.
"""

from __future__ import annotations

import functools
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

# --- units -------------------------------------------------------------------

CORES_PER_CARD = 100
"""One vcuda-core is 1 % of one card's compute; a whole card is 100."""

MEMORY_UNIT_MIB = 256
"""One vcuda-memory is 256 MiB of device memory."""

MAX_CARD_MEMORY_MIB = 512 * 1024
"""No card that exists or is announced has more than 512 GiB; a bigger ask is a typo."""

DEFAULT_RESOURCE_DOMAIN = "tencent.com"
PROJECT_DOMAIN = "vgpu.jupyter.org"
SCHEDULER_NAME = "vgpu-scheduler"
DEFAULT_METRICS_PORT = 5678

# --- container environment (set by the device plugin's Allocate) ------------

ENV_CORES = "VGPU_CORES"
ENV_MEMORY_MIB = "VGPU_MEMORY_MIB"
ENV_DEVICE_UUIDS = "VGPU_DEVICE_UUIDS"
ENV_DEVICE_INDICES = "VGPU_DEVICE_INDICES"
ENV_DEVICE_MODEL = "VGPU_DEVICE_MODEL"
ENV_NODE = "VGPU_NODE"
ENV_POD_NAME = "VGPU_POD_NAME"
ENV_POD_NAMESPACE = "VGPU_POD_NAMESPACE"
ENV_POD_UID = "VGPU_POD_UID"
ENV_CONTAINER = "VGPU_CONTAINER"
ENV_METRICS_URL = "VGPU_METRICS_URL"
ENV_TOKEN = "VGPU_TOKEN"
ENV_ENFORCEMENT = "VGPU_ENFORCEMENT"
ENV_MIG_PROFILE = "VGPU_MIG_PROFILE"

VGPU_ENV_NAMES = (
    ENV_CORES,
    ENV_MEMORY_MIB,
    ENV_DEVICE_UUIDS,
    ENV_DEVICE_INDICES,
    ENV_DEVICE_MODEL,
    ENV_NODE,
    ENV_POD_NAME,
    ENV_POD_NAMESPACE,
    ENV_POD_UID,
    ENV_CONTAINER,
    ENV_METRICS_URL,
    ENV_TOKEN,
    ENV_ENFORCEMENT,
    ENV_MIG_PROFILE,
)

ENV_NVIDIA_VISIBLE_DEVICES = "NVIDIA_VISIBLE_DEVICES"

# HAMi-core libvgpu.so contract
ENV_HAMI_MEMORY_LIMIT_PREFIX = "CUDA_DEVICE_MEMORY_LIMIT_"
ENV_HAMI_SM_LIMIT = "CUDA_DEVICE_SM_LIMIT"
ENV_HAMI_SHARED_CACHE = "CUDA_DEVICE_MEMORY_SHARED_CACHE"
# NVIDIA MPS client contract
ENV_MPS_PIPE_DIRECTORY = "CUDA_MPS_PIPE_DIRECTORY"
ENV_MPS_LOG_DIRECTORY = "CUDA_MPS_LOG_DIRECTORY"
ENV_MPS_PINNED_MEMORY_LIMIT = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"
ENV_MPS_ACTIVE_THREAD_PERCENTAGE = "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"
# framework guard rails read at process start
ENV_XLA_MEM_FRACTION = "XLA_PYTHON_CLIENT_MEM_FRACTION"
ENV_XLA_PREALLOCATE = "XLA_PYTHON_CLIENT_PREALLOCATE"
ENV_CUPY_MEMORY_LIMIT = "CUPY_GPU_MEMORY_LIMIT"
ENV_TF_FORCE_GROWTH = "TF_FORCE_GPU_ALLOW_GROWTH"
# notebook side: the fact source the server extension chose, passed on to its kernels
ENV_NOTEBOOK_SOURCE = "JUPYTER_VGPU_SOURCE"
# notebook side: the requester class the server extension was configured with, passed on to its kernels
ENV_NOTEBOOK_REQUESTER = "JUPYTER_VGPU_REQUESTER"
# notebook side: kubeconfig the simulated cluster gives a notebook pod to re-create itself
ENV_NOTEBOOK_KUBECONFIG = "JUPYTER_VGPU_KUBECONFIG"
# TKEStack gpu-manager (vcuda-controller) container contract
GM_VCUDA_CONFIG_DIR = "/etc/vcuda"
GM_VCUDA_CONFIG_NAME = "vcuda.config"
# JupyterHub user_options keys a vGPU share request sends to the Hub (read by jupyter_vgpu.hub)
HUB_OPTION_CORES = "vgpu_cores"
HUB_OPTION_MEMORY_UNITS = "vgpu_memory_units"
# set on vGPU notebook containers by jupyter_vgpu.hub's modify_pod_hook: what the Hub asked
# for and the user's ceiling (absent when unlimited), so the notebook can explain a missing
# allocation and refuse an over-limit request before restarting anything
ENV_HUB_REQUESTED_CORES = "VGPU_REQUESTED_CORES"
ENV_HUB_REQUESTED_MEMORY_MIB = "VGPU_REQUESTED_MEMORY_MIB"
ENV_HUB_MAX_CORES = "VGPU_MAX_CORES"
ENV_HUB_MAX_MEMORY_MIB = "VGPU_MAX_MEMORY_MIB"

ENFORCEMENT_BACKENDS = ("hami-core", "mps", "none")
ENFORCEMENT_MIG = "mig"
"""What a container on a MIG slice is told in ENV_ENFORCEMENT: the hardware isolates it, no library."""

# --- metric names ------------------------------------------------------------

# gpu-manager compatible, served on /metric with labels pod_name, namespace, node, container_name
METRIC_GM_CONTAINER_UTILIZATION = "container_gpu_utilization"
METRIC_GM_CONTAINER_REQUEST_UTILIZATION = "container_request_gpu_utilization"
METRIC_GM_CONTAINER_MEMORY_TOTAL = "container_gpu_memory_total"
METRIC_GM_CONTAINER_REQUEST_MEMORY = "container_request_gpu_memory"
GM_LABELS = ("pod_name", "namespace", "node", "container_name")
# gpu-manager's per-series extra label: "gpu<index>" or "total"
GM_LABEL_UTILIZATION_GPU = "gpu"
GM_LABEL_MEMORY_GPU = "gpu_memory"
GM_LABEL_REQUEST_UTILIZATION = "req_of_gpu"
GM_LABEL_REQUEST_MEMORY = "req_of_gpu_memory"

# this project's own, served on /metrics
METRIC_CARD_MEMORY_TOTAL = "vgpu_card_memory_total_bytes"
METRIC_CARD_MEMORY_USED = "vgpu_card_memory_used_bytes"
METRIC_CARD_UTILIZATION = "vgpu_card_utilization_percent"
METRIC_CARD_HEALTHY = "vgpu_card_healthy"
METRIC_CARD_ALLOCATED_CORES = "vgpu_card_allocated_cores"
METRIC_CARD_ALLOCATED_MEMORY = "vgpu_card_allocated_memory_bytes"
METRIC_CONTAINER_MEMORY_USED = "vgpu_container_memory_used_bytes"
METRIC_CONTAINER_UTILIZATION = "vgpu_container_utilization_percent"
METRIC_CONTAINER_REQUEST_CORES = "vgpu_container_request_cores"
METRIC_CONTAINER_REQUEST_MEMORY = "vgpu_container_request_memory_bytes"
METRIC_PROCESS_MEMORY_USED = "vgpu_process_memory_used_bytes"
METRIC_SAMPLE_STALE = "vgpu_sample_stale"
METRIC_SAMPLE_AGE = "vgpu_sample_age_seconds"
# the scheduler extender's own, served on its /metrics
METRIC_EXTENDER_REQUEST_SECONDS = "vgpu_extender_request_duration_seconds"  # label verb
METRIC_EXTENDER_DECISIONS = "vgpu_extender_decisions_total"  # labels verb, outcome
METRIC_EXTENDER_LEDGER_PODS = "vgpu_extender_ledger_pods"  # label state: held|assumed|unattributed
METRIC_EXTENDER_NODES = "vgpu_extender_nodes"
METRIC_EXTENDER_RIVAL_WAIT_SECONDS = "vgpu_extender_rival_wait_seconds"  # label outcome: settled|late|full
# one series per MIG slice; utilisation only where the backend measures it (NVML cannot: DCGM / GPM)
METRIC_SLICE_MEMORY_TOTAL = "vgpu_mig_slice_memory_total_bytes"
METRIC_SLICE_MEMORY_USED = "vgpu_mig_slice_memory_used_bytes"
METRIC_SLICE_UTILIZATION = "vgpu_mig_slice_utilization_percent"
METRIC_SLICE_HEALTHY = "vgpu_mig_slice_healthy"
SLICE_LABELS = ("node", "gpu", "uuid", "profile")
CARD_LABELS = ("node", "gpu", "uuid", "model")
CONTAINER_LABELS = ("node", "namespace", "pod", "container", "gpu", "uuid")
PROCESS_LABELS = ("node", "gpu", "uuid", "pid", "namespace", "pod", "container")  # "" when not in a known pod


# --- names that depend on the configured domains -----------------------------


@dataclass(frozen=True)
class Names:
    """Resource and annotation names for a resource domain and a project domain.

    The names every pod read asks for are computed once per instance (``cached_property``):
    rebuilding the extender's ledger reads them for each of 100,000 pods."""

    domain: str = DEFAULT_RESOURCE_DOMAIN
    project_domain: str = PROJECT_DOMAIN

    def __post_init__(self) -> None:
        for what, value in (("resource domain", self.domain), ("project domain", self.project_domain)):
            if not _DNS_SUBDOMAIN.fullmatch(value):
                raise ValueError(f"{what} {value!r} is not a DNS subdomain (like 'tencent.com')")

    # resources
    @functools.cached_property
    def core_resource(self) -> str:
        return f"{self.domain}/vcuda-core"

    @functools.cached_property
    def memory_resource(self) -> str:
        return f"{self.domain}/vcuda-memory"

    @functools.cached_property
    def resources(self) -> tuple[str, str]:
        return (self.core_resource, self.memory_resource)

    # gpu-admission's hand-off annotations (scheduler -> device plugin)
    def predicate_gpu_idx(self, container_index: int) -> str:
        return f"{self.domain}/predicate-gpu-idx-{container_index}"

    @functools.cached_property
    def predicate_gpu_idx_prefix(self) -> str:
        return f"{self.domain}/predicate-gpu-idx-"

    @functools.cached_property
    def predicate_node(self) -> str:
        return f"{self.domain}/predicate-node"

    @property
    def predicate_time(self) -> str:
        return f"{self.domain}/predicate-time"

    @property
    def gpu_assigned(self) -> str:
        return f"{self.domain}/gpu-assigned"

    # this project's own annotations
    @functools.cached_property
    def allocation(self) -> str:
        """Pod annotation: the full allocation record (JSON, see PodAllocation)."""
        return f"{self.project_domain}/allocation"

    @property
    def policy(self) -> str:
        """Pod annotation: per-pod placement policy override ('binpack' or 'spread')."""
        return f"{self.project_domain}/policy"

    @property
    def node_inventory(self) -> str:
        """Node annotation: GPU inventory and topology (JSON, see core.inventory)."""
        return f"{self.project_domain}/gpu-inventory"

    @property
    def share_request(self) -> str:
        """Pod annotation: the share request that re-created this notebook pod (JSON, notebook side)."""
        return f"{self.project_domain}/share-request"

    @property
    def isolation(self) -> str:
        """Pod annotation (user input): 'mig' asks to be placed only on a hardware-isolated MIG slice."""
        return f"{self.project_domain}/isolation"

    @property
    def gpu_sharing(self) -> str:
        """Node annotation (the admin's): which cards serve time-shared shares and which MIG slices
        (see core.mig.parse_sharing)."""
        return f"{self.project_domain}/gpu-sharing"

    def mig_slice(self, container_index: int) -> str:
        """Pod annotation written at bind (trusted key): the MIG device UUID a container holds."""
        return f"{self.project_domain}/mig-slice-{container_index}"

    @functools.cached_property
    def mig_slice_prefix(self) -> str:
        return f"{self.project_domain}/mig-slice-"

    @property
    def node_label_gpu(self) -> str:
        """Node label set by the device plugin on nodes that have healthy vGPU cards."""
        return f"{self.project_domain}/gpu"


_DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")

DEFAULT_NAMES = Names()


# --- quantities ------------------------------------------------------------------


class RequestError(ValueError):
    """A vGPU request that can never be valid, with a message a person can act on."""


_QUANTITY = re.compile(r"^([+-]?[0-9.]+(?:[eE][+-]?[0-9]+)?)(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E|m|u|n)?\Z")
_SUFFIX = {
    None: Decimal(1),
    "k": Decimal(10) ** 3,
    "M": Decimal(10) ** 6,
    "G": Decimal(10) ** 9,
    "T": Decimal(10) ** 12,
    "P": Decimal(10) ** 15,
    "E": Decimal(10) ** 18,
    "m": Decimal(10) ** -3,
    "u": Decimal(10) ** -6,
    "n": Decimal(10) ** -9,
    "Ki": Decimal(2) ** 10,
    "Mi": Decimal(2) ** 20,
    "Gi": Decimal(2) ** 30,
    "Ti": Decimal(2) ** 40,
    "Pi": Decimal(2) ** 50,
    "Ei": Decimal(2) ** 60,
}


MAX_QUANTITY_LENGTH = 64
"""Longest quantity text read at all: Kubernetes' own quantities are far shorter."""

MAX_QUANTITY_EXPONENT = 18
"""Largest decimal exponent a quantity may carry (``E``, the largest suffix, is 10**18)."""

MAX_COUNT = 2**63 - 1
"""Largest count of an extended resource: Kubernetes keeps them in an int64."""


def parse_count(value: object, resource: str) -> int:
    """A non-negative integer count of an extended resource, from an int or a Kubernetes quantity.

    Extended resources are whole numbers: '25', 25 and '1k' are counts; '0.5', '-1', '250m',
    True and 'lots' are not, and the error names the resource and the value. Texts longer than
    ``MAX_QUANTITY_LENGTH``, exponents beyond ``MAX_QUANTITY_EXPONENT`` and counts beyond
    ``MAX_COUNT`` are refused before any arithmetic, so no input can overflow or exhaust it.
    """
    if isinstance(value, bool):
        raise RequestError(f"{resource}: {value!r} is not a count (use a whole number such as 25)")
    if isinstance(value, int):
        if value > MAX_COUNT:
            raise RequestError(f"{resource}: {_short(value)} is more than any node has")
        number = Decimal(value)
    elif isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise RequestError(f"{resource}: {value!r} is not a count (use a whole number such as 25)")
        if not value.is_integer():
            raise RequestError(f"{resource}: {value!r} is not a whole number; {resource} is counted in whole units")
        if value > MAX_COUNT:
            raise RequestError(f"{resource}: {value!r} is more than any node has")
        number = Decimal(int(value))
    elif isinstance(value, str):
        number = _quantity(value, resource)
    else:
        raise RequestError(f"{resource}: {_short(value)} is not a count (use a whole number such as 25)")
    if number < 0:
        raise RequestError(f"{resource}: {_short(value)} is negative; ask for 0 or more")
    if number != number.to_integral_value():
        raise RequestError(f"{resource}: {_short(value)} is not a whole number; {resource} is counted in whole units")
    if number > MAX_COUNT:
        raise RequestError(f"{resource}: {_short(value)} is more than any node has")
    return int(number)


def _quantity(value: str, resource: str) -> Decimal:
    """A quantity's value, with its length and exponent checked before any Decimal arithmetic.

    Short texts are memoised: a cluster's pods repeat a handful of quantities ('25', '8Gi'),
    and rebuilding the extender's ledger reads every limit and request of every pod. Refusals
    raise and are not cached; long texts (padded with spaces, say) are never kept."""
    if len(value) <= MAX_QUANTITY_LENGTH:
        return _cached_quantity(value, resource)
    return _parse_quantity(value, resource)


def _parse_quantity(value: str, resource: str) -> Decimal:
    text = value.strip()
    if len(text) > MAX_QUANTITY_LENGTH:
        raise RequestError(f"{resource}: a quantity of {len(text)} characters is not a count "
                           f"(at most {MAX_QUANTITY_LENGTH}; use a whole number such as 25)")
    match = _QUANTITY.match(text)
    if not match:
        raise RequestError(f"{resource}: {value!r} is not a quantity (use a whole number such as 25)")
    mantissa, _, exponent = match.group(1).lower().partition("e")
    if exponent and abs(int(exponent)) > MAX_QUANTITY_EXPONENT:
        raise RequestError(f"{resource}: {value!r} has an exponent beyond ±{MAX_QUANTITY_EXPONENT}; "
                           f"use a whole number such as 25")
    try:
        return Decimal(match.group(1)) * _SUFFIX[match.group(2)]
    except ArithmeticError:  # InvalidOperation ('1.2.3', '.'), and any overflow the bounds above missed
        raise RequestError(f"{resource}: {value!r} is not a quantity") from None


_cached_quantity = functools.lru_cache(maxsize=1024)(_parse_quantity)


def _short(value: object) -> str:
    """A value for an error message, cut short: the input may be huge."""
    text = repr(value) if not isinstance(value, int) or value.bit_length() < 200 else f"a {value.bit_length()}-bit number"
    return text if len(text) <= 80 else text[:77] + "..."


# --- a container's request ---------------------------------------------------------------


@dataclass(frozen=True)
class Request:
    """A validated vGPU request of one container.

    ``cores`` is in vcuda-core units: 1-99 is a share of one card, 100*n is n whole cards.
    ``memory_units`` is in vcuda-memory units (256 MiB); 0 with whole cards means "all of
    each card's memory".
    """

    cores: int
    memory_units: int = 0

    def __post_init__(self) -> None:
        validate_request(self.cores, self.memory_units)

    @property
    def is_share(self) -> bool:
        return self.cores < CORES_PER_CARD

    @property
    def cards(self) -> int:
        """Number of cards the request spans: 1 for a share, n for 100*n cores."""
        return 1 if self.is_share else self.cores // CORES_PER_CARD

    @property
    def memory_mib(self) -> int:
        return self.memory_units * MEMORY_UNIT_MIB

    def describe(self) -> str:
        if self.is_share:
            return f"{self.cores} % of one card with {format_mib(self.memory_mib)}"
        cards = self.cards
        plural = "s" if cards > 1 else ""
        memory = f" ({format_mib(self.memory_mib)} declared)" if self.memory_units else ""
        return f"{cards} whole card{plural}{memory}"


def validate_request(cores: int, memory_units: int, core_name: str = "vcuda-core",
                     memory_name: str = "vcuda-memory", memory_example: str = "") -> None:
    """Raise RequestError unless (cores, memory_units) is a valid non-empty vGPU request. The messages
    name the request's fields as the caller's user knows them (resource names, or a command's flags),
    ``memory_example`` the way to ask for 4 GiB there."""
    for name, value in ((core_name, cores), (memory_name, memory_units)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise RequestError(f"{name}: {value!r} is not a whole number")
        if value < 0:
            raise RequestError(f"{name}: {value} is negative; ask for 0 or more")
    max_units = MAX_CARD_MEMORY_MIB // MEMORY_UNIT_MIB
    if cores == 0:
        if memory_units > 0:
            raise RequestError(
                f"{memory_name}={memory_units} with {core_name}=0: memory comes with a share of "
                f"compute; ask for {core_name} 1-99 (a share) or 100 per whole card"
            )
        raise RequestError(f"{core_name}=0 asks for no GPU; leave both resources out instead")
    if cores < CORES_PER_CARD:
        if memory_units == 0:
            raise RequestError(
                f"{core_name}={cores} is a share of one card and needs {memory_name} too "
                f"(1 unit = {MEMORY_UNIT_MIB} MiB), e.g. {memory_example or f'{memory_name}=16 for 4 GiB'}"
            )
        if memory_units > max_units:
            raise RequestError(
                f"{memory_name}={memory_units} is {format_mib(memory_units * MEMORY_UNIT_MIB)}, more than "
                f"any card has (at most {format_mib(MAX_CARD_MEMORY_MIB)}); 1 unit = {MEMORY_UNIT_MIB} MiB"
            )
        return
    if cores % CORES_PER_CARD:
        lower = cores // CORES_PER_CARD * CORES_PER_CARD
        raise RequestError(
            f"{core_name}={cores} is neither a share of one card (1-99) nor whole cards "
            f"(a multiple of {CORES_PER_CARD}); did you mean {lower} or {lower + CORES_PER_CARD}?"
        )
    cards = cores // CORES_PER_CARD
    if memory_units > cards * max_units:
        raise RequestError(
            f"{memory_name}={memory_units} is {format_mib(memory_units * MEMORY_UNIT_MIB)}, more than "
            f"{cards} card(s) could have (at most {format_mib(cards * MAX_CARD_MEMORY_MIB)})"
        )


def parse_container_request(
    limits: Mapping[str, object] | None,
    requests: Mapping[str, object] | None = None,
    names: Names = DEFAULT_NAMES,
) -> Request | None:
    """The vGPU request in a container's resources, None when it asks for none.

    Extended resources cannot be overcommitted, so Kubernetes requires requests to equal
    limits; a container that sets only requests or only limits is read from whichever is set.

    Maps whose vGPU quantities are all short texts (as the API server sends them) are read once
    per distinct set of texts: a cluster's pods repeat a handful of shapes, and rebuilding the
    extender's ledger reads every container of every pod. Anything else is read afresh (a long
    text is never kept: the cache holds at most 4,096 sets of four short texts).
    """
    if (limits is None or type(limits) is dict) and (requests is None or type(requests) is dict):
        core, memory = names.resources
        texts = (limits.get(core, _ABSENT) if limits else _ABSENT, limits.get(memory, _ABSENT) if limits else _ABSENT,
                 requests.get(core, _ABSENT) if requests else _ABSENT,
                 requests.get(memory, _ABSENT) if requests else _ABSENT)
        for text in texts:
            if text is not _ABSENT and (type(text) is not str or len(text) > MAX_QUANTITY_LENGTH):
                break
        else:
            return _request_from_texts(*texts, core, memory)
    return _parse_container_request(limits, requests, names.core_resource, names.memory_resource)


_ABSENT: Any = object()
"""A resource a container's map does not name (unlike one it names with the value null)."""


@functools.lru_cache(maxsize=4096)
def _request_from_texts(core_limit: Any, memory_limit: Any, core_request: Any, memory_request: Any,
                        core: str, memory: str) -> Request | None:
    """The request of a container whose vGPU quantities are these texts (refusals raise, uncached)."""
    limits = {name: text for name, text in ((core, core_limit), (memory, memory_limit)) if text is not _ABSENT}
    requests = {name: text for name, text in ((core, core_request), (memory, memory_request)) if text is not _ABSENT}
    return _parse_container_request(limits, requests, core, memory)


def _parse_container_request(limits: Mapping[str, object] | None, requests: Mapping[str, object] | None,
                             core_resource: str, memory_resource: str) -> Request | None:
    for what, given in (("limits", limits), ("requests", requests)):
        if given is not None and not isinstance(given, Mapping):
            raise RequestError(f"resources.{what} must be a map of resource names to quantities, "
                               f"not {type(given).__name__}")
    limits = limits or {}
    requests = requests or {}
    values: dict[str, int | None] = {}
    for resource in (core_resource, memory_resource):
        limit = parse_count(limits[resource], resource) if resource in limits else None
        request = parse_count(requests[resource], resource) if resource in requests else None
        if limit is not None and request is not None and limit != request:
            raise RequestError(
                f"{resource}: request {request} differs from limit {limit}; extended resources "
                f"cannot be overcommitted, set both to the same value"
            )
        values[resource] = limit if limit is not None else request
    cores, memory = values[core_resource], values[memory_resource]
    if cores is None and memory is None:
        return None
    if cores is None:
        raise RequestError(
            f"{memory_resource} without {core_resource}: memory comes with a share of "
            f"compute; add {core_resource} (1-99 for a share, 100 per whole card)"
        )
    if cores == 0 and not memory:
        return None
    validate_request(cores, memory or 0, core_resource, memory_resource)
    return Request(cores, memory or 0)


def pod_requests(pod: Mapping[str, Any], names: Names = DEFAULT_NAMES) -> dict[int, Request]:
    """Container index -> Request for every container of a pod (a dict as the API returns it).

    Indexes count ``spec.containers`` as gpu-admission does. An init container asking for a
    vGPU is refused: its share would be held for the pod's whole life for a moment's use.
    Raises RequestError naming the container on the first invalid request.
    """
    spec = _mapping(pod.get("spec"), "spec")
    for container in _containers(spec.get("initContainers") or spec.get("init_containers"), "init container"):
        resources = _mapping(container.get("resources"), f"init container {container.get('name')!r}: resources")
        for key in ("limits", "requests"):
            given = resources.get(key) or {}
            if not isinstance(given, Mapping):
                raise RequestError(f"init container {container.get('name')!r}: resources.{key} must be a map "
                                   f"of resource names to quantities, not {type(given).__name__}")
            if any(r in given for r in names.resources):
                raise RequestError(
                    f"init container {container.get('name')!r} asks for a vGPU; only regular containers can"
                )
    result: dict[int, Request] = {}
    for index, container in enumerate(_containers(spec.get("containers"), "container")):
        try:
            resources = _mapping(container.get("resources"), "resources")
            request = parse_container_request(resources.get("limits"), resources.get("requests"), names)
        except RequestError as error:
            raise RequestError(f"container {container.get('name')!r}: {error}") from None
        if request is not None:
            result[index] = request
    return result


def _mapping(value: object, what: str) -> Mapping[str, Any]:
    if type(value) is dict:  # what JSON decodes to: skip the abstract-class check
        return value
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise RequestError(f"{what} must be an object, not {type(value).__name__}")
    return value


def _containers(value: object, what: str) -> list[Mapping[str, Any]]:
    if value is None:
        return []
    if type(value) is list and all(type(c) is dict for c in value):  # what JSON decodes to
        return value
    if not isinstance(value, list) or not all(isinstance(c, Mapping) for c in value):
        raise RequestError(f"the pod's {what}s must be a list of objects")
    return value


# --- the allocation record (scheduler -> device plugin -> notebook) ----------------------


@dataclass(frozen=True)
class CardShare:
    """What one container holds on one card."""

    index: int
    uuid: str
    cores: int
    memory_units: int
    mig_device: str = ""
    """The MIG device (``MIG-<uuid>``) the share is served on, "" for a time-shared share or a whole card.
    Read from ``Names.mig_slice(i)``; the container gets the whole slice."""

    @property
    def memory_mib(self) -> int:
        return self.memory_units * MEMORY_UNIT_MIB


@dataclass(frozen=True)
class ContainerAllocation:
    index: int
    name: str
    cards: tuple[CardShare, ...]
    allocation_id: str = ""
    """The id in the read token (``VGPU_TOKEN``) of the answer this container really got, once the
    device plugin has seen kubelet's record of it; "" until then (and in the scheduler's record)."""

    @property
    def cores(self) -> int:
        return sum(card.cores for card in self.cards)

    @property
    def memory_units(self) -> int:
        return sum(card.memory_units for card in self.cards)


ALLOCATION_VERSION = 1


@dataclass(frozen=True)
class PodAllocation:
    """The project's allocation record, stored as JSON in the pod's ``allocation`` annotation."""

    node: str
    containers: tuple[ContainerAllocation, ...]
    assigned_at_ns: int = 0
    policy: str = "binpack"
    version: int = field(default=ALLOCATION_VERSION)

    def container(self, index: int) -> ContainerAllocation | None:
        for container in self.containers:
            if container.index == index:
                return container
        return None

    def to_json(self) -> str:
        return json.dumps(
            {
                "version": self.version,
                "node": self.node,
                "assignedAtNs": self.assigned_at_ns,
                "policy": self.policy,
                "containers": [
                    {
                        "index": c.index,
                        "name": c.name,
                        "cards": [
                            {"index": s.index, "uuid": s.uuid, "cores": s.cores, "memoryUnits": s.memory_units,
                             **({"migDevice": s.mig_device} if s.mig_device else {})}
                            for s in c.cards
                        ],
                        **({"allocationId": c.allocation_id} if c.allocation_id else {}),
                    }
                    for c in self.containers
                ],
            },
            separators=(",", ":"),
            sort_keys=True,
        )

    @classmethod
    def from_json(cls, text: str) -> PodAllocation:
        """Parse an allocation annotation; ValueError with the reason when it is malformed."""
        try:
            data = json.loads(text)
        except (TypeError, json.JSONDecodeError, RecursionError) as error:  # nested past the reader's depth too
            raise ValueError(f"allocation annotation is not JSON: {error}") from None
        try:
            if not isinstance(data, dict):
                raise TypeError("not an object")
            version = int(data.get("version", ALLOCATION_VERSION))
            if version != ALLOCATION_VERSION:
                raise ValueError(f"unsupported allocation version {version}")
            containers = []
            for c in data["containers"]:  # plain loops: the extender reads one record per pod
                index, name = _nonneg(c["index"], "container index"), str(c.get("name", ""))
                cards = []
                for s in c["cards"]:
                    cards.append(CardShare(_nonneg(s["index"], "card index"), str(s.get("uuid", "")),
                                           _nonneg(s["cores"], "cores"), _nonneg(s["memoryUnits"], "memoryUnits"),
                                           check_mig_device(s.get("migDevice", ""), allow_empty=True)))
                containers.append(ContainerAllocation(index, name, tuple(cards),
                                                      _allocation_id(c.get("allocationId", ""))))
            return cls(str(data["node"]), tuple(containers), int(data.get("assignedAtNs", 0)),
                       str(data.get("policy", "binpack")), version)
        except (KeyError, TypeError, ValueError) as error:
            raise ValueError(f"allocation annotation is malformed: {error!s}") from None


def _allocation_id(value: object) -> str:
    if value == "":
        return ""
    if not isinstance(value, str) or not value.isascii() or not all(ch.isalnum() or ch in "-_" for ch in value):
        raise ValueError(f"allocationId {value!r} is not a token id (letters, digits, '-' and '_')")
    return value


def check_mig_device(value: object, *, allow_empty: bool = False) -> str:
    """A MIG device UUID as NVML spells it ("MIG-" + letters, digits, '-' and '/'); ValueError otherwise."""
    if allow_empty and value == "":
        return ""
    if not isinstance(value, str) or not value.startswith("MIG-") or len(value) > 100 or not value.isascii() \
            or not all(ch.isalnum() or ch in "-/" for ch in value):
        raise ValueError(f"{_short(value)} is not a MIG device UUID ('MIG-<uuid>')")
    return value


def _nonneg(value: object, what: str) -> int:
    if type(value) is int and value >= 0:
        return value
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{what} {value!r} is not a non-negative integer")
    return value


def predicate_annotations(allocation: PodAllocation, names: Names = DEFAULT_NAMES) -> dict[str, str]:
    """The annotations written at bind: gpu-admission's keys plus our own record."""
    annotations = {
        names.predicate_gpu_idx(c.index): ",".join(str(s.index) for s in c.cards) for c in allocation.containers
    }
    for c in allocation.containers:
        devices = [s.mig_device for s in c.cards if s.mig_device]
        if devices:
            annotations[names.mig_slice(c.index)] = devices[0]
    annotations[names.predicate_node] = allocation.node
    annotations[names.predicate_time] = str(allocation.assigned_at_ns)
    annotations[names.gpu_assigned] = "false"
    annotations[names.allocation] = allocation.to_json()
    return annotations


def parse_predicate_indices(annotations: Mapping[str, str], names: Names = DEFAULT_NAMES) -> dict[int, tuple[int, ...]]:
    """Container index -> card indices from gpu-admission's ``predicate-gpu-idx-<i>`` keys.

    Raises ValueError naming the key when a value is not a comma-separated list of indices.
    """
    result: dict[int, tuple[int, ...]] = {}
    prefix = names.predicate_gpu_idx_prefix
    for key, value in annotations.items():
        if not key.startswith(prefix):
            continue
        suffix = key[len(prefix):]
        if not suffix.isdigit():
            raise ValueError(f"annotation {key!r}: container index {suffix!r} is not a number")
        if type(value) is str and value.isdigit():  # one card, the usual case
            result[int(suffix)] = (int(value),)
            continue
        parts = [p.strip() for p in str(value).split(",") if p.strip()]
        if not parts or not all(p.isdigit() for p in parts):
            raise ValueError(f"annotation {key}={value!r}: expected card indices like '1' or '0,3'")
        result[int(suffix)] = tuple(int(p) for p in parts)
    return result


def parse_mig_slices(annotations: Mapping[str, str], names: Names = DEFAULT_NAMES) -> dict[int, str]:
    """Container index -> MIG device UUID from the ``mig-slice-<i>`` keys our bind writes.

    Raises ValueError naming the key when the index or the UUID is malformed, or when two
    containers name the same slice (a slice is held whole, by one container).
    """
    result: dict[int, str] = {}
    prefix = names.mig_slice_prefix
    for key, value in annotations.items():
        if not key.startswith(prefix):
            continue
        suffix = key[len(prefix):]
        if not suffix.isdigit() or len(suffix) > 6:
            raise ValueError(f"annotation {key!r}: container index {suffix!r} is not a number")
        try:
            result[int(suffix)] = check_mig_device(value)
        except ValueError as error:
            raise ValueError(f"annotation {key}: {error}") from None
    if len(set(result.values())) != len(result):
        raise ValueError(f"annotations {prefix}<i> name one MIG slice for several containers")
    return result


# --- sizes ----------------------------------------------------------------------------------

_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*\Z")
_SIZE_MIB = {
    "": None,  # a bare number is in vcuda-memory units
    "units": None,
    "mib": Decimal(1),
    "mi": Decimal(1),
    "m": Decimal(1),
    "gib": Decimal(1024),
    "gi": Decimal(1024),
    "g": Decimal(1024),
    "tib": Decimal(1024 * 1024),
    "ti": Decimal(1024 * 1024),
}


def parse_memory_size(text: str | int) -> int:
    """vcuda-memory units from '4GiB', '4096MiB', '4Gi' or a bare number of 256 MiB units.

    A size that is not a whole number of 256 MiB units is refused (it would be silently
    rounded by someone else otherwise).
    """
    if isinstance(text, bool):
        raise RequestError(f"memory size {text!r} is not a size")
    if isinstance(text, int):
        units = text
    elif not isinstance(text, str):
        raise RequestError(f"memory size {text!r} is not a size")
    else:
        if len(text) > MAX_QUANTITY_LENGTH:
            raise RequestError(f"memory size of {len(text)} characters: use e.g. 4GiB, 4096MiB or a number "
                               f"of {MEMORY_UNIT_MIB} MiB units")
        match = _SIZE.match(text)
        if not match:
            raise RequestError(f"memory size {text!r}: use e.g. 4GiB, 4096MiB or a number of {MEMORY_UNIT_MIB} MiB units")
        number, unit = Decimal(match.group(1)), match.group(2).lower()
        if unit not in _SIZE_MIB:
            raise RequestError(f"memory size {text!r}: unknown unit {match.group(2)!r} (use MiB or GiB)")
        scale = _SIZE_MIB[unit]
        if scale is None:
            if number != number.to_integral_value():
                raise RequestError(f"memory size {text!r}: a bare number counts {MEMORY_UNIT_MIB} MiB units and must be whole")
            units = int(number)
        else:
            mib = number * scale
            if mib % MEMORY_UNIT_MIB:
                raise RequestError(f"memory size {text!r} is not a multiple of {MEMORY_UNIT_MIB} MiB")
            units = int(mib // MEMORY_UNIT_MIB)
    if units <= 0:
        raise RequestError(f"memory size {text!r} must be more than zero")
    return units


def format_mib(mib: float) -> str:
    """'4 GiB', '1.5 GiB', '768 MiB'."""
    if mib >= 1024:
        gib = mib / 1024
        return f"{gib:.0f} GiB" if gib == int(gib) else f"{gib:.1f} GiB"
    return f"{mib:.0f} MiB"


def memory_fraction(memory_mib: float, card_mib: float) -> float:
    """A share's memory as a fraction of its card, the one rule every framework limit uses (PyTorch's
    ``set_per_process_memory_fraction``, JAX's ``XLA_PYTHON_CLIENT_MEM_FRACTION``): floored to 3
    decimals, so rounding never lands above the share; at most 1, and 0 for an unknown card."""
    if card_mib <= 0 or memory_mib <= 0:
        return 0.0
    # integer arithmetic: 1000 * 4096 // 24576 is 166 exactly, where floats may land a hair below
    return min(1000, int(round(memory_mib * 1000)) // int(round(card_mib))) / 1000


def format_fraction(fraction: float) -> str:
    """A memory fraction as the environment carries it: '0.166'."""
    return f"{fraction:.3f}"


def request_limits(request: Request, names: Names = DEFAULT_NAMES) -> dict[str, str]:
    """The resources.limits entries for a request, as KubeSpawner and pod specs want them."""
    limits = {names.core_resource: str(request.cores)}
    if request.memory_units:
        limits[names.memory_resource] = str(request.memory_units)
    return limits


def card_ids_env(indices: Sequence[int]) -> str:
    """Comma-separated card indices as NVIDIA_VISIBLE_DEVICES and VGPU_DEVICE_INDICES spell them."""
    return ",".join(str(i) for i in indices)
