"""The node daemon with the kubelet stand-in: admission, checkpoint, restarts, reconciliation."""

from __future__ import annotations

import json
import os
import sys
import threading
import urllib.error
import urllib.request

import grpc
import pytest
from deviceplugin_support import (
    CORE,
    MEMORY,
    NAMES,
    annotations,
    confirmed_record,
    place_pod,
    read_pod,
)
from simkube.waiting import wait_for
from vgpu_plugin.demo.kubelet import SimKubelet
from vgpu_plugin.deviceplugin.checkpoint import read_checkpoint

from jupyter_vgpu.core import claims
from jupyter_vgpu.core import contract as c
from jupyter_vgpu.core.contract import PodAllocation, Request


@pytest.fixture
def kubelets(kube, plugin_dir):
    started = []

    def make(**kwargs):
        kubelet = SimKubelet("node-1", plugin_dir, kube.api_client(), **kwargs).start()
        started.append(kubelet)
        return kubelet

    yield make
    for kubelet in started:
        kubelet.stop()


def running(core_v1, name):
    pod = read_pod(core_v1, name)
    return pod if (pod.get("status") or {}).get("phase") == "Running" else None


def record(core_v1, name):
    return confirmed_record(core_v1, name)


def start_pair(kubelets, daemons, gpus, *, drive_gpus=False, **kubelet_kwargs):
    kubelet = kubelets(gpus=gpus if drive_gpus else None, **kubelet_kwargs)
    daemon = daemons(gpus)
    assert daemon.wait_ready(15)
    kubelet.wait_for(lambda: kubelet.registered(CORE) and kubelet.registered(MEMORY), 15)
    return kubelet, daemon


def test_pods_run_with_their_allocation(kubelets, daemons, gpus, core_v1):
    kubelet, daemon = start_pair(kubelets, daemons, gpus)
    node = wait_for(lambda: (lambda n: n if (n.get("status") or {}).get("allocatable", {}).get(CORE) == "400" else None)(
        json.loads(core_v1.read_node("node-1", _preload_content=False).data)), timeout=20)
    assert node["status"]["capacity"][MEMORY] == "640" and node["status"]["allocatable"][MEMORY] == "640"
    place_pod(core_v1, gpus, "nb-1", [(Request(25, 16), (1,))])
    place_pod(core_v1, gpus, "nb-2", [(Request(50, 40), (1,))])
    for name in ("nb-1", "nb-2"):
        pod = wait_for(lambda name=name: running(core_v1, name), timeout=20, what=f"{name} running")
        status = pod["status"]
        assert status["podIP"].startswith("127.")
        container_id = status["containerStatuses"][0]["containerID"]
        assert container_id.startswith("containerd://") and len(container_id) == len("containerd://") + 64
        assert record(core_v1, name).containers[0].cards[0].index == 1
    env = kubelet.env("default", "nb-2", "c0")
    assert env[c.ENV_DEVICE_INDICES] == "1" and env[c.ENV_CORES] == "50" and env[c.ENV_POD_NAME] == "nb-2"
    entries = read_checkpoint(kubelet.checkpoint_path)
    assert {(e.resource, len(e.device_ids)) for e in entries} == {(CORE, 25), (MEMORY, 16), (CORE, 50), (MEMORY, 40)}
    assert all(d.startswith("gpu1-") for e in entries for d in e.device_ids)
    raw = json.load(open(kubelet.checkpoint_path))
    assert set(raw) == {"Data", "Checksum"} and set(raw["Data"]["PodDeviceEntries"][0]["DeviceIDs"]) == {"0"}
    assert daemon.allocator.usage() == {1: (75, 56)}


@pytest.mark.parametrize("order", ["reversed", "random"])
def test_either_resource_order_gives_the_same_answer(kubelets, daemons, gpus, core_v1, order):
    kubelet, _ = start_pair(kubelets, daemons, gpus, resource_order=order, seed=3)
    for i, card in enumerate((0, 2, 3)):
        place_pod(core_v1, gpus, f"nb-{i}", [(Request(20 + i, 8 + i), (card,)), (Request(10, 4), (card,))])
    for i, card in enumerate((0, 2, 3)):
        wait_for(lambda i=i: running(core_v1, f"nb-{i}"), timeout=20)
        for ctr in ("c0", "c1"):
            env = kubelet.env("default", f"nb-{i}", ctr)
            assert env[c.ENV_CONTAINER] == ctr and env[c.ENV_DEVICE_INDICES] == str(card)
            # c0's size is unique, so its answer names its pod; the c1s are alike: theirs may name none
            assert env.get(c.ENV_POD_NAME) == f"nb-{i}" if ctr == "c0" else env.get(c.ENV_POD_NAME) in (None, f"nb-{i}")


def test_refused_admission_fails_the_pod_as_kubelet_does(kubelets, daemons, gpus, core_v1):
    _, daemon = start_pair(kubelets, daemons, gpus)
    gpus.lose_card(2)
    wait_for(lambda: not daemon.cards.by_index()[2].healthy, timeout=20)
    place_pod(core_v1, gpus, "doomed", [(Request(100), (2,))])
    pod = wait_for(lambda: (lambda p: p if p["status"].get("phase") == "Failed" else None)(read_pod(core_v1, "doomed")), timeout=20)
    assert pod["status"]["reason"] == "UnexpectedAdmissionError"
    message = pod["status"]["message"]
    # kubelet still has 300 healthy core devices on the other cards, so it asks the plugin, which
    # refuses because the scheduler's card is unhealthy, and says why
    assert "Allocate failed" in message and "card 2 is unhealthy" in message


def test_plugin_killed_and_restarted_keeps_every_assignment(kubelets, daemons, gpus, core_v1):
    kubelet, daemon = start_pair(kubelets, daemons, gpus)
    for i in range(4):
        place_pod(core_v1, gpus, f"nb-{i}", [(Request(20, 8), (i % 4,))])
    for i in range(4):
        wait_for(lambda i=i: running(core_v1, f"nb-{i}"), timeout=20)
        record(core_v1, f"nb-{i}")
    before = {f"nb-{i}": annotations(core_v1, f"nb-{i}") for i in range(4)}
    envs = {f"nb-{i}": kubelet.env("default", f"nb-{i}", "c0") for i in range(4)}
    calls = len(kubelet.allocate_calls)
    daemon.stop()  # killed mid-stream: ListAndWatch ends, sockets go away
    kubelet.wait_for(lambda: not kubelet.registered(CORE), 15)
    restarted = daemons(gpus)
    assert restarted.wait_ready(15)
    kubelet.wait_for(lambda: kubelet.registered(CORE) and kubelet.registered(MEMORY), 15)
    assert restarted.allocator.usage() == daemon_usage(before)
    # a new pod is served on its own card, and nobody's allocation was given twice
    place_pod(core_v1, gpus, "after", [(Request(20, 8), (0,))])
    wait_for(lambda: running(core_v1, "after"), timeout=20)
    assert record(core_v1, "after").containers[0].cards[0].index == 0
    assert len(kubelet.allocate_calls) == calls + 2
    assert {f"nb-{i}": annotations(core_v1, f"nb-{i}") for i in range(4)} == before
    assert {f"nb-{i}": kubelet.env("default", f"nb-{i}", "c0") for i in range(4)} == envs
    assert restarted.allocator.usage()[0] == (40, 16)


def daemon_usage(before):
    usage = {}
    for anns in before.values():
        for ctr in PodAllocation.from_json(anns[NAMES.allocation]).containers:
            for share in ctr.cards:
                cores, units = usage.get(share.index, (0, 0))
                usage[share.index] = (cores + share.cores, units + share.memory_units)
    return usage


def stream_loop_threads():
    return [t.name for t in threading.enumerate() if t.name == "sim-kubelet-streams"]


def test_a_stopped_kubelet_leaves_no_stream_loop_and_the_next_one_streams_again(kubelets, daemons, gpus, core_v1):
    kubelet, daemon = start_pair(kubelets, daemons, gpus)
    assert stream_loop_threads() == ["sim-kubelet-streams"]  # ListAndWatch is consumed there, one for the process
    kubelet.stop()
    assert stream_loop_threads() == []
    again = kubelets()  # the plugin sees kubelet.sock come back and registers again: a fresh loop and grpc.aio
    again.wait_for(lambda: again.registered(CORE) and again.registered(MEMORY), 15)
    assert len(again.devices(CORE)) == 400
    node = core_v1.read_node("node-1")
    assert node.status.allocatable[CORE] == "400"
    place_pod(core_v1, gpus, "nb", [(Request(25, 16), (3,))])
    wait_for(lambda: running(core_v1, "nb"), timeout=20)
    assert daemon.allocator.usage() == {3: (25, 16)}


def connectivity(channel: grpc.Channel) -> grpc.ChannelConnectivity:
    """The state ``channel`` is in, read without making it connect."""
    states: list[grpc.ChannelConnectivity] = []
    note = states.append
    channel.subscribe(note, try_to_connect=False)  # the callback is told the current state at once
    try:
        return wait_for(lambda: states, timeout=5)[0]
    finally:
        channel.unsubscribe(note)


def test_the_allocate_connection_is_up_before_the_first_allocate(kubelets, daemons, gpus, core_v1):
    """As kubelet dials each plugin at registration (grpc.WithBlock) and uses that connection for every
    call, the stand-in's Allocate channel is connected once the plugin is registered, before any pod."""
    kubelet, daemon = start_pair(kubelets, daemons, gpus)
    for resource in (CORE, MEMORY):
        channel = kubelet._plugins[resource].channel
        assert channel is not None
        assert connectivity(channel) == grpc.ChannelConnectivity.READY
    assert kubelet.allocate_calls == []
    place_pod(core_v1, gpus, "nb", [(Request(25, 16), (3,))])
    wait_for(lambda: running(core_v1, "nb"), timeout=20)
    assert daemon.allocator.usage() == {3: (25, 16)}


def test_kubelet_restart_reregisters_and_keeps_pods(kubelets, daemons, gpus, core_v1):
    kubelet, daemon = start_pair(kubelets, daemons, gpus)
    place_pod(core_v1, gpus, "nb", [(Request(25, 16), (3,))])
    wait_for(lambda: running(core_v1, "nb"), timeout=20)
    kubelet.restart()
    kubelet.wait_for(lambda: kubelet.registered(CORE) and kubelet.registered(MEMORY), 15)
    wait_for(lambda: daemon.registrations == 2, timeout=20)
    assert len(kubelet.devices(CORE)) == 400
    in_use = kubelet.in_use(CORE)  # recovered from its checkpoint
    assert len(in_use) == 25 and all(d.startswith("gpu3-") for d in in_use)
    place_pod(core_v1, gpus, "nb-2", [(Request(25, 16), (3,))])
    wait_for(lambda: running(core_v1, "nb-2"), timeout=20)
    assert daemon.allocator.usage() == {3: (50, 32)}


def api_get(url, token):
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, error.read().decode()


def test_out_of_order_admission_is_reconciled_so_records_and_tokens_are_true(kubelets, daemons, gpus, core_v1,
                                                                           tmp_path):
    proc_root = tmp_path / "proc"
    kubelet, daemon = start_pair(kubelets, daemons, gpus, drive_gpus=True, proc_root=str(proc_root))
    daemon.stop()
    kubelet.wait_for(lambda: not kubelet.registered(CORE), 15)
    # both pods wait for the plugin; kubelet will admit "early" first (it was bound first), but
    # "late" has the older placement, so with identical requests the plugin answers early's
    # Allocate with late's placement. The checkpoint tells the truth afterwards.
    place_pod(core_v1, gpus, "early", [(Request(30, 10), (0,))], predicate_time=2_000)
    place_pod(core_v1, gpus, "late", [(Request(30, 10), (2,))], predicate_time=1_000)
    restarted = daemons(gpus, metrics={"address": "127.0.0.1", "port": 0, "proc_root": str(proc_root),
                                       "period": 0.1})
    assert restarted.wait_ready(15)
    uids = {name: read_pod(core_v1, name)["metadata"]["uid"] for name in ("early", "late")}
    envs = {}
    for name in ("early", "late"):
        wait_for(lambda name=name: running(core_v1, name), timeout=20, what=name)
        envs[name] = kubelet.env("default", name, "c0")
    assert envs["early"][c.ENV_DEVICE_INDICES] == "2", "the ambiguity did happen"
    other = {"early": "late", "late": "early"}
    # the plugin could not know which pod kubelet was admitting, so the answer names none
    assert c.ENV_POD_NAME not in envs["early"] and c.ENV_POD_UID not in envs["early"]
    for name, env in envs.items():  # and no env ever names the other pod
        assert other[name] not in env.values() and uids[other[name]] not in env.values(), env

    def own_answers():
        """Each token's answers, checked on every poll: never the other pod, only ever its own."""
        answers = {}
        for name, env in envs.items():
            status, body = api_get(restarted.metrics_server.url + "/api/v1/allocation", env[c.ENV_TOKEN])
            assert other[name] not in body and uids[other[name]] not in body, (name, body)
            if status != 200:
                assert status == 403, (status, body)  # not confirmed yet: nothing at all
                return None
            answers[name] = json.loads(body)
        return answers

    answers = wait_for(own_answers, timeout=30, interval=0.05, what="both tokens confirmed")
    for name, answer in answers.items():
        assert (answer["pod"], answer["podUid"], answer["namespace"]) == (name, uids[name], "default")
        assert [str(card["index"]) for card in answer["cards"]] == [envs[name][c.ENV_DEVICE_INDICES]]
        assert answer["cores"] == 30 and answer["memoryMib"] == 10 * 256

    def truthful():
        for name in ("early", "late"):
            got = envs[name][c.ENV_DEVICE_INDICES]
            anns = annotations(core_v1, name)
            rec = PodAllocation.from_json(anns[NAMES.allocation])
            if [str(s.index) for s in rec.containers[0].cards] != [got] or anns.get(NAMES.predicate_gpu_idx(0)) != got:
                return False
            if anns.get(NAMES.gpu_assigned) != "true":
                return False
        return True

    wait_for(truthful, timeout=20, what="annotations matching what each container got")
    assert restarted.allocator.usage() == {0: (30, 10), 2: (30, 10)}

    # usage and topology read the process in the container that holds the token, on the card it got
    def usage_of(name):
        status, body = api_get(restarted.metrics_server.url + "/api/v1/usage?history=60", envs[name][c.ENV_TOKEN])
        assert status == 200 and other[name] not in body and uids[other[name]] not in body, body
        usage = json.loads(body)
        current = usage["current"]
        return usage if current and current["cards"] and current["memoryUsedMib"] > 0 else None

    for name in ("early", "late"):
        usage = wait_for(lambda name=name: usage_of(name), timeout=30, interval=0.1, what=f"{name}'s GPU process sampled")
        assert usage["limits"] == {"cores": 30, "memoryMib": 2560}
        assert [str(card["index"]) for card in usage["current"]["cards"]] == [envs[name][c.ENV_DEVICE_INDICES]]
        status, body = api_get(restarted.metrics_server.url + "/api/v1/topology", envs[name][c.ENV_TOKEN])
        mine = [str(gpu["index"]) for gpu in json.loads(body)["gpus"] if gpu["mine"]]
        assert status == 200 and mine == [envs[name][c.ENV_DEVICE_INDICES]]
        assert other[name] not in body and uids[other[name]] not in body


@pytest.mark.parametrize("b_on", ["another slice", "a time-shared card"])
def test_identical_pods_admitted_out_of_order_leave_true_mig_slice_keys(kubelets, daemons, gpus, core_v1, tmp_path,
                                                                        b_on):
    """Every claim reader lets mig-slice-<i> win over the record, so after a swap the key must move with
    the record (or go, off MIG): else the extender sees the wrong slice freed when a pod ends, and the
    node refuses the next pod placed there."""
    made = gpus.set_mig_layout(1, ["2g.10gb", "2g.10gb", "2g.10gb", "1g.5gb"])
    card_uuid = {card.index: card.uuid for card in gpus.inventory()}
    kubelet, daemon = start_pair(kubelets, daemons, gpus)
    daemon.stop()
    kubelet.wait_for(lambda: not kubelet.registered(CORE), 15)
    # kubelet admits "b" first (bound first); "a" has the older placement, so b's Allocate is answered
    # with a's slice, and a gets b's placement. The checkpoint tells the truth afterwards.
    b_card, b_slice = (1, made[1].uuid) if b_on == "another slice" else (0, "")
    place_pod(core_v1, gpus, "b", [(Request(20, 16), (b_card,))], predicate_time=2_000,
              slices={0: b_slice} if b_slice else None)
    place_pod(core_v1, gpus, "a", [(Request(20, 16), (1,))], predicate_time=1_000, slices={0: made[0].uuid})
    restarted = daemons(gpus, metrics={"address": "127.0.0.1", "port": 0, "proc_root": str(tmp_path / "proc"),
                                       "period": 0.1})
    assert restarted.wait_ready(15)
    got = {"a": (b_card, b_slice), "b": (1, made[0].uuid)}  # (card, MIG slice or "")
    for name, (card, mig) in got.items():
        wait_for(lambda name=name: running(core_v1, name), timeout=20, what=name)
        env = kubelet.env("default", name, "c0")
        assert (env[c.ENV_DEVICE_INDICES], env[c.ENV_NVIDIA_VISIBLE_DEVICES]) == (str(card), mig or card_uuid[card])

    def recorded():
        for name, held in got.items():
            anns = annotations(core_v1, name)
            share = PodAllocation.from_json(anns[NAMES.allocation]).containers[0].cards[0]
            if anns.get(NAMES.gpu_assigned) != "true" or (share.index, share.mig_device) != held:
                return False
        return True

    wait_for(recorded, timeout=20, what="records naming what each container got")
    for name, (card, mig) in got.items():  # the keys moved in the same patch: the extender and metrics read them
        anns = annotations(core_v1, name)
        assert (anns.get(NAMES.predicate_gpu_idx(0)), anns.get(NAMES.mig_slice(0))) == (str(card), mig or None), name
        claim = claims.pod_claim(read_pod(core_v1, name), NAMES)
        assert claim is not None and claim.problem is None, claim
        assert [(s.index, s.mig_device) for s in claim.allocation.containers[0].cards] == [(card, mig)], name

    def served_to_a():
        status, body = api_get(restarted.metrics_server.url + "/api/v1/allocation",
                               kubelet.env("default", "a", "c0")[c.ENV_TOKEN])
        return json.loads(body) if status == 200 else None

    answer = wait_for(served_to_a, timeout=20, what="a's token confirmed")
    assert [(card["index"], card["uuid"]) for card in answer["cards"]] == [(b_card, b_slice or card_uuid[b_card])]

    # a ends: what its claim held is what the extender sees freed, and a pod placed there runs
    freed = claims.pod_claim(read_pod(core_v1, "a"), NAMES).allocation.containers[0].cards[0]
    core_v1.delete_namespaced_pod("a", "default")
    b_uid = read_pod(core_v1, "b")["metadata"]["uid"]
    wait_for(lambda: [uid for uid, _ in restarted.allocator.served()] == [b_uid], timeout=20, what="a released")
    place_pod(core_v1, gpus, "c", [(Request(20, 16), (freed.index,))],
              slices={0: freed.mig_device} if freed.mig_device else None)
    c_uid = read_pod(core_v1, "c")["metadata"]["uid"]
    wait_for(lambda: running(core_v1, "c") or kubelet.failure(c_uid), timeout=20, what="c admitted or refused")
    assert kubelet.failure(c_uid) is None
    assert kubelet.env("default", "c", "c0")[c.ENV_NVIDIA_VISIBLE_DEVICES] == (b_slice or card_uuid[b_card])


def test_runs_the_container_command_with_its_env_and_a_gpu_process(kubelets, daemons, gpus, core_v1, tmp_path):
    proc_root = tmp_path / "proc"
    out = tmp_path / "env.json"
    kubelet, _ = start_pair(kubelets, daemons, gpus, drive_gpus=True, run_processes=True,
                              proc_root=str(proc_root))
    script = f"import json, os, time; json.dump(dict(os.environ), open({str(out)!r}, 'w')); time.sleep(60)"
    place_pod(core_v1, gpus, "proc", [(Request(40, 12), (1,))], extra={"command": [sys.executable, "-c", script]})
    pod = wait_for(lambda: running(core_v1, "proc"), timeout=20)
    env = wait_for(lambda: out.exists() and out.stat().st_size and json.loads(out.read_text()), timeout=20)
    assert env[c.ENV_POD_NAME] == "proc" and env[c.ENV_CORES] == "40" and env[c.ENV_DEVICE_INDICES] == "1"
    admitted = kubelet.admitted(pod["metadata"]["uid"])
    process = admitted.containers[0].process
    assert process is not None and process.poll() is None
    pid = process.pid
    assert pid in gpus.process_ids()
    sample = gpus.sample()
    assert [(p.pid, p.card_index) for p in sample.processes] == [(pid, 1)]
    cgroup = (proc_root / str(pid) / "cgroup").read_text()
    container_id = pod["status"]["containerStatuses"][0]["containerID"].split("//")[1]
    slug = pod["metadata"]["uid"].replace("-", "_")
    assert cgroup == (f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{slug}.slice/"
                      f"cri-containerd-{container_id}.scope\n")
    from vgpu_plugin.metrics.cgroup import read_process_identity  # the metrics code's parser agrees

    identity, _ = read_process_identity(str(proc_root), pid)
    assert identity.pod_uid == pod["metadata"]["uid"] and identity.container_id == container_id
    core_v1.delete_namespaced_pod("proc", "default")
    wait_for(lambda: process.poll() is not None, timeout=20, what="process stopped")
    wait_for(lambda: not kubelet.in_use(CORE) and pid not in gpus.process_ids(), timeout=20)
    assert not os.path.exists(proc_root / str(pid))
