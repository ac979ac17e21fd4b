"""A simulated single-user server for the Hub-path benchmark: it listens where the Hub
tells it (``JUPYTERHUB_SERVICE_URL``, as jupyterhub.singleuser reads it; else ``--ip``/``--port``) and
answers every request, which is all the Hub checks before it calls a server ready. The
real server's start-up (a Python interpreter importing jupyter_server, a few CPU-seconds
each) would make 100 spawns on a 2-core machine measure that start-up, not the path."""

from __future__ import annotations

import argparse
import http.server
import os
import sys
import urllib.parse


class Answer(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 - the http.server hook's name
        body = b'{"simulated": "notebook"}'
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_HEAD = do_GET

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the hook's signature
        pass


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--ip", default="0.0.0.0")
    parser.add_argument("--port", type=int)
    args, _ = parser.parse_known_args()  # the rest of what the Hub passes does not matter here
    service = urllib.parse.urlsplit(os.environ.get("JUPYTERHUB_SERVICE_URL", ""))
    address = (service.hostname or args.ip.strip("'\"")) or "0.0.0.0"
    port = service.port or args.port
    if not port:
        parser.error("no JUPYTERHUB_SERVICE_URL with a port, and no --port")
    http.server.ThreadingHTTPServer((address, port), Answer).serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
