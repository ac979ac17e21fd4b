"""Stand-ins for a GPU machine, for ``jupyter-vgpu doctor --acceptance`` on a build machine without one.

- NVML: tests/gpu/fake_pynvml.py (nvidia-ml-py's own process-query wrappers over a stand-in
  driver), whose cards list the processes registered in a directory: a file ``<pid>.json``
  (card UUID, MiB, utilisation) per live process, written by the fake CUDA worker. Every NVML
  function that changes something (``nvmlDeviceSet*``, ``*Create*``, ``*Destroy*``, ``*Reset*``,
  ``*Clear*``, as the installed nvidia-ml-py names them) is replaced by a recorder.
- ``nvidia-smi``: a script on PATH answering ``--query-gpu`` and ``-L`` from what the fake NVML
  says (or what a test makes it say), logging every invocation.
- ``nvidia-cuda-mps-control``: a script keeping a private daemon's state (running, the limits
  sent) in its pipe directory, logging every invocation.
- the CUDA worker (``--cuda-worker``): a script that speaks the worker protocol of
  vgpu_plugin/doctor/acceptance_cuda.py, registers its PID with the fake NVML, and obeys the
  limits the fake MPS daemon holds; ``FAKE_WORKER`` (comma-separated words) bends it.
"""

from __future__ import annotations

import importlib.util
import json
import re
import shlex
import shutil
import subprocess
import sys
import types
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pynvml


def _load_fake_pynvml() -> types.ModuleType:
    """tests/gpu/fake_pynvml.py (one module per session, whichever test area imports it first)."""
    if "fake_pynvml" in sys.modules:
        return sys.modules["fake_pynvml"]
    spec = importlib.util.spec_from_file_location("fake_pynvml", Path(__file__).parents[1] / "gpu" / "fake_pynvml.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["fake_pynvml"] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


fake_pynvml = _load_fake_pynvml()
MUTATOR = re.compile(r"(?:Set|Create|Destroy|Reset|Clear)(?=[A-Z_]|$)")


def mutating_functions() -> list[str]:
    """The installed nvidia-ml-py's functions that change a GPU, a MIG layout or the driver's state."""
    return sorted(name for name in dir(pynvml)
                  if name.startswith("nvml") and not name.startswith(("nvmlEventSet", "nvmlSystemEventSet"))
                  and callable(getattr(pynvml, name)) and MUTATOR.search(name[4:]))


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
            return handle.read().rsplit(")", 1)[1].split()[0] != "Z"  # a zombie has released its context
    except (OSError, IndexError):
        return False


@dataclass(eq=False)
class RegisteredCard(fake_pynvml.FakeCard):
    """A stand-in card whose processes are the live ones registered for its UUID."""

    registry: Path | None = None

    def running(self, family: str) -> list[tuple[int, int]]:
        self.refresh()
        return list(super().running(family))

    def refresh(self) -> None:
        if self.registry is None:
            return
        processes, busy = {}, {}
        for entry in sorted(self.registry.glob("*.json")):
            pid = int(entry.stem)
            try:
                data = json.loads(entry.read_text())
            except (OSError, ValueError):
                continue
            if data["uuid"] == self.uuid and _alive(pid):
                processes[pid] = int(data["mib"])
                if data.get("util"):
                    busy[pid] = int(data["util"])
        self.processes, self.process_util = processes, busy
        self.used_mib = sum(processes.values())


FAKE_SMI = '''
import json, sys
STATE, LOG = {state!r}, {log!r}
args = sys.argv[1:]
with open(LOG, "a") as log:
    log.write(json.dumps(args) + "\\n")
with open(STATE) as handle:
    state = json.load(handle)
if args == ["-L"]:
    for gpu in state["gpus"]:
        print(f"GPU {{gpu['index']}}: {{gpu['name']}} (UUID: {{gpu['uuid']}})")
        for mig in gpu["migDevices"]:
            print(f"  MIG {{mig['profile']:<11}} Device {{mig['device']:>2}}: (UUID: {{mig['uuid']}})")
elif len(args) == 2 and args[0].startswith("--query-gpu=") and args[1].startswith("--format=csv,noheader"):
    fields = args[0].split("=", 1)[1].split(",")
    for gpu in state["gpus"]:
        print(", ".join(str({{"driver_version": state["driver"]}}.get(f, gpu.get(f, "[N/A]"))) for f in fields))
else:
    print("the stand-in nvidia-smi only answers queries", file=sys.stderr)
    sys.exit(2)
'''

FAKE_MPS_CONTROL = '''
import json, os, sys
LOG = {log!r}
pipe = os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "/tmp/nvidia-mps")
path = os.path.join(pipe, "fake-mps.json")
args = sys.argv[1:]
command = "" if args else sys.stdin.read().strip()
with open(LOG, "a") as log:
    log.write(json.dumps({{"args": args, "command": command, "pipe": pipe,
                          "log": os.environ.get("CUDA_MPS_LOG_DIRECTORY")}}) + "\\n")
state = json.load(open(path)) if os.path.exists(path) else {{"running": False}}
if args == ["-d"]:
    if state["running"]:
        print("An instance of this daemon is already running", file=sys.stderr)
        sys.exit(1)
    state = {{"running": True, "limits": {{}}, "threads": None}}
elif not state["running"]:
    print("Cannot find MPS control daemon process", file=sys.stderr)
    sys.exit(1)
elif command.startswith("set_default_device_pinned_mem_limit "):
    _, device, value = command.split()
    state["limits"][device] = value
elif command.startswith("set_default_active_thread_percentage "):
    state["threads"] = int(command.split()[1])
elif command == "get_server_list":
    print(4242)
elif command == "quit":
    state["running"] = False
else:
    sys.exit(1)
with open(path, "w") as handle:
    json.dump(state, handle)
limit_file = os.path.join(pipe, "pinned-limit-mib")  # what the stand-in libcuda reads as a client
limits = [int(v[:-1]) * (1024 if v.endswith("G") else 1) for v in state.get("limits", {{}}).values()]
if state["running"] and limits:
    with open(limit_file, "w") as handle:
        handle.write(str(min(limits)))
elif os.path.exists(limit_file):
    os.unlink(limit_file)
'''

FAKE_WORKER = '''
import argparse, json, os, signal, sys, time
REGISTRY, PIDS = {registry!r}, {pids!r}
parser = argparse.ArgumentParser()
parser.add_argument("mode")
for flag in ("--mib", "--total-mib", "--below", "--above"):
    parser.add_argument(flag, type=int, default=0)
parser.add_argument("--seconds", type=float, default=8.0)
parser.add_argument("--exit-on-eof", action="store_true")
args = parser.parse_args()
bends = set(filter(None, os.environ.get("FAKE_WORKER", "").split(",")))
mine = os.path.join(REGISTRY, f"{{os.getpid()}}.json")
with open(PIDS, "a") as handle:
    handle.write(f"{{args.mode}} {{os.getpid()}}\\n")


def emit(event, **fields):
    print(json.dumps({{"event": event, **fields}}), flush=True)


def leave(*_):
    if os.path.exists(mine):
        os.unlink(mine)
    sys.exit(0)


signal.signal(signal.SIGTERM, leave)
if "hang" in bends:
    time.sleep(600)
if args.mode == "hold":
    print("a framework's chatter on stdout", flush=True)
    if "unlisted" not in bends:
        with open(mine + ".tmp", "w") as handle:  # written whole, then renamed: the fake NVML never reads half
            json.dump({{"uuid": os.environ["CUDA_VISIBLE_DEVICES"], "mib": args.mib + 305,
                       "util": 0 if "idle" in bends else 42}}, handle)
        os.rename(mine + ".tmp", mine)
    emit("ready", pid=os.getpid(), framework="fake", version="0", kernels="no-kernels" not in bends,
         allocatedMib=args.mib, smCount=108)
    time.sleep(args.seconds)
    emit("done")
    leave()
elif args.mode == "guard":
    if "no-torch" in bends:
        emit("unavailable", reason="PyTorch is not installed")
        sys.exit(3)
    share = int(os.environ["VGPU_MEMORY_MIB"])
    fraction = share / args.total_mib
    above = {{"ok": True}} if "guard-leaks" in bends else {{
        "ok": False, "refused": True, "error": "OutOfMemoryError: CUDA out of memory (stand-in)"}}
    emit("result", framework="torch", version="2.5.0+stand-in",
         guard={{"state": "in force", "detail": f"set_per_process_memory_fraction({{fraction:.3f}}) on 1 device(s)"}},
         shareMib=share, belowMib=share // 2, aboveMib=share + 1024, freeMib=args.total_mib - 600,
         below={{"ok": True}}, above=above)
elif args.mode == "alloc":
    pipe = os.environ.get("CUDA_MPS_PIPE_DIRECTORY", "")
    path = os.path.join(pipe, "fake-mps.json")
    state = json.load(open(path)) if pipe and os.path.exists(path) else {{"running": False}}
    limits = [int(v[:-1]) * (1024 if v.endswith("G") else 1) for v in state.get("limits", {{}}).values()]
    held = state["running"] and limits and "mps-leaks" not in bends
    above = {{"ok": False, "refused": True, "error": "CudaFailure: CUDA_ERROR_OUT_OF_MEMORY (2)"}} \\
        if held and args.above > min(limits) else {{"ok": True}}
    emit("result", framework="fake", version="0", belowMib=args.below, aboveMib=args.above, freeMib=70000,
         smCount=54, below={{"ok": True}}, above=above)
'''


def smi_state(nv: Any) -> dict[str, Any]:
    """What nvidia-smi prints for the stand-in cards: the same as the fake NVML says."""
    gpus = []
    for card in nv.cards:
        mode = {None: "[N/A]", 0: "Disabled", 1: "Enabled"}
        current = mode[card.mig[0]] if card.mig else "[N/A]"
        pending = mode[card.mig[1]] if card.mig else "[N/A]"
        devices = [{"profile": _profile(card, d), "device": d.slot, "uuid": d.uuid} for d in card.mig_devices
                   if card.mig and card.mig[0]]
        gpus.append({"index": str(card.index), "uuid": card.uuid, "name": card.name,
                     "memory.total": str(card.total_mib), "mig.mode.current": current,
                     "mig.mode.pending": pending, "migDevices": devices})
    return {"driver": nv.nvmlSystemGetDriverVersion(), "gpus": gpus}


def _profile(card: Any, device: Any) -> str:
    for name, slices, _, memory in card.profiles.values():
        if slices == device.gi_slices and memory == device.memory_mib:
            return str(name)
    return f"{device.gi_slices}g"


@dataclass
class StandIn:
    """A stand-in GPU machine under ``root``: ``bin`` (for PATH), the registry, the logs."""

    root: Path
    nv: Any
    bin: Path = field(init=False)
    registry: Path = field(init=False)
    smi_log: Path = field(init=False)
    smi_json: Path = field(init=False)
    mps_log: Path = field(init=False)
    pids: Path = field(init=False)

    def __post_init__(self) -> None:
        self.bin, self.registry = self.root / "bin", self.root / "registry"
        self.bin.mkdir()
        self.registry.mkdir()
        self.smi_log, self.smi_json = self.root / "nvidia-smi.log", self.root / "nvidia-smi.json"
        self.mps_log, self.pids = self.root / "mps-control.log", self.root / "worker-pids"
        self.smi_log.touch()
        self.mps_log.touch()
        self.pids.touch()
        for card in self.nv.cards:
            card.registry = self.registry
        self.smi_says(smi_state(self.nv))
        self._script("nvidia-smi", FAKE_SMI.format(state=str(self.smi_json), log=str(self.smi_log)))
        self._script("nvidia-cuda-mps-control", FAKE_MPS_CONTROL.format(log=str(self.mps_log)))
        self._script("fake-cuda-worker", FAKE_WORKER.format(registry=str(self.registry), pids=str(self.pids)))

    def _script(self, name: str, body: str) -> None:
        path = self.bin / name
        path.write_text(f"#!{sys.executable}\n{body}")
        path.chmod(0o755)

    def smi_says(self, state: dict[str, Any]) -> None:
        self.smi_json.write_text(json.dumps(state))

    @property
    def worker(self) -> str:
        """The ``--cuda-worker`` command."""
        return shlex.join([sys.executable, str(self.bin / "fake-cuda-worker")])

    def worker_pids(self) -> dict[str, list[int]]:
        found: dict[str, list[int]] = {}
        for line in self.pids.read_text().splitlines():
            mode, pid = line.split()
            found.setdefault(mode, []).append(int(pid))
        return found

    def smi_calls(self) -> list[list[str]]:
        return [json.loads(line) for line in self.smi_log.read_text().splitlines()]

    def mps_calls(self) -> list[dict[str, Any]]:
        return [json.loads(line) for line in self.mps_log.read_text().splitlines()]


def alive(pid: int) -> bool:
    return _alive(pid)


def stand_in_library(cards: list[Any] | None = None) -> Any:
    """The fake pynvml over registry-backed cards, with compute mode, versions and set-function recorders."""
    if cards is None:
        cards = [RegisteredCard(**{f: getattr(c, f) for f in ("index", "uuid", "name", "total_mib", "bus_id", "numa",
                                                                 "nvlinks")})
                 for c in fake_pynvml.default_cards()]
    nv = fake_pynvml.make_module(cards=cards)
    nv.nvmlSystemGetNVMLVersion = lambda: "12.550.54.15"
    nv.nvmlSystemGetCudaDriverVersion = lambda: 12040
    nv.nvmlDeviceGetComputeMode = lambda handle: 0  # NVML_COMPUTEMODE_DEFAULT
    nv.set_calls = []

    def recorder(name: str) -> Any:
        def call(*args: Any) -> None:
            nv.set_calls.append((name, args))
            raise AssertionError(f"the acceptance kit called {name}")

        return call

    for name in mutating_functions():
        setattr(nv, name, recorder(name))
    return nv


# A stand-in libcuda.so.1 for the bundled worker's driver-API fallback (acceptance_cuda.DriverAPI):
# the entry points it calls, with the C signatures of cuda.h. A context registers the process with
# the fake NVML (its memory: what it allocated, plus 300 MiB of context); memory is limited to
# FAKE_CUDA_TOTAL_MIB, or under the stand-in MPS daemon to the pinned-memory limit it holds.
FAKE_LIBCUDA = r"""
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef int CUresult;
static int initialised, has_context;
static size_t used, limit;
static struct { uint64_t ptr; size_t size; } blocks[256];

static void publish(void) {
    const char *dir = getenv("FAKE_CUDA_REGISTRY"), *uuid = getenv("CUDA_VISIBLE_DEVICES");
    char path[4096], tmp[4200];
    FILE *out;
    if (!dir || !uuid) return;
    snprintf(path, sizeof path, "%s/%d.json", dir, (int)getpid());
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    if (!(out = fopen(tmp, "w"))) return;
    fprintf(out, "{\"uuid\": \"%s\", \"mib\": %zu, \"util\": 0}", uuid, (used >> 20) + 300);
    fclose(out);
    rename(tmp, path);
}

CUresult cuInit(unsigned int flags) {
    const char *error = getenv("FAKE_CUDA_INIT_ERROR");
    if (error) return atoi(error);
    initialised = 1;
    return 0;
}
CUresult cuDriverGetVersion(int *version) { *version = 12040; return 0; }
CUresult cuDeviceGet(int *device, int ordinal) {
    if (!initialised) return 3;          /* CUDA_ERROR_NOT_INITIALIZED */
    if (ordinal != 0) return 101;        /* CUDA_ERROR_INVALID_DEVICE */
    *device = 0;
    return 0;
}
CUresult cuCtxCreate_v2(void **context, unsigned int flags, int device) {
    const char *total = getenv("FAKE_CUDA_TOTAL_MIB"), *pipe = getenv("CUDA_MPS_PIPE_DIRECTORY");
    char path[4096];
    FILE *in;
    long mib = 0;
    limit = (size_t)(total ? atol(total) : 1024) << 20;
    if (pipe) {
        snprintf(path, sizeof path, "%s/pinned-limit-mib", pipe);
        if ((in = fopen(path, "r"))) {
            if (fscanf(in, "%ld", &mib) == 1 && ((size_t)mib << 20) < limit) limit = (size_t)mib << 20;
            fclose(in);
        }
    }
    has_context = 1;
    *context = &has_context;
    publish();
    return 0;
}
CUresult cuCtxSynchronize(void) { return has_context ? 0 : 201; }
CUresult cuMemAlloc_v2(uint64_t *pointer, size_t size) {
    int i;
    if (!has_context) return 201;        /* CUDA_ERROR_INVALID_CONTEXT */
    if (used + size > limit) return 2;   /* CUDA_ERROR_OUT_OF_MEMORY */
    for (i = 0; i < 256 && blocks[i].size; i++) {}
    if (i == 256) return 2;
    used += size;
    blocks[i].ptr = 0x100000000ull * (i + 1);
    blocks[i].size = size;
    *pointer = blocks[i].ptr;
    publish();
    return 0;
}
CUresult cuMemFree_v2(uint64_t pointer) {
    int i;
    for (i = 0; i < 256; i++) {
        if (blocks[i].size && blocks[i].ptr == pointer) {
            used -= blocks[i].size;
            blocks[i].size = 0;
            publish();
            return 0;
        }
    }
    return 1;                            /* CUDA_ERROR_INVALID_VALUE */
}
CUresult cuMemsetD32_v2(uint64_t pointer, unsigned int value, size_t count) { return has_context ? 0 : 201; }
CUresult cuMemGetInfo_v2(size_t *free, size_t *total) { *free = limit - used; *total = limit; return 0; }
CUresult cuDeviceGetAttribute(int *value, int attribute, int device) { *value = attribute == 16 ? 108 : 0; return 0; }
CUresult cuGetErrorName(CUresult error, const char **name) {
    *name = error == 2 ? "CUDA_ERROR_OUT_OF_MEMORY" : error == 999 ? "CUDA_ERROR_UNKNOWN" : "CUDA_ERROR_OTHER";
    return 0;
}
"""


def build_fake_libcuda(directory: Path) -> Path | None:
    """Compile the stand-in libcuda.so.1 into ``directory``; None without a C compiler."""
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        return None
    source = directory / "fake_libcuda.c"
    source.write_text(FAKE_LIBCUDA)
    library = directory / "libcuda.so.1"
    subprocess.run([compiler, "-shared", "-fPIC", "-O1", "-o", str(library), str(source)], check=True,
                   capture_output=True, timeout=120)
    return library
