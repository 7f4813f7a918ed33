"""The loop's decisions, with a fake clock and fake triggers: no root, no threads, no waiting."""

from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import Any

import pytest

from reconciler.actions import Blocker, Component
from reconciler.clock import utc_iso
from reconciler.facts.memory import GuardFacts, GuardTrip
from reconciler.facts.node import load_facts
from reconciler.loop import BACKOFF_BASE_S, DEBOUNCE_S, SPEC_CHANGED, WAKE_EVERY_S, LoopLogic, SpecKeeper, Triggers
from reconciler.plan import Plan, plan
from reconciler.spec import Loop as LoopSettings
from tests.scenarios import CONVERGED_FACTS, SPEC_PATH, reference_deployment, with_container, with_node


@dataclass
class FakeClock:
    now: float = 1000.0
    wall: float = 1_700_000_000.0

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        return self.wall

    def advance(self, seconds: float) -> None:
        self.now += seconds
        self.wall += seconds


@dataclass
class Jitter:
    values: list[float] = field(default_factory=lambda: [1.0])

    def __call__(self) -> float:
        return self.values.pop(0) if len(self.values) > 1 else self.values[0]


def logic(clock: FakeClock, jitter: Jitter | None = None, **settings: Any) -> LoopLogic:
    return LoopLogic(LoopSettings(**settings), clock=clock, jitter=jitter or Jitter())


def converged_plan() -> Plan:
    return plan(reference_deployment(), load_facts(CONVERGED_FACTS))


def test_backoff_doubles_from_the_base_up_to_its_cap() -> None:
    clock = FakeClock()
    brain = logic(clock, max_backoff_s=100)
    delays = [brain.pass_failed("boom") for _ in range(5)]
    assert delays == [BACKOFF_BASE_S, 2 * BACKOFF_BASE_S, 4 * BACKOFF_BASE_S, 100, 100]
    assert brain.status.failures == 5
    assert brain.status.condition == "failed 5x, next try in 100 s: boom"


def test_jitter_spreads_the_delay_and_the_next_try_says_when() -> None:
    clock = FakeClock()
    brain = logic(clock, Jitter([0.8, 1.2]))
    assert brain.pass_failed("a") == pytest.approx(0.8 * BACKOFF_BASE_S)
    assert brain.backoff_until == pytest.approx(clock.now + 0.8 * BACKOFF_BASE_S)
    assert brain.pass_failed("b") == pytest.approx(1.2 * 2 * BACKOFF_BASE_S)
    assert brain.status.next_try == utc_iso(clock.wall + 1.2 * 2 * BACKOFF_BASE_S)


def test_during_a_backoff_only_a_spec_change_starts_a_pass() -> None:
    clock = FakeClock()
    brain = logic(clock)
    brain.pass_failed("boom")
    assert not brain.admits(["spark-worker: dsv41-r1 die"])
    assert not brain.admits(["resync"])
    assert brain.admits(["spec file changed"])
    clock.advance(BACKOFF_BASE_S + 0.1)
    assert brain.admits(["resync"])


def test_the_wait_is_the_backoff_left_or_the_resync_period() -> None:
    clock = FakeClock()
    brain = logic(clock, resync_s=300)
    assert brain.wait_s() == 300
    brain.pass_failed("boom")
    assert brain.wait_s() == pytest.approx(BACKOFF_BASE_S)
    clock.advance(BACKOFF_BASE_S - 0.5)
    assert brain.wait_s() == 1.0  # never a busy wait
    clock.advance(1)
    assert brain.wait_s() == 300


def test_a_pass_that_succeeds_clears_the_backoff_and_serves() -> None:
    brain = logic(FakeClock())
    brain.pass_failed("boom")
    brain.pass_started()
    assert not brain.serving
    brain.pass_succeeded(applied=False, after=converged_plan())
    assert (brain.status.failures, brain.backoff_until, brain.status.next_try) == (0, 0.0, None)
    assert brain.serving
    assert brain.status.condition == "converged"


def test_probes_call_for_a_pass_at_the_threshold_and_a_good_probe_resets_the_count() -> None:
    brain = logic(FakeClock(), failure_threshold=3)
    assert [brain.probed("HTTP 500") for _ in range(2)] == [False, False]
    assert brain.probed(None) is False
    assert brain.liveness.failures == 0
    assert [brain.probed("timeout") for _ in range(3)] == [False, False, True]
    assert brain.published().liveness_failures == 3


def test_a_pass_that_restarted_the_group_forgets_the_failed_probes() -> None:
    brain = logic(FakeClock(), failure_threshold=2)
    brain.probed("HTTP 500")
    brain.pass_succeeded(applied=True, after=converged_plan())
    assert brain.liveness.failures == 0
    brain.probed("HTTP 500")
    brain.pass_succeeded(applied=False, after=converged_plan())
    assert brain.liveness.failures == 1


def test_a_held_group_is_not_probed_and_says_why() -> None:
    trip = GuardTrip(at="2026-11-29T21:04:05Z", mem_available_gib=0.8, floor_gib=1.0)
    facts = with_node(load_facts(CONVERGED_FACTS), "spark-worker", guard=GuardFacts(running=True, trip=trip))
    held = plan(reference_deployment(), facts)
    brain = logic(FakeClock())
    brain.pass_succeeded(applied=True, after=held)
    assert not brain.serving
    assert brain.status.condition.startswith("held: memory guard tripped on spark-worker")


def test_a_blocker_that_leaves_the_ranks_alone_keeps_the_probes_running() -> None:
    converged = converged_plan()
    soft = Blocker("spark-head", Component.CHECKPOINT, "cannot check the checkpoint against the Hub: down", "", False)
    hard = Blocker("spark-worker", Component.RANKS, "node unreachable", "")
    brain = logic(FakeClock())
    brain.pass_succeeded(applied=False, after=Plan(converged.deployment, converged.nodes, blockers=[soft]))
    assert brain.serving
    assert brain.status.condition.startswith("blocked: spark-head: cannot check")
    brain.pass_succeeded(applied=False, after=Plan(converged.deployment, converged.nodes, blockers=[hard]))
    assert not brain.serving


def test_a_dead_rank_is_converging_not_serving() -> None:
    dead = plan(reference_deployment(), with_container(load_facts(CONVERGED_FACTS), "spark-worker", status="exited"))
    brain = logic(FakeClock())
    brain.pass_succeeded(applied=False, after=dead)
    assert not brain.serving
    assert brain.status.condition.startswith("converging: Plan:")


def test_triggers_coalesce_a_burst_into_one_pass_with_each_reason_once() -> None:
    slept: list[float] = []
    triggers = Triggers(sleep=slept.append)
    for reason in ["spark-head: dsv41-r0 die", "spark-worker: dsv41-r1 die", "spark-head: dsv41-r0 die"]:
        triggers.fire(reason)
    assert triggers.wait(timeout=60) == ["spark-head: dsv41-r0 die", "spark-worker: dsv41-r1 die"]
    assert slept == [DEBOUNCE_S]
    assert triggers.wait(timeout=0) == []
    assert slept == [DEBOUNCE_S]


def test_a_trigger_from_another_thread_wakes_the_wait() -> None:
    triggers = Triggers(sleep=lambda _s: None)
    threading.Timer(0.05, triggers.fire, args=("spec file changed",)).start()
    assert triggers.wait(timeout=30) == ["spec file changed"]


class CountingEvent:
    """An event that is never set and returns at once, recording each wait's timeout."""

    def __init__(self) -> None:
        self.timeouts: list[float] = []

    def wait(self, timeout: float) -> bool:
        self.timeouts.append(timeout)
        return False

    def clear(self) -> None:
        pass


def test_the_wait_wakes_every_second_so_a_sigterm_to_another_thread_is_handled() -> None:
    """Python runs signal handlers in the main thread only: a long blocking wait would leave a
    SIGTERM the kernel handed to another thread unanswered until it ends."""
    triggers = Triggers(sleep=lambda _s: None)
    event = CountingEvent()
    triggers._event = event  # type: ignore[assignment]
    assert triggers.wait(timeout=3.5) == []
    assert event.timeouts == [WAKE_EVERY_S] * 3 + [0.5]
    assert WAKE_EVERY_S <= 1.0


def test_a_stop_flag_ends_the_wait_at_the_next_wake_without_firing() -> None:
    """The SIGTERM handler sets a flag and takes no lock of the wait's: the wait sees the flag
    at its next wake and returns, with no reason, within a second."""
    triggers = Triggers(sleep=lambda _s: None)
    event = CountingEvent()
    triggers._event = event  # type: ignore[assignment]
    asked = iter([False, False, True])
    assert triggers.wait(timeout=300, until=lambda: next(asked)) == []
    assert event.timeouts == [WAKE_EVERY_S] * 2


def test_the_signal_handler_takes_no_lock_the_main_thread_may_hold() -> None:
    """Run in the main thread while the wait holds the triggers' lock (as Python may run it):
    it must return at once, and the loop's wait must then end."""
    import reconciler.loop as loop_module

    loop = object.__new__(loop_module.Loop)
    loop.stopping = threading.Event()
    loop.interrupted = False
    loop.triggers = Triggers(sleep=lambda _s: None)
    finished = threading.Event()

    def handler_while_locked() -> None:
        with loop.triggers._lock:
            loop._signalled()
        finished.set()

    runner = threading.Thread(target=handler_while_locked, daemon=True)
    runner.start()
    assert finished.wait(5), "the handler waited on a lock its own thread held"
    assert loop.stopping.is_set()
    assert loop.triggers.wait(300, until=loop.stopping.is_set) == []


def keeper() -> SpecKeeper:
    return SpecKeeper.load(str(SPEC_PATH))


def test_an_invalid_edit_keeps_the_last_good_spec_and_says_where() -> None:
    kept = keeper()
    good = kept.deployment
    change = kept.offer(kept.text.replace("nodes:", "nodes: [", 1))
    assert change.kind == "invalid"
    assert change.error is not None
    assert "running the last good spec" in change.error
    assert kept.deployment == good
    assert kept.offer(kept.text).kind == "invalid", "offered again, the invalid text is still invalid"


def test_a_valid_edit_replaces_the_spec_and_says_whether_it_changes_anything() -> None:
    kept = keeper()
    comment_only = kept.offer(kept.text + "\n# a comment\n")
    assert (comment_only.kind, comment_only.deployment_changed) == ("new", False)
    edited = kept.offer(kept.text + "loop: {resync_s: 60}\n")
    assert (edited.kind, edited.deployment_changed, edited.nodes_changed) == ("new", True, False)
    assert kept.deployment.loop.resync_s == 60


def test_a_fixed_spec_after_an_invalid_one_is_taken() -> None:
    kept = keeper()
    original = kept.text
    assert kept.offer("nodes: [").kind == "invalid"
    fixed = kept.offer(original + "loop: {resync_s: 60}\n")
    assert fixed.kind == "new"
    assert fixed.deployment_changed


def test_failed_probes_are_handed_to_one_pass_only_even_if_it_fails() -> None:
    """A pass that restarts the group after enough failed probes, then fails (a smoke, a later
    step): the next pass must not restart the group again for the same old probes."""
    brain = logic(FakeClock(), failure_threshold=2)
    brain.probed("HTTP 500")
    brain.probed("HTTP 500")
    handed = brain.pass_started()
    assert handed.failures == 2
    brain.pass_failed("smoke failed")
    assert brain.pass_started().failures == 0


def test_failed_probes_below_the_threshold_stay_counted_across_passes() -> None:
    brain = logic(FakeClock(), failure_threshold=3)
    brain.probed("HTTP 500")
    assert brain.pass_started().failures == 1
    assert brain.liveness.failures == 1


def test_a_thousand_failed_passes_in_a_row_do_not_overflow_the_backoff() -> None:
    brain = logic(FakeClock(), max_backoff_s=1)
    for _ in range(1100):
        delay = brain.pass_failed("boom")
    assert delay == 1


def test_a_node_named_like_the_spec_reason_does_not_skip_the_backoff() -> None:
    brain = logic(FakeClock())
    brain.pass_failed("boom")
    assert not brain.admits(["spec-worker: dsv41-r1 die"])
    assert brain.admits([SPEC_CHANGED])


def test_an_invalid_edit_undone_clears_the_error() -> None:
    kept = keeper()
    original = kept.text
    assert kept.offer(original + "bogus: [\n").kind == "invalid"
    assert kept.offer(original + "bogus: [\n").kind == "invalid", "the same invalid text stays invalid"
    undone = kept.offer(original)
    assert (undone.kind, undone.error) == ("new", None)
    assert kept.offer(original).error is None
