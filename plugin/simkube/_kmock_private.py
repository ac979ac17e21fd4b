"""Every use of kmock beyond its public API (``kmock.__all__``), in one place, behind public names.

kmock's public API (the scaffold, the reaction DSL, ``Request``, ``Payload``) covers the
simulated API server except for these, which kmock 0.8 has only under private names or
outside ``__all__`` (pyproject.toml pins kmock to the minor release tested here):

- the discovery handlers the scaffold registers itself (``_serve_api``, ``_serve_apis``,
  ``_serve_version``, ``_serve_server_version``): overriding them by name is the only way to
  change what kmock answers on ``/api``, ``/api/v1``, ``/apis/<group>/<version>`` and
  ``/version`` (its documents are not the ones kubectl expects);
- the reaction dispatcher (``_handle``), the request log (``_requests``) and the reactions
  (``_payloads``): API requests skip reaction matching while a test has added no reaction
  (kmock rescans its whole request log per reaction), the log is bounded for long-running
  demos, and a request kmock's path parser cannot parse is logged and served by hand
  (``Request``'s private ``raw_request`` field);
- ``Response`` (status, headers and a payload, streams included): kmock/__init__ imports it
  but leaves it out of ``__all__``.

``missing()`` lists what a kmock upgrade has moved; importing this module fails with that
list, so an upgrade breaks loudly here rather than quietly serving kmock's own answers.
"""

from __future__ import annotations

import importlib.metadata

import aiohttp.web
import attrs
import kmock
from kmock import KubernetesScaffold, Payload, Request

# isort: split
# imported by kmock/__init__ but left out of its __all__
from kmock import Response  # type: ignore[attr-defined]

__all__ = ["Response", "ScaffoldHooks", "TESTED_WITH", "explain", "missing"]

TESTED_WITH = "0.8"
_UNEXPORTED = ("Response",)
_METHODS = ("_handle", "_serve_api", "_serve_apis", "_serve_version", "_serve_server_version")
_FIELDS = ("_requests", "_payloads")
_REQUEST_FIELDS = ("id", "_raw_request", "url", "method", "params", "headers", "body", "text")


def missing(scaffold: type = KubernetesScaffold, request: type = Request, package: object = kmock) -> list[str]:
    """The private members this module relies on that ``scaffold`` / ``request`` / ``package`` no longer have."""
    gone = [f"kmock.{name}" for name in _UNEXPORTED if not isinstance(getattr(package, name, None), type)]
    gone += [f"{scaffold.__name__}.{name}()" for name in _METHODS if not callable(getattr(scaffold, name, None))]
    fields = {field.name for field in attrs.fields(scaffold)} if attrs.has(scaffold) else set()
    gone += [f"{scaffold.__name__}.{name}" for name in _FIELDS if name not in fields]
    request_fields = {field.name for field in attrs.fields(request)} if attrs.has(request) else set()
    gone += [f"{request.__name__}.{name}" for name in _REQUEST_FIELDS if name not in request_fields]
    return gone


def explain(gone: list[str]) -> str:
    return (f"kmock {importlib.metadata.version('kmock')} no longer has {', '.join(gone)}; simkube's "
            f"simulated API server was written against kmock {TESTED_WITH} and reaches these members "
            f"only in simkube/_kmock_private.py: adapt that module to the new release (or install "
            f"kmock=={TESTED_WITH}.*)")


_GONE = missing()
if _GONE:
    raise ImportError(explain(_GONE))


@attrs.define(kw_only=True)
class ScaffoldHooks(KubernetesScaffold):
    """kmock's Kubernetes scaffold with public hooks in place of its private members.

    Subclasses override ``serve_*`` to answer discovery, ``handle`` to serve a parsed
    request (``react`` is kmock's reaction matching), and call ``serve_unparsed`` for a
    request kmock cannot parse.
    """

    # -- discovery: kmock registers these bound methods on its own paths -------------------

    async def _serve_api(self, request: Request) -> Payload:
        return await self.serve_api_versions(request)

    async def _serve_apis(self, request: Request) -> Payload:
        return await self.serve_api_groups(request)

    async def _serve_version(self, request: Request) -> Payload:
        return await self.serve_resource_list(request)

    async def _serve_server_version(self, request: Request) -> Payload:
        return await self.serve_server_version(request)

    async def serve_api_versions(self, request: Request) -> Payload:
        """``/api``: the core group's versions."""
        return await super()._serve_api(request)

    async def serve_api_groups(self, request: Request) -> Payload:
        """``/apis``: the API groups and their versions."""
        return await super()._serve_apis(request)

    async def serve_resource_list(self, request: Request) -> Payload:
        """``/api/<version>`` and ``/apis/<group>/<version>``: the resources served there."""
        return await super()._serve_version(request)

    async def serve_server_version(self, request: Request) -> Payload:
        """``/version``."""
        return await super()._serve_server_version(request)

    # -- requests ------------------------------------------------------------------------

    async def _handle(self, request: Request) -> aiohttp.web.StreamResponse:
        return await self.handle(request)

    async def handle(self, request: Request) -> aiohttp.web.StreamResponse:
        """Serve a parsed, logged request; by default through kmock's reactions."""
        return await self.react(request)

    async def react(self, request: Request) -> aiohttp.web.StreamResponse:
        """kmock's reaction matching: the reactions tests added, then the fallbacks."""
        response: aiohttp.web.StreamResponse = await super()._handle(request)
        return response

    @property
    def reaction_count(self) -> int:
        """How many reactions are registered (kmock's fallbacks included)."""
        return len(self._payloads)

    def trim_request_log(self, limit: int) -> None:
        """Keep the most recent ``limit // 2`` requests once the log holds more than ``limit``."""
        if len(self._requests) > limit:
            del self._requests[: len(self._requests) - limit // 2]

    async def serve_unparsed(self, raw_request: aiohttp.web.BaseRequest) -> aiohttp.web.StreamResponse:
        """Log and serve a request without kmock's parser (for paths it cannot parse)."""
        body = await raw_request.read()
        request = Request(
            id=len(self._requests), raw_request=raw_request, url=raw_request.url, method=raw_request.method,
            params=dict(raw_request.query), headers=dict(raw_request.headers), body=body,
            text=body.decode("utf-8", "replace"))
        self._requests.append(request)
        return await self.handle(request)

