"""The demo notebook pod's entrypoint: wait for the lab's port, then become ``jupyter lab``.

    python -m vgpu_plugin.demo.notebook --port 8888 -- python -m jupyterlab --port=8888 ...

A share request re-creates the notebook pod make-before-break: the new pod runs while the
old one still holds the port the user's browser points at. The new pod's process waits
here until the old one has gone (the request retires it a few seconds after the new share
is served), so the lab comes back at the same URL with the same token, on the new share.

``--log FILE``: the lab's output goes to FILE (appended; each pod's lab starts with a line of its
own), a file that outlives the demo's work dir, rather than only to the kubelet's pod log.
"""

from __future__ import annotations

import argparse
import os
import socket
import sys
import time
from collections.abc import Sequence


def port_free(address: str, port: int) -> bool:
    with socket.socket() as sock:
        # as the server will bind it: connections of a previous server in TIME_WAIT do not count
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((address, port))
        except OSError:
            return False
    return True


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m vgpu_plugin.demo.notebook")
    parser.add_argument("--address", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--wait", type=float, default=300.0, help="seconds to wait for the port")
    parser.add_argument("--log", default="", help="append the lab's output (stdout and stderr) to this file")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- the command to run once the port is free")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("give the command to run after --")
    if args.log:
        _log_to(args.log)
    deadline = time.monotonic() + args.wait
    said = False
    while not port_free(args.address, args.port):
        if time.monotonic() > deadline:
            print(f"demo notebook: port {args.port} stayed busy for {args.wait:.0f} s; giving up", file=sys.stderr)
            return 1
        if not said:
            print(f"demo notebook: waiting for {args.address}:{args.port} (the previous notebook pod still "
                  "holds it)", file=sys.stderr, flush=True)
            said = True
        time.sleep(0.2)
    os.execvp(command[0], command)
    return 1  # not reached


def _log_to(path: str) -> None:
    """From here on, this process's and the lab's stdout and stderr go to ``path`` (appended)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    pod = os.environ.get("HOSTNAME", "?")
    os.write(fd, f"\n--- {time.strftime('%Y-%m-%d %H:%M:%S')} the lab of pod {pod} starts ---\n".encode())
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)


if __name__ == "__main__":
    sys.exit(main())
