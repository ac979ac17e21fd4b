"""The reclaimer benchmark's peers, in their own process so their CPU is not the reclaimer's:
a Hub REST API answering ``GET /users?state=active`` (paginated, as JupyterHub 5+ does) with
N users each running one KubeSpawner server, and node scrape listeners answering
``GET /api/v1/pods`` with each node's pods and their usage history (the real shapes:
docs/internals.md). Canned answers: this measures the reclaimer, not the Hub or the nodes.

    python peers.py SERVERS NODES POINTS PORTFILE
"""

from __future__ import annotations

import json
import sys
import time

import tornado.ioloop
import tornado.web


def main() -> None:
    servers, nodes, points, portfile = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    users = [{"kind": "user", "name": f"user{i:05d}", "admin": False, "groups": ["students"] if i % 4 else [],
              "servers": {"": {"name": "", "ready": True, "pending": None, "user_options": {"profile": "vgpu-quarter"},
                               "state": {"pod_name": f"jupyter-user{i:05d}", "namespace": "hub"}}}}
             for i in range(servers)]

    class Users(tornado.web.RequestHandler):
        def get(self) -> None:
            offset, limit = int(self.get_argument("offset", "0")), int(self.get_argument("limit", "200"))
            items = users[offset:offset + limit]
            following = {"offset": offset + limit, "limit": limit} if offset + limit < len(users) else None
            self.finish(json.dumps({"items": items, "_pagination": {"offset": offset, "limit": limit,
                                                                     "total": len(users), "next": following}}))

    class Pods(tornado.web.RequestHandler):
        def get(self, node: str) -> None:
            now = time.time()
            index = int(node)
            pods = []
            for i in range(index, servers, nodes):
                busy = i % 3 == 0
                history = [[now - points + k, 4000.0 if busy else 0.0, 40.0 if busy else 0.0] for k in range(points)]
                pods.append({"namespace": "hub", "pod": f"jupyter-user{i:05d}", "uid": f"uid-{i}", "cores": 25,
                             "memoryMib": 20480, "history": history})
            self.finish(json.dumps({"node": f"node-{index}", "stale": False, "message": None, "now": now,
                                    "periodSeconds": 1.0, "historySeconds": 900.0, "pods": pods}))

    app = tornado.web.Application([(r"/hub/api/users", Users), (r"/node/(\d+)/api/v1/pods", Pods)])
    server = app.listen(0, "127.0.0.1")
    port = next(iter(server._sockets.values())).getsockname()[1]
    with open(portfile, "w") as handle:
        handle.write(str(port))
    tornado.ioloop.IOLoop.current().start()


if __name__ == "__main__":
    main()
