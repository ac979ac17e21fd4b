"""`jupyter-vgpu demo` tried as a new user would: start it, open what it prints, Ctrl-C it."""

from __future__ import annotations

import base64
import json
import os
import re
import shlex
import signal
import socket
import ssl
import stat
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from simkube.waiting import wait_for

pytestmark = pytest.mark.slow

BIN = Path(sys.executable).parent


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class Output(threading.Thread):
    """Collects a process's output lines as they come."""

    def __init__(self, stream: Any) -> None:
        super().__init__(daemon=True)
        self.stream, self.lines = stream, []

    def run(self) -> None:
        for line in self.stream:
            self.lines.append(line.rstrip("\n"))

    def text(self) -> str:
        return "\n".join(self.lines)

    def wait_for(self, pattern: str, process: subprocess.Popen[str], timeout: float) -> re.Match[str]:
        def matched() -> re.Match[str] | None:
            match = next((m for line in list(self.lines) if (m := re.fullmatch(pattern, line))), None)
            if match is None and process.poll() is not None:
                time.sleep(0.5)  # the rest of the output
                raise AssertionError(f"the demo exited with {process.returncode}:\n{self.text()[-4000:]}")
            return match

        try:
            found: re.Match[str] = wait_for(matched, timeout=timeout, interval=0.1, what=f"a line matching {pattern!r}")
        except TimeoutError as error:
            raise AssertionError(f"{error}:\n{self.text()[-4000:]}") from None
        return found


def _descendants(pid: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(entry))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _processes_mentioning(*needles: str) -> list[str]:
    """Command lines of live processes that contain any of ``needles``."""
    hits = []
    for entry in os.listdir("/proc"):
        if entry.isdigit() and int(entry) != os.getpid():
            try:
                cmdline = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if any(n in cmdline for n in needles):
                hits.append(f"{entry}: {cmdline[:200]}")
    return hits


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _api(base: str, token: str, path: str, method: str = "GET", body: Any = None) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(base + path, data=data, method=method,
                                     headers={"Authorization": f"token {token}", "Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return json.loads(response.read())


def _request_share_and_follow(base: str, token: str, share: dict[str, Any], output: Any) -> Any:
    """Ask for ``share`` as the panel's form does; the allocation the lab reports once the
    notebook pod was re-created (as notebook-v2) and its lab took over the same URL and token."""
    request = _api(base, token, "vgpu/api/requests", "POST", share)
    assert request["state"] == "pending", request

    def on_new_share() -> Any:
        try:
            moved = _api(base, token, "vgpu/api/allocation")
        except (urllib.error.URLError, OSError):
            return None  # the old pod's lab is gone, the new one is starting
        return moved if (moved.get("allocation") or {}).get("pod") == "notebook-v2" else None

    try:
        return wait_for(on_new_share, timeout=90, interval=0.5, what="the lab on the new share")
    except TimeoutError:
        raise AssertionError(f"the lab did not come back on the new share:\n{output.text()[-3000:]}") from None


def _assert_api_wants_the_token(kubeconfig: str) -> None:
    """Only the kubeconfig's owner can read it, and the API answers nobody without its token."""
    assert stat.S_IMODE(os.stat(kubeconfig).st_mode) == 0o600
    config = json.loads(Path(kubeconfig).read_text())
    cluster, user = config["clusters"][0]["cluster"], config["users"][0]["user"]
    context = ssl.create_default_context(cadata=base64.b64decode(cluster["certificate-authority-data"]).decode())
    pod = {"metadata": {"name": "intruder"}, "spec": {"containers": [{"name": "c", "image": "i", "command": ["id"]}]}}
    for method, path, body in (("GET", "/api/v1/pods", None), ("POST", "/api/v1/namespaces/default/pods", pod)):
        request = urllib.request.Request(cluster["server"] + path, method=method, headers={
            "Content-Type": "application/json"}, data=json.dumps(body).encode() if body else None)
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(request, context=context, timeout=30)
        assert refused.value.code == 401 and json.loads(refused.value.read())["reason"] == "Unauthorized"
    request = urllib.request.Request(cluster["server"] + "/api/v1/namespaces/default/pods/intruder",
                                     headers={"Authorization": f"Bearer {user['token']}"})
    with pytest.raises(urllib.error.HTTPError) as missing:
        urllib.request.urlopen(request, context=context, timeout=30)
    assert missing.value.code == 404, "the refused create created nothing"


def _usage_samples(base: str, token: str) -> Any:
    """The lab's current usage, each time a new sample has been taken (one a second)."""
    last = None
    while True:
        def fresh(after: Any = last) -> Any:
            current = _api(base, token, "vgpu/api/usage")["current"]
            return current if current and current["t"] != after else None

        current = wait_for(fresh, timeout=120, interval=0.5, what="a new usage sample")
        last = current["t"]
        yield current


def _files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@dataclass
class DemoRun:
    """`jupyter-vgpu demo ...` started as a user would, with a home, a temp dir and a working dir of
    its own: what the demo leaves in them is checked after Ctrl-C."""

    process: subprocess.Popen[str]
    output: Output
    port: int
    home: Path
    tmp: Path
    cwd: Path


def _start_demo(tmp_path: Path, *flags: str) -> DemoRun:
    port = _free_port()
    home, tmp, cwd = tmp_path / "home", tmp_path / "tmp", tmp_path / "cwd"
    for path in (home, tmp, cwd):
        path.mkdir()
    environ = {key: value for key, value in os.environ.items()
               if not key.startswith(("JUPYTER", "IPYTHON", "XDG_", "MPLCONFIG"))}
    process = subprocess.Popen([str(BIN / "jupyter-vgpu"), "demo", *flags, "--no-browser", "--port", str(port)],
                               cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               env={**environ, "HOME": str(home), "TMPDIR": str(tmp),
                                    "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}"})
    output = Output(process.stdout)
    output.start()
    return DemoRun(process, output, port, home, tmp, cwd)


def _ctrl_c(run: DemoRun) -> int:
    """Ctrl-C the demo (if it still runs) and wait for it to finish stopping."""
    if run.process.poll() is None:
        run.process.send_signal(signal.SIGINT)
    try:
        code = run.process.wait(90)
    except subprocess.TimeoutExpired:
        run.process.kill()
        raise
    run.output.join(10)
    return code


def _assert_nothing_left(run: DemoRun, code: int, processes: set[int], token: str, workdir: str,
                         kept: tuple[Path, ...] = ()) -> None:
    """A clean stop: exit 0, its processes gone, the work dir gone, the port free again, and
    nothing written to the home (but the notebooks in ``kept``), the temp dir or the working dir."""
    assert code == 0, run.output.text()[-3000:]
    assert "jupyter-vgpu demo: stopping" in run.output.lines
    wait_for(lambda: not [p for p in processes if _alive(p)], timeout=20, interval=0.2,
             what="the demo's processes to exit with it")
    assert not _processes_mentioning(token, workdir)
    assert not os.path.exists(workdir), "the work dir (kubeconfig, sockets, logs) was left behind"
    for path in kept:
        assert path.is_file()
    assert [name for name in _files(run.home) if not name.startswith("jupyter-vgpu-demo")] == [], _files(run.home)
    assert _files(run.tmp) == [] and _files(run.cwd) == []
    with socket.socket() as sock:  # the lab's port is free again (as a server binds it)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("127.0.0.1", run.port))


def test_demo_serves_a_real_allocation_and_ctrl_c_leaves_nothing(tmp_path: Path) -> None:
    run = _start_demo(tmp_path)
    process, output, port, home = run.process, run.output, run.port, run.home
    try:
        match = output.wait_for(rf"http://127\.0\.0\.1:{port}/lab\?token=([0-9a-f]{{32,}})", process, 180)
        token = match.group(1)
        notebooks = Path(output.wait_for(r"\s*your notebooks: (\S+)\s+\(kept after Ctrl-C\)", process, 10).group(1))
        lab_log = Path(output.wait_for(r"\s*the lab's log:\s+(\S+)\s+\(kept after Ctrl-C\)", process, 10).group(1))
        printed = output.wait_for(r"\s*(kubectl --kubeconfig (\S+) get pods -A -o wide)", process, 10)
        kubeconfig = printed.group(2)
        workdir = os.path.dirname(kubeconfig)
        base = f"http://127.0.0.1:{port}/"

        # notebooks go to a directory of their own; the lab's log is where the guide says, beside them
        # (kept after Ctrl-C); the token is in a 0600 config file and on no command line
        assert notebooks == home / "jupyter-vgpu-demo" and notebooks.is_dir()
        assert lab_log == notebooks / ".jupyter-vgpu-demo" / "logs" / "lab.log" and "Jupyter" in lab_log.read_text()
        assert not _processes_mentioning(token), "the lab's token shows in ps"
        config = Path(workdir, "jupyter", "config", "jupyter_server_config.json")
        assert stat.S_IMODE(config.stat().st_mode) == 0o600 and token in config.read_text()

        # the lab answers with the token it printed, and refuses without it
        assert _api(base, token, "api/status")["started"]
        with pytest.raises(urllib.error.HTTPError) as refused:
            urllib.request.urlopen(base + "vgpu/api/allocation", timeout=30)
        assert refused.value.code == 403

        allocation = _api(base, token, "vgpu/api/allocation")
        assert allocation["state"] == "allocated" and allocation["source"] == "node-api", allocation
        held = allocation["allocation"]
        assert (held["cores"], held["memoryMib"], held["pod"]) == (25, 4096, "notebook")
        (card,) = held["cards"]

        # a real card: the node's inventory (read with the kubeconfig the demo printed) has it
        from kubernetes import client, config

        from jupyter_vgpu.core import contract as c
        from jupyter_vgpu.core.inventory import NodeInventory

        core = client.CoreV1Api(config.new_client_from_config(config_file=kubeconfig))
        node = core.read_node(held["node"])
        inventory = NodeInventory.from_json(node.metadata.annotations[c.DEFAULT_NAMES.node_inventory])
        assert inventory.card(card["index"]).uuid == card["uuid"]
        pods = {(p.metadata.namespace, p.metadata.name) for p in core.list_pod_for_all_namespaces().items}
        assert ("default", "notebook") in pods and len(pods) > 1, "the neighbours run beside the notebook"

        # the printed kubectl line works as printed; the API refuses anyone without the kubeconfig's token
        listed = subprocess.run([*shlex.split(printed.group(1)), "--cache-dir", str(tmp_path / "kube-cache")],
                                capture_output=True, text=True, timeout=60)
        assert listed.returncode == 0, listed.stderr
        header, *rows = [re.split(r"\s{2,}", line.strip()) for line in listed.stdout.splitlines() if line.strip()]
        assert header[:8] == ["NAMESPACE", "NAME", "READY", "STATUS", "RESTARTS", "AGE", "IP", "NODE"], header
        notebook_row = next(row for row in rows if row[:2] == ["default", "notebook"])
        assert (notebook_row[2], notebook_row[3], notebook_row[7]) == ("1/1", "Running", held["node"]), notebook_row
        _assert_api_wants_the_token(kubeconfig)

        # live usage: what the lab's processes hold and do (an idle lab: its memory, next to no compute)
        first = _api(base, token, "vgpu/api/usage?history=30")
        assert first["state"] == "live" and first["limits"] == {"cores": 25, "memoryMib": 4096}, first
        b = next(_usage_samples(base, token))
        assert 0 < b["memoryUsedMib"] <= 4096 and 0 <= b["utilizationPercent"] <= 25, b

        # the topology marks the card as mine, and other people's pods show only as totals
        topology = _api(base, token, "vgpu/api/topology")
        assert topology["state"] == "available", topology
        gpus = topology["topology"]["gpus"]
        assert [g["index"] for g in gpus if g["mine"]] == [card["index"]]
        assert any(g["allocatedCores"] > 0 for g in gpus if not g["mine"]), "neighbours occupy other cards"

        # a share request (the panel's form, %vgpu request): the pod is re-created with the new
        # share and its lab takes over the same URL and token
        moved = _request_share_and_follow(base, token, {"cores": 50, "memory": "8GiB"}, output)
        assert moved["state"] == "allocated" and (moved["allocation"]["cores"], moved["allocation"]["memoryMib"]) == (
            50, 8192), moved
        pods = {(p.metadata.namespace, p.metadata.name) for p in core.list_pod_for_all_namespaces().items}
        assert ("default", "notebook") not in pods and ("default", "notebook-v2") in pods

        # a kernel too: its own session, so Ctrl-C must reach it through the lab's shutdown
        kernel = _api(base, token, "api/kernels", "POST", {"name": "python3"})
        assert kernel["id"]
        created = _api(base, token, "api/contents", "POST", {"type": "notebook"})
        assert (notebooks / created["path"]).is_file(), "a new notebook lands in the notebook dir"

        # the card follows the notebook: a busy loop in its kernel raises the reported utilisation
        from jupyter_client import BlockingKernelClient

        kernel_client = BlockingKernelClient(
            connection_file=str(Path(workdir, "jupyter", "runtime", f"kernel-{kernel['id']}.json")))
        kernel_client.load_connection_file()
        kernel_client.start_channels()
        try:
            kernel_client.wait_for_ready(timeout=120)
            samples = _usage_samples(base, token)
            idle = sorted(next(samples)["utilizationPercent"] for _ in range(5))[2]  # the median
            kernel_client.execute("import time\n_t = time.time()\nwhile time.time() - _t < 120: pass")
            busy = [next(samples)["utilizationPercent"] for _ in range(10)]
            # (2 cores shared with other work: the loop gets part of one core, each part counts)
            assert max(busy) >= idle + 8, f"a busy loop did not move the card: idle {idle}, then {busy}"
            assert max(busy) <= 50, "never more than the share (one busy core = 50 % of the card)"
        finally:
            kernel_client.stop_channels()
        processes = _descendants(process.pid)
        assert processes, "the demo runs the lab as a child process"
    finally:
        code = _ctrl_c(run)
    # the notebooks stay, and the lab's log beside them
    _assert_nothing_left(run, code, processes, token, workdir, kept=(notebooks / created["path"], lab_log))


def test_demo_isolated_puts_the_notebook_on_a_mig_slice_and_ctrl_c_leaves_nothing(tmp_path: Path) -> None:
    """`jupyter-vgpu demo --isolated`: the notebook asks for 25 % and 4 GiB with isolation, lands on the
    smallest MIG slice that holds that (a 2g.10gb: the 1g.5gb has 1/7 of the compute), and the lab
    reports the whole slice, as the guide says."""
    run = _start_demo(tmp_path, "--isolated", "--no-neighbours")
    processes: set[int] = set()
    token = workdir = ""
    try:
        token = run.output.wait_for(rf"http://127\.0\.0\.1:{run.port}/lab\?token=([0-9a-f]{{32,}})", run.process,
                                    180).group(1)
        kubeconfig = run.output.wait_for(r"\s*kubectl --kubeconfig (\S+) get pods -A -o wide", run.process, 10).group(1)
        workdir = os.path.dirname(kubeconfig)
        # the guide says where the notebook is, in the panel's words, with the slice's real size
        guide = run.output.text()
        said = re.search(r"your notebook: pod default/notebook on node a100-mig: MIG 2g\.10gb on GPU 0 \(isolated\): "
                         r"the whole slice, 28 % of the card's compute and 10 GiB \(asked 25 % and 4 GiB\); "
                         r"device (MIG-\S+)", guide)
        assert said, guide
        assert "on a MIG slice the hardware isolates your compute and memory" in guide
        device = said.group(1)

        # the pod holds that slice (the bind's annotation), of the node's inventory, and nothing smaller fits
        from kubernetes import client, config

        from jupyter_vgpu.core import contract as c
        from jupyter_vgpu.core.inventory import NodeInventory

        core = client.CoreV1Api(config.new_client_from_config(config_file=kubeconfig))
        pod = core.read_namespaced_pod("notebook", "default")
        assert pod.metadata.annotations[c.DEFAULT_NAMES.isolation] == "mig"
        assert pod.metadata.annotations[c.DEFAULT_NAMES.mig_slice(0)] == device
        inventory = NodeInventory.from_json(core.read_node("a100-mig").metadata.annotations[
            c.DEFAULT_NAMES.node_inventory])
        slices = {s.uuid: s for s in inventory.card(0).slices}
        assert slices[device].profile == "2g.10gb"
        assert sorted(s.profile for s in slices.values()) == ["1g.5gb", "2g.10gb", "2g.10gb", "2g.10gb"]

        # the lab's vgpu/api reports the slice: its profile, the GPU, isolation, the whole slice's size
        base = f"http://127.0.0.1:{run.port}/"
        allocation = _api(base, token, "vgpu/api/allocation")
        assert allocation["state"] == "allocated" and allocation["source"] == "node-api", allocation
        held = allocation["allocation"]
        assert (held["node"], held["pod"], held["enforcement"]) == ("a100-mig", "notebook", c.ENFORCEMENT_MIG)
        assert (held["cores"], held["memoryMib"]) == (28, 10240)
        (card,) = held["cards"]
        assert card == {"index": 0, "uuid": device, "model": "NVIDIA A100-SXM4-40GB", "cores": 28,
                        "memoryMib": 10240, "memoryTotalMib": 10240, "migProfile": "2g.10gb"}
        usage = _api(base, token, "vgpu/api/usage")
        assert usage["state"] == "live" and usage["limits"] == {"cores": 28, "memoryMib": 10240}, usage

        # a smaller share from the lab (the panel's form): the re-created pod keeps asking for isolation
        # and lands on the 1g.5gb slice, the smallest that holds it; nothing of the old slice is carried over
        moved = _request_share_and_follow(base, token, {"cores": 10, "memory": "4GiB"}, run.output)
        (small,) = moved["allocation"]["cards"]
        assert (small["migProfile"], small["cores"], small["memoryMib"]) == ("1g.5gb", 14, 5120), moved
        pod = core.read_namespaced_pod("notebook-v2", "default")
        assert pod.metadata.annotations[c.DEFAULT_NAMES.isolation] == "mig"
        assert pod.metadata.annotations[c.DEFAULT_NAMES.mig_slice(0)] == small["uuid"] != device
        assert slices[small["uuid"]].profile == "1g.5gb"
        run.output.wait_for(r"demo: your notebook moved to pod default/notebook-v2 on node a100-mig: MIG 1g\.5gb on "
                            r"GPU 0 \(isolated\): the whole slice, 14 % of the card's compute and 5 GiB "
                            r"\(asked 10 % and 4 GiB\).*", run.process, 30)
        processes = _descendants(run.process.pid)
        assert processes, "the demo runs the lab as a child process"
    finally:
        code = _ctrl_c(run)
    _assert_nothing_left(run, code, processes, token, workdir)


def test_sim_runs_the_cluster_alone_for_kubectl_and_stops_clean(tmp_path: Path) -> None:
    process = subprocess.Popen([str(BIN / "jupyter-vgpu"), "sim", "--neighbours"], cwd=tmp_path,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    output = Output(process.stdout)
    output.start()
    try:
        kubeconfig = output.wait_for(r"\s*kubeconfig: (\S+)", process, 120).group(1)
        extender = output.wait_for(r"\s*extender:\s+(\S+)\s.*", process, 10).group(1)
        metrics = output.wait_for(r"\s*node dgx-a100: .*metrics (\S+)", process, 10).group(1)
        scrape_token = output.wait_for(r"\s*scrape token \(Authorization: Bearer \.\.\.\): (\S+)", process, 10).group(1)
        output.wait_for(r"Press Ctrl-C to stop\.", process, 10)
        nodes = subprocess.run(["kubectl", "--kubeconfig", kubeconfig, "--cache-dir", str(tmp_path / "kube-cache"),
                                "get", "nodes", "-o", "name"], capture_output=True, text=True, timeout=60)
        assert nodes.returncode == 0, nodes.stderr
        assert sorted(nodes.stdout.split()) == ["node/dgx-a100", "node/p40-pcie"]
        _assert_api_wants_the_token(kubeconfig)
        with urllib.request.urlopen(extender.rsplit("/scheduler", 1)[0] + "/inspect", timeout=30) as response:
            inspect = json.loads(response.read())
        cards = {n["name"]: n["cards"] for n in inspect["nodes"]}
        assert len(cards["dgx-a100"]) == 8 and len(cards["p40-pcie"]) == 7
        assert sum(card["cores"]["held"] for node in cards.values() for card in node) > 0, "neighbours hold cards"
        with pytest.raises(urllib.error.HTTPError) as refused:  # every tenant's series: the token only
            urllib.request.urlopen(metrics, timeout=30)
        assert refused.value.code == 401
        scrape = urllib.request.Request(metrics, headers={"Authorization": f"Bearer {scrape_token}"})
        with urllib.request.urlopen(scrape, timeout=30) as response:  # the metrics want the printed token
            assert b"vgpu_card_allocated_cores" in response.read()
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGINT)
        code = process.wait(60)
        output.join(10)
    assert code == 0, output.text()[-3000:]
    assert not os.path.exists(os.path.dirname(kubeconfig))
