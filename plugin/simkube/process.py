"""The simulated API server in a process of its own (its own interpreter, so its own GIL).

``SimKubeAPI`` serves from a thread of the process that uses it. When that process also
runs hundreds of client threads (a whole simulated cluster), the server's event loop waits
for the same GIL as every client, and a benchmark measures that contention as much as the
code it is about. ``SimKubeAPIProcess`` runs the same server in a spawned child process and
offers what clients need: ``url``, ``token``, ``identity``, ``api_client()``,
``write_kubeconfig()``, and ``start``/``stop``/``restart`` (a restart keeps the objects and
the port, as ``SimKubeAPI.restart`` does). What needs the store itself (``call``,
``emulator``, ``compact``) exists only in-process.
"""

from __future__ import annotations

import os
from multiprocessing.connection import Connection
from typing import Any

from . import child
from .apiserver import SimKubeAPI
from .tls import ServerIdentity

__all__ = ["SimKubeAPIProcess"]


def _serve(conn: Connection, port: int, token: str, cert_pem: bytes, key_pem: bytes, options: dict[str, Any]) -> None:
    """The child: serve until told to stop (or the parent is gone), restarting on request."""
    api = SimKubeAPI(port=port, token=token, **options)
    api.identity = ServerIdentity(cert_pem, key_pem)  # the certificate the parent's clients trust
    try:
        api.start()
    except Exception as error:  # noqa: BLE001 - reported to the parent, which raises it
        conn.send(("failed", str(error)))
        return
    conn.send(("ready", api.port))
    try:
        for command in child.commands(conn):
            if command != "restart":
                break
            api.restart()
            conn.send(("ready", api.port))
    finally:
        api.stop()


class SimKubeAPIProcess:
    def __init__(self, *, port: int = 0, token: str | None = None, **options: Any) -> None:
        """``options``: SimKubeAPI's other keyword arguments (history, watch_timeout, bookmark_interval)."""
        self._client_side = SimKubeAPI(port=port, token=token)  # never started: url, token, certificate
        self._options = options
        self._process: Any = None
        self._conn: Connection | None = None

    @property
    def port(self) -> int:
        return self._client_side.port

    @property
    def token(self) -> str:
        return self._client_side.token

    @property
    def identity(self) -> ServerIdentity:
        return self._client_side.identity

    @property
    def url(self) -> str:
        return self._client_side.url

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.is_alive()

    def api_client(self) -> Any:
        return self._client_side.api_client()

    def write_kubeconfig(self, path: str | os.PathLike[str]) -> str:
        return self._client_side.write_kubeconfig(path)

    def start(self, timeout: float = 60.0) -> SimKubeAPIProcess:
        if self._process is not None:
            raise RuntimeError("the simulated API is already running")
        self._process, self._conn = child.spawn(
            _serve, (self.port, self.token, self.identity.cert_pem, self.identity.key_pem, self._options),
            "sim-kube-api")
        self._await_ready(timeout)
        return self

    def _await_ready(self, timeout: float) -> None:
        state, detail = ("failed", "it is not running") if self._conn is None else child.await_ready(self._conn, timeout)
        if state != "ready":
            self.stop()
            raise RuntimeError("the simulated API process did not start in time" if state == "timeout"
                               else f"the simulated API process failed to start: {detail}")
        self._client_side.port = int(detail)  # a restart serves the same port

    def stop(self, timeout: float = 10.0) -> None:
        process, conn = self._process, self._conn
        self._process, self._conn = None, None
        child.stop(process, conn, timeout)

    def restart(self, timeout: float = 60.0) -> None:
        """Stop serving and serve again: same objects, same port; watches must resume."""
        if self._conn is None:
            raise RuntimeError("the simulated API is not running")
        self._conn.send("restart")
        self._await_ready(timeout)

    def __enter__(self) -> SimKubeAPIProcess:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
