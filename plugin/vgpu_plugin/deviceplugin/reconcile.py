"""Reconciliation with kubelet as a pure plan: ledger + kubelet's checkpoint + pods in, new ledger out.

kubelet's checkpoint is the truth: which container holds which device IDs, and (in
``AllocResp``) the answer that container was given. When identical requests made the
choice at Allocate ambiguous, kubelet may have given one container the answer prepared
for another; the plan moves the records (and the answers' allocation ids) to match, and
names the pods whose annotations must change. Nothing here does I/O or changes its
inputs: the allocator shell applies the plan (swaps in the ledger, logs its notes, asks
for the annotations), so every case can be tested by calling a function.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from jupyter_vgpu.core import contract as c
from jupyter_vgpu.core.contract import CardShare, ContainerAllocation, Names

from .allocate import AllocationError, placement
from .checkpoint import PodDeviceEntry
from .devices import CORE, MEMORY
from .pods import PodView, Wanted
from .served import Key, Ledger, Served, same_cards

if TYPE_CHECKING:
    from jupyter_vgpu.core.inventory import Card

ABSENCE_GRACE = 60.0  # seconds a served pod may be missing from the cache before it counts as gone

PodName = tuple[str, str]  # (namespace, name)


@dataclass(frozen=True)
class World:
    """What a plan reads besides the ledger."""

    node: str
    names: Names
    views: Sequence[PodView]                        # this node's vGPU pods
    cards: Mapping[int, Card]
    verify: Callable[[str | None], str | None]      # a token's allocation id when this node minted it
    answer_env: Callable[[bytes], dict[str, str]]   # the env of an answer kubelet recorded ({} unreadable)
    now: float                                      # time.monotonic() of the plan: when new records start


@dataclass
class Plan:
    ledger: Ledger                                  # the ledger to swap in
    dirty: set[PodName] = field(default_factory=set)  # pods whose annotations must change
    # what the shell logs: (level, message)
    notes: list[tuple[int, str]] = field(default_factory=list)


def gone_pods(ledger: Ledger, deleted: Collection[str], present: Collection[str], now: float) -> set[str]:
    """Pods whose devices are released: deleted or finished, or missing from the cache for long
    (a pod our cache has not seen yet, served from a direct list, is not gone at once)."""
    absent = {key[0] for key, served in ledger.served.items()
              if key[0] not in present and now - served.since > ABSENCE_GRACE}
    return absent | set(deleted)


def plan_reconcile(ledger: Ledger, entries: Sequence[PodDeviceEntry], world: World,
                   gone: Collection[str]) -> Plan:
    """Release what gone pods held, then match the ledger to kubelet's checkpoint."""
    planner = _Planner(ledger.copy(), world)
    new = planner.ledger
    by_uid = {v.uid for v in world.views}
    for key in [k for k in new.served if k[0] in gone]:
        served = new.served.pop(key)
        planner.note(logging.INFO, f"released {served.namespace}/{served.pod} container {served.container!r} "
                                   f"(pod gone or finished)")
    for key in [k for k in new.overrides if k[0] in gone or k[0] not in by_uid]:
        del new.overrides[key]
    for ids in [i for i, (_, k) in new.given.items() if k[0] in gone]:
        del new.given[ids]
    planner.apply_checkpoint(entries)
    for view in world.views:
        if (not view.problem and view.containers and not view.assigned
                and all(new.container_complete(w) for w in view.containers)):
            planner.dirty.add((view.namespace, view.name))
    return planner.plan()


def plan_restore(entries: Sequence[PodDeviceEntry], world: World, *, checkpoint_complete: bool = False,
                 running: Collection[str] = ()) -> Plan:
    """The ledger after a restart: kubelet's checkpoint, then the pods marked assigned count as
    served before (a kubelet may keep no checkpoint). When ``entries`` are kubelet's whole record
    (``checkpoint_complete``: its file was read), a pod marked assigned that has no entry and that
    kubelet does not run was never admitted: anyone can write ``gpu-assigned``, so it stays a
    waiting pod (a rival), not one served before."""
    planner = _Planner(Ledger(), world)
    planner.apply_checkpoint(entries)
    recorded = {entry.pod_uid for entry in entries}
    for view in world.views:
        if checkpoint_complete and view.uid not in recorded and view.uid not in running:
            if view.assigned:
                planner.note(logging.WARNING, f"pod {view.namespace}/{view.name} is marked "
                                              f"{world.names.gpu_assigned}=true but kubelet's checkpoint has no "
                                              f"device of it: treated as not admitted yet")
            continue
        if view.assigned and not view.problem:
            for wanted in view.containers:
                for kind in (CORE, MEMORY) if wanted.request.memory_units else (CORE,):
                    if not planner.ledger.served_kind((wanted.uid, wanted.index), kind):
                        planner.mark(wanted, kind, ())
    return planner.plan()


class _Planner:
    """Works on its own copy of the ledger; ``plan()`` hands it back with what changed."""

    def __init__(self, ledger: Ledger, world: World) -> None:
        self.ledger = ledger
        self.world = world
        self.by_uid = {v.uid: v for v in world.views}
        self.dirty: set[PodName] = set()
        self.notes: list[tuple[int, str]] = []
        # (kind, device IDs) -> the containers that were given them, built at the first question: each
        # checkpoint entry asks who else holds its IDs (a pass over the ledger per entry was ~70 x 70 on
        # a packed node). Kept up to date by ``mark``, the one place that gives devices during a plan;
        # a record that lost them since is filtered out where it is read.
        self._holders: dict[tuple[str, tuple[str, ...]], list[Key]] | None = None

    def plan(self) -> Plan:
        return Plan(ledger=self.ledger, dirty=self.dirty, notes=self.notes)

    def note(self, level: int, message: str) -> None:
        self.notes.append((level, message))

    def kind(self, resource: str) -> str | None:
        if resource == self.world.names.core_resource:
            return CORE
        if resource == self.world.names.memory_resource:
            return MEMORY
        return None

    def mark(self, wanted: Wanted, kind: str, ids: tuple[str, ...]) -> Served | None:
        key = (wanted.uid, wanted.index)
        served = self.ledger.served.get(key)
        if served is None:
            try:
                allocation = placement(wanted, self.ledger.overrides.get(key), self.world.cards, self.world.node)
            except AllocationError as error:
                self.note(logging.WARNING, f"cannot restore {wanted.describe()}: {error}")
                return None
            served = Served(key=key, namespace=wanted.namespace, pod=wanted.pod, container=wanted.container,
                            allocation=allocation, identity_uid=wanted.uid, since=self.world.now)
            self.ledger.served[key] = served
        served.devices[kind] = ids
        if self._holders is not None:
            self._holders.setdefault((kind, ids), []).append(key)
        if kind == CORE and ids:
            self.ledger.given[ids] = (served.allocation, key)
        return served

    def apply_checkpoint(self, entries: Sequence[PodDeviceEntry]) -> None:
        ledger = self.ledger
        located: list[tuple[Wanted, str, PodDeviceEntry]] = []
        for entry in entries:
            kind = self.kind(entry.resource)
            view = self.by_uid.get(entry.pod_uid)
            if kind is None or view is None or view.problem:
                continue
            wanted = next((w for w in view.containers if w.container == entry.container_name), None)
            if wanted is not None and entry.device_ids:
                located.append((wanted, kind, entry))
        in_checkpoint = {((w.uid, w.index), kind) for w, kind, _ in located}
        for wanted, kind, entry in sorted(located, key=lambda item: item[1] != CORE):  # cores first
            key = (wanted.uid, wanted.index)
            ids = entry.device_ids
            if kind == MEMORY:
                self.take_devices(wanted, MEMORY, ids, in_checkpoint)
                continue
            received = self.received(entry)
            served = ledger.served.get(key)
            if received is None:  # not an answer we can read: keep what the ledger says
                self.take_devices(wanted, CORE, ids, in_checkpoint)
                continue
            allocation, partner = received
            allocation = replace(allocation, index=wanted.index, name=wanted.container)
            if served is not None and served.devices.get(CORE) == ids and same_cards(served.allocation, allocation):
                ledger.given[ids] = (allocation, key)
                if served.allocation.allocation_id != allocation.allocation_id:  # kubelet confirms who holds it
                    served.allocation = replace(served.allocation, allocation_id=allocation.allocation_id)
                    self.dirty.add((wanted.namespace, wanted.pod))
                continue
            try:
                previous: ContainerAllocation | None = (
                    served.allocation if served is not None and CORE in served.devices
                    else placement(wanted, ledger.overrides.get(key), self.world.cards, self.world.node))
            except AllocationError:
                previous = None
            self.take_devices(wanted, CORE, ids, in_checkpoint)
            served = ledger.served[key]
            if served.allocation.allocation_id != allocation.allocation_id:
                self.dirty.add((wanted.namespace, wanted.pod))
            served.allocation = allocation  # with the id of the answer it holds
            served.identity_uid = partner[0] or served.identity_uid
            ledger.given[ids] = (allocation, key)
            if previous is None or same_cards(previous, allocation):
                continue
            self.dirty.add((wanted.namespace, wanted.pod))
            self.note(logging.WARNING,
                      f"kubelet gave {wanted.describe()} the answer prepared for pod UID {partner[0]} container "
                      f"{partner[1]} (identical requests admitted out of placement order): its records now show "
                      f"card(s) {[s.index for s in allocation.cards]} and its token's allocation id; its "
                      f"VGPU_POD_* env names the other pod")
            if partner != key and (partner, CORE) not in in_checkpoint and partner[0] in self.by_uid:
                # the other container is not admitted yet: it takes the placement this one left free
                other = ledger.served.get(partner)
                if other is not None and other.devices.get(CORE) == ids:
                    ledger.drop_devices(partner, CORE)
                partner_view = self.by_uid[partner[0]]
                name = next((w.container for w in partner_view.containers if w.index == partner[1]), "")
                ledger.overrides[partner] = replace(previous, index=partner[1], name=name, allocation_id="")
                self.dirty.add((partner_view.namespace, partner_view.name))
        for wanted, kind, entry in located:  # kubelet confirms who holds these: no guess any more
            served = ledger.served.get((wanted.uid, wanted.index))
            if kind == CORE and served is not None and served.devices.get(CORE) == entry.device_ids:
                served.guessed = False

    def take_devices(self, wanted: Wanted, kind: str, ids: tuple[str, ...],
                     in_checkpoint: set[tuple[Key, str]]) -> None:
        """Record that kubelet gave ``wanted``'s container these IDs; whoever the ledger thought had them
        (and kubelet says has not) loses them."""
        key = (wanted.uid, wanted.index)
        for other_key in list(dict.fromkeys(self.holders(kind, ids))):
            other = self.ledger.served.get(other_key)
            if other is None or other.devices.get(kind) != ids:
                continue  # it lost them since
            if other_key != key and (other_key, kind) not in in_checkpoint:
                self.ledger.drop_devices(other_key, kind)
                self.dirty.add((other.namespace, other.pod))
        served = self.ledger.served.get(key)
        if served is None or served.devices.get(kind) != ids:
            if self.mark(wanted, kind, ids) is not None and served is None:
                self.dirty.add((wanted.namespace, wanted.pod))

    def holders(self, kind: str, ids: tuple[str, ...]) -> list[Key]:
        """The containers given ``ids`` of ``kind`` at some point of this plan (they may have lost them since)."""
        if self._holders is None:
            holders: dict[tuple[str, tuple[str, ...]], list[Key]] = {}
            for key, served in self.ledger.served.items():
                for held_kind, held in served.devices.items():
                    holders.setdefault((held_kind, held), []).append(key)
            self._holders = holders
        return self._holders.get((kind, ids), [])

    def received(self, entry: PodDeviceEntry) -> tuple[ContainerAllocation, Key] | None:
        """The allocation in the answer kubelet recorded for these IDs (with the answer's allocation
        id, from its token), and whom it was prepared for."""
        env = self.world.answer_env(entry.alloc_response)
        given = self.ledger.given.get(entry.device_ids)
        if c.ENV_DEVICE_INDICES in env:
            try:
                indices = [int(i) for i in env[c.ENV_DEVICE_INDICES].split(",") if i]
                uuids = env.get(c.ENV_DEVICE_UUIDS, "").split(",")
                cores = int(env[c.ENV_CORES])
                mib = int(env[c.ENV_MEMORY_MIB])
            except (KeyError, ValueError):
                return None
            if not indices:
                return None
            cards = self.world.cards
            # whom the answer was prepared for: named in it when that was certain, else in our memory
            partner_uid = env.get(c.ENV_POD_UID) or (given[1][0] if given else "")
            view = self.by_uid.get(partner_uid)
            index = next((w.index for w in view.containers if w.container == env.get(c.ENV_CONTAINER)), -1) \
                if view is not None else -1
            visible = env.get(c.ENV_NVIDIA_VISIBLE_DEVICES, "")
            if visible.startswith("MIG-") and len(indices) == 1:
                # a slice answer tells the slice's size, not the request: the share is the request on that slice
                asked = next((w.request for w in view.containers if w.index == index), None) \
                    if view is not None else None
                if asked is None:
                    return (given[0], given[1]) if given is not None else None
                card = cards.get(indices[0])
                shares: tuple[CardShare, ...] = (CardShare(indices[0], card.uuid if card is not None else "",
                                                           asked.cores, asked.memory_units, visible),)
            elif len(indices) == 1 and cores < c.CORES_PER_CARD:
                shares = (CardShare(indices[0], uuids[0] if uuids else "", cores, mib // c.MEMORY_UNIT_MIB),)
            else:
                shares = tuple(
                    CardShare(i, uuids[n] if n < len(uuids) else "", c.CORES_PER_CARD,
                              cards[i].memory_units if i in cards else mib // len(indices) // c.MEMORY_UNIT_MIB)
                    for n, i in enumerate(indices))
            # an answer whose token this node did not mint (a lost secret) gets no id: it reads nothing
            answer_id = self.world.verify(env.get(c.ENV_TOKEN)) or ""
            return (ContainerAllocation(index=index, name=env.get(c.ENV_CONTAINER, ""), cards=shares,
                                        allocation_id=answer_id), (partner_uid, index))
        if given is not None:
            return given[0], given[1]
        return None
