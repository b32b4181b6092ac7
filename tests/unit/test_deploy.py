"""deploy/: the Prometheus alert rules pass `promtool check rules` and their own unit tests
(`promtool test rules`: each alert fires on the series that should raise it, and not on a healthy
node), and the Grafana dashboard is a well-formed dashboard whose every expression names only
metrics senddock exports."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml
from tests_support import require_tool

from senddock.observe.cluster_metrics import ClusterCollector
from senddock.observe.node_metrics import NodeMetrics

DEPLOY = Path(__file__).resolve().parents[2] / "deploy"
METRIC = re.compile(r"\b(senddock_[a-z_]+|up)\b")


def exported() -> set[str]:
    """Every series name a node and `serve` expose, with the suffixes Prometheus adds."""
    names = set()
    for family in [*NodeMetrics().registry.collect(), *ClusterCollector(None, None).describe()]:
        names.add(family.name)
        suffixes = {"counter": ("_total", "_created"), "histogram": ("_bucket", "_count", "_sum", "_created"),
                    "gauge": ()}[family.type]
        names |= {family.name + s for s in suffixes}
    return names | {"up"}  # Prometheus's own, per scrape target


def promtool() -> str:
    return require_tool("promtool", "prometheus")


@pytest.mark.parametrize("command", [["check", "rules", "alerts.yml"], ["test", "rules", "alerts_test.yml"]])
def test_alert_rules_pass_promtool(command):
    result = subprocess.run([promtool(), *command], cwd=DEPLOY / "prometheus", capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_alert_rules_name_only_exported_metrics():
    rules = yaml.safe_load((DEPLOY / "prometheus" / "alerts.yml").read_text())
    expressions = [rule["expr"] for group in rules["groups"] for rule in group["rules"]]
    assert expressions
    for expr in expressions:
        assert set(METRIC.findall(expr)) <= exported(), expr


def test_the_grafana_dashboard_is_well_formed_and_names_only_exported_metrics():
    dashboard = json.loads((DEPLOY / "grafana" / "senddock.json").read_text())
    assert {"title", "uid", "schemaVersion", "panels", "templating"} <= set(dashboard)
    assert [v["name"] for v in dashboard["templating"]["list"]] == ["datasource"]
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
    for panel in dashboard["panels"]:
        assert {"type", "title", "gridPos", "targets", "datasource"} <= set(panel), panel.get("title")
        assert panel["datasource"]["uid"] == "${datasource}"
        grid = panel["gridPos"]
        assert 0 <= grid["x"] and grid["x"] + grid["w"] <= 24 and grid["h"] > 0
        refs = [target["refId"] for target in panel["targets"]]
        assert refs and len(refs) == len(set(refs))
        for target in panel["targets"]:
            names = set(METRIC.findall(target["expr"]))
            assert names and names <= exported(), (panel["title"], target["expr"])
