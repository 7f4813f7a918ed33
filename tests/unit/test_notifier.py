"""`loop.notify`: which history lines and passes are news for the owner, and how the command is run
(the event on stdin, no secret in it, a bounded run, a failure that is only a journal line)."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

from reconciler.facts.memory import GuardTrip
from reconciler.facts.node import Facts, Hold
from reconciler.notifier import Notifications, Notifier, run_command
from reconciler.plan import plan
from reconciler.redact import clear, register
from reconciler.spec import Deployment
from tests.scenarios import converged_facts, empty_facts, reference_deployment, with_node

HEAD, WORKER = "spark-head", "spark-worker"
TRIP = GuardTrip(at="2026-12-04T10:00:00Z", mem_available_gib=0.4, floor_gib=0.5)


@pytest.fixture
def deployment() -> Deployment:
    return reference_deployment()


def tripped(deployment: Deployment, trip: GuardTrip = TRIP) -> Facts:
    base = converged_facts(deployment)
    return with_node(base, WORKER, guard=base.nodes[WORKER].guard.model_copy(update={"trip": trip}))


def test_a_breaker_trip_and_an_incident_are_each_one_event(deployment: Deployment) -> None:
    told = Notifications(deployment)
    trip = told.from_history({"kind": "step", "step": "ranks.hold-crash-loop", "outcome": "done"})
    incident = told.from_history({"kind": "incident", "id": "x-001-rank-exit", "incident": "rank exit", "cause": "r1"})
    assert trip is not None
    assert (trip["event"], trip["what"]) == ("trip", "breaker")
    assert incident is not None
    assert (incident["event"], incident["id"], incident["incident"]) == ("incident", "x-001-rank-exit", "rank exit")
    for event in (trip, incident):
        assert event["deployment"] == "dsv41"
        assert event["at"].endswith("Z")


def test_a_hold_is_told_once_by_its_code_whoever_made_it(deployment: Deployment) -> None:
    """`reconciler stop` runs in another process: the loop learns of the hold from the facts."""
    told = Notifications(deployment)
    stopped = with_node(converged_facts(deployment), HEAD, hold=Hold(since="2026-12-04T10:00:00Z"))
    held = plan(deployment, stopped)
    first = told.from_pass(held, stopped)
    assert [(e["event"], e["reason"]) for e in first] == [("hold", "stopped")]
    assert first[0]["summary"] == "dsv41: the serving group is held by `reconciler stop`"
    assert told.from_pass(held, stopped) == []
    unreachable = with_node(stopped, HEAD, reachable=False)
    assert told.from_pass(plan(deployment, unreachable), unreachable) == []
    clear = converged_facts(deployment)
    assert [(e["event"], e["after"]) for e in told.from_pass(plan(deployment, clear), clear)] == [
        ("recovery", ["hold"])
    ]
    assert [e["reason"] for e in told.from_pass(held, stopped)] == ["stopped"], "a new stop is news again"


def test_other_history_lines_are_not_news(deployment: Deployment) -> None:
    told = Notifications(deployment)
    for line in (
        {"kind": "hold", "reason": "a sentence from the plan"},
        {"kind": "pass", "outcome": "converged"},
        {"kind": "step", "step": "ranks.hold-crash-loop", "outcome": "failed"},
        {"kind": "step", "step": "ranks.start", "outcome": "done"},
        {"kind": "restart", "cause": "rank exit", "planned": True},
        {"kind": "progress", "step": "checkpoint.download"},
    ):
        assert told.from_history(line) is None
    assert told.from_pass(plan(deployment, converged_facts(deployment)), converged_facts(deployment)) == []


def test_a_guard_trip_is_told_once_then_the_recovery_once(deployment: Deployment) -> None:
    told = Notifications(deployment)
    facts = tripped(deployment)
    held = plan(deployment, facts)
    first = told.from_pass(held, facts)
    assert [(e["event"], e.get("what"), e.get("node"), e.get("reason")) for e in first] == [
        ("hold", None, None, "guard_trip"),
        ("trip", "memguard", WORKER, None),
    ]
    assert "MemAvailable 0.40 GiB under the floor of 0.5 GiB" in first[1]["summary"]
    assert told.from_pass(held, facts) == []  # the same trip, seen again
    clear = converged_facts(deployment)
    recovered = told.from_pass(plan(deployment, clear), clear)
    assert [(e["event"], e["after"]) for e in recovered] == [("recovery", ["hold", "trip"])]
    assert told.from_pass(plan(deployment, clear), clear) == []
    again = tripped(deployment, TRIP.model_copy(update={"at": "2026-12-04T11:00:00Z"}))
    assert [e["event"] for e in told.from_pass(plan(deployment, again), again)] == ["hold", "trip"]


def test_no_recovery_while_the_deployment_still_differs(deployment: Deployment) -> None:
    told = Notifications(deployment)
    told.from_history({"kind": "incident", "id": "i", "incident": "liveness", "cause": "no answer"})
    facts = empty_facts()
    assert told.from_pass(plan(deployment, facts), facts) == []
    clear = converged_facts(deployment)
    assert [e["event"] for e in told.from_pass(plan(deployment, clear), clear)] == ["recovery"]


def script(tmp_path: Path, body: str) -> list[str]:
    path = tmp_path / "notify.py"
    path.write_text(body, encoding="utf-8")
    return [sys.executable, str(path)]


def test_the_command_gets_the_event_as_json_on_stdin_and_no_secret(tmp_path: Path) -> None:
    secret = "sk-notify-test-" + "q" * 30
    register(secret)
    out = tmp_path / "got.json"
    argv = script(
        tmp_path, f"import sys, os\nopen({str(out)!r}, 'w').write(sys.stdin.read() + repr(sorted(os.environ)))\n"
    )
    try:
        line = run_command(argv, {"event": "incident", "summary": f"cause mentions {secret}", "cause": secret})
    finally:
        clear()
    assert line == "notify (incident): done"
    text = out.read_text(encoding="utf-8")
    assert secret not in text
    event = json.loads(text.splitlines()[0])
    assert event["event"] == "incident"
    assert set(eval(text.splitlines()[1])) <= {"PATH", "HOME", "LANG"}


def test_a_failing_missing_or_hanging_command_is_one_journal_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    event = {"event": "trip", "summary": "s"}
    failing = script(tmp_path, "import sys\nprint('webhook said 503')\nsys.exit(3)\n")
    assert run_command(failing, event).endswith("exited 3: webhook said 503")
    assert run_command([str(tmp_path / "absent")], event).startswith("notify (trip): cannot run ")
    monkeypatch.setattr("reconciler.notifier.TIMEOUT_S", 0.5)
    hanging = script(tmp_path, "import time\ntime.sleep(30)\n")
    assert run_command(hanging, event).endswith("did not finish in 0.5 s; it was stopped")


def test_the_notifier_runs_events_in_order_off_the_caller_and_only_when_set(tmp_path: Path) -> None:
    out = tmp_path / "got.jsonl"
    argv = script(tmp_path, f"import sys\nopen({str(out)!r}, 'a').write(sys.stdin.read())\n")
    command: list[list[str] | None] = [None]
    journal: list[str] = []
    notifier = Notifier(lambda: command[0], journal.append)
    notifier.send({"event": "hold", "summary": "not sent: no command"})
    command[0] = argv
    for number in range(3):
        notifier.send({"event": "incident", "summary": str(number)})
    assert notifier.drain(20)
    assert [json.loads(line)["summary"] for line in out.read_text(encoding="utf-8").splitlines()] == ["0", "1", "2"]
    assert journal == ["notify (incident): done"] * 3


def test_a_chatty_command_keeps_only_its_last_words_and_leaves_nothing_running(tmp_path: Path) -> None:
    pidfile = tmp_path / "child.pid"
    body = (
        "import os, subprocess, sys, time\n"
        f"child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'])\n"
        f"open({str(pidfile)!r}, 'w').write(str(child.pid))\n"
        "sys.stdout.write('x' * 5_000_000 + 'the end')\n"
    )
    line = run_command(script(tmp_path, body), {"event": "hold", "summary": "s"})
    assert line.endswith("the end")
    assert len(line) < 2200
    child = int(pidfile.read_text(encoding="utf-8"))
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and running(child):
        time.sleep(0.1)
    alive = running(child)
    assert not alive, "what the command started ends with it"


def running(pid: int) -> bool:
    """Whether the process exists and is not a zombie waiting for its parent."""
    try:
        return Path(f"/proc/{pid}/stat").read_text(encoding="utf-8").rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
