"""Pieces a real JupyterHub loads in the Hub tests (imported by the Hub process, not by pytest).

The proxy is the Hub tests' ``null_proxy.MemoryProxy`` (tests/hub/hubfiles);
``RecordingSpawner`` serves a tiny HTTP endpoint inside the Hub's own event loop as the
"single-user server" and appends every spawn's ``user_options`` and API token to a
JSON-lines file, so the test can see exactly what a share request made the Hub start and
act with exactly the token a real server would hold.
"""

from __future__ import annotations

import json
import os

import tornado.httpserver
import tornado.netutil
import tornado.web
from jupyterhub.spawner import Spawner
from traitlets import Unicode


class _Alive(tornado.web.RequestHandler):
    def get(self, *args):
        self.finish({"ok": True})


class RecordingSpawner(Spawner):
    record_file = Unicode(os.environ.get("VGPU_TEST_SPAWN_LOG", ""), config=True)

    def __init__(self, **kwargs):
        super().__init__(**kwargs)
        self._http = None

    async def start(self):
        sockets = tornado.netutil.bind_sockets(0, "127.0.0.1")
        self._http = tornado.httpserver.HTTPServer(tornado.web.Application([(r"/.*", _Alive)]))
        self._http.add_sockets(sockets)
        if self.record_file:
            with open(self.record_file, "a") as handle:
                handle.write(json.dumps({"user": self.user.name, "user_options": self.user_options,
                                         "token": self.api_token}) + "\n")
        return ("127.0.0.1", sockets[0].getsockname()[1])

    async def poll(self):
        return None if self._http is not None else 0

    async def stop(self, now=False):
        if self._http is not None:
            self._http.stop()
            self._http = None

    def get_state(self):
        return super().get_state()
