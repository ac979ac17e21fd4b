"""CPU time of the fgd-filter batch alone (``fgd_batch.levels_of``): what one full re-scoring
costs after the learned mix's snapshot moves, on synthetic rows (no extender, no HTTP).

Rows: ``--rows`` nodes x ``--gpus`` cards, each card's free cores drawn from a used cluster's
values; a mix of five typical pods (shares and whole cards, some asking for CPU). Per CPU
headroom case (all unknown, all ample, a mix of binding and ample, all binding) and request (a share,
two whole cards) it prints the median and worst CPU time of ``--repeats`` calls, with the
per-row counts given (the extender memoises them per snapshot), as the filter calls it.

``--moves``: also time what a filter pays for every row after a snapshot move that keeps the
typical pods and changes their weights (``RequestColumns``: the kept columns re-weighed),
beside the batch's full re-scoring under the moved mix, checking their levels are identical.

``--compare PATH``: also load the ``fgd_batch.py`` at PATH (an earlier version, e.g. from
``git show main:plugin/vgpu_plugin/extender/fgd_batch.py``) and time both side by side, call
by call in turn, checking that their levels are identical.

Usage: python benchmarks/extender/time_fgd_batch.py [--rows 4000] [--gpus 8] [--repeats 30] [--compare PATH] [--moves]
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from types import ModuleType

import numpy as np
from vgpu_plugin.extender import fgd_batch

from jupyter_vgpu.core.contract import CORES_PER_CARD, Request
from jupyter_vgpu.core.fragment import Mix, Shape

MIX = Mix.of([(Shape(25, 16, 1, 2000), 3.0), (Shape(50, 32, 1, 4000), 2.0), (Shape(10, 8, 1, 0), 2.0),
              (Shape(CORES_PER_CARD, 0, 1, 8000), 1.0), (Shape(CORES_PER_CARD, 0, 2, 16_000), 0.5)])
REQUESTS = {"share 25 cores": (Request(25, 16), 2000), "2 whole cards": (Request(2 * CORES_PER_CARD), 16_000)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=4000)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--compare", metavar="PATH", help="another fgd_batch.py, timed side by side")
    parser.add_argument("--moves", action="store_true", help="also time the re-weighing after a snapshot move")
    args = parser.parse_args()
    versions = {"this": fgd_batch, **({"other": _load(args.compare)} if args.compare else {})}
    rng = np.random.default_rng(args.seed)
    used = rng.choice([0, 0, 0, 10, 25, 50, 75, 90, 100], size=(args.rows, args.gpus))
    free = (CORES_PER_CARD - used).astype(np.int64)
    memory = np.where(used == 100, 0, 64).astype(np.int64)
    whole = used == 0
    prepared = {}
    for label, module in versions.items():
        arrays = module.MixArrays(MIX)
        prepared[label] = (module, arrays, module.counts_of(free, arrays))
    admitted = np.ones((args.rows, len(MIX.shapes)), dtype=bool)
    ample = np.full(args.rows, 10**6, dtype=float)
    headrooms = {"CPU unknown": np.full(args.rows, np.nan), "CPU ample": ample,
                 "CPU binds on 1 row in 4": np.where(np.arange(args.rows) % 4 == 0, 20_000.0, ample),
                 # about bench_extender's cluster with its headroom fed (86 of 4,761 rows may bind)
                 "CPU binds on 1 row in 50": np.where(np.arange(args.rows) % 50 == 0, 20_000.0, ample),
                 # below 64 CPUs (what as many copies of each CPU-asking typical pod as 8 free
                 # cards hold ask): every row counts copies
                 "CPU binds on every row": np.full(args.rows, 40_000.0)}
    for case, cpu in headrooms.items():
        for name, (request, pod_cpu) in REQUESTS.items():
            times: dict[str, list[float]] = {label: [] for label in prepared}
            levels = {}
            for _ in range(args.repeats):
                for label, (module, arrays, counts) in prepared.items():  # in turn: the same load for both
                    start = time.process_time()
                    levels[label] = module.levels_of(free, memory, whole, cpu, admitted, request, pod_cpu, arrays,
                                                     counts)
                    times[label].append((time.process_time() - start) * 1000)
            line = "  ".join(f"{label} p50 {statistics.median(t):6.2f} max {max(t):6.2f} ms" for label, t in times.items())
            if args.compare:
                same = all(np.array_equal(a, b) for a, b in zip(levels["this"], levels["other"], strict=True))
                line += "  levels identical" if same else "  LEVELS DIFFER"
            print(f"{case:24} {name:15} {line}")
            if args.moves:
                print(f"{'':24} {'':15} {_moves(free, memory, whole, cpu, request, pod_cpu, args.repeats)}")


MOVED = Mix.of([(shape, weight * (1.5 if i % 2 else 0.7)) for i, (shape, weight) in enumerate(MIX.shapes)])


def _moves(free: np.ndarray, memory: np.ndarray, whole: np.ndarray, cpu: np.ndarray, request: Request,
           pod_cpu: int, repeats: int) -> str:
    """After a move between MIX and MOVED (and back), every row: the kept columns re-weighed
    against the batch from scratch under the new mix (its counts given, as the extender keeps them)."""
    rows = fgd_batch.NodeRows()
    for k in range(len(free)):
        rows.set(str(k), free[k].tolist(), memory[k].tolist(), whole[k].tolist())
        rows.set_cpu(k, float(cpu[k]))
    picked = np.arange(len(free))
    columns = fgd_batch.RequestColumns()
    snapshots = [fgd_batch.MixArrays(MIX), fgd_batch.MixArrays(MOVED)]
    counts = [fgd_batch.CountMemo(arrays) for arrays in snapshots]
    columns.levels("request", rows, picked, None, request, pod_cpu, snapshots[0], counts[0])  # first sight
    moved, batch = [], []
    for i in range(repeats):
        arrays, memo = snapshots[(i + 1) % 2], counts[(i + 1) % 2]
        start = time.process_time()
        level, fit = columns.levels("request", rows, picked, None, request, pod_cpu, arrays, memo)
        moved.append((time.process_time() - start) * 1000)
        start = time.process_time()
        want, want_fit = fgd_batch.levels_of(free, memory, whole, cpu, arrays.admit_all(len(free)), request, pod_cpu,
                                             arrays, memo.of(rows, picked))
        batch.append((time.process_time() - start) * 1000)
        if not (np.array_equal(fit, want_fit) and np.array_equal(level[fit], want[fit])):
            return "after a move: LEVELS DIFFER"
    return (f"after a move: re-weighed p50 {statistics.median(moved):6.2f} ms, "
            f"batch p50 {statistics.median(batch):6.2f} ms, levels identical")


def _load(path: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location("fgd_batch_compared", path)
    if spec is None or spec.loader is None:
        raise SystemExit(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


if __name__ == "__main__":
    main()
