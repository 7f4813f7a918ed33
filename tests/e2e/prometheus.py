"""A real Prometheus (Debian's) inside spark-head, set up as monitoring/prometheus.yml tells a
user: the loop's metrics on loopback, vLLM's through the front with the key from a file, and
monitoring/alerts.yml loaded. Two changes for a test's pace: scrapes and rule evaluations every
second, and every alert's `for:` cut to 0s (promtool's rule tests cover the real durations).
Queried with `promtool query instant` in the same node."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from tests.e2e.conftest import Bed, wait_until
from tests.scenarios import ROOT

PORT = 19090
SERVER = f"http://127.0.0.1:{PORT}"


class Prometheus:
    def __init__(self, bed: Bed) -> None:
        self.bed = bed

    def query(self, expr: str) -> list[dict[str, Any]]:
        """An instant query's vector: [{"metric": {...}, "value": [time, "text"]}]."""
        result = self.bed.node("spark-head", "promtool", "query", "instant", "-o", "json", SERVER, expr)
        loaded: list[dict[str, Any]] = json.loads(result.stdout)
        return loaded

    def value(self, expr: str) -> float | None:
        """The one value of a query that returns at most one series (None: no series)."""
        vector = self.query(expr)
        assert len(vector) <= 1, vector
        return float(vector[0]["value"][1]) if vector else None

    def refused(self, expr: str) -> str | None:
        """Why Prometheus refuses an expression (None: it evaluates)."""
        result = self.bed.node("spark-head", "promtool", "query", "instant", SERVER, expr, check=False)
        return None if result.returncode == 0 else (result.stderr or result.stdout).strip()

    def targets_up(self) -> dict[str, float | None]:
        return {job: self.value(f'up{{job="{job}"}}') for job in ("spark-reconciler", "spark-vllm")}


def scrape_config(directory: Path, api: str) -> str:
    """monitoring/prometheus.yml with its placeholders filled, paced for a test."""
    text = (ROOT / "monitoring/prometheus.yml").read_text(encoding="utf-8")
    host_port = re.sub(r"^https?://", "", api).rstrip("/")
    text = text.replace("HEAD:PORT", host_port).replace("/etc/prometheus/spark-api-key", str(directory / "key"))
    config = yaml.safe_load(text)
    config["global"] = {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "1s"}
    return yaml.safe_dump(config)


def dashboard_expressions() -> list[str]:
    """Every query of monitoring/grafana-dashboard.json, Grafana's interval variable filled in."""
    dashboard = json.loads((ROOT / "monitoring/grafana-dashboard.json").read_text(encoding="utf-8"))
    queries = [target["expr"] for panel in dashboard["panels"] for target in panel.get("targets", [])]
    return [query.replace("$__rate_interval", "1m") for query in queries]


def quick_rules() -> str:
    return re.sub(r"(?m)^(\s+)for: \S+$", r"\1for: 0s", (ROOT / "monitoring/alerts.yml").read_text(encoding="utf-8"))


@contextlib.contextmanager
def real_prometheus(bed: Bed, api: str) -> Iterator[Prometheus]:
    directory = bed.spec.parent / "prometheus"
    directory.mkdir(exist_ok=True)
    key = directory / "key"
    key.write_text(bed.api_key() + "\n", encoding="utf-8")
    key.chmod(0o600)
    (directory / "prometheus.yml").write_text(scrape_config(directory, api), encoding="utf-8")
    (directory / "alerts.yml").write_text(quick_rules(), encoding="utf-8")
    argv = [
        "prometheus",
        f"--config.file={directory / 'prometheus.yml'}",
        f"--storage.tsdb.path={directory / 'data'}",
        f"--web.listen-address=127.0.0.1:{PORT}",
    ]
    log = (directory / "prometheus.log").open("w", encoding="utf-8")
    process = subprocess.Popen(
        bed.testbed.exec_argv("spark-head", argv), stdout=log, stderr=subprocess.STDOUT, start_new_session=True
    )
    prometheus = Prometheus(bed)
    try:
        wait_until(lambda: _ready(bed), 60, "Prometheus ready", every=0.5)
        yield prometheus
    finally:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        log.close()


def _ready(bed: Bed) -> bool:
    probe = f"curl -fsS -o /dev/null {SERVER}/-/ready"
    return bed.node("spark-head", "sh", "-c", probe, check=False).returncode == 0
