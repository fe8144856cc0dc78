"""The Grafana dashboard in docs/ charts exactly the metrics the exporters define."""

from __future__ import annotations

import json
import re
from pathlib import Path

from stickless.metrics._hooks import METRICS

DASHBOARD = Path(__file__).resolve().parent.parent / "docs" / "grafana-dashboard.json"


def test_the_dashboard_charts_every_exported_metric_and_no_other() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    queries = " ".join(
        target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])
    )
    charted = {
        re.sub(r"_(bucket|sum|count)$", "", name) if name not in METRICS else name
        for name in re.findall(r"stickless_[a-z_]+", queries)
    }
    assert charted == set(METRICS)
