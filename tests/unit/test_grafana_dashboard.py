"""conf/grafana/tandem-dashboard.json queries only what ``tandem exporter`` serves: every metric a panel, variable or
annotation reads is in the catalog the exporter's families come from, every label it selects on is one that metric
carries, and every query is valid PromQL for Prometheus' own parser (``promtool check rules`` over the queries as
recording rules). Grafana itself is not installable here (no package in Debian or PyPI): its rendering is not tested.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path

import yaml

from tandem.monitoring.catalog import BY_NAME

ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "conf" / "grafana" / "tandem-dashboard.json"
TARGET_LABELS = {"job", "instance"}
"""Labels Prometheus gives every scraped series."""
GRAFANA_VARIABLES = {"$__rate_interval": "1m", "$__interval": "15s", "$plan_instance": ".*", "$plan": ".*"}


def queries(dashboard: dict) -> Iterator[tuple[str, str]]:
    """(where, PromQL) of every panel target, template variable and annotation."""
    for panel in dashboard["panels"]:
        for target in panel.get("targets", []):
            yield f"panel {panel['title']!r} {target['refId']}", target["expr"]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] == "query":
            inner = re.fullmatch(r"label_values\((.*), *\w+\)", variable["query"]["query"])
            assert inner, variable["query"]
            yield f"variable {variable['name']}", inner.group(1)
    for annotation in dashboard["annotations"]["list"]:
        yield f"annotation {annotation['name']}", annotation["expr"]


def substituted(expr: str) -> str:
    for variable, value in GRAFANA_VARIABLES.items():
        expr = expr.replace(variable, value)
    return expr


def test_every_query_reads_exported_metrics_by_their_labels() -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    found = list(queries(dashboard))
    assert len(found) > 25
    read = set()
    for where, expr in found:
        names = re.findall(r"\btandem_[a-z_]+\b", expr)
        assert names, f"{where} reads no Tandem metric: {expr}"
        for name in names:
            assert name in BY_NAME, f"{where} reads {name}, which the exporter does not serve"
            read.add(name)
        for name, selector in re.findall(r"\b(tandem_[a-z_]+)\{([^}]*)\}", expr):
            for label in re.findall(r"(\w+)\s*(?:=~|!~|!=|=)", selector):
                assert label in set(BY_NAME[name].labels) | TARGET_LABELS, f"{where}: {name} has no label {label}"
        for grouped in re.findall(r"\bby \(([^)]*)\)", expr):
            labels = {label.strip() for label in grouped.split(",")}
            carried = set().union(*(BY_NAME[n].labels for n in names)) | TARGET_LABELS
            assert labels <= carried, f"{where}: groups by {labels - carried}, which its metrics do not carry"
    unread = set(BY_NAME) - read
    assert not unread, f"metrics no panel shows: {sorted(unread)}"


def test_every_query_is_valid_promql(tmp_path: Path) -> None:
    dashboard = json.loads(DASHBOARD.read_text())
    rules = {"groups": [{"name": "dashboard", "rules": [
        {"record": f"tandem:dashboard_query:{number}", "expr": substituted(expr)}
        for number, (_, expr) in enumerate(queries(dashboard))]}]}
    path = tmp_path / "dashboard-queries.yml"
    path.write_text(yaml.safe_dump(rules))
    checked = subprocess.run(["promtool", "check", "rules", str(path)], capture_output=True, text=True, timeout=120)
    assert checked.returncode == 0, checked.stdout + checked.stderr
