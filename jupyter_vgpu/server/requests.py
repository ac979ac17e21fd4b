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

    def submit(self, cores: int, memory_units: int) -> ShareRequest:
        """Start a request (already validated); RequestError if one is still pending."""
        with self._lock:
            for request in self._requests.values():
                if request.state == "pending":
                    raise RequestError(f"request {request.id} is still pending; wait for its outcome first")
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
        with self._lock:
            request = self._requests[request_id]
            request.state, request.message = outcome.state, outcome.message
            request.node, request.cards, request.updated = outcome.node, list(outcome.cards), time.time()
        self._done[request_id].set()

    def get(self, request_id: str) -> ShareRequest | None:
        with self._lock:
            request = self._requests.get(request_id)
            return ShareRequest(**copy.deepcopy(asdict(request))) if request else None

    def latest(self) -> ShareRequest | None:
        with self._lock:
            last = self._order[-1] if self._order else None
        return self.get(last) if last else None

    def wait(self, request_id: str, timeout: float | None = None) -> ShareRequest | None:
        done = self._done.get(request_id)
        if done is not None:
            done.wait(timeout)
        return self.get(request_id)


# --- JupyterHub ----------------------------------------------------------------------------

HUB_SCOPE_HINT = (
    'c.JupyterHub.load_roles = [{"name": "server", "scopes": '
    '["users:activity!user", "access:servers!server", "servers!server"]}]'
)


class HubRequester:
    """Restart this user's server through the Hub REST API with the new share as user_options.

    The server's own token needs the ``servers`` scope on its own server
    (``servers!server``); without it the outcome says what the admin must grant.
    """

    name = "jupyterhub"

    def __init__(self, api_url: str, token: str, user: str, server_name: str = "", *,
                 timeout: float = 300.0, poll_interval: float = 0.5, http_timeout: float = 10.0) -> None:
        self.api_url = api_url.rstrip("/")
        self._token = token
        self.user = user
        self.server_name = server_name
        self._timeout = timeout
        self._poll = poll_interval
        self._http_timeout = http_timeout

    @classmethod
    def from_environ(cls, environ: Mapping[str, str], **kwargs: Any) -> HubRequester | None:
        api, token, user = (environ.get(k) for k in ("JUPYTERHUB_API_URL", "JUPYTERHUB_API_TOKEN", "JUPYTERHUB_USER"))
        if not (api and token and user):
            return None
        return cls(api, token, user, environ.get("JUPYTERHUB_SERVER_NAME", ""), **kwargs)

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

    def _server_path(self) -> str:
        user = urllib.parse.quote(self.user, safe="")
        if self.server_name:
            return f"/users/{user}/servers/{urllib.parse.quote(self.server_name, safe='')}"
        return f"/users/{user}/server"

    def _may_restart(self, scopes: list[str]) -> bool:
        own = {f"servers!server={self.user}/{self.server_name}", f"servers!user={self.user}",
               "servers!user", "servers!server", "servers", "admin:servers", f"admin:servers!user={self.user}"}
        return any(scope in own for scope in scopes)

    def _server_model(self) -> dict[str, Any] | None:
        status, body = self._call("GET", f"/users/{urllib.parse.quote(self.user, safe='')}")
        if status != 200 or not isinstance(body, dict):
            raise RuntimeError(f"the Hub answered HTTP {status} when asked about user {self.user}: {_hub_message(body)}")
        return (body.get("servers") or {}).get(self.server_name)

    def _wait(self, done: Callable[[dict[str, Any] | None], bool], what: str) -> dict[str, Any] | None:
        deadline = time.monotonic() + self._timeout
        while True:
            model = self._server_model()
            if done(model):
                return model
            if time.monotonic() > deadline:
                raise TimeoutError(f"the Hub did not {what} within {self._timeout:.0f} s")
            time.sleep(self._poll)

    def request(self, cores: int, memory_units: int, progress: Progress) -> Outcome:
        progress("checking this server's permissions with the Hub")
        status, me = self._call("GET", "/user")
        if status != 200 or not isinstance(me, dict):
            return Outcome("failed", f"the Hub did not accept this server's token (HTTP {status}: {_hub_message(me)})")
        if not self._may_restart(list(me.get("scopes") or [])):
            return Outcome("failed",
                           "this server's Hub token may not restart the server (it lacks the "
                           f"'servers!server' scope); ask your admin to grant it: {HUB_SCOPE_HINT}")
        progress("stopping your server")
        status, body = self._call("DELETE", self._server_path())
        if status not in (202, 204):
            return Outcome("failed", f"the Hub refused to stop the server (HTTP {status}: {_hub_message(body)})")
        self._wait(lambda m: m is None or (not m.get("ready") and not m.get("pending")), "stop the server")
        progress(f"starting your server with {describe_share(cores, memory_units)}")
        options = {contract.HUB_OPTION_CORES: cores, contract.HUB_OPTION_MEMORY_UNITS: memory_units}
        status, body = self._call("POST", self._server_path(), options)
        if status not in (201, 202):
            return Outcome("failed", f"the Hub could not start the server with the new share "
                                     f"(HTTP {status}: {_hub_message(body)})")
        model = self._wait(lambda m: m is None or bool(m.get("ready")) or not m.get("pending"), "start the server")
        if not model or not model.get("ready"):
            return Outcome("failed", "the Hub could not start the server with the new share; "
                                     "see the Hub's spawn log for the scheduler's reason")
        where = (model.get("state") or {}).get("pod_name") or model.get("url", "")
        return Outcome("scheduled", f"your server restarted with {describe_share(cores, memory_units)} ({where})")


def _hub_message(body: Any) -> str:
    if isinstance(body, dict):
        return str(body.get("message") or body)
    return str(body)[:200] if body else "no details"
