"""Pi config editing (pure): the provider from the spec, enabledModels and defaults, the install
record, uninstall removing exactly what install added, and the file edge (backups, atomic writes)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from reconciler.actions import PiTarget
from reconciler.errors import PiConfigError
from reconciler.pi import config as pi_config
from reconciler.pi import files as pi_files
from reconciler.pi import jsonc
from reconciler.pi.config import MODELS, SETTINGS, PiFiles, target_for
from tests.scenarios import reference_deployment, with_serving

PROVIDER = "dsv41-sparks"
REF = "dsv41-sparks/deepseek-v4.1-flash"
EXTENSION = pi_config.extension_file(PROVIDER)
MANIFEST = pi_config.manifest_file(PROVIDER)
EXISTING_MODELS = """{
  // Local models. Docs: https://example.com//pi
  "providers": {
    "other-local": {
      "baseUrl": "http://127.0.0.1:9/v1", // the other box
      "api": "openai-completions",
      "apiKey": "other-literal-key",
      "models": [{"id": "other-model"},],
    },
  },
}
"""
EXISTING_SETTINGS = (
    '{\n  "defaultProvider": "other-local",\n  "defaultModel": "other-model",\n'
    '  "enabledModels": ["other-local/other-model"]\n}\n'
)


def target(set_default: bool = False, **serving: object) -> PiTarget:
    deployment = with_serving(reference_deployment(), **serving) if serving else reference_deployment()
    return target_for(
        deployment.serving,
        PROVIDER,
        2,
        base_url="http://127.0.0.1:8000",
        key_env=pi_config.DEFAULT_KEY_ENV,
        set_default=set_default,
    )


def files(**texts: str) -> PiFiles:
    return PiFiles("/home/u/.pi/agent", texts)


def existing() -> PiFiles:
    return PiFiles("/home/u/.pi/agent", {MODELS: EXISTING_MODELS, SETTINGS: EXISTING_SETTINGS})


def applied(before: PiFiles, changes: pi_config.Changes) -> PiFiles:
    texts = dict(before.texts)
    for name, text in changes.writes.items():
        if text is None:
            texts.pop(name, None)
        else:
            texts[name] = text
    return PiFiles(before.directory, texts)


def install(before: PiFiles, pi_target: PiTarget | None = None) -> PiFiles:
    return applied(before, pi_config.install_changes(before, pi_target or target()))


def uninstall(before: PiFiles) -> PiFiles:
    return applied(before, pi_config.uninstall_changes(before, PROVIDER))


# --- what install writes ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        ("http://10.0.0.5:8000", "http://10.0.0.5:8000/v1"),
        ("http://10.0.0.5:8000/", "http://10.0.0.5:8000/v1"),
        ("http://10.0.0.5:8000/v1/", "http://10.0.0.5:8000/v1"),
        (" https://api.example.com/v1 ", "https://api.example.com/v1"),
    ],
)
def test_base_url_is_normalised_to_end_in_v1(given: str, expected: str) -> None:
    assert pi_config.normalise_base_url(given) == expected


@pytest.mark.parametrize("bad", ["10.0.0.5:8000", "ftp://h/v1", "http://", "http://h:8000/v1?x=1"])
def test_a_base_url_that_is_not_http_is_refused(bad: str) -> None:
    with pytest.raises(PiConfigError, match="not an http"):
        pi_config.normalise_base_url(bad)


@pytest.mark.parametrize("bad", ["DSV41 KEY", "KEY;rm -rf ~", "$KEY", "1KEY", ""])
def test_the_key_variable_must_be_a_plain_name_because_sh_runs_it(bad: str) -> None:
    with pytest.raises(PiConfigError, match="not an environment variable name"):
        pi_config.key_command(bad)


def test_provider_entry_is_the_reference_fragment_with_a_printenv_key() -> None:
    entry = pi_config.provider_entry(target())
    assert entry["name"] == "DeepSeek-V4.1-Flash (2x DGX Spark)"
    assert entry["api"] == "openai-completions"
    assert entry["baseUrl"] == "http://127.0.0.1:8000/v1"
    # The only apiKey form both Pi versions resolve from the environment and refuse when unset.
    assert entry["apiKey"] == "!printenv DSV41_API_KEY"
    (model,) = entry["models"]
    assert model["id"] == "deepseek-v4.1-flash"
    assert model["reasoning"] is True
    assert model["input"] == ["text", "image"]
    assert model["contextWindow"] == model["maxTokens"] == 262144
    assert model["cost"] == {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0}
    assert model["compat"] == {"supportsDeveloperRole": False, "supportsStore": False, "supportsUsageInStreaming": True}
    assert model["thinkingLevelMap"]["xhigh"] == "max"


def test_model_entry_follows_the_spec() -> None:
    changed = target(served_model_name="dsv41-custom", max_model_len=131072, images_per_prompt=0)
    model = pi_config.model_entry(changed)
    assert (model["id"], model["contextWindow"], model["input"]) == ("dsv41-custom", 131072, ["text"])
    assert changed.model_ref == "dsv41-sparks/dsv41-custom"


def test_extension_scopes_to_the_provider_and_never_holds_the_key() -> None:
    text = pi_config.extension_text(PROVIDER, "MY_KEY")
    assert 'import type { ExtensionAPI } from "@mariozechner/pi-coding-agent";' in text
    assert "@earendil-works" not in text  # a value import of the new name breaks Pi 0.73.1
    assert 'const PROVIDER = "dsv41-sparks";' in text
    assert 'const KEY_ENV = "MY_KEY";' in text
    assert "ctx.model?.provider !== PROVIDER" in text
    assert "delete payload.max_tokens;" in text
    assert "delete payload.max_completion_tokens;" in text
    assert "is not set" in text


# --- install ---------------------------------------------------------------------------------------


def test_install_into_an_empty_dir_creates_models_extension_and_record_only() -> None:
    changes = pi_config.install_changes(files(), target())
    assert list(changes.writes) == [MANIFEST, MODELS, EXTENSION]  # the record first
    assert changes.messages == [f"{MODELS}: provider {PROVIDER} added", f"{EXTENSION}: installed"]
    after = applied(files(), changes)
    assert jsonc.loads(after.texts[MODELS]) == {"providers": {PROVIDER: pi_config.provider_entry(target())}}
    record = json.loads(after.texts[MANIFEST])
    assert record["created"] == [MODELS]
    assert record["key_env"] == "DSV41_API_KEY"
    assert (record["enabled_model"], record["defaults"]) == (None, None)


def test_a_second_install_changes_nothing() -> None:
    for before in (files(), existing()):
        for default in (False, True):
            once = install(before, target(set_default=default))
            assert pi_config.install_changes(once, target(set_default=default)).unchanged


def test_existing_config_keeps_comments_and_other_providers_byte_for_byte() -> None:
    after = install(existing())
    text = after.texts[MODELS]
    cut = text.index(f'    "{PROVIDER}"')
    assert text[:cut] == EXISTING_MODELS[: EXISTING_MODELS.index("  },\n}")]
    assert text.endswith("  },\n}\n")
    assert jsonc.loads(text)["providers"]["other-local"] == jsonc.loads(EXISTING_MODELS)["providers"]["other-local"]


def test_a_non_empty_enabled_models_gets_the_model_appended() -> None:
    after = install(existing())
    settings = json.loads(after.texts[SETTINGS])
    assert settings["enabledModels"] == ["other-local/other-model", REF]
    assert (settings["defaultProvider"], settings["defaultModel"]) == ("other-local", "other-model")
    assert json.loads(after.texts[MANIFEST])["enabled_model"] == REF


@pytest.mark.parametrize("settings", ['{"enabledModels": []}\n', '{"theme": "dark"}\n'])
def test_an_empty_or_missing_enabled_models_is_left_alone(settings: str) -> None:
    # An empty list offers every model; a list holding only ours would hide all the others.
    changes = pi_config.install_changes(files(**{SETTINGS: settings}), target())
    assert SETTINGS not in changes.writes


def test_set_default_sets_both_defaults_and_remembers_the_previous_ones() -> None:
    after = install(existing(), target(set_default=True))
    settings = json.loads(after.texts[SETTINGS])
    assert (settings["defaultProvider"], settings["defaultModel"]) == (PROVIDER, "deepseek-v4.1-flash")
    assert REF in settings["enabledModels"]  # else Pi starts on the list's first model
    record = json.loads(after.texts[MANIFEST])
    assert record["defaults"] == {"previous": {"defaultProvider": "other-local", "defaultModel": "other-model"}}


def test_set_default_without_settings_creates_them() -> None:
    after = install(files(), target(set_default=True))
    assert json.loads(after.texts[SETTINGS]) == {"defaultProvider": PROVIDER, "defaultModel": "deepseek-v4.1-flash"}
    assert json.loads(after.texts[MANIFEST])["created"] == [MODELS, SETTINGS]


def test_a_provider_from_the_reference_installer_is_replaced_saying_what_changed() -> None:
    old = pi_config.provider_entry(target()) | {"apiKey": "$DSV41_API_KEY"}
    before = files(**{MODELS: json.dumps({"providers": {PROVIDER: old}}, indent=2)})
    changes = pi_config.install_changes(before, target())
    assert changes.messages[0] == f"{MODELS}: provider {PROVIDER} replaced (apiKey changed)"


def test_a_new_model_id_replaces_the_enabled_models_entry_install_added() -> None:
    once = install(existing())
    renamed = target(served_model_name="dsv41-next")
    changes = pi_config.install_changes(once, renamed)
    assert f"{SETTINGS}: {REF} removed from enabledModels" in changes.messages
    enabled = json.loads(applied(once, changes).texts[SETTINGS])["enabledModels"]
    assert enabled == ["other-local/other-model", "dsv41-sparks/dsv41-next"]


def test_installed_key_variable_is_recorded_and_used_by_the_extension() -> None:
    custom = PiTarget(**{**target().__dict__, "key_env": "SPARK_KEY"})
    after = install(files(), custom)
    assert jsonc.loads(after.texts[MODELS])["providers"][PROVIDER]["apiKey"] == "!printenv SPARK_KEY"
    assert json.loads(after.texts[MANIFEST])["key_env"] == "SPARK_KEY"
    assert 'const KEY_ENV = "SPARK_KEY";' in after.texts[EXTENSION]


@pytest.mark.parametrize(
    ("name", "text", "where"),
    [
        (MODELS, '{\n  "providers": {\n    "a": 1\n    "b": 2\n  }\n}\n', f"/home/u/.pi/agent/{MODELS}:4:5:"),
        (MODELS, "[]", f"/home/u/.pi/agent/{MODELS}: the top level is not a JSON object"),
        (MODELS, '{"providers": []}', '"providers" is not an object'),
        (SETTINGS, '{"enabledModels": "all"}', '"enabledModels" is not a list'),
        (SETTINGS, '{\n  "theme": "dark",,\n}', f"/home/u/.pi/agent/{SETTINGS}:2:19:"),
    ],
)
def test_a_broken_file_is_an_error_naming_file_and_line(name: str, text: str, where: str) -> None:
    with pytest.raises(PiConfigError) as caught:
        pi_config.install_changes(files(**{name: text}), target())
    assert where in caught.value.message
    assert "nothing was written" in caught.value.hint


# --- uninstall -------------------------------------------------------------------------------------


@pytest.mark.parametrize("default", [False, True])
def test_uninstall_restores_an_existing_config_byte_for_byte(default: bool) -> None:
    after = uninstall(install(existing(), target(set_default=default)))
    assert after.texts == existing().texts


@pytest.mark.parametrize("default", [False, True])
def test_uninstall_after_install_into_nothing_leaves_nothing(default: bool) -> None:
    assert uninstall(install(files(), target(set_default=default))).texts == {}


def test_uninstall_removes_defaults_it_set_when_there_were_none() -> None:
    before = files(**{SETTINGS: '{\n  "theme": "dark"\n}\n'})
    after = uninstall(install(before, target(set_default=True)))
    assert after.texts[SETTINGS] == before.texts[SETTINGS]


def test_uninstall_keeps_defaults_the_user_changed_since() -> None:
    installed = install(existing(), target(set_default=True))
    settings = jsonc.set_member(installed.texts[SETTINGS], [], "defaultProvider", "anthropic")
    settings = jsonc.set_member(settings, [], "defaultModel", "claude")
    after = uninstall(PiFiles(installed.directory, {**installed.texts, SETTINGS: settings}))
    data = json.loads(after.texts[SETTINGS])
    assert (data["defaultProvider"], data["defaultModel"]) == ("anthropic", "claude")
    assert data["enabledModels"] == ["other-local/other-model"]


def test_uninstall_without_a_record_removes_provider_and_extension_only() -> None:
    entry = pi_config.provider_entry(target())
    settings = json.dumps({"enabledModels": ["x/y", REF]})
    before = files(**{MODELS: json.dumps({"providers": {PROVIDER: entry}}), SETTINGS: settings, EXTENSION: "//"})
    changes = pi_config.uninstall_changes(before, PROVIDER)
    assert set(changes.writes) == {MODELS, EXTENSION}
    assert any("no install record" in message for message in changes.messages)


def test_uninstall_with_nothing_installed_is_unchanged() -> None:
    assert pi_config.uninstall_changes(existing(), PROVIDER).unchanged


# --- the file edge ---------------------------------------------------------------------------------


def test_write_changes_backs_up_then_writes_atomically(tmp_path: Path) -> None:
    (tmp_path / MODELS).write_text(EXISTING_MODELS, encoding="utf-8")
    (tmp_path / MODELS).chmod(0o600)
    changes = pi_config.install_changes(pi_files.read_files(tmp_path, PROVIDER), target())
    backups = pi_files.write_changes(tmp_path, changes, PROVIDER, stamp="20261129-210000")
    assert backups == [str(tmp_path / f"{MODELS}.bak-dsv41-sparks-20261129-210000")]
    assert Path(backups[0]).read_text(encoding="utf-8") == EXISTING_MODELS
    assert (tmp_path / MODELS).stat().st_mode & 0o777 == 0o600  # the user's mode is kept
    assert not [path for path in tmp_path.rglob("*") if ".tmp-" in path.name]
    uninstalled = pi_config.uninstall_changes(pi_files.read_files(tmp_path, PROVIDER), PROVIDER)
    second = pi_files.write_changes(tmp_path, uninstalled, PROVIDER, stamp="20261129-210000")
    assert second == [f"{backups[0]}-1"]  # the same second never overwrites the older backup
    assert (tmp_path / MODELS).read_text(encoding="utf-8") == EXISTING_MODELS
    assert not (tmp_path / "extensions").exists()


def test_backup_names_carry_a_timestamp(tmp_path: Path) -> None:
    (tmp_path / MODELS).write_text("{}", encoding="utf-8")
    changes = pi_config.install_changes(pi_files.read_files(tmp_path, PROVIDER), target())
    (backup,) = pi_files.write_changes(tmp_path, changes, PROVIDER)
    assert re.fullmatch(r"models\.json\.bak-dsv41-sparks-\d{8}-\d{6}", Path(backup).name)


def test_a_symlinked_config_is_edited_where_it_lives(tmp_path: Path) -> None:
    dotfiles = tmp_path / "dotfiles"
    dotfiles.mkdir()
    (dotfiles / "models.json").write_text(EXISTING_MODELS, encoding="utf-8")
    agent = tmp_path / "agent"
    agent.mkdir()
    (agent / MODELS).symlink_to(dotfiles / "models.json")
    changes = pi_config.install_changes(pi_files.read_files(agent, PROVIDER), target())
    pi_files.write_changes(agent, changes, PROVIDER)
    assert (agent / MODELS).is_symlink()
    assert PROVIDER in jsonc.loads((dotfiles / "models.json").read_text(encoding="utf-8"))["providers"]


def test_agent_dir_follows_pi(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("PI_CODING_AGENT_DIR", raising=False)
    assert pi_files.agent_dir() == tmp_path / ".pi" / "agent"
    monkeypatch.setenv("PI_CODING_AGENT_DIR", "~/elsewhere")
    assert pi_files.agent_dir() == tmp_path / "elsewhere"


def test_nothing_is_written_when_a_file_is_broken(tmp_path: Path) -> None:
    (tmp_path / SETTINGS).write_text('{"enabledModels": ["a",, "b"]}', encoding="utf-8")
    with pytest.raises(PiConfigError):
        pi_config.install_changes(pi_files.read_files(tmp_path, PROVIDER), target())
    assert os.listdir(tmp_path) == [SETTINGS]


def test_a_broken_install_record_says_what_it_is() -> None:
    with pytest.raises(PiConfigError) as caught:
        pi_config.uninstall_changes(files(**{MANIFEST: "{"}), PROVIDER)
    assert MANIFEST in caught.value.message
    assert "install record" in caught.value.hint
