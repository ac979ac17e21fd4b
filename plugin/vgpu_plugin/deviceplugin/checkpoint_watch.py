"""Wake the node daemon the moment kubelet rewrites its checkpoint (inotify on the checkpoint's directory).

A guessed Allocate answer is confirmed, and its pod marked ``gpu-assigned=true``, only once kubelet's
checkpoint says who holds it; polling the file every 0.2 s delays each confirmation by up to that much.
kubelet writes the checkpoint through its checkpoint manager's file store (pkg/kubelet/util/store,
filestore.go ``writeFile``): a temp file named ``.<random>`` in the same directory, written, synced,
closed, then renamed over ``kubelet_internal_checkpoint`` -- so the event that names the checkpoint
is IN_MOVED_TO; IN_CLOSE_WRITE / IN_CREATE cover a writer that writes it in place, IN_DELETE /
IN_MOVED_FROM its removal. The daemon's poll stays as the safety net, and is all there is when
inotify is unavailable (not Linux, ``inotify_simple`` missing, the watch limit reached) or the
directory is missing (the watch is tried again every ``retry_period`` until it exists).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

_READ_TIMEOUT_MS = 500  # a blocking read returns this often, so the thread ends soon after stop


class CheckpointWatch:
    """Call ``on_change`` whenever the file at ``path`` is replaced, written, created or removed,
    until ``stopping`` is set; ``run`` is the thread's target."""

    def __init__(self, path: str, on_change: Callable[[], None], stopping: threading.Event,
                 retry_period: float = 1.0) -> None:
        self.directory, self.name = os.path.split(os.path.abspath(path))
        self.on_change = on_change
        self.stopping = stopping
        self.retry_period = retry_period
        self.watching = threading.Event()  # set while the directory is watched
        self._said: str | None = None  # the last problem logged, so each is said once
        self._changed = 0  # the events about a file in the directory that change the checkpoint
        self._lost = 0  # the events that end the watch (set once inotify_simple is imported)

    def run(self) -> None:
        try:
            if not sys.platform.startswith("linux"):
                raise OSError(f"no inotify on {sys.platform}")
            import inotify_simple
        except (ImportError, OSError) as error:
            log.warning("not watching kubelet's checkpoint (%s); it is polled instead", error)
            return
        flags = inotify_simple.flags
        self._changed = flags.MOVED_TO | flags.CLOSE_WRITE | flags.CREATE | flags.DELETE | flags.MOVED_FROM
        # the directory itself removed or moved (the watch is gone or points elsewhere), or events lost
        self._lost = flags.DELETE_SELF | flags.MOVE_SELF | flags.IGNORED | flags.UNMOUNT | flags.Q_OVERFLOW
        while not self.stopping.is_set():
            inotify = self._open(inotify_simple)
            if inotify is None:
                self.stopping.wait(self.retry_period)
                continue
            try:
                self._follow(inotify)
            except OSError as error:  # reading the events failed: watch anew
                self._say(f"reading {self.directory}'s inotify events failed ({error})")
                self.stopping.wait(self.retry_period)
            finally:
                self.watching.clear()
                inotify.close()

    def _say(self, problem: str) -> None:
        if problem != self._said:
            log.warning("%s; kubelet's checkpoint is polled until it is watched again", problem)
            self._said = problem

    def _open(self, inotify_simple: Any) -> Any:
        """An inotify instance watching the directory; None (the problem logged once) when that fails."""
        inotify = None
        try:
            inotify = inotify_simple.INotify()
            inotify.add_watch(self.directory, self._changed | self._lost | inotify_simple.flags.ONLYDIR)
        except OSError as error:  # ENOENT: no directory yet; ENOSPC / EMFILE: the watch or instance limit
            if inotify is not None:
                inotify.close()
            self._say(f"cannot watch {self.directory} ({error.strerror or error})")
            return None
        if self._said is not None:
            log.info("watching %s for kubelet's checkpoint now", self.directory)
            self._said = None
        self.watching.set()
        self.on_change()  # anything written before the watch began is read at once too
        return inotify

    def _follow(self, inotify: Any) -> None:
        """Read events until stopped or the watch is lost (then the caller watches the directory anew)."""
        while not self.stopping.is_set():
            events = inotify.read(timeout=_READ_TIMEOUT_MS)
            if any(event.mask & self._changed and event.name == self.name for event in events):
                self.on_change()
            if any(event.mask & self._lost for event in events):
                self.on_change()
                return
