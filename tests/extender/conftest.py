"""Extender fixtures: ``cluster`` is the simulated API plus an extender (started on demand)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from extender_support import Cluster


@pytest.fixture
def cluster(kube: Any) -> Iterator[Cluster]:
    c = Cluster(kube)
    try:
        yield c
    finally:
        c.stop_extender()
