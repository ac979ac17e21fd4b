"""Asking for a new share: the requester interface, its types, and validation of a share.

A ``Requester`` turns "I want N cores and M memory units" (``cores == 0`` releases) into a
new notebook server with that share, reporting progress as it goes, and returns an
``Outcome``. jupyter-vgpu ships ``hub.HubRequester`` (JupyterHub restarts the server with
new user_options); the simulated cluster plugs in its own (``vgpu_plugin.demo.requester``)
through ``c.VGPUSettings.requester_class``. ``tracker.RequestTracker`` runs them.
"""

from __future__ import annotations

import abc
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

from jupyter_vgpu.core import contract
from jupyter_vgpu.core.contract import RequestError

Progress = Callable[[str], None]


@dataclass(frozen=True)
class Outcome:
    state: str  # "scheduled" | "failed"
    message: str
    node: str | None = None
    cards: list[dict[str, Any]] = field(default_factory=list)


@dataclass(frozen=True)
class RequesterSettings:
    """What a requester may need to set itself up, filled from ``VGPUSettings``."""

    environ: Mapping[str, str]
    timeout: float = 300.0  # seconds a request may stay pending
    kubeconfig: str = ""  # for requesters that go through the Kubernetes API


class RequesterUnavailable(Exception):
    """This environment lacks what the requester needs; the message says what, for the user."""


class Requester(abc.ABC):
    """One way of getting the notebook a new share; subclass it to add another.

    ``c.VGPUSettings.requester_class`` names the class; ``from_settings`` builds it for this
    server or raises ``RequesterUnavailable``.
    """

    name = ""
    request_id = ""
    """The tracker's id of the request being carried out, set before ``request()``: a requester whose
    request outlives this server (a re-created pod) hands it on, so ``recover()`` answers with the same id."""

    @classmethod
    @abc.abstractmethod
    def from_settings(cls, settings: RequesterSettings) -> Requester: ...

    @abc.abstractmethod
    def request(self, cores: int, memory_units: int, progress: Progress) -> Outcome:
        """Carry the request out (blocking; the tracker runs it in a thread), reporting progress."""

    def recover(self) -> ShareRequest | None:
        """After this server was (re)started by a request: that request and its outcome."""
        return None

    def waiting(self) -> Waiting | None:
        """Where the request in flight waits for the scheduler (its position, why, what fits now),
        if this requester can tell; None while it is not waiting in the queue."""
        return None

    def withdraw(self) -> bool:
        """Ask the request in flight to give up (its ``request`` then returns a failed outcome and
        undoes what it started); False when this requester cannot withdraw one."""
        return False


@dataclass(frozen=True)
class Waiting:
    """One pending request's place in the scheduler's queue, in the extender's words (no other pod
    named): ``alternative`` is the largest share no larger than the request that would start now."""

    position: int
    waiting: int
    why: str
    cores: int
    memory_mib: int
    alternative: Alternative | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"position": self.position, "waiting": self.waiting, "why": self.why, "cores": self.cores,
                "memoryMib": self.memory_mib,
                "alternative": None if self.alternative is None else self.alternative.to_dict()}


@dataclass(frozen=True)
class Alternative:
    cores: int
    memory_mib: int
    nodes: int
    text: str

    def to_dict(self) -> dict[str, Any]:
        return {"cores": self.cores, "memoryMib": self.memory_mib, "nodes": self.nodes, "text": self.text}


def waiting_from_queue(answer: Any) -> Waiting | None:
    """A ``Waiting`` from the extender's one-pod ``GET /queue?namespace=&pod=`` answer (queue_access.py);
    None when the pod is not in the queue or fits now. Anything malformed is None, never an error."""
    try:
        entries = answer["pending"]
        if not entries or not entries[0].get("why"):
            return None
        entry = entries[0]
        other = entry.get("alternative")
        alternative = None if not other else Alternative(int(other["cores"]), int(other["memoryMib"]),
                                                         int(other["nodes"]), str(other["text"]))
        return Waiting(int(entry["position"]), int(answer["waiting"]), str(entry["why"]), int(entry["cores"]),
                       int(entry["memoryMib"]), alternative)
    except (KeyError, TypeError, ValueError, IndexError, AttributeError):
        return None


# --- validation -------------------------------------------------------------------------


def parse_share(cores: object, memory: object, environ: Mapping[str, str] | None = None) -> tuple[int, int]:
    """(cores, memory units) from user input; ``cores == 0`` is a release. RequestError otherwise.

    Memory is '4GiB', '4096MiB' or a whole number of 256 MiB units. The per-user ceiling the
    Hub put in our environment is enforced here, before anything is restarted.
    """
    count = contract.parse_count(cores, "cores")
    if count == 0:
        if memory not in (None, 0, "", "0"):
            raise RequestError("cores 0 releases the share; leave out --memory")
        return 0, 0
    if memory is not None and (isinstance(memory, bool) or not isinstance(memory, (str, int))):
        raise RequestError(f"memory {memory!r}: use a size such as '4GiB' or '4096MiB', or a number of "
                           f"{contract.MEMORY_UNIT_MIB} MiB units")
    units = contract.parse_memory_size(memory) if memory not in (None, "", 0) else 0
    request = contract.Request(count, units)  # validates: shares need memory, whole cards are 100*n
    environ = environ or {}
    ceiling_cores = _int_env(environ, contract.ENV_HUB_MAX_CORES)
    ceiling_mib = _int_env(environ, contract.ENV_HUB_MAX_MEMORY_MIB)
    if ceiling_cores is not None and request.cores > ceiling_cores:
        raise RequestError(f"{request.cores} cores is more than your limit of {ceiling_cores}")
    if ceiling_mib is not None and request.memory_mib > ceiling_mib:
        raise RequestError(f"{contract.format_mib(request.memory_mib)} is more than your limit of "
                           f"{contract.format_mib(ceiling_mib)}")
    return request.cores, request.memory_units


def _int_env(environ: Mapping[str, str], name: str) -> int | None:
    try:
        return int(environ[name])
    except (KeyError, ValueError):
        return None


def describe_share(cores: int, memory_units: int) -> str:
    if cores == 0:
        return "no GPU (release)"
    return contract.Request(cores, memory_units).describe()


# --- a request's state, as the REST API serves it --------------------------------------


@dataclass
class ShareRequest:
    id: str
    cores: int
    memoryUnits: int  # noqa: N815 - the REST field name
    state: str = "pending"
    message: str = ""
    node: str | None = None
    cards: list[dict[str, Any]] = field(default_factory=list)
    progress: list[str] = field(default_factory=list)  # every message while pending, in order
    handed_over: bool = False  # pending on a peer that outlives this server (the Hub restarting it)
    created: float = field(default_factory=time.time)
    updated: float = field(default_factory=time.time)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
