"""The spec's `pi:` section in plan and apply, the Pi facts, and `reconciler pi install|uninstall|status`
on a temp Pi dir with a stand-in `pi` on PATH (the real Pi runs in tests/integration/test_pi_real.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from reconciler.apply import executor_for
from reconciler.cli import main
from reconciler.components.pi import desired_target, differences, plan_pi
from reconciler.errors import FactsChangedError, PiInstallError
from reconciler.execution import ApplyContext
from reconciler.facts.node import Facts
from reconciler.facts.pi import REDACTED, gather_pi, pi_facts_from_files
from reconciler.lock import deployment_lock
from reconciler.pi import agent as pi_agent
from reconciler.pi import config as pi_config
from reconciler.pi import files as pi_files
from reconciler.pi.agent import locate_pi
from reconciler.plan import plan
from reconciler.spec import Deployment
from tests.scenarios import SPEC_PATH, empty_facts, reference_deployment, with_serving

HEAD = "spark-head"
PROVIDER = "dsv41-sparks"


@pytest.fixture
def agent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A temp Pi dir and a stand-in `pi` on PATH, laid out as `npm install -g` links it."""
    package = tmp_path / "lib/node_modules/@mariozechner/pi-coding-agent"
    (package / "dist").mkdir(parents=True)
    (package / "package.json").write_text('{"name": "@mariozechner/pi-coding-agent", "version": "0.73.1"}')
    cli = package / "dist/cli.js"
    cli.write_text("#!/bin/sh\nexit 0\n")
    cli.chmod(0o755)
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin/pi").symlink_to(cli)
    directory = tmp_path / "agent"
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    monkeypatch.setenv("PI_CODING_AGENT_DIR", str(directory))
    monkeypatch.delenv("DSV41_API_KEY", raising=False)
    return directory


def facts_with_pi(deployment: Deployment | None = None) -> Facts:
    deployment = deployment or reference_deployment()
    return empty_facts().model_copy(update={"pi": gather_pi(deployment.pi.provider)})


def pi_plan(deployment: Deployment | None = None) -> tuple[list[str], list[str]]:
    outcome = plan_pi(deployment or reference_deployment(), facts_with_pi(deployment))
    return [action.cause for action in outcome.actions], [item.reason for item in outcome.in_sync]


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


# --- facts -------------------------------------------------------------------------------------------


def test_pi_on_path_is_found_with_its_package(agent: Path) -> None:
    path, package = locate_pi()
    assert path is not None
    assert path.endswith("/bin/pi")
    assert package == "@mariozechner/pi-coding-agent@0.73.1"
    assert gather_pi(PROVIDER).directory == str(agent)


def test_facts_never_hold_a_secret() -> None:
    entry = {"apiKey": "sk-live-secret", "headers": {"x-token": "t0ken"}, "models": [{"headers": {"a": "b"}}]}
    files = pi_config.PiFiles("/d", {pi_config.MODELS: json.dumps({"providers": {PROVIDER: entry}})})
    observed = pi_facts_from_files(files, PROVIDER)
    assert observed.provider == {
        "apiKey": REDACTED,
        "headers": {"x-token": REDACTED},
        "models": [{"headers": {"a": REDACTED}}],
    }
    ours = pi_config.PiFiles("/d", {pi_config.MODELS: json.dumps({"providers": {PROVIDER: {"apiKey": "!printenv K"}}})})
    assert pi_facts_from_files(ours, PROVIDER).provider == {"apiKey": "!printenv K"}


def test_a_broken_config_becomes_a_fact_and_a_plan_note(agent: Path) -> None:
    agent.mkdir()
    (agent / "models.json").write_text("{\n  oops\n}\n")
    facts = facts_with_pi()
    assert facts.pi is not None
    assert facts.pi.error is not None
    assert f"{agent}/models.json:2:3:" in facts.pi.error
    outcome = plan_pi(reference_deployment(), facts)
    assert not outcome.actions
    assert outcome.notes
    assert "Pi config left alone" in outcome.notes[0]


@pytest.mark.usefixtures("agent")
def test_pi_facts_round_trip_through_a_snapshot() -> None:
    facts = facts_with_pi()
    assert Facts.model_validate_json(facts.to_json()) == facts


# --- plan --------------------------------------------------------------------------------------------


@pytest.mark.usefixtures("agent")
def test_without_pi_facts_or_pi_or_when_disabled_nothing_is_planned(tmp_path: Path) -> None:
    deployment = reference_deployment()
    assert [i.reason for i in plan_pi(deployment, empty_facts()).in_sync] == ["no Pi facts in this snapshot"]
    disabled = deployment.model_copy(update={"pi": deployment.pi.model_copy(update={"enabled": False})})
    assert "pi.enabled is false" in plan_pi(disabled, facts_with_pi()).in_sync[0].reason
    (tmp_path / "bin/pi").unlink()
    assert pi_plan() == ([], ["Pi not installed: run `reconciler pi install`"])


def test_a_fresh_pi_gets_the_provider_after_the_ranks(agent: Path) -> None:
    result = plan(reference_deployment(), facts_with_pi())
    action = result.actions[-1]
    assert action.id == f"pi.configure@{HEAD}"
    assert action.verb == "create"
    assert action.summary == f"configure Pi in {agent}: provider {PROVIDER} -> http://127.0.0.1:8000/v1"
    assert action.cause == f"provider {PROVIDER} missing from models.json; extension extensions/{PROVIDER}.ts missing"
    assert all(action.id not in other.depends_on for other in result.actions)


def test_apply_configures_pi_and_the_next_plan_is_in_sync(agent: Path) -> None:
    deployment = reference_deployment()
    facts = facts_with_pi()
    (action,) = plan_pi(deployment, facts).actions
    message = executor_for(action)(ApplyContext(deployment, facts, {}), action)
    assert message == f"models.json: provider {PROVIDER} added; extensions/{PROVIDER}.ts: installed"
    assert pi_plan() == ([], [f"provider {PROVIDER} in {agent} points at http://127.0.0.1:8000/v1"])


def test_a_config_changed_since_the_plan_is_left_alone_and_the_next_plan_decides(agent: Path) -> None:
    deployment = reference_deployment()
    facts = facts_with_pi()
    (action,) = plan_pi(deployment, facts).actions
    agent.mkdir()
    (agent / "settings.json").write_text('{"enabledModels": ["other/model"]}\n')
    with pytest.raises(FactsChangedError, match="changed since the plan was made: nothing was written"):
        executor_for(action)(ApplyContext(deployment, facts, {}), action)
    assert sorted(path.name for path in agent.iterdir()) == ["settings.json"]
    (cause,), _ = pi_plan(deployment)
    assert f"{PROVIDER}/deepseek-v4.1-flash not in enabledModels (Pi would start on other/model)" in cause


def test_other_providers_changed_since_the_plan_do_not_stop_it(agent: Path) -> None:
    """The plan is decided on our provider and the settings we touch, not on the user's others."""
    agent.mkdir()
    (agent / "models.json").write_text('{"providers": {"theirs": {"baseUrl": "http://a/v1"}}}\n')
    deployment = reference_deployment()
    (action,) = plan_pi(deployment, facts_with_pi()).actions
    (agent / "models.json").write_text('{"providers": {"theirs": {"baseUrl": "http://b/v1"}}}\n')
    executor_for(action)(ApplyContext(deployment, facts_with_pi(), {}), action)
    assert '"baseUrl": "http://b/v1"' in (agent / "models.json").read_text()
    assert pi_plan(deployment)[0] == []


@pytest.mark.usefixtures("agent")
def test_a_changed_port_updates_only_the_base_url() -> None:
    deployment = reference_deployment()
    (action,) = plan_pi(deployment, facts_with_pi()).actions
    executor_for(action)(ApplyContext(deployment, facts_with_pi(), {}), action)
    moved = with_serving(deployment, port=8001)
    assert pi_plan(moved) == ([f"provider {PROVIDER} differs: baseUrl changed"], [])


def test_set_default_and_enabled_models_are_planned(agent: Path) -> None:
    agent.mkdir()
    (agent / "settings.json").write_text('{"enabledModels": ["other/model"], "defaultModel": "model"}')
    deployment = reference_deployment()
    deployment = deployment.model_copy(update={"pi": deployment.pi.model_copy(update={"set_default": True})})
    (cause,), _ = pi_plan(deployment)
    assert f"{PROVIDER}/deepseek-v4.1-flash not in enabledModels (Pi would start on other/model)" in cause
    assert "pi.set_default: default model is -/model" in cause


def test_apply_keeps_the_key_variable_the_last_install_chose(agent: Path) -> None:
    deployment = reference_deployment()
    chosen = desired_target(deployment, {"key_env": "SPARK_KEY"})
    assert chosen.key_env == "SPARK_KEY"
    assert desired_target(deployment, {"key_env": "bad name"}).key_env == "DSV41_API_KEY"
    changes = pi_config.install_changes(pi_files.read_files(agent, PROVIDER), chosen)
    pi_files.write_changes(agent, changes, PROVIDER)
    facts = facts_with_pi()
    assert facts.pi is not None
    assert differences(facts.pi, desired_target(deployment, facts.pi.manifest)) == []


# --- the command line --------------------------------------------------------------------------------


def test_install_twice_then_uninstall(agent: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = ("--spec", str(SPEC_PATH))
    code, out, _ = run(capsys, "pi", "install", "http://10.0.0.5:8000/", *spec)
    assert code == 0
    assert f"models.json: provider {PROVIDER} added" in out
    assert f"pi --model {PROVIDER}/deepseek-v4.1-flash" in out
    assert "~/.dsv41-two-sparks/api_key on spark-head" in out
    code, out, _ = run(capsys, "pi", "install", "http://10.0.0.5:8000", *spec)
    assert (code, f"Pi config in {agent}: unchanged" in out) == (0, True)
    code, out, _ = run(capsys, "pi", "status", "--json", *spec)
    status = json.loads(out)
    assert status["base_url"] == "http://10.0.0.5:8000/v1"
    assert (status["key_env"], status["key_env_set"], status["extension"]) == ("DSV41_API_KEY", False, "current")
    code, out, _ = run(capsys, "pi", "uninstall", "--json", *spec)
    report = json.loads(out)
    assert report["changes"] == [
        "models.json: removed (install created it for this provider alone)",
        f"extensions/{PROVIDER}.ts: removed",
    ]
    # Only the backup of the models.json install had created is left (backups are never removed).
    assert [path.name for path in agent.iterdir()] == [Path(report["backups"][0]).name]


@pytest.mark.parametrize("pi_action", ["install", "uninstall"])
def test_install_and_uninstall_hold_the_deployments_lock(
    agent: Path, capsys: pytest.CaptureFixture[str], pi_action: str
) -> None:
    """A converge configuring Pi holds the lock: install and uninstall never write beside it."""
    deployment = reference_deployment()
    if pi_action == "uninstall":
        assert run(capsys, "pi", "install", "--spec", str(SPEC_PATH))[0] == 0
    before = {path.name: path.read_bytes() for path in agent.rglob("*") if path.is_file()} if agent.exists() else {}
    with deployment_lock(deployment, "a loop pass"):
        code, _, err = run(capsys, "pi", pi_action, "--wait", "0", "--spec", str(SPEC_PATH))
    assert code == 1
    assert "the deployment is busy: pid" in err
    assert "a loop pass" in err
    after = {path.name: path.read_bytes() for path in agent.rglob("*") if path.is_file()} if agent.exists() else {}
    assert after == before, "nothing was written"


def test_install_json_and_options(agent: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(
        capsys,
        "pi",
        "install",
        "http://h:8000",
        "--set-default",
        "--key-env",
        "SPARK_KEY",
        "--json",
        "--spec",
        str(SPEC_PATH),
    )
    report = json.loads(out)
    assert code == 0
    assert (report["key_env"], report["model"], report["changed"]) == (
        "SPARK_KEY",
        f"{PROVIDER}/deepseek-v4.1-flash",
        True,
    )
    assert report["pi"] == {
        "path": str(agent.parent / "bin/pi"),
        "package": "@mariozechner/pi-coding-agent@0.73.1",
        "installed_now": False,
    }
    settings = json.loads((agent / "settings.json").read_text())
    assert settings == {"defaultProvider": PROVIDER, "defaultModel": "deepseek-v4.1-flash"}


def test_install_without_url_or_spec_says_what_to_give(
    agent: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("RECONCILER_SPEC", raising=False)
    code, _, err = run(capsys, "pi", "install")
    assert code == 1
    assert "no BASE_URL and no spec" in err
    assert not agent.exists()
    code, out, _ = run(capsys, "pi", "install", "http://h:8000")  # reference defaults without a spec
    assert code == 0
    assert "export DSV41_API_KEY=<the API key>    # the deployment's key" in out


def test_a_broken_config_fails_clearly_and_writes_nothing(agent: Path, capsys: pytest.CaptureFixture[str]) -> None:
    agent.mkdir()
    (agent / "models.json").write_text('{\n  "providers": {\n    "a": 1,,\n  }\n}\n')
    code, _, err = run(capsys, "pi", "install", "http://h:8000", "--spec", str(SPEC_PATH))
    assert code == 1
    assert f"error: {agent}/models.json:3:12:" in err
    assert "nothing was written" in err
    assert sorted(path.name for path in agent.iterdir()) == ["models.json"]


@pytest.mark.usefixtures("agent")
def test_status_without_pi(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "bin/pi").unlink()
    code, out, _ = run(capsys, "pi", "status", "--spec", str(SPEC_PATH))
    assert code == 0
    assert "Pi: not on PATH (run `reconciler pi install`)" in out
    assert f"provider {PROVIDER}: not configured" in out


# --- which Pi npm installs -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("node", "package"),
    [
        ("v22.19.0", "@earendil-works/pi-coding-agent@1.6.0"),
        ("v24.1.0", "@earendil-works/pi-coding-agent@1.6.0"),
        ("v20.20.2", "@mariozechner/pi-coding-agent@0.73.1"),
        ("v22.8.0", "@mariozechner/pi-coding-agent@0.73.1"),
    ],
)
def test_the_package_follows_the_node_version(node: str, package: str) -> None:
    chosen, notes = pi_agent.choose_package(pi_agent.parse_node_version(node))
    assert chosen.spec == package
    assert bool(notes) == package.startswith("@mariozechner")


@pytest.mark.parametrize("node", [None, "v18.19.0", "v20.5.1"])
def test_no_node_or_an_old_one_is_refused_with_what_to_do(node: str | None) -> None:
    with pytest.raises(PiInstallError) as caught:
        pi_agent.choose_package(pi_agent.parse_node_version(node) if node else None)
    assert "Node.js 22.19" in caught.value.hint
