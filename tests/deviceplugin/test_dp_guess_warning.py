"""A vcuda-core Allocate that comes before the container's memory one is a guess among the waiting
containers asking for that many vcuda-core. When their answers would differ (another memory limit),
the daemon says so: a wrong guess swaps the two pods' limits, and only a scheduler that binds such
pods to a node one at a time (the vGPU extender does) prevents it. Real gRPC on a unix socket, pods
in the simulated API through the official client."""

from __future__ import annotations

from deviceplugin_support import CORE, MEMORY, all_ids, make_node, place_pod, wait_registered
from simkube.waiting import wait_for

from jupyter_vgpu.core.contract import Request

LOGGER = "vgpu_plugin.deviceplugin.allocate"


def two_waiting(daemons, peer, gpus, core_v1, small: Request, large: Request):
    make_node(core_v1)
    daemon = daemons(gpus)
    wait_registered(peer)
    place_pod(core_v1, gpus, "small", [(small, (0,))], predicate_time=1_000)
    place_pod(core_v1, gpus, "large", [(large, (1,))], predicate_time=2_000)
    wait_for(lambda: daemon.informer.get("default", "small") and daemon.informer.get("default", "large"), timeout=20)


def test_a_guess_between_other_memory_limits_is_a_warning(daemons, peer, gpus, core_v1, caplog):
    two_waiting(daemons, peer, gpus, core_v1, Request(10, 4), Request(10, 40))
    with caplog.at_level("WARNING", logger=LOGGER):
        peer.allocate(CORE, [f"gpu1-core-{n:02d}" for n in range(10)])  # kubelet admits "large", core first
    warned = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert len(warned) == 1
    assert "Allocate of 10 vcuda-core: guessing default/small" in warned[0]
    assert "default/large container 'c0' (10 vcuda-core, 40 vcuda-memory, card 1)" in warned[0]


def test_no_warning_when_memory_came_first_or_the_answers_are_alike(daemons, peer, gpus, core_v1, caplog):
    two_waiting(daemons, peer, gpus, core_v1, Request(10, 4), Request(10, 4))
    with caplog.at_level("WARNING", logger=LOGGER):
        peer.allocate(CORE, [f"gpu1-core-{n:02d}" for n in range(10)])  # alike: a guess, but harmless
    assert [r for r in caplog.records if r.name == LOGGER] == []


def test_no_warning_when_the_memory_count_told_them_apart(daemons, peer, gpus, core_v1, caplog):
    two_waiting(daemons, peer, gpus, core_v1, Request(10, 4), Request(10, 40))
    with caplog.at_level("WARNING", logger=LOGGER):
        peer.allocate(MEMORY, [i for i in all_ids("memory") if i.startswith("gpu1-")][:40])
        peer.allocate(CORE, [f"gpu1-core-{n:02d}" for n in range(10)])
    assert [r for r in caplog.records if r.name == LOGGER] == []
