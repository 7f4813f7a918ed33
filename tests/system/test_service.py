"""The boot-time unit under a real systemd: install, READY, STATUS, watchdog, recovery, stop.

A throwaway machine (tests/system/machine.py: this host's /usr booted by systemd-nspawn,
loopback only) runs the real `reconciler install-service` and then the real `reconciler run`
as the unit it wrote. The spec's worker is a closed loopback port and the machine's Docker
is masked, so the loop can never converge: it must still report READY after its first pass,
say why in STATUS, keep the watchdog fed, and stop cleanly. The tests run in file order on
one machine; each states what it waits for, so a failure says which stage broke.

Only test speed is adjusted, by a drop-in: WatchdogSec=4s (the unit says 60s) and
RestartSec=1s (15s), so the hung-loop recovery takes seconds.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from reconciler.constants import UNIT_NAME
from tests.system.machine import Machine, booted, make_root, nspawn_available, read_only_binds

pytestmark = [
    pytest.mark.system,
    pytest.mark.skipif(not nspawn_available(), reason="needs root and systemd-nspawn (make system-test installs it)"),
]

RECONCILER = str(Path(__file__).resolve().parents[2] / ".venv/bin/reconciler")
SPEC = "/srv/spec/deployment.yaml"
STATE_DIR = "/srv/spark/state"
MODEL_DIR = "/srv/spark/models/DeepSeek-V4.1-Flash-Spark"
# Nothing listens on port 9 in the machine's private network: every connection is refused.
SPEC_TEXT = f"""\
name: svctest
state_dir: {STATE_DIR}
nodes:
  - name: spark-head
    role: head
    model_dir: {MODEL_DIR}
    fabric: {{ip: 198.18.10.10, ifname: enp1s0f1np1}}
  - name: spark-worker
    ssh: {{host: 127.0.0.1, port: 9, user: root, connect_timeout_s: 2}}
    model_dir: /srv/spark/models/DeepSeek-V4.1-Flash-Spark
    fabric: {{ip: 198.18.10.11, ifname: enp1s0f1np1}}
model: {{endpoint: "http://127.0.0.1:9"}}
image: {{ref: "127.0.0.1:9/none@sha256:{"0" * 64}"}}
"""
DROP_IN = """\
[Service]
WatchdogSec=4s
RestartSec=1s
LimitCORE=0
"""
WATCHDOG_INTERVAL_S = 2.0  # half the drop-in's WatchdogSec, as notify.watchdog_interval_s() computes
PROPERTIES = ("ActiveState", "SubState", "StatusText", "MainPID", "NRestarts", "WatchdogTimestampMonotonic")


def checkout_under_tmp() -> bool:
    return any(path.is_relative_to("/tmp") or path.is_relative_to("/var/tmp") for path in read_only_binds())


def drop_in() -> str:
    """The speed drop-in; PrivateTmp=no only when this checkout itself lives under a tmp dir."""
    if checkout_under_tmp():
        print("\n[note] the checkout is under a tmp dir, which PrivateTmp would hide: PrivateTmp=no for this test")
        return DROP_IN + "PrivateTmp=no\n"
    return DROP_IN


def timing(stage: str, started: float) -> None:
    print(f"\n[timing] {stage}: {time.monotonic() - started:.1f} s")


def wait_for(machine: Machine, what: str, done: Callable[[dict[str, str]], bool], timeout_s: float) -> dict[str, str]:
    deadline = time.monotonic() + timeout_s
    while True:
        state = machine.show(UNIT_NAME, *PROPERTIES)
        if done(state):
            return state
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not within {timeout_s:.0f} s; last {state}\n{machine.journal(UNIT_NAME)}")
        time.sleep(0.2)


def running(state: dict[str, str]) -> bool:
    return state["ActiveState"] == "active" and state["SubState"] == "running"


@pytest.fixture(scope="module")
def machine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Machine]:
    root = tmp_path_factory.mktemp("machine") / "root"
    files = {SPEC.lstrip("/"): SPEC_TEXT, f"etc/systemd/system/{UNIT_NAME}.d/10-test-speed.conf": drop_in()}
    started = time.monotonic()
    make_root(root, files, masked=["docker.service", "docker.socket"])
    with booted(root, read_only_binds()) as booted_machine:
        timing("machine built and booted", started)
        yield booted_machine


@pytest.fixture(scope="module")
def installed(machine: Machine) -> dict[str, object]:
    started = time.monotonic()
    result = machine.run([RECONCILER, "install-service", "--spec", SPEC, "--json"])
    timing("install-service", started)
    report: dict[str, object] = json.loads(result.stdout)
    return report


@pytest.fixture
def serving(machine: Machine, installed: dict[str, object]) -> Machine:
    """The unit installed and running, whatever a test before left (stopped, or restarting)."""
    del installed
    if machine.show(UNIT_NAME, "ActiveState")["ActiveState"] in ("inactive", "failed"):
        machine.run(["systemctl", "start", "--no-block", UNIT_NAME])
    wait_for(machine, "running", running, timeout_s=90)
    return machine


def test_install_service_writes_enables_and_starts_the_unit(machine: Machine, installed: dict[str, object]) -> None:
    assert installed["written"] is True
    assert installed["systemd_running"] is True
    assert installed["ran"] == [
        "systemctl daemon-reload",
        f"systemctl enable {UNIT_NAME}",
        f"systemctl restart --no-block {UNIT_NAME}",
    ]
    assert installed["created_dirs"] == ["/srv/spark", "/srv/spark/models", MODEL_DIR, STATE_DIR]
    assert (machine.root / "etc/systemd/system/multi-user.target.wants" / UNIT_NAME).is_symlink()
    assert machine.run(["systemctl", "is-enabled", UNIT_NAME]).stdout.strip() == "enabled"


def test_installing_again_changes_nothing(machine: Machine, installed: dict[str, object]) -> None:
    again = json.loads(machine.run([RECONCILER, "install-service", "--spec", SPEC, "--json"]).stdout)
    assert installed["written"] is True
    assert again["written"] is False
    assert again["ran"] == [f"systemctl enable {UNIT_NAME}", f"systemctl start --no-block {UNIT_NAME}"]


def test_ready_after_the_first_pass_with_the_condition_in_status(serving: Machine) -> None:
    machine = serving
    state = wait_for(machine, "READY=1 (active/running)", running, timeout_s=90)
    stamps = machine.show(UNIT_NAME, "ExecMainStartTimestampMonotonic", "ActiveEnterTimestampMonotonic")
    ready_s = (int(stamps["ActiveEnterTimestampMonotonic"]) - int(stamps["ExecMainStartTimestampMonotonic"])) / 1e6
    print(f"\n[timing] process start to READY=1 (first pass done): {ready_s:.1f} s\n[status] {state['StatusText']}")
    assert "unreachable" in state["StatusText"] or "failed" in state["StatusText"], state
    journal = machine.journal(UNIT_NAME)
    assert "READY=1" in journal
    assert "STATUS=" in journal
    assert (machine.root / STATE_DIR.lstrip("/") / "loop-status.json").is_file(), "the loop could not write its state"


def test_the_watchdog_is_fed_at_half_its_interval(serving: Machine) -> None:
    machine = serving
    wait_for(machine, "running", running, timeout_s=30)
    pings = set()
    started = time.monotonic()
    while time.monotonic() - started < 3 * WATCHDOG_INTERVAL_S + 1:
        pings.add(int(machine.show(UNIT_NAME, "WatchdogTimestampMonotonic")["WatchdogTimestampMonotonic"]))
        time.sleep(0.2)
    gaps = [(later - earlier) / 1e6 for earlier, later in zip(sorted(pings), sorted(pings)[1:], strict=False)]
    print(f"\n[timing] watchdog pings every {', '.join(f'{gap:.2f}' for gap in gaps)} s")
    assert len(pings) >= 3, f"the watchdog timestamp did not advance: {sorted(pings)}"
    assert all(0.5 * WATCHDOG_INTERVAL_S < gap < 1.5 * WATCHDOG_INTERVAL_S for gap in gaps), gaps


def test_the_sandbox_keeps_the_os_read_only_and_the_data_writable(serving: Machine) -> None:
    machine = serving
    pid = wait_for(machine, "running", running, timeout_s=30)["MainPID"]

    def can_write(path: str) -> bool:
        """In the service's own mount namespace, as its sandbox shows the file system."""
        touch = f"touch {path}/.sandbox-probe && rm {path}/.sandbox-probe"
        return machine.run(["nsenter", "-t", pid, "-m", "sh", "-c", touch], check=False).returncode == 0

    assert not can_write("/etc")
    assert not can_write("/usr/local")
    assert can_write("/root")
    assert can_write(STATE_DIR)
    if not checkout_under_tmp():
        # With PrivateTmp the service gets its own writable /tmp; a checkout under /tmp is
        # bound read-only there instead (see drop_in), so this only holds in the usual case.
        assert can_write("/tmp")


def test_the_sandboxed_loop_reaches_the_docker_socket(serving: Machine) -> None:
    machine = serving
    fake = str(Path(__file__).with_name("fake_docker.py"))
    machine.run(["systemd-run", "--unit=fake-docker", "--collect", "/usr/bin/python3", fake, "/run/docker.sock"])
    try:
        deadline = time.monotonic() + 10
        while machine.run(["test", "-S", "/run/docker.sock"], check=False).returncode != 0:
            assert time.monotonic() < deadline, "the fake Docker socket did not appear"
            time.sleep(0.1)
        machine.run(["systemctl", "restart", UNIT_NAME])
        state = wait_for(machine, "STATUS quoting the fake Docker", lambda s: "HTTP 500" in s["StatusText"], 30)
        print(f"\n[status] {state['StatusText']}")
    finally:
        machine.run(["systemctl", "stop", "fake-docker"], check=False)


def test_a_hung_loop_is_killed_by_the_watchdog_and_restarted(serving: Machine) -> None:
    machine = serving
    before = wait_for(machine, "running", running, timeout_s=30)
    started = time.monotonic()
    machine.run(["kill", "-STOP", before["MainPID"]])

    def restarted(state: dict[str, str]) -> bool:
        return int(state["NRestarts"]) > int(before["NRestarts"]) and running(state)

    after = wait_for(machine, "restart after a watchdog timeout", restarted, timeout_s=60)
    timing("hung loop to running again", started)
    assert after["MainPID"] != before["MainPID"]
    assert "Watchdog timeout" in machine.journal(UNIT_NAME)


def test_stop_sends_stopping_and_exits_cleanly(serving: Machine) -> None:
    machine = serving
    wait_for(machine, "running", running, timeout_s=30)
    started = time.monotonic()
    machine.run(["systemctl", "stop", UNIT_NAME], timeout=120)
    timing("systemctl stop", started)
    state = machine.show(UNIT_NAME, "ActiveState", "Result", "ExecMainStatus")
    assert state == {"ActiveState": "inactive", "Result": "success", "ExecMainStatus": "0"}
    assert "STOPPING=1" in machine.journal(UNIT_NAME)
