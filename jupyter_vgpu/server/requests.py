"""Asking for a new share: validation, one small requester interface, and a tracker.

A ``Requester`` turns "I want N cores and M memory units" (``cores == 0`` releases) into a
new notebook server with that share, reporting progress as it goes, and returns an
``Outcome``. Implementations: ``HubRequester`` (JupyterHub REST API: stop the server,
start it with new user_options) and ``KubeRecreateRequester`` (the simulated cluster:
re-create the notebook pod through the Kubernetes API). The ``RequestTracker`` runs one
request at a time in a background thread, so neither the server's event loop nor a
kernel cell blocks, and keeps every request's state for the REST API and ``%vgpu``.
"""

from __future__ import annotations

import copy
import itertools
import json
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from jupyter_vgpu.core import contract
from jupyter_vgpu.core.contract import RequestError

Progress = Callable[[str], None]


@dataclass(frozen=True)
class Outcome:
    state: str  # "scheduled" | "failed"
    message: str
    node: str | None = None
    cards: list[dict[str, Any]] = field(default_factory=list)


class Requester(Protocol):
    name: str

    def request(self, cores: int, memory_units: int, progress: Progress) -> Outcome: ...


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


# --- the tracker -------------------------------------------------------------------------


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


class RequestTracker:
    def __init__(self, requester: Requester | None, unavailable_reason: str = "") -> None:
        self.requester = requester
        self.unavailable_reason = unavailable_reason
        self._requests: dict[str, ShareRequest] = {}
        self._order: list[str] = []
        self._lock = threading.Lock()
        self._done: dict[str, threading.Event] = {}
        self._counter = itertools.count(1)
        self._recovered = False

    def submit(self, cores: int, memory_units: int) -> ShareRequest:
        """Start a request (already validated); RequestError if one is still pending."""
        with self._lock:
            for request in self._requests.values():
                if request.state == "pending" and not request.handed_over:
                    raise RequestError(f"request {request.id} is still pending; wait for its outcome first")
            self._recovered = True  # a request from this server supersedes anything from before it
            first = f"asking for {describe_share(cores, memory_units)}"
            request = ShareRequest(id=f"r{next(self._counter)}-{uuid.uuid4().hex[:8]}", cores=cores,
                                   memoryUnits=memory_units, message=first, progress=[first])
            self._requests[request.id] = request
            self._order.append(request.id)
            self._done[request.id] = threading.Event()
        if self.requester is None:
            self._finish(request.id, Outcome("failed", self.unavailable_reason))
        else:
            threading.Thread(target=self._run, args=(request.id,), name=f"vgpu-request-{request.id}",
                             daemon=True).start()
        return self.get(request.id) or request

    def _run(self, request_id: str) -> None:
        request = self._requests[request_id]
        assert self.requester is not None
        try:
            outcome = self.requester.request(request.cores, request.memoryUnits,
                                             lambda message: self._progress(request_id, message))
        except Exception as error:  # noqa: BLE001 - any failure is the request's outcome, said plainly
            outcome = Outcome("failed", f"{self.requester.name}: {error}")
        self._finish(request_id, outcome)

    def _progress(self, request_id: str, message: str) -> None:
        with self._lock:
            request = self._requests[request_id]
            if request.state == "pending" and message != request.message:
                request.message, request.updated = message, time.time()
                request.progress.append(message)

    def _finish(self, request_id: str, outcome: Outcome) -> None:
        """Record the outcome; a "pending" outcome means the request was handed over to a peer
        that outlives this server (the Hub restarting it), so it stays pending here."""
        with self._lock:
            request = self._requests[request_id]
            request.state, request.message = outcome.state, outcome.message
            request.node, request.cards, request.updated = outcome.node, list(outcome.cards), time.time()
            if not request.progress or request.progress[-1] != outcome.message:
                request.progress.append(outcome.message)
            if outcome.state == "pending":
                request.handed_over = True
        self._done[request_id].set()

    def get(self, request_id: str) -> ShareRequest | None:
        if request_id.startswith(("hub-", "pod-")):
            self._recover()
        with self._lock:
            request = self._requests.get(request_id)
            return ShareRequest(**copy.deepcopy(asdict(request))) if request else None

    def latest(self) -> ShareRequest | None:
        self._recover()
        with self._lock:
            last = self._order[-1] if self._order else None
        return self.get(last) if last else None

    def _recover(self) -> None:
        """The outcome of a request made before this server (re)started, asked once it is final."""
        if self._recovered or self.requester is None or not hasattr(self.requester, "recover"):
            return
        earlier = self.requester.recover()
        with self._lock:
            if earlier is None or earlier.state != "pending":
                self._recovered = True
            if earlier is None:
                return
            earlier.handed_over = True
            if earlier.id not in self._requests:
                self._order.insert(0, earlier.id)
                self._done[earlier.id] = threading.Event()
            self._requests[earlier.id] = earlier
            if earlier.state != "pending":
                self._done[earlier.id].set()

    def wait(self, request_id: str, timeout: float | None = None) -> ShareRequest | None:
        done = self._done.get(request_id)
        if done is not None:
            done.wait(timeout)
        return self.get(request_id)


# --- JupyterHub ----------------------------------------------------------------------------

HUB_RESTART_SCOPE = "custom:jupyter-vgpu:restart"
HUB_SETUP_HINT = "VGPUHub(config=c).configure(c) in jupyterhub_config.py (see jupyter-vgpu's admin guide)"
HANDED_OVER = ("the Hub is restarting your server with the new share; this server stops now — "
               "the outcome shows here (and in `%vgpu status`) once it is back")


class HubRequester:
    """Ask the Hub to restart this server with a new share (jupyter_vgpu.hub's restart endpoint).

    A server cannot restart itself through the plain REST API — stopping it revokes its
    token and, on Kubernetes, deletes the pod that would send the start — so the Hub does
    it: ``POST {hub api}/vgpu/restart/<user>[/<server>]``. This server is stopped during the
    restart; the restarted server reads the outcome with ``recover()``.
    """

    name = "jupyterhub"

    def __init__(self, api_url: str, token: str, user: str, server_name: str = "", *,
                 timeout: float = 300.0, poll_interval: float = 0.5, http_timeout: float = 10.0,
                 environ: Mapping[str, str] | None = None) -> None:
        self.api_url = api_url.rstrip("/")
        self._token = token
        self.user = user
        self.server_name = server_name
        self._timeout = timeout
        self._poll = poll_interval
        self._http_timeout = http_timeout
        self._environ = environ if environ is not None else {}

    @classmethod
    def from_environ(cls, environ: Mapping[str, str], **kwargs: Any) -> HubRequester | None:
        api, token, user = (environ.get(k) for k in ("JUPYTERHUB_API_URL", "JUPYTERHUB_API_TOKEN", "JUPYTERHUB_USER"))
        if not (api and token and user):
            return None
        return cls(api, token, user, environ.get("JUPYTERHUB_SERVER_NAME", ""), environ=environ, **kwargs)

    @property
    def restart_path(self) -> str:
        path = f"/vgpu/restart/{urllib.parse.quote(self.user, safe='')}"
        return path + (f"/{urllib.parse.quote(self.server_name, safe='')}" if self.server_name else "")

    def _call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        data = None if body is None else json.dumps(body).encode()
        request = urllib.request.Request(
            self.api_url + path, data=data, method=method,
            headers={"Authorization": f"token {self._token}", "Content-Type": "application/json"},
        )
        try:
            with urllib.request.urlopen(request, timeout=self._http_timeout) as response:
                status, text = response.status, response.read().decode("utf-8", "replace")
        except urllib.error.HTTPError as error:
            status, text = error.code, error.read().decode("utf-8", "replace")
        try:
            return status, json.loads(text) if text.strip() else None
        except ValueError:
            return status, text

    def request(self, cores: int, memory_units: int, progress: Progress) -> Outcome:
        progress("asking the Hub to restart your server with the new share")
        try:
            status, body = self._call("POST", self.restart_path,
                                      {contract.HUB_OPTION_CORES: cores, contract.HUB_OPTION_MEMORY_UNITS: memory_units})
        except OSError as error:
            return Outcome("failed", f"the Hub at {self.api_url} is unreachable: {getattr(error, 'reason', error)}")
        if status == 403:
            return Outcome("failed", f"this server's Hub token may not restart it ({_hub_message(body)}); ask your "
                                     f"admin to grant the server role {HUB_RESTART_SCOPE}!server — {HUB_SETUP_HINT} does")
        if status == 404:
            return Outcome("failed", f"the Hub cannot restart servers with a new share ({_hub_message(body)}); "
                                     f"ask your admin to enable it: {HUB_SETUP_HINT}")
        if status != 202 or not isinstance(body, dict):
            return Outcome("failed", f"the Hub refused the new share (HTTP {status}): {_hub_message(body)}")
        progress(str(body.get("message") or "the Hub accepted the request"))
        deadline = time.monotonic() + self._timeout
        while time.monotonic() < deadline:
            time.sleep(self._poll)
            try:
                status, record = self._call("GET", self.restart_path)
            except OSError:
                continue  # the Hub is busy restarting us; ask again
            if status in (401, 403):  # stopping this server revoked its token: the Hub carries on
                return Outcome("pending", HANDED_OVER)
            if status == 200 and isinstance(record, dict):
                if record.get("state") in ("scheduled", "failed"):
                    return Outcome(str(record["state"]), str(record.get("message") or ""))
                progress(str(record.get("message") or "restarting"))
        return Outcome("failed", f"the Hub did not finish the restart within {self._timeout:.0f} s")

    def recover(self) -> ShareRequest | None:
        """After a restart: the Hub's record of the latest one, with where the new share landed."""
        try:
            status, record = self._call("GET", self.restart_path)
        except OSError:
            return None
        if status != 200 or not isinstance(record, dict) or record.get("state") not in ("pending", "scheduled", "failed"):
            return None
        request = ShareRequest(id=f"hub-{record.get('id', 'latest')}", cores=int(record.get("cores") or 0),
                               memoryUnits=int(record.get("memoryUnits") or 0), state=str(record["state"]),
                               message=str(record.get("message") or ""), created=float(record.get("startedAt") or time.time()))
        request.progress = [request.message]
        if request.state == "scheduled":
            from jupyter_vgpu.server.facts import env_allocation

            allocation = env_allocation(self._environ)
            if allocation and allocation.get("cores") == request.cores:
                request.node = allocation.get("node")
                request.cards = [{k: c.get(k) for k in ("index", "uuid", "cores", "memoryMib")}
                                 for c in allocation.get("cards") or []]
                where = ", ".join(f"card {c['index']} ({c['uuid']})" for c in request.cards)
                request.message = f"{request.message}: on {request.node}, {where}"
        return request


def _hub_message(body: Any) -> str:
    if isinstance(body, dict):
        return str(body.get("message") or body)
    return str(body)[:200] if body else "no details"
