"""Issue 17: the reclaimer's Grafana dashboard queries only series the reclaimer serves, with their labels."""

from __future__ import annotations

import json
import re
from pathlib import Path

from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from jupyter_vgpu.reclaimer.record import Counters

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "components" / "monitoring" / "reclaimer-dashboard.json"


def test_every_series_the_dashboard_queries_is_served() -> None:
    counters = Counters()
    counters.warnings.labels("idle").inc()
    counters.reclaimed.labels("idle", "cpu").inc()
    counters.gpu_hours.labels("idle").inc(0.5)
    counters.dry_run.labels("act", "hoarding").inc()
    served: dict[str, set[str]] = {}
    for family in text_string_to_metric_families(generate_latest(counters.registry).decode()):
        for sample in family.samples:
            served.setdefault(sample.name, set()).update(sample.labels)
    dashboard = json.loads(DASHBOARD.read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    assert exprs
    for expr in exprs:
        names = set(re.findall(r"\bvgpu_reclaimer_\w+", expr))
        assert names and names <= served.keys(), (expr, sorted(served))
        for grouping in re.findall(r"by \(([^)]*)\)", expr):
            labels = {label.strip() for label in grouping.split(",")}
            assert all(labels <= served[name] for name in names), (expr, labels)
