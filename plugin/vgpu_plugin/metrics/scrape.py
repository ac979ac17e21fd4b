"""The scrape port: Prometheus ``/metrics`` and gpu-manager-compatible ``/metric``, behind a bearer token.

These pages name every tenant on the node (namespace, pod, container, card, usage, PIDs),
so they are not served on the hostPort the notebooks reach: they get their own port, not
exposed on the host, and every request must carry ``Authorization: Bearer <scrape token>``.
The token is the one Prometheus holds (a Secret its ServiceMonitor names), read from a file
that Kubernetes updates in place when the Secret changes; with no token configured every
scrape is refused, never answered openly.
"""

from __future__ import annotations

import hmac
import logging
import os
import threading

import tornado.web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest
from prometheus_client.registry import CollectorRegistry

log = logging.getLogger(__name__)

# a token shorter than this is a configuration mistake, not a secret
MIN_TOKEN_LENGTH = 16


class ScrapeAuth:
    """Checks a scrape's ``Authorization`` header against the configured token.

    ``token`` is a literal (tests, the simulated cluster); ``token_file`` a mounted Secret key,
    re-read whenever its modification time changes. ``required=False`` (the daemon's
    ``--metrics-require-token=false``, debugging only) lets every scrape through.
    Subclasses name another token in the refusals (the extender's queue token).
    """

    WHAT = "scrape token"
    NOT_CONFIGURED = "this node has no scrape token configured (--metrics-scrape-token-file)"
    HOW = "send 'Authorization: Bearer <scrape token>' (the Secret the ServiceMonitor names)"

    def __init__(self, token: str | None = None, token_file: str | None = None, *, required: bool = True) -> None:
        if token is not None and token_file:
            raise ValueError(f"give the {self.WHAT} or a file holding it, not both")
        if token is not None and len(token.strip()) < MIN_TOKEN_LENGTH:
            raise ValueError(f"the {self.WHAT} must be at least {MIN_TOKEN_LENGTH} characters")
        self.required = required
        self._literal = token.strip() if token is not None else None
        self._file = token_file or None
        self._lock = threading.Lock()
        self._file_stamp: tuple[float, int] | None = None
        self._file_token: str | None = None
        self._file_problem: str | None = None

    def describe(self) -> str:
        if not self.required:
            return "open (tokens turned off)"
        if self._literal is not None:
            return "bearer token"
        if self._file:
            return f"bearer token from {self._file}"
        return f"closed (no {self.WHAT} configured)"

    def _token(self) -> tuple[str | None, str | None]:
        """(token, why there is none)."""
        if self._literal is not None:
            return self._literal, None
        if not self._file:
            return None, self.NOT_CONFIGURED
        with self._lock:
            try:
                status = os.stat(self._file)
            except OSError as error:
                self._file_stamp, self._file_token = None, None
                self._file_problem = f"the {self.WHAT} file cannot be read ({error.strerror})"
                return None, self._file_problem
            stamp = (status.st_mtime, status.st_size)
            if stamp != self._file_stamp:
                self._file_stamp = stamp
                try:
                    with open(self._file, encoding="utf-8") as handle:
                        text = handle.read().strip()
                except (OSError, UnicodeDecodeError) as error:
                    text, self._file_problem = "", f"the {self.WHAT} file cannot be read ({error})"
                else:
                    self._file_problem = None
                if self._file_problem is None and len(text) < MIN_TOKEN_LENGTH:
                    self._file_problem = f"the {self.WHAT} file holds fewer than {MIN_TOKEN_LENGTH} characters"
                self._file_token = text if self._file_problem is None else None
                if self._file_problem:
                    log.warning("%s: every request for it is refused until it is fixed", self._file_problem)
            return self._file_token, self._file_problem

    def check(self, authorization: str | None) -> tuple[int, str] | None:
        """None when the scrape may proceed, else (HTTP status, reason)."""
        if not self.required:
            return None
        expected, problem = self._token()
        if expected is None:
            return 401, problem or f"no {self.WHAT}"
        scheme, _, value = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not value.strip():
            return 401, self.HOW
        if not hmac.compare_digest(value.strip().encode(), expected.encode()):
            return 403, f"the {self.WHAT} is not valid"
        return None


class PrometheusHandler(tornado.web.RequestHandler):
    def initialize(self, registry: CollectorRegistry, auth: ScrapeAuth) -> None:
        self.registry = registry
        self.auth = auth

    def prepare(self) -> None:
        refused = self.auth.check(self.request.headers.get("Authorization"))
        if refused is not None:
            status, reason = refused
            self.set_status(status)
            self.set_header("Content-Type", "text/plain; charset=utf-8")
            self.set_header("Cache-Control", "no-store")
            if status == 401:
                self.set_header("WWW-Authenticate", 'Bearer realm="vgpu-metrics"')
            self.finish(reason + "\n")

    def get(self) -> None:
        self.set_header("Content-Type", CONTENT_TYPE_LATEST)
        self.finish(generate_latest(self.registry))
