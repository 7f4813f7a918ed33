"""Runs ON every node (stdlib only): the memory guard.

A DGX Spark shares one memory pool between CPU and GPU; when MemAvailable reaches zero the
host wedges until the hardware watchdog reboots it, instead of OOM-killing cleanly. This
guard polls /proc/meminfo and, below the floor, kills this deployment's rank containers
(found by label through the Docker API, not by a name substring), logs why with the top
memory users, and records the trip so the reconciler holds the group instead of restarting
it into the same wall.

Usage: python3 memguard.py STATE_DIR   (config in STATE_DIR/memguard.json, written by apply)
"""

from __future__ import annotations

import http.client  # noqa: F401  (loaded now: the first Docker call comes when memory is short)
import json
import os
import socket  # noqa: F401
import sys
import time
import urllib.parse
from typing import Any

from reconciler.nodeside.common import docker_request, write_private
from reconciler.nodeside.statedir import StateDir

KIB_PER_GIB = 1024 * 1024
LOW_WATER_GIB = 10.0
# The memory record: the lowest MemAvailable of each window of this many samples (a minute at
# the default 1 s interval), with the rank configs that ran through it; the last windows kept.
WINDOW_SAMPLES = 60
KEPT_WINDOWS = 240
CONFIG_LABEL = "io.spark-reconciler.config-hash"
RECORD_TIMEOUT_S = 2.0


def _docker(method: str, path: str, timeout: float = 10.0) -> Any:
    body = docker_request(method, path, timeout)[1]
    return json.loads(body) if body.strip() else None


def now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S%z")


def mem_available_gib(meminfo_path: str) -> float:
    with open(meminfo_path, encoding="ascii") as handle:
        for line in handle:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / KIB_PER_GIB
    raise RuntimeError("no MemAvailable in " + meminfo_path)


def top_rss(count: int = 3) -> list[str]:
    """The largest resident processes, as `ps -eo rss,comm --sort=-rss` lists them, read from /proc."""
    found: list[tuple[int, str]] = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{pid}/status", encoding="ascii", errors="replace") as handle:
                fields = dict(line.split(":", 1) for line in handle if ":" in line)
        except OSError:
            continue
        rss = fields.get("VmRSS", "0 kB").split()[0]
        found.append((int(rss) if rss.isdigit() else 0, f"{fields.get('Name', '?').strip()}[{pid}]"))
    return [f"{name} {rss / KIB_PER_GIB:.1f}G" for rss, name in sorted(found, reverse=True)[:count]]


# A container of ours with a role is not a rank (the front): it holds no GPU memory, and the API
# answers 503 through it while the ranks are held.
ROLE_LABEL = "io.spark-reconciler.role"


def rank_configs(labels: list[str]) -> list[str]:
    """The config hashes of this deployment's running ranks on this node."""
    filters = urllib.parse.quote(json.dumps({"label": labels, "status": ["running"]}))
    # A short timeout: a Docker slow to answer must not hold back the next check of the floor.
    containers = _docker("GET", f"/containers/json?filters={filters}", RECORD_TIMEOUT_S)
    if not isinstance(containers, list):
        raise RuntimeError(f"Docker's container list is not a list: {str(containers)[:100]}")
    labelled = [found for item in containers if isinstance(found := (item or {}).get("Labels"), dict)]
    return sorted(str(found[CONFIG_LABEL]) for found in labelled if CONFIG_LABEL in found and not found.get(ROLE_LABEL))


def kill_ranks(labels: list[str]) -> list[str]:
    filters = urllib.parse.quote(json.dumps({"label": labels, "status": ["running"]}))
    containers = _docker("GET", f"/containers/json?filters={filters}") or []
    names = []
    for container in containers:
        if (container.get("Labels") or {}).get(ROLE_LABEL):
            continue
        _docker("POST", f"/containers/{container['Id']}/kill?signal=SIGKILL")
        names.append(container["Names"][0].lstrip("/"))
    return names


class Guard:
    def __init__(self, state_dir: str) -> None:
        self.layout = StateDir(state_dir)
        with open(self.layout.guard_config, encoding="utf-8") as handle:
            self.config: dict[str, Any] = json.load(handle)
        self.log_path = self.layout.guard_log
        self.window_low: float | None = None
        self.window_configs: list[str] | None = None

    def log(self, message: str) -> None:
        # Private, and never through a symlink someone placed at the log's name.
        descriptor = os.open(self.log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW, 0o600)
        with os.fdopen(descriptor, "a", encoding="utf-8") as handle:
            handle.write(f"{now()} {message}\n")

    def record_trip(self, available: float, floor: float, killed: list[str]) -> None:
        trip = {"at": now(), "mem_available_gib": round(available, 3), "floor_gib": floor, "killed": killed}
        write_private(self.layout.guard_trip, json.dumps(trip))

    def remember(self, count: int, available: float) -> None:
        """Keep the window's lowest MemAvailable; at its end, record it with the rank configs
        that ran at its start and its end (a window that saw a restart names neither)."""
        if count % WINDOW_SAMPLES == 0:
            configs = rank_configs(self.config["labels"])
            if self.window_low is not None and self.window_configs is not None:
                ran = configs if configs == self.window_configs else []
                self.record_window(self.window_low, ran)
            self.window_low, self.window_configs = available, configs
        elif self.window_low is not None:
            self.window_low = min(self.window_low, available)

    def record_window(self, low: float, configs: list[str]) -> None:
        try:
            with open(self.layout.guard_record, encoding="utf-8") as handle:
                windows = json.load(handle).get("windows", [])
        except (OSError, ValueError, AttributeError):
            windows = []
        entry = {"at": round(time.time()), "low_kib": round(low * KIB_PER_GIB), "ranks": configs}
        windows = [*windows, entry][-KEPT_WINDOWS:]
        record = {
            "window_samples": WINDOW_SAMPLES,
            "interval_s": self.config.get("interval_s", 1.0),
            "windows": windows,
        }
        write_private(self.layout.guard_record, json.dumps(record))

    def tick(self, count: int) -> None:
        floor = float(self.config["floor_gib"])
        available = mem_available_gib(self.config.get("meminfo", "/proc/meminfo"))
        self.guard_floor(count, floor, available)
        try:
            self.remember(count, available)
        except Exception as exc:  # the record is a help; whatever fails in it, the guard keeps guarding
            self.window_low = None
            self.log(f"memory record: {type(exc).__name__}: {exc}")

    def guard_floor(self, count: int, floor: float, available: float) -> None:
        if available < LOW_WATER_GIB and count % 10 == 0:
            self.log(f"MemAvailable {available:.2f}G; top: {', '.join(top_rss())}")
        if available < floor:
            killed = kill_ranks(self.config["labels"])
            if killed:
                top = ", ".join(top_rss())
                self.log(f"MemAvailable {available:.2f}G < {floor:g}G: killing {' '.join(killed)}; top: {top}")
                self.record_trip(available, floor, killed)

    def run(self) -> None:
        self.log(f"memguard start floor {self.config['floor_gib']}G pid {os.getpid()}")
        count = 0
        while True:
            try:
                self.tick(count)
            except Exception as exc:  # one failed tick (Docker's odd answer, a full disk) never ends the guard
                self.log(f"error: {type(exc).__name__}: {exc}")
            count += 1
            time.sleep(float(self.config.get("interval_s", 1.0)))


if __name__ == "__main__":
    Guard(sys.argv[1]).run()
