"""With allow_unauthenticated_access=False, no vgpu endpoint may answer without credentials.

The routes are not listed by hand: every handler the server registered under
``{base_url}vgpu/`` is found in the tornado router and probed, so a route added later
without authentication fails this test.
"""

from __future__ import annotations

import re

import pytest
import tornado.httpclient
import tornado.websocket


@pytest.fixture
def jp_server_config():
    from traitlets.config import Config

    return Config({
        "ServerApp": {"jpserver_extensions": {"jupyter_vgpu": True}, "allow_unauthenticated_access": False},
        "VGPUSettings": {"source": "none"},
    })


def vgpu_paths(web_app, base_url):
    paths = []
    for rule in web_app.wildcard_router.rules + web_app.default_router.rules:
        rules = getattr(rule.target, "rules", [rule])  # host-matched rule groups
        for inner in rules:
            regex = getattr(inner.matcher, "regex", None)
            if regex is None or f"{base_url}vgpu/" not in regex.pattern:
                continue
            # (tornado's reverse() cannot format a base URL with '%' in it)
            path = re.sub(r"\([^)]*\)", "r1-x", regex.pattern).replace("/?", "").strip("^$")
            paths.append((path, inner.target))
    return paths


def test_every_vgpu_endpoint_requires_authentication(run, jp_fetch, jp_serverapp, jp_base_url, jp_http_port,
                                                     jp_auth_header):
    assert jp_serverapp.allow_unauthenticated_access is False
    paths = vgpu_paths(jp_serverapp.web_app, jp_base_url)
    assert len(paths) >= 6, paths  # allocation, topology, usage, usage/stream, requests, requests/<id>
    origin = f"http://127.0.0.1:{jp_http_port}"

    async def probe(path, method, headers):
        body = b'{"cores": 25, "memory": "4GiB"}' if method == "POST" else None
        return await tornado.httpclient.AsyncHTTPClient().fetch(
            origin + path, method=method, body=body, headers=headers, raise_error=False)

    async def ws(path, headers):
        request = tornado.httpclient.HTTPRequest(f"ws://127.0.0.1:{jp_http_port}{path}", headers=headers)
        try:
            connection = await tornado.websocket.websocket_connect(request)
        except tornado.httpclient.HTTPClientError as error:
            if error.code == 302:  # strict mode sends a browser to the login page instead
                assert "/login" in error.response.headers["Location"]
                return 403
            return error.code
        connection.close()
        return 101

    for path, handler in paths:
        if issubclass(handler, tornado.websocket.WebSocketHandler):
            assert run(ws(path, {})) == 403, path
            assert run(ws(path, dict(jp_auth_header))) == 101, path  # the probe itself can tell
            continue
        for method in ("GET", "POST", "DELETE"):
            response = run(probe(path, method, {}))
            assert response.code in (401, 403, 405), (path, method, response.code)
            assert response.code != 405 or method not in ("GET",), (path, method)
        authed = run(probe(path, "GET", dict(jp_auth_header)))
        assert authed.code not in (401, 403), (path, authed.code)


class TestAuthorisation:
    """The routes ask jupyter-server's Authorizer about resource 'vgpu': read for views, write for requests."""

    @pytest.fixture
    def jp_server_config(self):
        from jupyter_server.auth.authorizer import Authorizer
        from traitlets.config import Config

        class ViewOnly(Authorizer):
            asked: list = []

            def is_authorized(self, handler, user, action, resource):
                ViewOnly.asked.append((action, resource))
                return not (resource == "vgpu" and action == "write")

        self.authorizer = ViewOnly
        return Config({"ServerApp": {"jpserver_extensions": {"jupyter_vgpu": True}, "authorizer_class": ViewOnly},
                       "VGPUSettings": {"source": "none"}})

    def test_views_need_read_and_requests_need_write(self, run, jp_fetch, jp_ws_fetch):
        for route in ("allocation", "topology", "usage"):
            assert run(jp_fetch("vgpu", "api", route)).code == 200
        run(jp_ws_fetch("vgpu", "api", "usage", "stream")).close()
        refused = run(jp_fetch("vgpu", "api", "requests", method="POST", body='{"cores": 25, "memory": 16}',
                               raise_error=False))
        assert refused.code == 403
        # where a request waits is a view; switching it is a request
        assert run(jp_fetch("vgpu", "api", "requests", "r1-x", "waiting")).code == 204
        switch = run(jp_fetch("vgpu", "api", "requests", "r1-x", "switch", method="POST",
                              body='{"cores": 10, "memory": 16}', raise_error=False))
        assert switch.code == 403
        asked = {a for a in self.authorizer.asked if a[1] == "vgpu"}
        assert asked == {("read", "vgpu"), ("write", "vgpu")}
