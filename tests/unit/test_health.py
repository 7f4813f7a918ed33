"""The liveness probe against the engine stand-in: what /health hides, a keyed completion sees."""

from __future__ import annotations

from reconciler.health import health_code, liveness_problem
from tests.scenarios import reference_deployment, with_serving
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
