"""CPU time of the fgd-filter batch alone (``fgd_batch.levels_of``): what one full re-scoring
costs after the learned mix's snapshot moves, on synthetic rows (no extender, no HTTP).

Rows: ``--rows`` nodes x ``--gpus`` cards, each card's free cores drawn from a used cluster's
values; a mix of five typical pods (shares and whole cards, some asking for CPU). Per CPU
headroom case (all unknown, all ample, a mix of binding and ample, all binding as in
bench_extender's cluster) and request (a share,
two whole cards) it prints the median and worst CPU time of ``--repeats`` calls, with the
per-row counts given (the extender memoises them per snapshot), as the filter calls it.

Usage: python benchmarks/extender/time_fgd_batch.py [--rows 4000] [--gpus 8] [--repeats 30]
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
from vgpu_plugin.extender.fgd_batch import MixArrays, counts_of, levels_of

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
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    used = rng.choice([0, 0, 0, 10, 25, 50, 75, 90, 100], size=(args.rows, args.gpus))
    free = (CORES_PER_CARD - used).astype(np.int64)
    memory = np.where(used == 100, 0, 64).astype(np.int64)
    whole = used == 0
    arrays = MixArrays(MIX)
    admitted = np.ones((args.rows, len(arrays.weight)), dtype=bool)
    counts = counts_of(free, arrays)
    ample = np.full(args.rows, 10**6, dtype=float)
    headrooms = {"CPU unknown": np.full(args.rows, np.nan), "CPU ample": ample,
                 "CPU binds on 1 row in 4": np.where(np.arange(args.rows) % 4 == 0, 20_000.0, ample),
                 # below 64 CPUs (what as many copies of each CPU-asking typical pod as 8 free
                 # cards hold ask), as in bench_extender's cluster: every row counts copies
                 "CPU binds on every row": np.full(args.rows, 40_000.0)}
    for case, cpu in headrooms.items():
        for name, (request, pod_cpu) in REQUESTS.items():
            times = []
            for _ in range(args.repeats):
                start = time.process_time()
                levels_of(free, memory, whole, cpu, admitted, request, pod_cpu, arrays, counts)
                times.append((time.process_time() - start) * 1000)
            print(f"{case:24} {name:15} p50 {statistics.median(times):6.2f} ms  max {max(times):6.2f} ms")


if __name__ == "__main__":
    main()
