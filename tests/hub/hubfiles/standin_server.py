"""Stand-in single-user server for Hub tests: answers HTTP on the port the Hub assigned and
records the API token the Hub issued to it (what a real server receives the same way)."""

import os
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlparse


class Handler(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 (http.server's naming)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(b"{}")

    def log_message(self, *args):
        pass


def main():
    url = urlparse(os.environ["JUPYTERHUB_SERVICE_URL"])
    record = Path(os.environ["STANDIN_RECORD_DIR"]) / f"{os.environ['JUPYTERHUB_USER']}.token"
    record.write_text(os.environ["JUPYTERHUB_API_TOKEN"])
    ThreadingHTTPServer((url.hostname, url.port), Handler).serve_forever()


if __name__ == "__main__":
    sys.exit(main())
