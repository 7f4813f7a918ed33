"""The monitoring files users import (monitoring/): Debian's promtool checks the rules and makes
each alert fire and clear, the scrape config is one Prometheus accepts, and every reconciler
metric the rules and the dashboard name is one the loop serves."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from reconciler.metrics import LoopMetrics
from tests.scenarios import ROOT, reference_deployment

MONITORING = ROOT / "monitoring"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(PROMTOOL is None, reason="no promtool (Debian's prometheus package)")


def promtool(*args: str, cwd: Path = MONITORING) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run([PROMTOOL, *args], cwd=cwd, capture_output=True, text=True, timeout=120, check=False)


@needs_promtool
def test_promtool_accepts_the_alert_rules() -> None:
    result = promtool("check", "rules", "alerts.yml")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS: 12 rules found" in result.stdout


@needs_promtool
def test_each_alert_fires_and_clears_in_promtool_s_rule_tests() -> None:
    result = promtool("test", "rules", "alerts.test.yml")
    assert result.returncode == 0, result.stdout + result.stderr
    tested = set(re.findall(r"alertname: (\w+)", (MONITORING / "alerts.test.yml").read_text(encoding="utf-8")))
    assert tested == alert_names()


@needs_promtool
def test_the_scrape_config_is_one_prometheus_accepts_once_its_placeholders_are_filled(tmp_path: Path) -> None:
    key = tmp_path / "spark-api-key"
    key.write_text("sk-test\n", encoding="utf-8")
    text = (MONITORING / "prometheus.yml").read_text(encoding="utf-8")
    filled = text.replace("HEAD:PORT", "192.0.2.10:8000").replace("/etc/prometheus/spark-api-key", str(key))
    (tmp_path / "prometheus.yml").write_text(filled, encoding="utf-8")
    shutil.copy(MONITORING / "alerts.yml", tmp_path / "alerts.yml")
    result = promtool("check", "config", "prometheus.yml", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr


def alert_names() -> set[str]:
    return set(re.findall(r"- alert: (\w+)", (MONITORING / "alerts.yml").read_text(encoding="utf-8")))


def family_names() -> set[str]:
    """The name of every metric the loop's registry declares (a labelled one serves no sample
    until set, but its family is there from the start)."""
    return {family.name for family in LoopMetrics(reference_deployment()).registry.collect()}


def family_of(sample: str) -> str:
    """`x_total` -> `x`, `x_seconds_bucket` -> `x_seconds`: the family a sample name belongs to."""
    return re.sub(r"_(total|bucket|count|sum)$", "", sample)


def test_every_reconciler_metric_the_rules_and_the_dashboard_use_is_served() -> None:
    dashboard = json.loads((MONITORING / "grafana-dashboard.json").read_text(encoding="utf-8"))
    expressions = [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]
    rules = (MONITORING / "alerts.yml").read_text(encoding="utf-8")
    used = {family_of(name) for name in re.findall(r"spark_reconciler_[a-z_]+", rules + "\n".join(expressions))}
    assert len(used) > 10, used
    assert used <= family_names(), used - family_names()


def test_the_dashboard_is_grafana_json_over_a_chosen_prometheus() -> None:
    dashboard = json.loads((MONITORING / "grafana-dashboard.json").read_text(encoding="utf-8"))
    assert dashboard["uid"] == "spark-reconciler"
    panels = [panel for panel in dashboard["panels"] if panel["type"] != "row"]
    assert panels
    assert all(panel["datasource"]["uid"] == "${datasource}" for panel in panels)
    assert {variable["name"] for variable in dashboard["templating"]["list"]} == {"datasource"}
    ids = [panel["id"] for panel in dashboard["panels"]]
    assert len(ids) == len(set(ids))
