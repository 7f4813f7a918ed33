"""The liveness probe against the engine stand-in: what /health hides, a keyed completion sees."""

from __future__ import annotations

import pytest

from reconciler import health
from reconciler.execution import ApplyContext
from reconciler.health import health_code, liveness_problem
from tests.scenarios import empty_facts, reference_deployment, with_serving
from tests.unit.test_engine_standin import KEY, Launcher, start_group


def test_liveness_sees_a_dead_rank1_that_health_hides(launcher: Launcher) -> None:
    group = start_group(launcher)
    deployment = with_serving(reference_deployment(), port=group.port)
    assert liveness_problem(deployment, KEY) is None
    assert liveness_problem(deployment, "not-the-key") == "GET /v1/models answered 401"
    group.rank1.proc.kill()
    group.rank1.proc.wait(timeout=10)
    assert health_code(deployment) == 200  # the lie, as real vLLM tells it
    assert liveness_problem(deployment, KEY) == "POST /v1/completions answered 500"


def test_liveness_without_an_api_names_the_connection_error() -> None:
    deployment = with_serving(reference_deployment(), port=9)
    problem = liveness_problem(deployment, KEY)
    assert problem is not None
    assert problem.startswith("ConnectError")


def test_a_front_fault_the_engine_does_not_share_is_no_group_failure(
    launcher: Launcher, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With no front listening, the keyed probe fails; rank 0 past the front still answers, so the
    loop must not count it against the group (a group restart would only take the API down). A
    dead engine behind it still counts."""
    group = start_group(launcher, keyed=False)
    deployment = with_serving(reference_deployment(), port=9)  # nothing listens on the front's port
    deployment = deployment.model_copy(update={"api": deployment.api.model_copy(update={"engine_port": group.port})})
    monkeypatch.setattr(health, "read_key", lambda _ctx: KEY)
    ctx = ApplyContext(deployment, empty_facts(), {})
    assert liveness_problem(deployment, KEY) is not None
    assert health.probe_liveness(ctx) is None
    group.rank1.proc.kill()
    group.rank1.proc.wait(timeout=10)
    problem = health.probe_liveness(ctx)
    assert problem is not None
    assert problem.startswith("ConnectError")  # the front's failure is what is reported
