"""What the enforcement backends leave on the host: directories, their modes, mounts and device nodes.

Everything runs against a temp host root: the HAMi root, the lock directory, the MPS directories
and /dev are all configurable. Where a mode matters for a non-root notebook, a real process with
uid 1000 tries what libvgpu.so does (this test process is root, so it can drop to that uid).
"""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest
from deviceplugin_support import all_ids, make_node, place_pod, sim_gpus, wait_registered
from simkube.waiting import wait_for
from vgpu_plugin.deviceplugin import api_pb2
from vgpu_plugin.deviceplugin.checkpoint import PodDeviceEntry, write_checkpoint
from vgpu_plugin.deviceplugin.daemon import DaemonConfig, NodeDaemon
from vgpu_plugin.deviceplugin.enforcement import (
    EnforcementConfig,
    Identity,
    container_response,
    hami_cache_dir,
    mount_sources,
    remove_stale_hami_dirs,
)

from jupyter_vgpu.core import contract as c
from jupyter_vgpu.core.contract import CardShare, ContainerAllocation, Request

NOTEBOOK_UID = 1000
root_only = pytest.mark.skipif(os.geteuid() != 0, reason="dropping to a notebook's uid needs root")


def _share(cores: int = 25, units: int = 16, index: int = 0) -> ContainerAllocation:
    card = sim_gpus().inventory()[index]
    return ContainerAllocation(index=0, name="notebook",
                               cards=(CardShare(index=index, uuid=card.uuid, cores=cores, memory_units=units),))


def _answer(config: EnforcementConfig, allocation_id: str = "alloc-1") -> api_pb2.ContainerAllocateResponse:
    cards = {card.index: card for card in sim_gpus().inventory()}
    identity = Identity(node="n1", namespace="ns", pod="nb", pod_uid="uid-1", container="notebook",
                        container_index=0, allocation_id=allocation_id)
    return container_response(config, _share(), cards, identity, metrics_url="http://x", token="t")


def _as_notebook(script: str) -> subprocess.CompletedProcess:
    """Run a shell script as uid/gid 1000 with a notebook's usual umask."""
    def drop() -> None:
        os.setgroups([])
        os.setgid(NOTEBOOK_UID)
        os.setuid(NOTEBOOK_UID)
        os.umask(0o022)

    return subprocess.run(["/bin/sh", "-c", script], preexec_fn=drop, capture_output=True, text=True, timeout=30)


@pytest.fixture
def host():
    """A temp host root any uid can traverse (pytest's own temp dir is 0700); the daemon's umask is
    the usual 022, which is what cut mkdir's 0777 to 0755."""
    previous = os.umask(0o022)
    root = Path(tempfile.mkdtemp(prefix="vgpu-host-"))
    os.chmod(root, 0o755)
    (root / "usr/local/vgpu").mkdir(parents=True)
    (root / "tmp").mkdir()
    os.chmod(root / "tmp", 0o1777)
    try:
        yield root
    finally:
        os.umask(previous)
        shutil.rmtree(root, ignore_errors=True)


def _hami(host) -> EnforcementConfig:
    return EnforcementConfig(mode="hami-core", hami_root=str(host / "usr/local/vgpu"),
                             hami_lock_dir=str(host / "tmp/vgpulock"))


def test_hami_cache_dir_is_writable_by_any_uid_despite_the_umask(host):
    config = _hami(host)
    answer = _answer(config)
    cache = host / "usr/local/vgpu/containers/alloc-1"
    mounts = {m.container_path: m for m in answer.mounts}
    assert mounts["/usr/local/vgpu/cache"].host_path == str(cache) and not mounts["/usr/local/vgpu/cache"].read_only
    assert stat.S_IMODE(cache.stat().st_mode) == 0o777


@root_only
def test_a_uid_1000_notebook_can_create_hamis_cache_and_lock_files(host):
    config = _hami(host)
    _answer(config)
    cache = host / "usr/local/vgpu/containers/alloc-1"
    lock = host / "tmp/vgpulock"
    # what libvgpu.so does on its first CUDA call: create its shared region and take the node lock
    done = _as_notebook(f"echo x > {cache / 'vgpu.cache'} && echo x > {lock / 'lock'}")
    assert done.returncode == 0, done.stderr
    assert (cache / "vgpu.cache").stat().st_uid == NOTEBOOK_UID


def test_the_lock_dir_is_one_per_node_owned_by_the_daemon_and_sticky(host):
    config = _hami(host)
    first, second = _answer(config, "alloc-1"), _answer(config, "alloc-2")
    lock = host / "tmp/vgpulock"
    for answer in (first, second):  # HAMi-core serialises host-PID discovery through one node-wide lock
        mounts = {m.container_path: m for m in answer.mounts}
        assert mounts["/tmp/vgpulock"].host_path == str(lock)
    info = lock.stat()
    assert stat.S_IMODE(info.st_mode) == 0o1777 and info.st_uid == os.geteuid()


@root_only
def test_a_tenant_cannot_remove_another_tenants_lock_file(host):
    config = _hami(host)
    _answer(config)
    lock = host / "tmp/vgpulock"
    (lock / "lock").write_text("")  # created by another tenant (here root)
    done = _as_notebook(f"rm -f {lock / 'lock'}")
    assert done.returncode != 0 and "Operation not permitted" in done.stderr
    assert (lock / "lock").exists()


def test_a_planted_symlink_lock_dir_is_not_opened_up(host, tmp_path, caplog):
    target = tmp_path / "elsewhere"
    target.mkdir(mode=0o700)
    (host / "tmp/vgpulock").symlink_to(target)
    _answer(_hami(host))
    assert stat.S_IMODE(target.stat().st_mode) == 0o700, "chmod must not follow a symlink"
    assert "cannot prepare HAMi-core directories" in caplog.text


@root_only
def test_a_lock_dir_owned_by_a_tenant_is_refused(host, caplog):
    lock = host / "tmp/vgpulock"
    lock.mkdir()
    os.chown(lock, NOTEBOOK_UID, NOTEBOOK_UID)
    os.chmod(lock, 0o700)
    _answer(_hami(host))
    assert stat.S_IMODE(lock.stat().st_mode) == 0o700
    assert "owned by uid 1000" in caplog.text


def test_mps_clients_get_the_daemons_shm_as_dev_shm_and_a_read_only_pipe_dir(host):
    config = EnforcementConfig(mode="mps", mps_pipe_dir=str(host / "run/nvidia-mps/pipe"),
                               mps_shm_dir=str(host / "run/nvidia-mps/shm"))
    answer = _answer(config)
    mounts = {m.container_path: (m.host_path, m.read_only) for m in answer.mounts}
    assert mounts == {
        "/tmp/nvidia-mps": (str(host / "run/nvidia-mps/pipe"), True),
        "/dev/shm": (str(host / "run/nvidia-mps/shm"), False),
    }
    assert answer.envs[c.ENV_MPS_PIPE_DIRECTORY] == "/tmp/nvidia-mps"
    assert answer.envs[c.ENV_MPS_ACTIVE_THREAD_PERCENTAGE] == "25"


@pytest.mark.parametrize(("present", "expected"), [
    (["nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia0"],
     ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia0"]),
    (["nvidiactl", "nvidia-uvm", "nvidia0"], ["/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia0"]),
])
def test_device_specs_pass_the_optional_uvm_tools_node_only_where_the_host_has_it(tmp_path, present, expected):
    dev = tmp_path / "dev"
    dev.mkdir()
    for name in present:
        (dev / name).write_text("")
    answer = _answer(EnforcementConfig(mode="none", device_specs=True, dev_root=str(dev)))
    assert [d.container_path for d in answer.devices] == expected
    assert [d.host_path for d in answer.devices] == expected, "kubelet needs the host's path, not ours"


# --- removing the cache directories of containers that are gone ----------------------------------------


def _old(path, seconds: float = 3600) -> None:
    info = os.stat(path)
    os.utime(path, (info.st_atime - seconds, info.st_mtime - seconds))


def test_stale_cache_dirs_go_live_and_young_ones_stay(host):
    config = _hami(host)
    live_answer = _answer(config, "live")
    for name in ("live", "gone", "young"):
        hami_cache = hami_cache_dir(config, Identity("n", "ns", "p", "u", "c", 0, name))
        os.makedirs(hami_cache, exist_ok=True)
        (host / "usr/local/vgpu/containers" / name / "vgpu.cache").write_text("x")
        if name != "young":
            _old(hami_cache)
    live = mount_sources([live_answer.SerializeToString(), b"", b"\xff\xff garbage"])
    now = os.stat(host / "usr/local/vgpu/containers/young").st_mtime + 1
    removed = remove_stale_hami_dirs(config, live, min_age=300, now=now)
    assert removed == ["gone"]
    assert sorted(os.listdir(host / "usr/local/vgpu/containers")) == ["live", "young"]


def _daemon(host, tmp_path) -> NodeDaemon:
    plugin_dir = tmp_path / "plugins"
    plugin_dir.mkdir()
    config = DaemonConfig(node="n1", plugin_dir=str(plugin_dir), enforcement=_hami(host), hami_gc_min_age=0)
    return NodeDaemon(config, sim_gpus(), api_client=None)


def test_nothing_is_removed_without_a_readable_checkpoint(host, tmp_path):
    daemon = _daemon(host, tmp_path)
    stale = host / "usr/local/vgpu/containers/a"
    stale.mkdir(parents=True)
    assert daemon.collect_hami_dirs() == [] and stale.exists(), "no checkpoint: kubelet may not be up yet"
    with open(daemon.checkpoint_path, "w") as handle:
        handle.write("{garbled")
    assert daemon.collect_hami_dirs() == [] and stale.exists()
    write_checkpoint(daemon.checkpoint_path, [], {})
    assert daemon.collect_hami_dirs() == ["a"] and not stale.exists()


def test_the_daemon_removes_a_gone_containers_cache_dir_on_its_loop(daemons, peer, core_v1, tmp_path):
    make_node(core_v1)
    gpus = sim_gpus()
    daemon = daemons(gpus, hami_gc_period=0.05, hami_gc_min_age=0)
    wait_registered(peer)
    place_pod(core_v1, gpus, "nb", [(Request(25, 16), (2,))])
    ids, answer = peer.admit(c.DEFAULT_NAMES.core_resource, 25, all_ids("core"))
    cache = next(m.host_path for m in answer.mounts if m.container_path == "/usr/local/vgpu/cache")
    assert os.path.isdir(cache)
    checkpoint = daemon.checkpoint_path
    entry = PodDeviceEntry("uid-nb", "c0", c.DEFAULT_NAMES.core_resource, tuple(ids), answer.SerializeToString())
    write_checkpoint(checkpoint, [entry], {})
    daemon.collect_hami_dirs()
    assert os.path.isdir(cache), "the container is still in kubelet's checkpoint"
    write_checkpoint(checkpoint, [], {})  # kubelet dropped the pod
    wait_for(lambda: not os.path.exists(cache), timeout=20, what="the gone container's cache dir removed")


def test_a_mig_card_advertises_only_its_slices_and_no_health_event_makes_it_shareable():
    from vgpu_plugin.deviceplugin.devices import CORE, MEMORY, device_list
    from vgpu_plugin.deviceplugin.state import CardsState

    gpus = sim_gpus()
    gpus.set_mig_mode(1, current=True)      # MIG mode, no instances yet: nothing to hand out
    state = CardsState(gpus.inventory())
    health = {d.ID.split("-")[0]: d.health for d in device_list(CORE, state.cards())}
    assert health == {"gpu0": "Healthy", "gpu2": "Healthy", "gpu3": "Healthy"}
    assert state.set_health(1, True, "card restored") is False
    assert not state.by_index()[1].healthy
    # the admin creates 3 x 2g.10gb + 1g.5gb: the card advertises what the slices hold together
    gpus.set_mig_layout(1, ["2g.10gb", "2g.10gb", "2g.10gb", "1g.5gb"])
    assert state.refresh_mig(gpus.inventory()) is True
    assert state.refresh_mig(gpus.inventory()) is False
    cores = [d for d in device_list(CORE, state.cards()) if d.ID.startswith("gpu1-")]
    memory = [d for d in device_list(MEMORY, state.cards()) if d.ID.startswith("gpu1-")]
    assert len(cores) == 3 * 28 + 14 and len(memory) == 3 * 40 + 20
    assert {d.health for d in cores} == {"Healthy"}
    assert not state.by_index()[1].healthy   # never a whole card nor time-shared
    for made in state.by_index()[1].slices:
        gpus.fail_slice(made.uuid)
    state.refresh_mig(gpus.inventory())
    assert [d for d in device_list(CORE, state.cards()) if d.ID.startswith("gpu1-")] == []


def test_where_minor_and_index_differ_dev_nodes_use_the_minor_and_the_rest_the_index(tmp_path, caplog):
    from dataclasses import replace

    from vgpu_plugin.deviceplugin.devices import minor_mismatches

    cards = {card.index: card for card in sim_gpus().inventory()}
    cards[0] = replace(cards[0], minor=5)  # e.g. a card probed late by the driver
    identity = Identity(node="n1", namespace="ns", pod="nb", pod_uid="u", container="c", container_index=0)
    answer = container_response(EnforcementConfig(mode="none", device_specs=True, dev_root=str(tmp_path)), _share(),
                                cards, identity, metrics_url="http://x", token="t")
    assert [d.container_path for d in answer.devices][-1] == "/dev/nvidia5"
    assert answer.envs[c.ENV_DEVICE_INDICES] == "0" and answer.envs[c.ENV_NVIDIA_VISIBLE_DEVICES] == cards[0].uuid
    assert minor_mismatches(list(cards.values())) == ["index 0 = /dev/nvidia5"]


def test_the_daemon_logs_a_mig_card_and_advertises_nothing_on_it_without_slices(daemons, peer, core_v1, caplog):
    make_node(core_v1)
    gpus = sim_gpus()
    gpus.set_mig_mode(3, current=True)
    with caplog.at_level("WARNING"):
        daemons(gpus)
        wait_registered(peer)
    assert "card 3" in caplog.text and "MIG mode is enabled" in caplog.text
    health = {d.ID.split("-")[0]: d.health for d in peer.list_devices(c.DEFAULT_NAMES.core_resource)}
    assert "gpu3" not in health and health["gpu0"] == "Healthy"


def test_the_device_plugins_xla_fraction_and_the_kernels_torch_fraction_are_one_rounding():
    """4 GiB of a 24 GiB P40 is 0.1666…: the env the device plugin writes for JAX and the fraction the
    kernel's guard rails give PyTorch are the same number, floored (never above the share)."""
    from jupyter_vgpu.guards import GuardRails

    gpus = sim_gpus("p40-7gpu-pix-phb.txt", memory_mib=24576)
    cards = {card.index: card for card in gpus.inventory()}
    share = ContainerAllocation(index=0, name="notebook", cards=(CardShare(0, cards[0].uuid, 25, 16),))
    identity = Identity(node="n1", namespace="ns", pod="nb", pod_uid="uid-1", container="notebook",
                        container_index=0)
    envs = dict(container_response(EnforcementConfig(mode="none"), share, cards, identity, metrics_url="http://x",
                                   token="t").envs)
    assert envs[c.ENV_XLA_MEM_FRACTION] == "0.166"
    allocation = {"cores": 25, "memoryMib": 4096, "cards": [
        {"index": 0, "uuid": cards[0].uuid, "cores": 25, "memoryMib": 4096, "memoryTotalMib": 24576}]}
    rails = GuardRails(allocation, environ=dict(envs), modules={})
    rails.apply()
    assert rails.share is not None and rails.share.fraction == float(envs[c.ENV_XLA_MEM_FRACTION])
    text = rails.status_text()
    assert "XLA_PYTHON_CLIENT_MEM_FRACTION=0.166" in text and "set_per_process_memory_fraction(0.166)" in text
    for memory_mib, card_mib in ((4096, 24576), (10240, 40960), (2560, 15360), (7936, 81920), (81920, 81920)):
        fraction = c.memory_fraction(memory_mib, card_mib)
        assert fraction * card_mib <= memory_mib and memory_mib / card_mib - fraction < 0.001
