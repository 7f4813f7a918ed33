"""A long first pass on the testbed shows how far it is, from anywhere, while it runs.

`reconciler run` runs inside spark-head with NOTIFY_SOCKET pointing at a unix datagram socket
this test listens on (systemd's side of sd_notify). The Hub stand-in caps every response at
RATE_BPS, so the head's download of the fresh checkpoint takes tens of seconds, and the engine
stand-in waits ENGINE_STARTUP_DELAY_S before it serves, logging as it loads. Before READY=1
(the end of the first pass) STATUS= must have said, several times and each time something
new, how many bytes of the download are done, at what rate and for how long still; `reconciler
status --json` must have shown the pass under way from loop-status.json; and the readiness
wait's STATUS= must have carried a line of rank 0's log. The loop's own output (the journal
under systemd) must hold progress lines with an ETA and the ranks' log lines.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import RECONCILER, Bed
from tests.testbed.hub.control import StandinControl

pytestmark = pytest.mark.testbed

HUB = "http://198.19.0.1:5080"
# Per response: the eight downloads the Hub client runs at once each get this much, so the
# ~29 MB checkpoint (4 MB shards the largest) takes about half a minute.
RATE_BPS = 200_000
STARTUP_DELAY_S = 20
FIRST_PASS_TIMEOUT_S = 600
BYTE_PROGRESS = re.compile(r"download \d+% of [\d.]+ [kMG]?B, [\d.]+ [kMG]?B/s, ETA \d+[smhd]")


class NotifyListener:
    """systemd's end of sd_notify: every datagram received, in order, on a thread of its own."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self.sock.bind(self.path)
        self.sock.settimeout(0.5)
        self.messages: list[dict[str, str]] = []
        self.ready = threading.Event()
        self.stopping = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._receive, daemon=True)
        self._thread.start()

    def _receive(self) -> None:
        while not self._stop.is_set():
            try:
                data = self.sock.recv(65536).decode("utf-8", "replace")
            except TimeoutError:
                continue
            fields = dict(line.split("=", 1) for line in data.splitlines() if "=" in line)
            self.messages.append(fields)
            if fields.get("READY") == "1":
                self.ready.set()
            if fields.get("STOPPING") == "1":
                self.stopping.set()

    def statuses_before_ready(self) -> list[str]:
        found: list[str] = []
        for fields in list(self.messages):
            if fields.get("READY") == "1":
                return found
            if "STATUS" in fields:
                found.append(fields["STATUS"])
        return found

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self.sock.close()


@pytest.fixture
def slow_hub() -> Iterator[StandinControl]:
    control = StandinControl(HUB)
    control.rate(RATE_BPS)
    try:
        yield control
    finally:
        control.clear_faults()


def in_progress(bed: Bed) -> dict[str, Any] | None:
    """The pass under way as `reconciler status --json` shows it (from loop-status.json)."""
    result = bed.reconciler("status", "--json", check=False, timeout=120)
    if result.returncode not in (0, 2):  # 2: not converged yet, as during a first pass
        return None
    loop = json.loads(result.stdout).get("loop") or {}
    current = loop.get("pass")
    return current if isinstance(current, dict) else None


def first_pass(bed: Bed, listener: NotifyListener, log_path: Path) -> list[dict[str, Any]]:
    """Run the loop until READY=1; returns every in-progress pass `status --json` showed meanwhile."""
    argv = [RECONCILER, "run", "--spec", str(bed.spec)]
    full = bed.testbed.exec_argv("spark-head", argv, env={"NOTIFY_SOCKET": listener.path})
    seen: list[dict[str, Any]] = []
    with log_path.open("w", encoding="utf-8") as log:
        # A session of its own: SIGTERM must reach the loop inside the node, not only nsenter.
        process = subprocess.Popen(full, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            deadline = time.monotonic() + FIRST_PASS_TIMEOUT_S
            while not listener.ready.is_set() and time.monotonic() < deadline and process.poll() is None:
                current = in_progress(bed)
                if current is not None:
                    seen.append(current)
                listener.ready.wait(1)
        finally:
            os.killpg(process.pid, signal.SIGTERM)
            listener.stopping.wait(60)
            try:
                process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
    return seen


def test_a_long_first_pass_shows_its_progress_in_status_the_status_file_and_the_journal(
    bed: Bed, slow_hub: StandinControl, tmp_path: Path
) -> None:
    assert slow_hub.faults()["rate_bps"] == RATE_BPS
    original = bed.spec.read_text(encoding="utf-8")
    delay = 'ENGINE_STARTUP_DELAY_S: "1"'
    assert delay in original
    bed.spec.write_text(original.replace(delay, f'ENGINE_STARTUP_DELAY_S: "{STARTUP_DELAY_S}"'), encoding="utf-8")
    listener = NotifyListener(tmp_path / "notify.sock")
    log_path = tmp_path / "loop.log"
    started = time.monotonic()
    try:
        seen = first_pass(bed, listener, log_path)
        converged = bed.plan_exit()  # against the spec the loop converged, before it is restored
    finally:
        listener.close()
        bed.spec.write_text(original, encoding="utf-8")
    journal = log_path.read_text(encoding="utf-8")
    print(journal[-4000:])
    assert listener.ready.is_set(), f"no READY=1 within {FIRST_PASS_TIMEOUT_S} s"
    assert converged == 0, "the first pass left the plan empty"
    statuses = listener.statuses_before_ready()
    downloading = [status for status in statuses if "checkpoint.download@spark-head" in status]
    with_bytes = [status for status in downloading if BYTE_PROGRESS.search(status)]
    print(f"first pass {time.monotonic() - started:.0f} s: {len(statuses)} STATUS= before READY=1, ")
    print(f"{len(set(with_bytes))} distinct with download progress: {with_bytes}")
    assert statuses[0] == "starting"
    assert len(set(with_bytes)) >= 3, f"STATUS= during the download: {downloading}"
    assert all(status.startswith("pass in progress: step ") for status in with_bytes)

    waiting = [status for status in statuses if "ranks.wait-ready@" in status and "r0| " in status]
    assert waiting, f"no rank log line in STATUS= during the readiness wait: {statuses[-10:]}"
    assert any("Model loading" in status for status in waiting), waiting

    downloads = [step for current in seen for step in current["active"] if (step.get("bytes") or {}).get("what")]
    midway = [step for step in downloads if 0 < step["bytes"]["done"] < step["bytes"]["total"]]
    assert midway, f"`reconciler status --json` never showed the download under way: {seen[-3:]}"
    assert all(current["by"] == "reconcile loop pass" for current in seen)
    # The worker's copy runs alongside the download (pipelined) and shows its bytes too.
    head_download = [step for step in midway if step["action"] == "checkpoint.download@spark-head"]
    assert head_download, f"the head's download never showed its bytes midway: {midway[-3:]}"
    step = head_download[-1]
    assert step["step"] <= step["steps"]
    assert step["bytes"]["rate_bps"] is None or step["bytes"]["rate_bps"] > 0

    assert re.search(r"(?m)^    spark-head: " + BYTE_PROGRESS.pattern, journal), "progress lines in the journal"
    assert re.search(r"(?m)^      r0\| .*Model loading", journal), "rank 0's log line in the journal"
    assert listener.stopping.is_set(), "the loop said STOPPING=1 on SIGTERM"
    assert in_progress(bed) is None, "the loop ended its pass before it stopped"
