"""Share requests in flight: one at a time, in a background thread, every state kept.

The ``RequestTracker`` runs a ``Requester`` so neither the server's event loop nor a
kernel cell blocks, and keeps every request's state for the REST API and ``%vgpu``.
"""

from __future__ import annotations

import copy
import itertools
import threading
import time
import uuid
from dataclasses import asdict

from jupyter_vgpu.core.contract import RequestError
from jupyter_vgpu.requesters.base import Outcome, Requester, ShareRequest, Waiting, describe_share


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
        self.requester.request_id = request_id
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
        with self._lock:
            known = request_id in self._requests
        if not known:  # perhaps the request that (re)started this server, by the id it had before
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
        if self._recovered or self.requester is None:
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

    def _in_flight(self, request_id: str) -> ShareRequest | None:
        with self._lock:
            request = self._requests.get(request_id)
            return request if request is not None and request.state == "pending" and not request.handed_over else None

    def waiting(self, request_id: str) -> Waiting | None:
        """Where the pending request ``request_id`` stands in the scheduler's queue (None: not waiting there)."""
        if self._in_flight(request_id) is None or self.requester is None:
            return None
        return self.requester.waiting()

    def switch(self, request_id: str, cores: int, memory_units: int, timeout: float = 60.0) -> ShareRequest:
        """Withdraw the pending request and ask for (cores, memory_units) instead (already validated).
        RequestError when it is not pending here or the requester cannot withdraw it."""
        if self._in_flight(request_id) is None:
            raise RequestError(f"request {request_id} is not waiting here; ask for the share as a new request")
        if self.requester is None or not self.requester.withdraw():
            raise RequestError(f"request {request_id} cannot be withdrawn; wait for its outcome first")
        done = self._done[request_id]
        if not done.wait(timeout):
            raise RequestError(f"request {request_id} was not withdrawn within {timeout:.0f} s; try again")
        return self.submit(cores, memory_units)

    def wait(self, request_id: str, timeout: float | None = None) -> ShareRequest | None:
        done = self._done.get(request_id)
        if done is not None:
            done.wait(timeout)
        return self.get(request_id)
