"""``jupyter-vgpu doctor --acceptance`` (the GPU acceptance kit, issue #31) against stand-ins.

This machine has no GPU: the kit runs through its real command line (``main(argv)``) over the
stand-ins of acceptance_support.py: the fake pynvml as ``pynvml`` behind our NVML backend, a
``nvidia-smi`` and an ``nvidia-cuda-mps-control`` on PATH, and a CUDA worker speaking the
worker protocol. The real metrics sampler reads the workers' real ``/proc/<pid>/cgroup``.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from acceptance_support import (
    RegisteredCard,
    StandIn,
    alive,
    build_fake_libcuda,
    fake_pynvml,
    mutating_functions,
    stand_in_library,
)
from simkube.waiting import wait_for
from vgpu_plugin.doctor import acceptance, acceptance_process
from vgpu_plugin.doctor.acceptance import run_acceptance
from vgpu_plugin.doctor.acceptance_report import SCHEMA, SCHEMA_VERSION
from vgpu_plugin.doctor.acceptance_setup import AcceptanceOptions
from vgpu_plugin.doctor.acceptance_worker import package_shim, worker_env
from vgpu_plugin.doctor.main import main
from vgpu_plugin.metrics.cgroup import parse_cgroup_file

from jupyter_vgpu.gpu.nvml import NVMLBackend

REPO = Path(__file__).resolve().parents[2]
CHECKS = ["cards", "mig", "process-attribution", "process-utilisation", "guard-rails", "mps"]
KIT = sorted((REPO / "plugin" / "vgpu_plugin" / "doctor").glob("acceptance*.py"))


def in_a_pod() -> bool:
    return parse_cgroup_file(Path("/proc/self/cgroup").read_text()) is not None


@pytest.fixture
def machine(tmp_path, monkeypatch) -> StandIn:
    return install(StandIn(tmp_path, stand_in_library()), monkeypatch)


def install(stand_in: StandIn, monkeypatch: pytest.MonkeyPatch) -> StandIn:
    monkeypatch.setitem(sys.modules, "pynvml", stand_in.nv)  # what our NVML backend imports
    monkeypatch.setenv("PATH", f"{stand_in.bin}:{stand_in.bin.parent / 'nothing'}:/usr/bin:/bin")
    monkeypatch.delenv("FAKE_WORKER", raising=False)
    for name in ("VGPU_GPUS", "VGPU_DOCTOR_ALLOW_MPS", "VGPU_DOCTOR_CUDA_WORKER", "VGPU_DOCTOR_REPORT_DIR"):
        monkeypatch.delenv(name, raising=False)
    return stand_in


def accept(machine: StandIn, *extra: str) -> tuple[int, dict, str]:
    out = machine.root / "report"
    code = main(["--acceptance", "--report-dir", str(out), "--cuda-worker", machine.worker, *extra])
    report = json.loads((out / "acceptance.json").read_text())
    return code, report, (out / "acceptance.md").read_text()


def by_name(report: dict) -> dict[str, dict]:
    return {check["name"]: check for check in report["checks"]}


def assert_left_the_gpu_alone(machine: StandIn) -> None:
    assert machine.nv.set_calls == []
    for call in machine.smi_calls():
        assert call == ["-L"] or (call[0].startswith("--query-gpu=") and call[1].startswith("--format=csv")), call
    for mode, pids in machine.worker_pids().items():
        assert not any(alive(pid) for pid in pids), f"a {mode} worker outlived the kit"
    calls = machine.mps_calls()
    if calls:
        assert calls[0]["args"] == ["-d"] and calls[-1]["command"] == "quit"
        assert all(call["pipe"] == calls[0]["pipe"] for call in calls)
        assert "vgpu-acceptance-mps-" in calls[0]["pipe"] and not Path(calls[0]["pipe"]).exists()


def test_the_stand_in_records_every_nvml_setter():
    setters = mutating_functions()
    for name in ("nvmlDeviceSetMigMode", "nvmlDeviceSetComputeMode", "nvmlDeviceSetPersistenceMode",
                 "nvmlDeviceCreateGpuInstance", "nvmlGpuInstanceDestroy", "nvmlDeviceResetGpuLockedClocks",
                 "nvmlDeviceClearEccErrorCounts"):
        assert name in setters
    assert not [name for name in setters if name.startswith("nvmlDeviceGet")]
    nv = stand_in_library()
    with pytest.raises(AssertionError):
        nv.nvmlDeviceSetMigMode(nv.cards[0], 1)
    assert nv.set_calls == [("nvmlDeviceSetMigMode", (nv.cards[0], 1))]


def test_a_healthy_machine_passes_and_both_reports_hold_every_check(machine, capsys):
    code, report, markdown = accept(machine, "--allow-mps")
    checks = by_name(report)
    assert code == 0, json.dumps(report, indent=1)[:4000]
    assert [c["name"] for c in report["checks"]] == CHECKS
    assert {name: c["status"] for name, c in checks.items()} == {
        "cards": "pass", "mig": "n/a", "process-attribution": "pass", "process-utilisation": "pass",
        "guard-rails": "pass", "mps": "pass"}
    # the documented shape
    assert report["schema"] == SCHEMA and report["schemaVersion"] == SCHEMA_VERSION == 1
    assert set(report) == {"schema", "schemaVersion", "result", "counts", "tool", "host", "driver", "cards",
                           "options", "checks", "started", "finished", "seconds"}
    assert report["result"] == "pass" and report["counts"] == {"pass": 5, "fail": 0, "n/a": 1}
    assert report["driver"] == {"version": "550.54.15", "nvml": "12.550.54.15", "cuda": "12.4", "problem": None}
    assert [c["uuid"] for c in report["cards"]] == [c.uuid for c in machine.nv.cards]
    assert report["cards"][0]["computeMode"] == "DEFAULT" and report["cards"][0]["mig"] is None
    assert report["options"]["allowMps"] is True and report["seconds"] < 60
    for check in report["checks"]:
        assert set(check) == {"name", "status", "summary", "details", "seconds"} and check["summary"]
    # the process: the sampler found the worker's PID on its card, with its memory, owned as its cgroup says
    process = checks["process-attribution"]["details"]
    [hold] = machine.worker_pids()["hold"]
    assert process["pid"] == hold and process["card"] == 0 and process["listedMib"] >= 256
    assert process["owner"] == process["expectedOwner"] == ("unknown-pod" if in_a_pod() else "host")
    assert (parse_cgroup_file(process["cgroup"]) is None) == (process["owner"] == "host")  # as read from /proc
    assert process["workerEnded"] == "terminated"
    assert "up to 42 %" in checks["process-utilisation"]["summary"]
    # the share the guard worker was given: 25 % of an 80 GiB card, at most 4 GiB
    assert checks["guard-rails"]["details"]["shareMib"] == 4096
    assert "5120 MiB refused" in checks["guard-rails"]["summary"]
    mps = checks["mps"]["details"]
    assert mps["commands"]["set_default_device_pinned_mem_limit 0 2048M"] == "ok" and mps["quit"] == "ok"
    assert mps["servers"] == ["4242"]
    # the Markdown says the same
    assert "**Result: PASS**" in markdown
    for check in report["checks"]:
        assert f"| {check['name']} | {check['status']} |" in markdown
        assert f"### {check['name']}: {check['status']}" in markdown
    assert "changed no GPU setting" in markdown
    assert capsys.readouterr().out.splitlines()[-1] == "result: pass (5 pass, 0 fail, 1 n/a)"
    assert_left_the_gpu_alone(machine)


def test_a_process_nvml_does_not_list_fails(machine, monkeypatch):
    monkeypatch.setenv("FAKE_WORKER", "unlisted")
    code, report, _ = accept(machine)
    checks = by_name(report)
    assert code == 1 and report["result"] == "fail"
    assert checks["process-attribution"]["status"] == "fail"
    assert "never appeared in the sampler's" in checks["process-attribution"]["summary"]
    assert checks["process-utilisation"]["status"] == "n/a"
    assert_left_the_gpu_alone(machine)


def test_an_idle_process_with_kernels_fails_utilisation_and_without_kernels_is_not_available(machine, monkeypatch):
    monkeypatch.setenv("FAKE_WORKER", "idle")
    code, report, _ = accept(machine)
    assert code == 1 and by_name(report)["process-utilisation"]["status"] == "fail"
    assert by_name(report)["process-attribution"]["status"] == "pass"
    monkeypatch.setenv("FAKE_WORKER", "idle,no-kernels")
    code, report, _ = accept(machine)
    utilisation = by_name(report)["process-utilisation"]
    assert code == 0 and utilisation["status"] == "n/a" and "launches no kernels" in utilisation["summary"]


def test_nvidia_smi_disagreeing_with_nvml_fails_the_cards(machine):
    state = json.loads(machine.smi_json.read_text())
    state["gpus"][2]["memory.total"] = "40960"
    state["gpus"][3]["uuid"] = "GPU-99999999-aaaa-bbbb-cccc-dddddddddddd"
    machine.smi_says(state)
    code, report, markdown = accept(machine)
    cards = by_name(report)["cards"]
    assert code == 1 and cards["status"] == "fail"
    assert "card 2: 81920 MiB in NVML, 40960 MiB in nvidia-smi" in cards["details"]["disagreements"]
    assert any("GPU-99999999" in problem for problem in cards["details"]["disagreements"])
    assert "| cards | fail |" in markdown and "**Result: FAIL**" in markdown


def test_without_nvidia_smi_the_cards_are_not_compared(machine):
    (machine.bin / "nvidia-smi").unlink()
    code, report, _ = accept(machine)
    cards = by_name(report)["cards"]
    assert code == 0 and cards["status"] == "n/a" and "nvidia-smi is not installed" in cards["summary"]
    assert len(cards["details"]["nvml"]) == 4


def test_the_cuda_worker_is_stopped_when_a_check_raises(machine, monkeypatch):
    class BrokenSampler:
        def __init__(self, *args, **kwargs):
            raise RuntimeError("the sampler broke")

    monkeypatch.setattr(acceptance_process, "Sampler", BrokenSampler)
    code, report, _ = accept(machine)
    checks = by_name(report)
    assert code == 1
    assert checks["process-attribution"]["summary"] == "the check itself failed: RuntimeError: the sampler broke"
    assert checks["process-utilisation"]["status"] == "n/a"
    [hold] = machine.worker_pids()["hold"]
    assert not alive(hold)
    assert checks["guard-rails"]["status"] == "pass"  # the rest still ran
    assert_left_the_gpu_alone(machine)


def test_a_worker_that_never_gets_ready_is_killed_at_its_timeout(machine, monkeypatch):
    monkeypatch.setenv("FAKE_WORKER", "hang")
    options = AcceptanceOptions(cuda_worker=machine.worker, ready_timeout=1.5, result_timeout=1.5, allow_mps=True)
    backend = NVMLBackend(library=machine.nv)
    report = run_acceptance(backend, options, smi=str(machine.bin / "nvidia-smi"))
    checks = {c.name: c for c in report.checks}
    for name in ("process-attribution", "guard-rails", "mps"):
        assert checks[name].status == "fail", checks[name]
        assert checks[name].details["workerEnded"] == "terminated"
    assert checks["process-attribution"].summary.startswith("the CUDA worker said nothing within 2 s and was terminated")
    assert checks["guard-rails"].summary == "the CUDA worker said nothing within 2 s and was terminated"
    assert checks["mps"].summary == "MPS client: the CUDA worker said nothing within 2 s and was terminated"
    assert report.seconds < 30
    assert_left_the_gpu_alone(machine)


def test_terminating_the_kit_stops_its_worker_and_its_mps_daemon(machine, monkeypatch):
    """SIGTERM unwinds the kit like Ctrl-C: the worker is stopped and the private MPS daemon quits."""
    monkeypatch.setenv("FAKE_WORKER", "hang")

    def terminate_when_the_client_waits() -> None:
        wait_for(lambda: "alloc" in machine.worker_pids(), timeout=60, what="the MPS client")
        os.kill(os.getpid(), signal.SIGTERM)

    killer = threading.Thread(target=terminate_when_the_client_waits, daemon=True)
    killer.start()
    monkeypatch.setattr(acceptance, "STEPS", tuple(s for s in acceptance.STEPS if s[0] == ("mps",)))
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(SystemExit) as exited:
        main(["--acceptance", "--allow-mps", "--cuda-worker", machine.worker])
    killer.join(10)
    assert exited.value.code == 128 + signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) == before  # the kit's handler is gone again
    [client] = machine.worker_pids()["alloc"]
    assert not alive(client)
    assert machine.mps_calls()[-1]["command"] == "quit"
    assert_left_the_gpu_alone(machine)


def test_a_spent_budget_skips_the_checks(machine):
    report = run_acceptance(NVMLBackend(library=machine.nv), AcceptanceOptions(budget_seconds=0))
    assert {c.status for c in report.checks} == {"n/a"}
    assert all(c.summary == "skipped: the run's 0 s budget is spent" for c in report.checks)
    assert machine.worker_pids() == {}


def test_a_worker_under_another_python_gets_only_our_packages(tmp_path, monkeypatch):
    """--cuda-worker may name another Python (one with PyTorch): PYTHONPATH gets a directory with
    vgpu_plugin and jupyter_vgpu only, never this install's site-packages; no share or card selection
    of the kit's own environment leaks into a worker."""
    shim = package_shim(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["jupyter_vgpu", "vgpu_plugin"]
    monkeypatch.setenv("VGPU_MEMORY_MIB", "4096")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-elsewhere")
    monkeypatch.setenv("CUDA_DEVICE_MEMORY_LIMIT_0", "1g")
    env = worker_env({"CUDA_VISIBLE_DEVICES": "GPU-0"}, shim)
    assert env["PYTHONPATH"].split(os.pathsep)[0] == shim and env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    assert env["CUDA_VISIBLE_DEVICES"] == "GPU-0" and "VGPU_MEMORY_MIB" not in env
    assert "CUDA_DEVICE_MEMORY_LIMIT_0" not in env
    assert "PYTHONPATH" not in worker_env({}, None, base={})
    # -S: no site-packages at all, as under a Python that has none of our dependencies
    done = subprocess.run([sys.executable, "-S", "-c", "import vgpu_plugin.doctor.acceptance_cuda, jupyter_vgpu.guards, "
                           "jupyter_vgpu.sources.base"], env={"PYTHONPATH": shim}, capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr


def test_the_guard_rail_fails_when_pytorch_allocates_past_the_share(machine, monkeypatch):
    monkeypatch.setenv("FAKE_WORKER", "guard-leaks")
    code, report, _ = accept(machine)
    guard = by_name(report)["guard-rails"]
    assert code == 1 and guard["status"] == "fail" and "the guard rail did not hold" in guard["summary"]
    monkeypatch.setenv("FAKE_WORKER", "no-torch")
    code, report, _ = accept(machine)
    guard = by_name(report)["guard-rails"]
    assert code == 0 and guard["status"] == "n/a" and "PyTorch is not installed" in guard["summary"]


def test_mps_needs_consent_and_fails_when_a_client_passes_the_limit(machine, monkeypatch):
    code, report, _ = accept(machine)
    assert code == 0 and by_name(report)["mps"]["status"] == "n/a" and "--allow-mps" in by_name(report)["mps"]["summary"]
    assert machine.mps_calls() == []  # nothing started without --allow-mps
    monkeypatch.setenv("FAKE_WORKER", "mps-leaks")
    code, report, _ = accept(machine, "--allow-mps")
    mps = by_name(report)["mps"]
    assert code == 1 and mps["status"] == "fail" and "past the server's 2048 MiB pinned-memory limit" in mps["summary"]
    assert_left_the_gpu_alone(machine)  # the daemon was told to quit all the same


def test_mig_state_is_listed_read_only_and_compared_with_nvidia_smi(tmp_path, monkeypatch):
    cards = [RegisteredCard(**{f: getattr(c, f) for f in ("index", "uuid", "name", "total_mib", "bus_id", "numa")})
             for c in fake_pynvml.default_cards()[:2]]
    cards[0].name, cards[0].total_mib = "NVIDIA A100-SXM4-40GB", 40960
    fake_pynvml.mig_layout(cards[0], [("3g.20gb", 3), ("2g.10gb", 2)])
    cards[1].mig = (0, 1)  # on after the next reset
    machine = install(StandIn(tmp_path, stand_in_library(cards)), monkeypatch)
    code, report, markdown = accept(machine)
    mig = by_name(report)["mig"]
    assert mig["status"] == "pass", mig
    assert mig["summary"] == ("card 0: MIG on with 3g.20gb, 2g.10gb; card 1: MIG off (on after the next reset) "
                              "(read only)")
    # card 0 is in MIG mode and card 1 leaves it pending: no card for CUDA
    assert by_name(report)["process-attribution"]["status"] == "n/a"
    assert report["cards"][0]["mig"] == {"current": True, "pending": True}
    assert [s["profile"] for s in report["cards"][0]["slices"]] == ["3g.20gb", "2g.10gb"]
    assert "3g.20gb (MIG-" in markdown
    # nvidia-smi seeing another layout is a disagreement
    state = json.loads(machine.smi_json.read_text())
    state["gpus"][0]["migDevices"].pop()
    machine.smi_says(state)
    code, report, _ = accept(machine)
    assert code == 1 and by_name(report)["mig"]["status"] == "fail"
    assert_left_the_gpu_alone(machine)


def test_usage_errors_come_before_the_run(machine, capsys):
    assert main(["--acceptance", "--gpus", "sim:dgx-a100"]) == 2
    assert "--acceptance checks real cards through NVML" in capsys.readouterr().err
    (machine.root / "a-file").touch()
    assert main(["--acceptance", "--report-dir", str(machine.root / "a-file" / "out"), "--cuda-worker", machine.worker]) == 2
    assert "cannot use --report-dir" in capsys.readouterr().err
    assert machine.worker_pids() == {} and machine.smi_calls() == []


def test_the_command_on_a_machine_without_a_driver_fails_the_cards_and_writes_the_reports(tmp_path):
    """The installed command, with the real nvidia-ml-py: this build machine has no driver at all."""
    if Path("/dev/nvidiactl").exists():
        pytest.skip("this machine has an NVIDIA driver")
    out = tmp_path / "out"
    done = subprocess.run([sys.executable, "-m", "jupyter_vgpu.cli", "doctor", "--acceptance", "--report-dir", str(out)],
                          capture_output=True, text=True, timeout=120, env={"PATH": "/usr/bin:/bin"})
    assert done.returncode == 1, done.stdout + done.stderr
    report = json.loads((out / "acceptance.json").read_text())
    statuses = {c["name"]: c["status"] for c in report["checks"]}
    assert statuses == {"cards": "fail", "mig": "n/a", "process-attribution": "n/a", "process-utilisation": "n/a",
                        "guard-rails": "n/a", "mps": "n/a"}
    assert "no NVIDIA driver" in by_name(report)["cards"]["summary"]
    assert (out / "acceptance.md").read_text().startswith("# GPU acceptance: ")
    assert done.stdout.splitlines()[-1] == "result: fail (0 pass, 1 fail, 5 n/a)"


@pytest.mark.parametrize("mode", ["hold", "alloc", "guard"])
def test_the_bundled_worker_says_when_it_cannot_run_cuda(mode):
    """The real worker on this machine (no PyTorch, no CuPy, no libcuda.so.1): unavailable, with why."""
    if any(importlib.util.find_spec(name) for name in ("torch", "cupy")) or Path("/dev/nvidiactl").exists():
        pytest.skip("this machine may run CUDA")
    done = subprocess.run([sys.executable, "-m", "vgpu_plugin.doctor.acceptance_cuda", mode],
                          capture_output=True, text=True, timeout=60)
    message = json.loads(done.stdout.splitlines()[-1])
    assert done.returncode == 3 and message["event"] == "unavailable", done.stdout + done.stderr
    assert "PyTorch is not installed" in message["reason"]
    if mode != "guard":
        assert "libcuda.so.1" in message["reason"]


@pytest.fixture(scope="module")
def libcuda(tmp_path_factory) -> Path:
    """A directory with the stand-in libcuda.so.1, for the bundled worker's driver-API fallback."""
    if any(importlib.util.find_spec(name) for name in ("torch", "cupy")):
        pytest.skip("PyTorch or CuPy is installed: the worker would not fall back to the driver API")
    library = build_fake_libcuda(tmp_path_factory.mktemp("libcuda"))
    if library is None:
        pytest.skip("no C compiler to build the stand-in libcuda.so.1")
    return library.parent


def test_the_driver_api_fallback_allocates_and_is_refused_past_the_memory(libcuda):
    env = {"PATH": "/usr/bin:/bin", "LD_LIBRARY_PATH": str(libcuda), "FAKE_CUDA_TOTAL_MIB": "1024"}
    done = subprocess.run([sys.executable, "-m", "vgpu_plugin.doctor.acceptance_cuda", "alloc", "--below", "256",
                           "--above", "2048"], capture_output=True, text=True, timeout=60, env=env)
    message = json.loads(done.stdout.splitlines()[-1])
    assert done.returncode == 0 and message["event"] == "result", done.stdout + done.stderr
    assert message["framework"] == "cuda" and message["version"] == "12.4" and message["smCount"] == 108
    assert message["below"] == {"ok": True} and message["freeMib"] == 1024
    assert message["above"] == {"ok": False, "refused": True,
                                "error": "CudaFailure: cuMemAlloc_v2 failed: CUDA_ERROR_OUT_OF_MEMORY (2)"}
    assert message["skipped"][0].startswith("torch: PyTorch is not installed")


def test_the_bundled_worker_end_to_end_without_pytorch(machine, libcuda, monkeypatch):
    """No --cuda-worker: the kit's own worker, through the driver-API fallback, against the stand-ins."""
    monkeypatch.setenv("LD_LIBRARY_PATH", str(libcuda))
    monkeypatch.setenv("FAKE_CUDA_REGISTRY", str(machine.registry))
    monkeypatch.setenv("FAKE_CUDA_TOTAL_MIB", "81920")
    out = machine.root / "report"
    code = main(["--acceptance", "--report-dir", str(out), "--allow-mps"])
    report = json.loads((out / "acceptance.json").read_text())
    checks = by_name(report)
    assert {name: c["status"] for name, c in checks.items()} == {
        "cards": "pass", "mig": "n/a", "process-attribution": "pass", "process-utilisation": "n/a",
        "guard-rails": "n/a", "mps": "pass"}, json.dumps(report, indent=1)[:4000]
    assert code == 0 and report["options"]["cudaWorker"] == "bundled"
    attribution = checks["process-attribution"]["details"]
    assert attribution["framework"] == "cuda" and attribution["kernels"] is False
    assert attribution["listedMib"] == 256 + 64 + 300  # the allocation, the busy buffer, the context
    assert "launches no kernels" in checks["process-utilisation"]["summary"]
    assert checks["guard-rails"]["summary"].startswith("not checked: PyTorch is not installed")
    assert "2048 MiB, set_default_device_pinned_mem_limit): 512 MiB allowed, 3072 MiB refused" in checks["mps"]["summary"]
    assert checks["mps"]["details"]["result"]["above"]["error"].endswith("CUDA_ERROR_OUT_OF_MEMORY (2)")
    assert_left_the_gpu_alone(machine)
    assert list(machine.registry.iterdir()) == [] or not any(
        alive(int(p.name.split(".")[0])) for p in machine.registry.iterdir())


def test_a_driver_that_cannot_start_cuda_fails(machine, libcuda, monkeypatch):
    monkeypatch.setenv("LD_LIBRARY_PATH", str(libcuda))
    monkeypatch.setenv("FAKE_CUDA_INIT_ERROR", "999")
    out = machine.root / "report"
    assert main(["--acceptance", "--report-dir", str(out), "--allow-mps"]) == 1
    checks = by_name(json.loads((out / "acceptance.json").read_text()))
    assert checks["process-attribution"]["status"] == "fail"
    assert checks["process-attribution"]["summary"].startswith(
        "the CUDA worker failed: CudaFailure: cuInit failed: CUDA_ERROR_UNKNOWN (999)")
    assert checks["mps"]["status"] == "fail" and "cuInit failed" in checks["mps"]["summary"]
    assert_left_the_gpu_alone(machine)


@pytest.mark.parametrize("path", KIT, ids=lambda p: p.name)
def test_the_kit_is_python_3_10(path):
    assert len(KIT) >= 8
    tree = ast.parse(path.read_text(), filename=str(path), feature_version=(3, 10))
    names = {node.id for node in ast.walk(tree) if isinstance(node, ast.Name)}
    attributes = {f"{node.value.id}.{node.attr}" for node in ast.walk(tree)
                  if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)}
    assert not names & {"ExceptionGroup", "BaseExceptionGroup", "Self", "tomllib"}
    assert not attributes & {"datetime.UTC", "typing.Self", "asyncio.TaskGroup", "enum.StrEnum"}
