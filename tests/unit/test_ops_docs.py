"""docs/operations: the alert rules and the Grafana dashboard use only metric names that
exist, and docs/operations.md lists every metric."""

from __future__ import annotations

import json
import re
from pathlib import Path

from pydblog.api.sync import SYNC
from pydblog.metrics import CAPTURE, metric_names

DOCS = Path(__file__).resolve().parents[2] / "docs"
NAME = re.compile(r"\bdblog_[a-z_]+")
KNOWN = metric_names(CAPTURE.registry) | metric_names(SYNC.registry)


def _expressions_of_rules() -> list[str]:
    text = (DOCS / "operations" / "alerts.yml").read_text()
    return [line.split("expr:", 1)[1] for line in text.splitlines() if "expr:" in line]


def _expressions_of_dashboard() -> list[str]:
    dash = json.loads((DOCS / "operations" / "grafana-dashboard.json").read_text())
    return [t["expr"] for p in dash["panels"] for t in p["targets"]]


def test_alert_rules_use_existing_metrics() -> None:
    exprs = _expressions_of_rules()
    assert len(exprs) >= 10
    used = {n for e in exprs for n in NAME.findall(e)}
    assert used and used <= KNOWN, sorted(used - KNOWN)


def test_dashboard_uses_existing_metrics() -> None:
    exprs = _expressions_of_dashboard()
    used = {n for e in exprs for n in NAME.findall(e)}
    assert used <= KNOWN, sorted(used - KNOWN)
    # every family is on the dashboard (a histogram through one of its series)
    families = {re.sub(r"_(bucket|sum|count)$", "", n) for n in KNOWN}
    shown = {re.sub(r"_(bucket|sum|count)$", "", n) for n in used}
    assert families <= shown, sorted(families - shown)


def test_operations_doc_lists_every_metric() -> None:
    text = (DOCS / "operations.md").read_text()
    families = {re.sub(r"_(bucket|sum|count)$", "", n) for n in KNOWN}
    missing = sorted(f for f in families if f"`{f}" not in text)
    assert not missing, missing
