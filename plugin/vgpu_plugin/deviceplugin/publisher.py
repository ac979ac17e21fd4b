"""Publishes the node's GPU inventory and topology as a Node annotation, only when it changes."""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING, Any

from jupyter_vgpu.core.contract import DEFAULT_NAMES, Names
from jupyter_vgpu.core.inventory import NodeInventory

from .devices import serves

if TYPE_CHECKING:
    from jupyter_vgpu.gpu import GPUBackend

    from .state import CardsState

log = logging.getLogger(__name__)


class NodePublisher:
    def __init__(self, core_api: Any, node: str, backend: GPUBackend, cards: CardsState,
                 names: Names = DEFAULT_NAMES) -> None:
        self._api = core_api
        self.node = node
        self._backend = backend
        self._cards = cards
        self._names = names
        self._last: str | None = None
        self.writes = 0

    def inventory(self) -> NodeInventory:
        backend = self._backend
        if not backend.available():
            return NodeInventory(node=self.node, cards=(), topology=None, driver=backend.driver_version(),
                                 problem=backend.problem() or "no GPUs")
        cards = tuple(self._cards.cards())
        return NodeInventory(node=self.node, cards=cards, topology=backend.topology() if cards else None,
                             driver=backend.driver_version(), problem=None if cards else "no GPUs")

    def publish(self, *, check_node: bool = False) -> bool:
        """Write the annotation (and the GPU label) if it differs; True when written.

        Without ``check_node`` an unchanged inventory costs no API call; with it the Node is
        read and repaired if someone else changed or removed the annotation.
        """
        inventory = self.inventory()
        text = inventory.to_json()
        has_gpu = any(serves(card) for card in inventory.cards)  # a MIG card with healthy slices serves too
        label_value = "true" if has_gpu else None
        if text == self._last and not check_node:
            return False
        response = self._api.read_node(self.node, _preload_content=False, _request_timeout=30)
        meta = json.loads(response.data).get("metadata") or {}
        annotations = meta.get("annotations") or {}
        labels = meta.get("labels") or {}
        if annotations.get(self._names.node_inventory) == text and labels.get(self._names.node_label_gpu) == label_value:
            self._last = text
            return False
        patch = {"metadata": {"annotations": {self._names.node_inventory: text},
                              "labels": {self._names.node_label_gpu: label_value}}}
        self._api.patch_node(self.node, patch, _request_timeout=30)
        self._last = text
        self.writes += 1
        if inventory.problem:
            log.info("node %s: published 'no usable GPUs': %s", self.node, inventory.problem)
        else:
            unhealthy = [card.index for card in inventory.cards if not card.healthy]
            log.info("node %s: published inventory of %d card(s)%s", self.node, len(inventory.cards),
                     f", unhealthy: {unhealthy}" if unhealthy else "")
        return True
