"""kubelet's checkpoint write confirms a guessed Allocate answer at once: the node daemon watches the
checkpoint's directory (inotify) instead of waiting for its next poll. The real daemon, a kubelet
peer over gRPC on unix sockets, pods in the simulated API through the official client; the poll is
made useless (60 s) so only the watch can confirm within the test's timeout. Last, the watch alone on
real files: it follows its directory when it is removed and made again."""

from __future__ import annotations

import logging
import os
import shutil
import sys
import threading

from deviceplugin_support import (
    CORE,
    MEMORY,
    NAMES,
    all_ids,
    annotations,
    confirmed_record,
    make_node,
    place_pod,
    wait_registered,
)
from simkube.waiting import wait_for
from vgpu_plugin.deviceplugin.checkpoint import PodDeviceEntry, write_checkpoint
from vgpu_plugin.deviceplugin.checkpoint_watch import CheckpointWatch

from jupyter_vgpu.core import contract as c
from jupyter_vgpu.core.contract import Request

POLL_NEVER = {"watch_period": 60.0, "reconcile_period": 60.0, "confirm_grace": 3600.0}
WATCH_LOGGER = "vgpu_plugin.deviceplugin.checkpoint_watch"


def admit_a_guess(daemon, peer, gpus, core_v1, checkpoint: str) -> None:
    """Two waiting pods ask for the same; kubelet admits one (the daemon's answer is a guess), then
    writes its checkpoint saying it was "b": the daemon's record must follow the checkpoint."""
    place_pod(core_v1, gpus, "a", [(Request(30, 12), (0,))], predicate_time=1_000)
    b = place_pod(core_v1, gpus, "b", [(Request(30, 12), (1,))], predicate_time=2_000)
    for name in ("a", "b"):
        wait_for(lambda name=name: (daemon.informer.get("default", name) or {}).get("spec", {}).get("nodeName"),
                 timeout=20, what=f"{name} in the daemon's cache")
    core_ids, core = peer.admit(CORE, 30, all_ids("core"))
    memory_ids, memory = peer.admit(MEMORY, 12, all_ids("memory"))
    assert c.ENV_POD_UID not in core.envs  # a guess: the answer names no pod
    assert annotations(core_v1, "a")[NAMES.gpu_assigned] == "false"
    assert annotations(core_v1, "b")[NAMES.gpu_assigned] == "false"
    # as kubelet's checkpoint manager writes it: a temp file in the directory renamed over the checkpoint
    write_checkpoint(checkpoint, [
        PodDeviceEntry(b["metadata"]["uid"], "c0", CORE, tuple(sorted(core_ids)), core.SerializeToString()),
        PodDeviceEntry(b["metadata"]["uid"], "c0", MEMORY, tuple(sorted(memory_ids)), memory.SerializeToString()),
    ], {CORE: all_ids("core"), MEMORY: all_ids("memory")})


def test_the_checkpoint_write_confirms_a_guessed_answer_at_once(daemons, peer, gpus, core_v1):
    make_node(core_v1)
    daemon = daemons(gpus, **POLL_NEVER)
    wait_registered(peer)
    assert daemon.wait_ready(10)
    assert daemon.checkpoint_watch.watching.wait(10)
    admit_a_guess(daemon, peer, gpus, core_v1, daemon.checkpoint_path)
    record = confirmed_record(core_v1, "b", timeout=10)  # the poll would take 60 s
    assert record.containers[0].allocation_id
    # the daemon guessed "a" (placed first, on card 0); the checkpoint says "b" holds that answer
    assert [(s.index, s.cores, s.memory_units) for s in record.containers[0].cards] == [(0, 30, 12)]
    assert annotations(core_v1, "a")[NAMES.gpu_assigned] == "false"


def test_a_checkpoint_directory_made_later_is_watched_once_it_exists(daemons, peer, gpus, core_v1, tmp_path,
                                                                    caplog):
    caplog.set_level(logging.INFO, logger=WATCH_LOGGER)
    later = tmp_path / "later"
    make_node(core_v1)
    daemon = daemons(gpus, checkpoint_path=str(later / "kubelet_internal_checkpoint"), **POLL_NEVER)
    wait_registered(peer)
    assert daemon.wait_ready(10)
    wait_for(lambda: any("cannot watch" in r.getMessage() for r in caplog.records), timeout=10,
             what="the missing directory said")
    os.mkdir(later)
    assert daemon.checkpoint_watch.watching.wait(10)
    admit_a_guess(daemon, peer, gpus, core_v1, daemon.checkpoint_path)
    assert confirmed_record(core_v1, "b", timeout=10).containers[0].allocation_id
    said = [r.getMessage() for r in caplog.records if r.name == WATCH_LOGGER]
    assert len([m for m in said if "cannot watch" in m]) == 1, said  # said once, though tried each second
    assert any("watching" in m and str(later) in m for m in said), said


def test_without_inotify_the_poll_still_confirms(daemons, peer, gpus, core_v1, monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "inotify_simple", None)  # the package is not installed: import fails
    caplog.set_level(logging.WARNING, logger=WATCH_LOGGER)
    make_node(core_v1)
    daemon = daemons(gpus, watch_period=0.1, reconcile_period=60.0, confirm_grace=3600.0)
    wait_registered(peer)
    assert daemon.wait_ready(10)
    wait_for(lambda: any("not watching kubelet's checkpoint" in r.getMessage() for r in caplog.records),
             timeout=10, what="inotify's absence said")
    assert not daemon.checkpoint_watch.watching.is_set()
    admit_a_guess(daemon, peer, gpus, core_v1, daemon.checkpoint_path)
    assert confirmed_record(core_v1, "b", timeout=10).containers[0].allocation_id
    assert len([r for r in caplog.records if r.name == WATCH_LOGGER]) == 1


def test_the_watch_follows_the_directory_when_it_is_removed_and_made_again(tmp_path):
    directory = tmp_path / "device-plugins"
    directory.mkdir()
    checkpoint = directory / "kubelet_internal_checkpoint"
    changes = threading.Semaphore(0)
    stopping = threading.Event()
    watch = CheckpointWatch(str(checkpoint), changes.release, stopping, retry_period=0.1)
    thread = threading.Thread(target=watch.run, daemon=True)
    thread.start()
    try:
        assert watch.watching.wait(10)
        assert changes.acquire(timeout=10)  # a look when the watch begins
        (directory / "kubelet.sock").write_bytes(b"")  # another file: not a change
        assert not changes.acquire(timeout=0.5)
        write_checkpoint(str(checkpoint), [], {})
        assert changes.acquire(timeout=10)
        shutil.rmtree(directory)
        wait_for(lambda: not watch.watching.is_set(), timeout=10, what="the watch lost")
        directory.mkdir()
        assert watch.watching.wait(10)
        while changes.acquire(timeout=0.5):  # the removal's and the new watch's
            pass
        write_checkpoint(str(checkpoint), [], {})
        assert changes.acquire(timeout=10)
    finally:
        stopping.set()
        thread.join(5)
    assert not thread.is_alive()
