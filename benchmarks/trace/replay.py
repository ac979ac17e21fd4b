"""Replay Alibaba's openb GPU-sharing trace the way the FGD paper's simulator does.

Tasks are submitted in the simulator's inflation order (the trace, topped up with random
copies of its own tasks to 130 % of the cluster's GPU capacity, then shuffled by seed), no
task ever departs, and the percentage of GPU capacity left unallocated is recorded when
the arrived GPU requests reach 90/100/110/130 % of capacity. See README.md.

Policies: the simulator's own (FGD, BestFit, DotProduct, GpuPacking, GpuClustering,
Random), each the only scorer, ties broken at random as kube-scheduler does; and this
project's extender policies (binpack, fragment) scored as deployed: the extender's 0-10
score x weight x 10 added to kube-scheduler's default NodeResourcesFit (LeastAllocated)
and NodeResourcesBalancedAllocation scores.
Research rows (README "Second round"): FGD-copies (FGD's measure with a typical pod
counted as many times as the node's free CPU hosts it) and FGD-copies-deployed (the same as
extender levels over a MostAllocated profile). Third round: fgd-filter, the same measure with
typical pods learned online (core MixLearner, by count, with node selectors) and the node
chosen by the extender's filter (the best FGD score, first of list on ties), as deployed.
``--learn filter`` learns as the extender did before issue 32 (every pod its filter is asked
about) and ``--hostile N`` adds a namespace of N pending pods that never fit (README "A hostile
namespace").

    .venv/bin/python benchmarks/trace/replay.py --trace default --seeds 42 43 --policies FGD fragment
"""

from __future__ import annotations

import argparse
import csv
import math
import statistics
import sys
import time
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "plugin")]

from jupyter_vgpu.core.fgd import FGD_BLEND, FGD_CAPACITY, FGD_DECAY, drifted  # noqa: E402
from jupyter_vgpu.core.fragment import Mix, MixLearner, Shape  # noqa: E402
from jupyter_vgpu.core.placement import FRAGMENT_PACKING, FRAGMENT_SPAN  # noqa: E402

DATA = Path(__file__).resolve().parent / "data"
MILESTONES = (0.9, 1.0, 1.1, 1.3)
G = 8  # most cards per node in the trace
MAX_CPU, MAX_GPU = 128000, 8000  # the simulator's normalisation constants (BestFit, DotProduct)
# Card memory per model in GiB, from the vendors' public specifications (README.md).
# G2 and G3 are anonymised in the trace; both are taken as 32 GiB cards.
CARD_GIB = {"P100": 16, "T4": 16, "V100M16": 16, "V100M32": 32, "A10": 24, "G2": 32, "G3": 32}
UNIT_MIB = 256
SIM_POLICIES = ("FGD", "BestFit", "DotProduct", "GpuPacking", "GpuClustering", "Random")
OUR_POLICIES = ("binpack", "fragment")
# Research rows (README.md, "Second round"): FGD's measure with a typical pod counted as many
# times as the node's free CPU can host it, alone and first of list (as FGD), and the same
# measure as an extender could deploy it (11 levels x weight over a MostAllocated profile).
COPIES_POLICIES = ("FGD-copies", "FGD-copies-deployed")
# Third round (README.md): the same measure as an extender's filter would deploy it, with the
# typical pods learned online (core MixLearner, by count, per GPU model) from the GPU tasks seen
# so far; the filter returns only its best node (FGD's 0-100 score, first in node order on ties),
# so kube-scheduler does not score.
FILTER_POLICIES = ("fgd-filter",)
FILTER_CAPACITY, FILTER_DECAY = FGD_CAPACITY, FGD_DECAY
SEEN_PODS = 4096  # the extender's: how many pod uids a learned mix remembers having counted
# A hostile namespace's pending pods (README "A hostile namespace"): a 10 % share asking 40 GiB,
# more than any card of the trace has (32 GiB at most) but not than a node's cards together, so
# kube-scheduler's own resource fit passes them to the extender, which never places one; and 32
# CPUs, so that, learned, it would make every node with less CPU free look fragmented.
HOSTILE_MILLI, HOSTILE_UNITS, HOSTILE_CPU, HOSTILE_MEM = 100, 40 * 1024 // UNIT_MIB, 32_000, 1024
HOSTILE_SHAPE = Shape(HOSTILE_MILLI // 10, 0, 1, HOSTILE_CPU)


@dataclass
class Cluster:
    models: list[str]
    model: np.ndarray  # [N] model index
    cpu_cap: np.ndarray
    mem_cap: np.ndarray
    ngpu: np.ndarray
    unit_cap: np.ndarray  # [N] memory units per card

    @property
    def gpu_milli(self) -> int:
        return int(self.ngpu.sum()) * 1000


@dataclass
class Tasks:
    cpu: np.ndarray
    mem: np.ndarray
    num: np.ndarray  # cards
    milli: np.ndarray  # per card (1000 for whole cards, 0 for CPU-only)
    units: np.ndarray  # vcuda-memory units per share (whole cards: 0)
    access: np.ndarray  # [n, models] bool: the task may run on this model
    key: list[tuple[int, int, int, str]]  # (cpu, milli, num, spec): the simulator's typical-pod key


def load_cluster() -> Cluster:
    rows = list(csv.DictReader(open(DATA / "openb_node_list_gpu_node.csv")))
    models = sorted({r["model"] for r in rows})
    return Cluster(
        models,
        np.array([models.index(r["model"]) for r in rows]),
        np.array([int(r["cpu_milli"]) for r in rows], dtype=np.int64),
        np.array([int(r["memory_mib"]) for r in rows], dtype=np.int64),
        np.array([int(r["gpu"]) for r in rows]),
        np.array([CARD_GIB[r["model"]] * 1024 // UNIT_MIB for r in rows]),
    )


def load_tasks(trace: str, cluster: Cluster) -> list[dict[str, str]]:
    return list(csv.DictReader(open(DATA / f"openb_pod_list_{trace}.csv")))


def build_tasks(rows: list[dict[str, str]], cluster: Cluster) -> Tasks:
    n = len(rows)
    access = np.ones((n, len(cluster.models)), dtype=bool)
    units = np.zeros(n, dtype=np.int64)
    keys = []
    for i, r in enumerate(rows):
        spec = r.get("gpu_spec", "") or ""
        if spec:
            allowed = set(spec.split("|"))
            access[i] = [m in allowed for m in cluster.models]
        milli = int(r["gpu_milli"]) if int(r["num_gpu"]) > 0 else 0
        if 0 < milli < 1000:  # a share's memory: its fraction of the smallest card it may use
            gib = min(CARD_GIB[m] for m, ok in zip(cluster.models, access[i], strict=True) if ok)
            units[i] = math.ceil(milli * gib * 1024 / 1000 / UNIT_MIB)
        keys.append((int(r["cpu_milli"]), milli, int(r["num_gpu"]), spec))
    num = np.array([int(r["num_gpu"]) for r in rows])
    milli = np.array([int(r["gpu_milli"]) if int(r["num_gpu"]) > 0 else 0 for r in rows])
    milli = np.where(num > 1, 1000, milli)
    return Tasks(np.array([int(r["cpu_milli"]) for r in rows], dtype=np.int64),
                 np.array([int(r["memory_mib"]) for r in rows], dtype=np.int64), num, milli, units, access, keys)


def inflate(rows: list[dict[str, str]], cluster: Cluster, seed: int) -> list[dict[str, str]]:
    """The trace topped up with random copies to 130 % of GPU capacity, then shuffled."""
    rng = np.random.default_rng(seed)

    def gpu(r: dict[str, str]) -> int:
        return int(r["num_gpu"]) * (int(r["gpu_milli"]) if int(r["num_gpu"]) == 1 else 1000)

    out = list(rows)
    total, target = sum(gpu(r) for r in out), MILESTONES[-1] * cluster.gpu_milli
    while True:
        r = rows[int(rng.integers(len(rows)))]
        if total + gpu(r) > target:
            break
        out.append(r)
        total += gpu(r)
    order = rng.permutation(len(out))
    return [out[i] for i in order]


def typical_pods(tasks: Tasks, cluster: Cluster, threshold: float = 0.95):
    """The simulator's typical pods: the most frequent task shapes covering 95 % of tasks."""
    counts: dict[tuple[int, int, int, str], int] = {}
    first: dict[tuple[int, int, int, str], int] = {}
    for i, k in enumerate(tasks.key):
        counts[k] = counts.get(k, 0) + 1
        first.setdefault(k, i)
    ordered = sorted(counts.items(), key=lambda kv: -kv[1])
    total, kept, cum = len(tasks.key), [], 0
    for k, c in ordered:
        if cum >= threshold * total:
            break
        kept.append((k, c))
        cum += c
    w = np.array([c for _, c in kept], dtype=float)
    w /= w.sum()
    idx = [first[k] for k, _ in kept]
    return (w, tasks.cpu[idx], tasks.milli[idx], np.maximum(tasks.num[idx], 1),
            tasks.access[idx][:, cluster.model].T)  # access [N, T]


class State:
    def __init__(self, cluster: Cluster, project_units: bool):
        n = len(cluster.model)
        present = np.arange(G)[None, :] < cluster.ngpu[:, None]
        self.c = cluster
        self.present = present
        self.cores = np.where(present, 100, -1).astype(np.int64)  # per card, vcuda-core (milli / 10)
        self.units = np.where(present, cluster.unit_cap[:, None], -1).astype(np.int64)
        self.cpu = cluster.cpu_cap.copy()
        self.mem = cluster.mem_cap.copy()
        self.project_units = project_units
        self.affinity: list[dict[int, int]] = [{} for _ in range(n)]  # GpuClustering
        self.allocated = 0

    def free_whole(self) -> np.ndarray:
        return ((self.cores == 100) & (self.units == self.c.unit_cap[:, None])).sum(1)


# --- the simulator's policies ----------------------------------------------------------------


def fgd_frag(left: np.ndarray, cpu: np.ndarray, typ, access: np.ndarray) -> np.ndarray:
    """FGD's node fragment (milli-GPU): left [K,G] milli, cpu [K], access [K,T]."""
    w, tcpu, tmilli, tnum, _ = typ
    left = np.maximum(left, 0)
    total = left.sum(1)
    fit = left[:, None, :] >= tmilli[None, :, None]  # [K,T,G]
    small = (left[:, None, :] * ~fit).sum(2)
    ok = access & (fit.sum(2) >= tnum[None, :]) & (cpu[:, None] >= tcpu[None, :]) & (tmilli[None, :] > 0)
    return (np.where(ok, small, total[:, None]) * w[None, :]).sum(1)


def fgd_frag_each_card(left: np.ndarray, milli: int, cpu: np.ndarray, typ, access: np.ndarray) -> np.ndarray:
    """[K,G]: FGD's node fragment after ``milli`` is taken from card g (only that card changes)."""
    w, tcpu, tmilli, tnum, _ = typ
    left = np.maximum(left, 0)
    new = np.maximum(left - milli, 0)
    fit = left[:, None, :] >= tmilli[None, :, None]  # [K,T,G]
    fit2 = new[:, None, :] >= tmilli[None, :, None]
    cnt = fit.sum(2, keepdims=True) - fit + fit2
    small = (left[:, None, :] * ~fit).sum(2, keepdims=True) - left[:, None, :] * ~fit + new[:, None, :] * ~fit2
    total = left.sum(1)[:, None] - left + new  # [K,G]
    ok = (access & (cpu[:, None] >= tcpu[None, :]) & (tmilli[None, :] > 0))[:, :, None] & (cnt >= tnum[None, :, None])
    return (np.where(ok, small, total[:, None, :]) * w[None, :, None]).sum(1)


def _distinct(st: State, nodes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Nodes in identical states score identically: one representative each, and the map back."""
    key = np.column_stack((st.c.model[nodes], st.c.cpu_cap[nodes], st.c.mem_cap[nodes], st.cpu[nodes],
                           st.mem[nodes], st.cores[nodes], st.units[nodes]))
    _, first, inverse = np.unique(key, axis=0, return_index=True, return_inverse=True)
    return nodes[first], inverse.reshape(-1)


def sim_choose(policy: str, st: State, t: int, tasks: Tasks, nodes: np.ndarray, rng, typ, frag_cache) -> tuple[int, list[int]]:
    """(node, cards) chosen by one of the simulator's policies among feasible ``nodes``."""
    if policy == "FGD":
        reps, back = _distinct(st, nodes)
        score, cards = _fgd(st, t, tasks, reps, typ, frag_cache)
        i = _pick_first(score[back], rng)  # the first node in the list among the best
        return int(nodes[i]), cards[back[i]]
    milli, num, cpu = int(tasks.milli[t]), int(tasks.num[t]), int(tasks.cpu[t])
    left = st.cores[nodes] * 10  # milli per card, -10 absent
    share = 0 < milli < 1000
    total_left = np.maximum(left, 0).sum(1)
    if policy == "BestFit":
        raw = 0.5 * (st.cpu[nodes] - cpu) / MAX_CPU + 0.5 * (total_left - milli * num) / MAX_GPU
        score = ((1 - raw) * 100).astype(int)
    elif policy == "Random":
        score = rng.random(len(nodes))
    elif policy == "GpuPacking":
        free = (left == 1000).sum(1)
        ngpu = st.c.ngpu[nodes]
        if num == 0:
            score = np.zeros(len(nodes), dtype=int)
        else:
            srt = np.sort(np.where(left >= milli, left, 10**9), axis=1)[:, :num]
            use_free = (srt == 1000).sum(1)
            case1 = np.maximum(100 - ((srt * 100 // 1000).sum(1)) // 10, 50)
            case2 = np.maximum(50 - use_free, 33)
            score = np.where(free == ngpu, np.maximum(33 - free, free), np.where(use_free > 0, case2, case1))
    elif policy == "GpuClustering":
        if num == 0:
            score = np.zeros(len(nodes), dtype=int)
        else:
            aff = milli if share else 1000 * num
            base = 25 * (MAX_GPU - total_left) // MAX_GPU
            same = np.array([st.affinity[n].get(aff, 0) > 0 for n in nodes])
            kinds = np.array([len(st.affinity[n]) for n in nodes])
            score = base + np.where(same, np.where(kinds == 1, 75, 50), np.where(kinds == 0, 25, 0))
    elif policy == "DotProduct":
        # Tetris: node free vector and pod demand, normalised by the largest spec; the
        # simulator scores 1 - dot / dims for the best-matching card
        if num == 0 or not share:
            dot = (st.cpu[nodes] / MAX_CPU) * (cpu / MAX_CPU) + (total_left / MAX_GPU) * (milli * num / MAX_GPU)
        else:
            per_card = np.where(left >= milli, left, 10**9).min(1)
            dot = (st.cpu[nodes] / MAX_CPU) * (cpu / MAX_CPU) + (per_card / 1000) * (milli / 1000)
        score = ((1 - dot / 2) * 100).astype(int)
    else:
        raise ValueError(policy)
    i = _pick_first(score, rng)
    node = int(nodes[i])
    return node, _best_fit_cards(st, node, milli, num, tasks, t)


def _fgd(st: State, t: int, tasks: Tasks, nodes: np.ndarray, typ, frag_cache) -> tuple[np.ndarray, list[list[int]]]:
    """FGD's score of each node (0-100, the fragment decrease through a sigmoid) and its card(s)."""
    milli, num, cpu = int(tasks.milli[t]), int(tasks.num[t]), int(tasks.cpu[t])
    left = st.cores[nodes] * 10  # milli per card, -10 absent

    def scored(after: np.ndarray) -> np.ndarray:
        before = frag_cache[nodes] if after.ndim == 1 else frag_cache[nodes][:, None]
        return (100 / (1 + np.exp(-(before - after) / 1000))).astype(int)

    if num == 0:
        return scored(fgd_frag(left, st.cpu[nodes] - cpu, typ, typ[4][nodes])), [[] for _ in nodes]
    if milli < 1000:
        need_u = int(tasks.units[t]) if st.project_units else 0
        ok = (left >= milli) & (st.units[nodes] >= need_u)
        sc = np.where(ok, scored(fgd_frag_each_card(left, milli, st.cpu[nodes] - cpu, typ, typ[4][nodes])), -1)
        return sc.max(1), [[int(g)] for g in sc.argmax(1)]  # the first card of the node's best score
    trial = left.copy()
    cards = _first_free(left, num)
    trial[np.arange(len(nodes))[:, None], cards] = 0
    return scored(fgd_frag(trial, st.cpu[nodes] - cpu, typ, typ[4][nodes])), [[int(g) for g in c] for c in cards]


def _pick_index(score: np.ndarray, rng) -> int:
    """kube-scheduler's selectHost: a node of the highest score, ties at random."""
    top = np.flatnonzero(score == score.max())
    return int(top[rng.integers(len(top))]) if len(top) > 1 else int(top[0])


def _pick_first(score: np.ndarray, rng) -> int:
    """The simulator's choice among equal scores, as calibrated against its published figures:
    the first node in the node list (random ties make its FGD leave twice the idle GPUs)."""
    return int(np.argmax(score))


def _first_free(left: np.ndarray, num: int) -> np.ndarray:
    """[K, num]: the lowest-index free cards of each node (the node is known to have them)."""
    order = np.argsort(~(left == 1000), axis=1, kind="stable")
    return order[:, :num]


def _best_fit_cards(st: State, node: int, milli: int, num: int, tasks: Tasks, t: int) -> list[int]:
    if num == 0:
        return []
    cores, units = st.cores[node], st.units[node]
    if milli < 1000:
        need_u = int(tasks.units[t]) if st.project_units else 0
        ok = (cores * 10 >= milli) & (units >= need_u)
        left = np.where(ok, cores, 10**9)
        return [int(np.argmin(left))]
    free = np.flatnonzero((cores == 100) & (units == st.c.unit_cap[node]))
    return [int(g) for g in free[:num]]


# --- FGD's measure with CPU-counted copies (research, README.md "Second round") ---------------


def _copies_per_card(left: np.ndarray, typ) -> tuple[np.ndarray, np.ndarray]:
    """[K,T,G]: the milli of each card a typical pod could use (FGD: all of it if the pod fits),
    and whether it fits."""
    _, _, tmilli, _, _ = typ
    share = ((tmilli < 1000) & (tmilli > 0))[None, :, None]
    cards = left[:, None, :]
    fits = np.where(share, cards >= np.maximum(tmilli, 1)[None, :, None], cards >= 1000)
    return cards * fits, fits


def _copies_frag(total: np.ndarray, usable: np.ndarray, fitting: np.ndarray, cpu: np.ndarray, typ,
                 access: np.ndarray, blend: float = 0.0) -> np.ndarray:
    """FGD's expected fragment where a typical pod can use at most as much GPU as the copies of
    it that the node's free CPU can host (FGD itself: one copy is enough for all of it).
    ``usable``/``fitting`` are the per-card sums [..., T], ``total`` the free milli [...];
    ``blend``: the weight of FGD's own fragment in a mix of the two."""
    w, tcpu, tmilli, tnum, _ = typ
    share = (tmilli < 1000) & (tmilli > 0)
    by_gpu = np.where(share | (fitting >= tnum), usable, 0.0)
    hosts = np.where(share, fitting >= 1, fitting >= tnum)
    free_cpu = np.maximum(cpu, 0)[..., None]
    copies = np.where(tcpu > 0, np.floor(free_cpu / np.maximum(tcpu, 1)), 1e9)
    by_cpu = copies * np.where(share, tmilli, tnum * 1000.0)
    ok = access & hosts & (copies >= 1) & (tmilli > 0)
    left = (1 - blend) * np.minimum(by_gpu, by_cpu) + blend * by_gpu  # what the pod could use
    return (np.where(ok, total[..., None] - left, total[..., None]) * w).sum(-1)


def copies_choose(policy: str, st: State, t: int, tasks: Tasks, nodes: np.ndarray, rng, typ,
                  blend: float = 0.0) -> tuple[int, list[int]]:
    reps, back = _distinct(st, nodes)
    milli, num, cpu, mem = int(tasks.milli[t]), int(tasks.num[t]), int(tasks.cpu[t]), int(tasks.mem[t])
    left = np.maximum(st.cores[reps] * 10, 0).astype(float)
    access = typ[4][reps]
    rows = np.arange(len(reps))
    usable, fits = _copies_per_card(left, typ)
    total = left.sum(1)
    before = _copies_frag(total, usable.sum(2), fits.sum(2), st.cpu[reps], typ, access, blend)
    cpu_after, mem_after = st.cpu[reps] - cpu, st.mem[reps] - mem
    if num == 0:
        after = _copies_frag(total, usable.sum(2), fits.sum(2), cpu_after, typ, access, blend)
        cards: list[list[int]] = [[] for _ in reps]
    elif milli < 1000:  # per card: only the chosen card's terms change
        need_u = int(tasks.units[t]) if st.project_units else 0
        ok = (st.cores[reps] * 10 >= milli) & (st.units[reps] >= need_u)
        left2 = np.maximum(left - milli, 0)
        usable2, fits2 = _copies_per_card(left2, typ)
        u = usable.sum(2)[:, None, :] - usable.transpose(0, 2, 1) + usable2.transpose(0, 2, 1)  # [K,G,T]
        f = fits.sum(2)[:, None, :] - fits.transpose(0, 2, 1) + fits2.transpose(0, 2, 1)
        each = _copies_frag(total[:, None] - left + left2, u, f, np.repeat(cpu_after[:, None], G, 1), typ,
                            np.repeat(access[:, None, :], G, 1), blend)
        g = np.where(ok, np.round(each, 6) + 1e-4 * left / 1000, np.inf).argmin(1)  # then the tightest card
        after = each[rows, g]
        cards = [[int(x)] for x in g]
    else:
        trial = left.copy()
        taken = _first_free(st.cores[reps] * 10, num)
        trial[rows[:, None], taken] = 0
        usable2, fits2 = _copies_per_card(trial, typ)
        after = _copies_frag(trial.sum(1), usable2.sum(2), fits2.sum(2), cpu_after, typ, access, blend)
        cards = [[int(x) for x in c] for c in taken]
    fell = before - after
    if policy == "FGD-copies":  # FGD's score and tie rule
        i = _pick_first(((100 / (1 + np.exp(-fell / 1000))).astype(int))[back], rng)
        return int(nodes[i]), cards[back[i]]
    # deployed: the extender's 0-10 (a change of one card spans the range) x weight 11 x 10 over a
    # profile whose only other score is NodeResourcesFit MostAllocated over CPU, memory and GPU
    level = np.round(10 * np.clip(0.5 + fell / 1000, 0, 1))
    most = ((1 - cpu_after / st.c.cpu_cap[reps]) + (1 - mem_after / st.c.mem_cap[reps])
            + (1 - (total - milli * num) / (st.c.ngpu[reps] * 1000.0))) / 3
    i = _pick_index((level * 110 + np.floor(most * 100))[back], rng)
    return int(nodes[i]), cards[back[i]]


# --- this project's extender, scored as deployed ---------------------------------------------


def default_scores(st: State, nodes: np.ndarray, cpu: int, mem: int, most: bool | str = False,
                   gpu_milli: int = 0) -> np.ndarray:
    """kube-scheduler's NodeResourcesFit (LeastAllocated, or MostAllocated) + BalancedAllocation;
    ``most="vgpu"``: the vgpu profile (deploy/scheduler), NodeResourcesFit MostAllocated over CPU,
    memory and vcuda-core alone."""
    fc = 1 - (st.cpu[nodes] - cpu) / st.c.cpu_cap[nodes]
    fm = 1 - (st.mem[nodes] - mem) / st.c.mem_cap[nodes]
    if most == "vgpu":
        fg = 1 - (np.maximum(st.cores[nodes], 0).sum(1) * 10 - gpu_milli) / (st.c.ngpu[nodes] * 1000)
        return np.floor((fc + fm + fg) / 3 * 100).astype(int)
    fit = ((fc + fm) / 2 * 100).astype(int) if most else (((1 - fc) + (1 - fm)) / 2 * 100).astype(int)
    balanced = ((1 - np.abs(fc - fm) / 2) * 100).astype(int)
    return fit + balanced


def _spec_admits(item: str, model: str) -> bool:
    return model in item.removeprefix("gpu_spec=").split("|")


def learned_typical(mix, cluster: Cluster):
    """The learned mix as the simulator's typical pods (w, cpu, milli, cards, access [N,T])."""
    shapes = mix.shapes
    w = np.array([x for _, x in shapes], dtype=float)
    milli = np.array([1000 if s.whole else s.cores * 10 for s, _ in shapes])
    # a node's labels: one "gpu_spec=<spec>" per spec of the trace that admits its model
    allowed = np.array([[not s.selector or _spec_admits(s.selector[0], m) for s, _ in shapes]
                        for m in cluster.models], dtype=bool)
    return (w, np.array([s.cpu_milli for s, _ in shapes], dtype=np.int64), milli,
            np.array([s.cards for s, _ in shapes]), allowed[cluster.model])


def mix_arrays(mix, nodes_n: int):
    shapes = mix.shapes
    w = np.array([x for _, x in shapes])
    return (w, np.array([s.cores for s, _ in shapes]), np.array([s.memory_units for s, _ in shapes]),
            np.array([s.cards for s, _ in shapes]), np.array([s.cpu_milli for s, _ in shapes]),
            np.array([s.memory_mib for s, _ in shapes]))


def our_frag(cores: np.ndarray, units: np.ndarray, cap: np.ndarray, cpu: np.ndarray, mem: np.ndarray, mx) -> np.ndarray:
    """core.fragment.node_fragment, vectorised: cores/units [K,G], cap/cpu/mem [K]."""
    w, tc, tu, tn, tcpu, tmem = mx
    present = cores >= 0
    amount = np.where(present, (np.clip(cores, 0, 100) / 100 + np.maximum(units, 0) / cap[:, None]) / 2, 0.0)
    total = amount.sum(1)
    whole_card = (cores >= 100) & (units >= cap[:, None])
    share_fit = (cores[:, None, :] >= tc[None, :, None]) & (units[:, None, :] >= tu[None, :, None])
    fit = np.where((tc >= 100)[None, :, None], whole_card[:, None, :], share_fit) & (amount[:, None, :] > 0)
    small = (amount[:, None, :] * ~fit).sum(2)
    ok = (fit.sum(2) >= tn[None, :]) & (cpu[:, None] >= tcpu[None, :]) & (mem[:, None] >= tmem[None, :])
    return (np.where(ok, small, total[:, None]) * w[None, :]).sum(1)


def our_frag_each_card(cores, units, cap, c: int, u: int, cpu, mem, mx) -> np.ndarray:
    """[K,G]: our_frag after a share of (c, u) is taken from card g (only that card changes)."""
    w, tc, tu, tn, tcpu, tmem = mx

    def amount_fit(co, un):
        present = co >= 0
        amount = np.where(present, (np.clip(co, 0, 100) / 100 + np.maximum(un, 0) / cap[:, None]) / 2, 0.0)
        whole_card = (co >= 100) & (un >= cap[:, None])
        share_fit = (co[:, None, :] >= tc[None, :, None]) & (un[:, None, :] >= tu[None, :, None])
        fit = np.where((tc >= 100)[None, :, None], whole_card[:, None, :], share_fit) & (amount[:, None, :] > 0)
        return amount, fit

    a1, f1 = amount_fit(cores, units)
    a2, f2 = amount_fit(cores - c, units - u)
    cnt = f1.sum(2, keepdims=True) - f1 + f2
    small = (a1[:, None, :] * ~f1).sum(2, keepdims=True) - a1[:, None, :] * ~f1 + a2[:, None, :] * ~f2
    total = a1.sum(1)[:, None] - a1 + a2
    ok = ((cpu[:, None] >= tcpu[None, :]) & (mem[:, None] >= tmem[None, :]))[:, :, None] & (cnt >= tn[None, :, None])
    return (np.where(ok, small, total[:, None, :]) * w[None, :, None]).sum(1)


def ours_choose(policy: str, st: State, t: int, tasks: Tasks, nodes: np.ndarray, rng, mx, weight: int,
                span: float, most: bool | str = False, packing: float = FRAGMENT_PACKING) -> tuple[int, list[int]]:
    reps, back = _distinct(st, nodes)
    if policy == "fragment-exact":  # the extender's measure alone, unquantised, first of list on ties
        total, cards = _ours("fragment", st, t, tasks, reps, mx, weight, span, most, packing, exact=True)
        i = _pick_first(total[back], rng)
        return int(nodes[i]), [int(x) for x in cards[back[i]]]
    total, cards = _ours(policy, st, t, tasks, reps, mx, weight, span, most, packing)
    if CHECKS["left"] > 0 and span == FRAGMENT_SPAN and packing == FRAGMENT_PACKING:
        plugins = default_scores(st, reps, int(tasks.cpu[t]), int(tasks.mem[t]), most,
                                 int(tasks.milli[t]) * max(1, int(tasks.num[t])))
        _check_against_core(policy, st, t, tasks, reps, total - plugins, weight)
    i = _pick_index(total[back], rng)
    return int(nodes[i]), [int(x) for x in cards[back[i]]]


def _ours(policy: str, st: State, t: int, tasks: Tasks, nodes: np.ndarray, mx, weight: int,
          span: float, most: bool | str, packing: float = FRAGMENT_PACKING,
          exact: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """The deployed total score of each node (kube-scheduler's plugins + extender x weight x 10)
    and the card(s) the extender would bind."""
    milli, num = int(tasks.milli[t]), int(tasks.num[t])
    cpu, mem = int(tasks.cpu[t]), int(tasks.mem[t])
    cores, units, cap = st.cores[nodes], st.units[nodes], st.c.unit_cap[nodes]
    k = len(nodes)
    rows = np.arange(k)
    share = milli < 1000
    if share:
        c, u = milli // 10, int(tasks.units[t])
        fits = (cores >= c) & (units >= u)
        card_free = (cores == 100) & (units == cap[:, None])
        left_after = (cores - c) / 100 + (units - u) / cap[:, None]
    if policy == "binpack":
        if share:
            # keep whole cards, then the tightest fit (no topology in the trace: nothing else ranks)
            rank = np.where(fits, card_free * 10.0 + left_after, np.inf)
            g = rank.argmin(1)
            broken = card_free[rows, g]
            tc, tu = cores.copy(), units.copy()
            tc[rows, g] -= c
            tu[rows, g] -= u
        else:
            g2 = _first_free_2d(cores, units, cap, num)
            tc, tu = cores.copy(), units.copy()
            tc[rows[:, None], g2] = 0
            tu[rows[:, None], g2] = 0
        used_c = np.where(tc >= 0, 100 - tc, 0) / 100
        used_u = np.where(tu >= 0, cap[:, None] - tu, 0) / cap[:, None]
        full = np.maximum(used_c, used_u)
        node_full = full.sum(1) / st.c.ngpu[nodes]
        if share:
            packed = (node_full + full[rows, g]) / 2
            fit = 0.45 * packed + 0.55 * ~broken
            cards = g[:, None]
        else:
            free_after = ((tc == 100) & (tu == cap[:, None])).sum(1)
            fit = 1 - np.minimum(free_after, 8) / 8
            cards = g2
    else:  # fragment
        before = our_frag(cores, units, cap, st.cpu[nodes], st.mem[nodes], mx)
        if share:
            each = our_frag_each_card(cores, units, cap, c, u, st.cpu[nodes] - cpu, st.mem[nodes] - mem, mx)
            # ties: binpack's order (a used card, then the tightest)
            key = np.where(fits, np.round(each, 9) + 1e-7 * (card_free * 10.0 + left_after), np.inf)
            g = key.argmin(1)
            after = each[rows, g]
            cards = g[:, None]
        else:
            g2 = _first_free_2d(cores, units, cap, num)
            tc, tu = cores.copy(), units.copy()
            tc[rows[:, None], g2] = 0
            tu[rows[:, None], g2] = 0
            after = our_frag(tc, tu, cap, st.cpu[nodes] - cpu, st.mem[nodes] - mem, mx)
            cards = g2
        free_after = ((tc == 100) & (tu == cap[:, None])).sum(1) if not share else \
            ((cores == 100) & (units == cap[:, None])).sum(1) - card_free[rows, g]
        grown = after - before
        gpu = milli * max(1, num) / 1000
        frag_fit = np.clip(0.5 - grown / span, 0, 1) if span > 0 else np.clip((1 - grown / gpu) / 2, 0, 1)
        fit = ((1 - packing) * frag_fit
               + packing * (1 - np.minimum(free_after, 8) / 8))
    if exact:
        return -(after - before) if policy == "fragment" else fit, cards
    ext = 1 + np.round(9 * np.clip(fit, 0, 1)).astype(int)
    return default_scores(st, nodes, cpu, mem, most, milli * max(1, num)) + weight * 10 * ext, cards


CHECKS: dict[str, Any] = {"left": 0, "done": 0, "differ": 0}


def _check_against_core(policy: str, st: State, t: int, tasks: Tasks, nodes: np.ndarray, ext: np.ndarray,
                        weight: int) -> None:
    """Compare the vectorised extender score with the core's score_node on one node."""
    from jupyter_vgpu.core.contract import Request
    from jupyter_vgpu.core.fragment import Headroom
    from jupyter_vgpu.core.placement import CardState, FragmentView, NodeState, score_node

    CHECKS["left"] -= 1
    k = len(nodes) // 2
    n = int(nodes[k])
    cap = int(st.c.unit_cap[n])
    cards = tuple(CardState(g, cap, True, 100 - int(st.cores[n, g]), cap - int(st.units[n, g]))
                  for g in range(int(st.c.ngpu[n])))
    state = NodeState(cards, None, Headroom(int(st.cpu[n]), int(st.mem[n])))
    milli, num = int(tasks.milli[t]), int(tasks.num[t])
    request = Request(milli // 10, int(tasks.units[t])) if milli < 1000 else Request(100 * num)
    view = FragmentView(CHECKS["mix"], int(tasks.cpu[t]), int(tasks.mem[t]))
    core = score_node(state, {0: request}, policy, view=view)
    CHECKS["done"] += 1
    CHECKS["differ"] += int(core != int(ext[k]) // (weight * 10))


def _first_free_2d(cores, units, cap, num):
    free = (cores == 100) & (units == cap[:, None])
    return np.argsort(~free, axis=1, kind="stable")[:, :num]


# --- the replay ----------------------------------------------------------------------------


class LearnedMix:
    """fgd-filter's typical pods as the extender learns them: a pod counted once while its uid is
    among the last ``SEEN_PODS`` counted, a new snapshot at each of the first 16 pods and then
    every 16 once drifted, as the simulator's typical pods (``learned_typical``). ``evicted``:
    the hostile pods whose next retry counts again (their uid left the last ones counted)."""

    def __init__(self, cluster: Cluster, capacity: int, decay: float) -> None:
        self.cluster = cluster
        self.learner = MixLearner(capacity=capacity, decay=decay, by="count")
        self.seen: OrderedDict[object, None] = OrderedDict()
        self.evicted: list[object] = []
        self.observed = 0
        self.mix: Mix | None = None
        self.typical: Any = None

    def observe(self, uid: object, shape: Shape) -> None:
        if uid in self.seen:
            return
        self.seen[uid] = None
        if len(self.seen) > SEEN_PODS:
            gone = self.seen.popitem(last=False)[0]
            if isinstance(gone, str):
                self.evicted.append(gone)
        self.learner.observe(shape)
        self.observed += 1
        if self.mix is None or self.observed <= 16 or self.observed % 16 == 0:  # the extender's snapshot rule
            mix = self.learner.mix()
            if self.mix is None or drifted(self.mix, mix):
                self.typical, self.mix = learned_typical(mix, self.cluster), mix

    def for_pod(self, tasks: Tasks, t: int) -> Any:
        """The typical pods a filter decides with: the pod's own shape while nothing is learned."""
        if self.typical is None:
            return learned_typical(Mix(((_filter_shape(tasks, t), 1.0),)), self.cluster)
        return self.typical


def run(trace: str, policy: str, seed: int, regime: str, project_units: bool = True, weight: int = 5,
        span: float = FRAGMENT_SPAN, decay: float = 0.999, packing: float = FRAGMENT_PACKING,
        coverage: float = 0.95, blend: float = 0.0, filter_decay: float = FILTER_DECAY,
        filter_capacity: int = FILTER_CAPACITY, learn: str = "bind", hostile: int = 0) -> dict[str, float]:
    """``learn``: fgd-filter learns from the pods bound ("bind", the extender since issue 32) or
    from every pod its filter is asked about ("filter", before). ``hostile``: that many pending
    pods of ``HOSTILE_SHAPE``, submitted before the first task and each retried between any two
    tasks (kube-scheduler requeues unschedulable pods as pods are bound); the extender's filter is
    asked about a retry whenever kube-scheduler's own filters leave a node for it."""
    cluster = load_cluster()
    rows = inflate(load_tasks(trace, cluster), cluster, seed)
    tasks = build_tasks(rows, cluster)
    typ = typical_pods(build_tasks(load_tasks(trace, cluster), cluster), cluster, coverage)
    st = State(cluster, project_units)
    rng = np.random.default_rng(seed + 1000)
    learner = MixLearner(decay=decay)
    typical = LearnedMix(cluster, filter_capacity, filter_decay)
    typical.evicted = [f"hostile-{i}" for i in range(hostile)]  # not counted yet
    frag_cache = fgd_frag(st.cores * 10, st.cpu, typ, typ[4]) if policy == "FGD" else None
    cap = cluster.gpu_milli
    # a scheduler profile scoring NodeResourcesFit MostAllocated (with BalancedAllocation), or
    # the vgpu profile: MostAllocated over CPU, memory and GPU alone (vGPU pods only)
    most: bool | str = "vgpu" if regime.endswith("vgpu") else regime.endswith("pack")
    arrived, out, failed, m = 0, {}, 0, 0
    observed, mx = 0, None
    for t in range(len(rows)):
        milli, num = int(tasks.milli[t]), int(tasks.num[t])
        arrived += milli * num
        gpu_pod = num > 0
        if policy in FILTER_POLICIES and learn == "filter" and typical.evicted and _hostile_seen(st):
            retried, typical.evicted = typical.evicted, []
            for uid in retried:  # a retry counts again only once its uid left the last ones counted
                typical.observe(uid, HOSTILE_SHAPE)
        if gpu_pod or not regime.startswith("taint"):
            if policy in FILTER_POLICIES and learn == "filter" and gpu_pod and _seen_by_extender(st, tasks, t):
                typical.observe(t, _filter_shape(tasks, t))
            nodes = _feasible(st, tasks, t)
            if len(nodes) == 0:
                failed += 1
            else:
                if policy in SIM_POLICIES:
                    node, cards = sim_choose(policy, st, t, tasks, nodes, rng, typ, frag_cache)
                elif policy in COPIES_POLICIES:
                    node, cards = copies_choose(policy, st, t, tasks, nodes, rng, typ, blend)
                elif policy in FILTER_POLICIES and gpu_pod:
                    node, cards = copies_choose("FGD-copies", st, t, tasks, nodes, rng, typical.for_pod(tasks, t),
                                                blend)
                    if learn == "bind":  # bound: learned now (its own filter did not count it)
                        typical.observe(t, _filter_shape(tasks, t))
                elif not gpu_pod:  # never reaches the extender: kube-scheduler's defaults alone
                    total = default_scores(st, nodes, int(tasks.cpu[t]), int(tasks.mem[t]), most=most is True)
                    node, cards = int(nodes[_pick_index(total, rng)]), []
                else:
                    learner.observe(Shape(min(100, milli // 10), int(tasks.units[t]), max(1, num),
                                          int(tasks.cpu[t]), int(tasks.mem[t])))
                    observed += 1
                    if mx is None or observed <= 16 or observed % 16 == 0:  # the extender's snapshot rule
                        mix = learner.mix()
                        CHECKS["mix"] = mix
                        mx = mix_arrays(mix, len(nodes))
                    node, cards = ours_choose(policy, st, t, tasks, nodes, rng, mx, weight, span, most, packing)
                _apply(st, tasks, t, node, cards)
                if frag_cache is not None:
                    frag_cache[node] = fgd_frag(st.cores[node:node + 1] * 10, st.cpu[node:node + 1], typ,
                                                typ[4][node:node + 1])[0]
        while m < len(MILESTONES) and arrived >= MILESTONES[m] * cap:
            out[f"unalloc_{round(MILESTONES[m] * 100)}"] = 100 * (1 - st.allocated / cap)
            m += 1
    while m < len(MILESTONES):
        out[f"unalloc_{round(MILESTONES[m] * 100)}"] = 100 * (1 - st.allocated / cap)
        m += 1
    out["failed"] = failed
    if CHECKS["done"]:
        print(f"  vectorised vs core score_node: {CHECKS['differ']} of {CHECKS['done']} sampled scores differ",
              flush=True)
    return out


def _seen_by_extender(st: State, tasks: Tasks, t: int) -> bool:
    """kube-scheduler calls the extender only when its own filters (CPU, memory, the GPU-model
    node selector) leave a node."""
    ok = (st.cpu >= tasks.cpu[t]) & (st.mem >= tasks.mem[t]) & tasks.access[t][st.c.model]
    return bool(ok.any())


def _hostile_seen(st: State) -> bool:
    """kube-scheduler's own filters leave a node for a hostile pod: CPU, memory, and the cards'
    vGPU memory together (its resource fit counts a node's vcuda-memory, not a card's)."""
    room = (st.cpu >= HOSTILE_CPU) & (st.mem >= HOSTILE_MEM) & (np.maximum(st.units, 0).sum(1) >= HOSTILE_UNITS)
    return bool(room.any())


def _filter_shape(tasks: Tasks, t: int) -> Shape:
    """What the extender learns of a pod: its GPU request, CPU and node selector, here its
    ``gpu_spec`` (the measure uses neither the pod's memory nor the share's card memory).
    A spec naming several models would be a node affinity in Kubernetes, not a selector."""
    milli, num = int(tasks.milli[t]), int(tasks.num[t])
    spec = tasks.key[t][3]
    return Shape(min(100, milli // 10), 0, max(1, num), int(tasks.cpu[t]), 0, (f"gpu_spec={spec}",) if spec else ())


def _feasible(st: State, tasks: Tasks, t: int) -> np.ndarray:
    milli, num = int(tasks.milli[t]), int(tasks.num[t])
    ok = (st.cpu >= tasks.cpu[t]) & (st.mem >= tasks.mem[t])
    if num > 0:
        ok &= tasks.access[t][st.c.model]
        if milli < 1000:
            need_u = int(tasks.units[t]) if st.project_units else 0
            ok &= ((st.cores * 10 >= milli) & (st.units >= need_u)).any(1)
        else:
            ok &= st.free_whole() >= num
    return np.flatnonzero(ok)


def _apply(st: State, tasks: Tasks, t: int, node: int, cards: list[int]) -> None:
    milli, num = int(tasks.milli[t]), int(tasks.num[t])
    st.cpu[node] -= tasks.cpu[t]
    st.mem[node] -= tasks.mem[t]
    for g in cards:
        if milli < 1000:
            st.cores[node, g] -= milli // 10
            st.units[node, g] -= int(tasks.units[t]) if st.project_units else 0
        else:
            st.cores[node, g] = 0
            st.units[node, g] = 0
    st.allocated += milli * num
    if num > 0:
        aff = milli if milli < 1000 else 1000 * num
        st.affinity[node][aff] = st.affinity[node].get(aff, 0) + 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trace", nargs="+", default=["default"])
    p.add_argument("--policies", nargs="+", default=list(SIM_POLICIES + OUR_POLICIES),
                   choices=SIM_POLICIES + OUR_POLICIES + COPIES_POLICIES + FILTER_POLICIES + ("fragment-exact",))
    p.add_argument("--seeds", nargs="+", type=int, default=[42, 43, 44])
    p.add_argument("--regime", nargs="+", default=["spread"], choices=["spread", "pack", "taint", "taint-pack", "vgpu", "taint-vgpu"],
                   help="spread: kube-scheduler's default profile, CPU-only pods on the GPU nodes too; "
                        "pack: a profile scoring NodeResourcesFit MostAllocated; taint: GPU nodes tainted, "
                        "CPU-only pods go elsewhere (the simulator's own policies: the same pods dropped)")
    p.add_argument("--paper-units", action="store_true",
                   help="GPU memory not modelled (the simulator's one dimension), to compare with the paper")
    p.add_argument("--weight", type=int, default=5, help="the extender's weight in kube-scheduler")
    p.add_argument("--span", type=float, default=FRAGMENT_SPAN, help="fragment: FRAGMENT_SPAN")
    p.add_argument("--packing", type=float, default=FRAGMENT_PACKING, help="fragment: FRAGMENT_PACKING")
    p.add_argument("--coverage", type=float, default=0.95,
                   help="the simulator's typical pods: the most frequent shapes covering this share of tasks")
    p.add_argument("--blend", type=float, default=None,
                   help="FGD-copies / fgd-filter: the weight of FGD's own fragment mixed with the CPU-counted "
                        f"one (default 0 for FGD-copies, {FGD_BLEND} for fgd-filter)")
    p.add_argument("--filter-decay", type=float, default=FILTER_DECAY,
                   help="fgd-filter: the learned mix's decay per GPU pod seen")
    p.add_argument("--filter-capacity", type=int, default=FILTER_CAPACITY,
                   help="fgd-filter: the most shapes the learned mix keeps")
    p.add_argument("--learn", nargs="+", choices=("bind", "filter"), default=["bind"],
                   help="fgd-filter: learn the typical pods from the pods bound (the extender since issue 32) "
                        "or from every pod its filter is asked about (before); several: one row each")
    p.add_argument("--hostile", nargs="+", type=int, default=[0],
                   help="fgd-filter: a hostile namespace's pending pods that never fit, retried throughout "
                        "(README \"A hostile namespace\"); several: one row each")
    p.add_argument("--csv", help="append one row per run to this file")
    p.add_argument("--check", type=int, default=0,
                   help="compare this many of the extender scores with the core's score_node (first tasks)")
    args = p.parse_args(argv)
    for trace in args.trace:
        for regime in args.regime:
            variants = [(name, learn, hostile) for name in args.policies
                        for learn in (args.learn if name in FILTER_POLICIES else ["-"])
                        for hostile in (args.hostile if name in FILTER_POLICIES else [0])]
            for policy, learn, hostile in variants:
                results = []
                for seed in args.seeds:
                    started = time.time()
                    CHECKS.update(left=args.check, done=0, differ=0)
                    blend = (FGD_BLEND if policy in FILTER_POLICIES else 0.0) if args.blend is None else args.blend
                    r = run(trace, policy, seed, regime, not args.paper_units, args.weight, args.span,
                            packing=args.packing, coverage=args.coverage,
                            blend=blend,
                            filter_decay=args.filter_decay, filter_capacity=args.filter_capacity,
                            learn=learn, hostile=hostile)
                    results.append(r)
                    if args.csv:
                        with open(args.csv, "a") as f:
                            f.write(",".join(str(x) for x in (trace, regime, policy, seed, args.weight, args.span,
                                                             args.packing, args.coverage, blend,
                                                             int(args.paper_units),
                                                             *(round(r[f"unalloc_{x}"], 3) for x in (90, 100, 110, 130)),
                                                             r["failed"], round(time.time() - started, 1),
                                                             args.filter_decay, args.filter_capacity, learn,
                                                             hostile)) + "\n")
                cells = []
                for x in (90, 100, 110, 130):
                    v = [r[f"unalloc_{x}"] for r in results]
                    sd = statistics.stdev(v) if len(v) > 1 else 0.0
                    cells.append(f"{statistics.mean(v):6.2f} ± {sd:4.2f}")
                variant = f" learn={learn} hostile={hostile}" if policy in FILTER_POLICIES else ""
                print(f"{trace:11s} {regime:6s} {policy:13s} " + "  ".join(cells) + variant, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
