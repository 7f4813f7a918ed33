"""install-service: the rendered unit, the settings found on this machine, the install steps.

systemd itself is not needed here: systemctl is a recorded fake and the unit directory a
temporary one. The unit under a real systemd is tests/system/test_service.py.
Rewrite the example unit after a deliberate change with `.venv/bin/python -m tests.unit.test_service`.
"""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

import pytest

from reconciler import service
from reconciler.cli import main
from reconciler.constants import UNIT_NAME
from reconciler.errors import ReconcilerError, SpecError
from reconciler.service import UnitSettings, install, render_unit, settings_for
from tests.scenarios import ROOT, SPEC_PATH

# The repository copy is named reconciler.service; systemd installs it as UNIT_NAME.
EXAMPLE_PATH = ROOT / "systemd" / "reconciler.service"
EXAMPLE = UnitSettings(
    executable="/home/nvidia/spark-reconciler/.venv/bin/reconciler",
    spec="/home/nvidia/spark-reconciler/specs/deployment.yaml",
    user="nvidia",
    home="/home/nvidia",
)
ME = pwd.getpwuid(os.getuid())


class FakeSystemctl:
    """Records commands; fails the ones named in `failing`."""

    def __init__(self, failing: str = "") -> None:
        self.commands: list[str] = []
        self.failing = failing

    def __call__(self, command: Sequence[str]) -> subprocess.CompletedProcess[str]:
        text = " ".join(command)
        self.commands.append(text)
        code = 1 if self.failing and self.failing in text else 0
        return subprocess.CompletedProcess(list(command), code, "", "Access denied" if code else "")


def my_settings(extra: tuple[str, ...] = ()) -> UnitSettings:
    executable = str(Path(sys.prefix) / "bin" / "reconciler")
    return UnitSettings(executable, str(SPEC_PATH), ME.pw_name, ME.pw_dir, extra)


def write_spec(directory: Path, state_dir: str, model_dir: str) -> Path:
    text = SPEC_PATH.read_text(encoding="utf-8")
    text = text.replace("state_dir: ~/.dsv41-two-sparks", f"state_dir: {state_dir}")
    text = text.replace("model_dir: ~/models/DeepSeek-V4.1-Flash-Spark", f"model_dir: {model_dir}", 1)
    path = directory / "deployment.yaml"
    path.write_text(text, encoding="utf-8")
    return path


def test_the_example_unit_in_systemd_is_current() -> None:
    assert EXAMPLE_PATH.read_text(encoding="utf-8") == render_unit(EXAMPLE), (
        "systemd/reconciler.service is stale: run `.venv/bin/python -m tests.unit.test_service`"
    )


def test_the_unit_runs_the_loop_as_a_notify_service_with_a_watchdog() -> None:
    unit = render_unit(EXAMPLE)
    for line in (
        "Type=notify",
        "User=nvidia",
        "ExecStart=/home/nvidia/spark-reconciler/.venv/bin/reconciler run --spec "
        "/home/nvidia/spark-reconciler/specs/deployment.yaml",
        "Environment=HOME=/home/nvidia PYTHONUNBUFFERED=1",
        "Wants=network-online.target docker.service",
        "After=network-online.target docker.service",
        "Restart=always",
        "WatchdogSec=60s",
        "TimeoutStartSec=infinity",
        "KillMode=process",
        "ProtectSystem=strict",
        "ReadWritePaths=/home/nvidia",
        "WantedBy=multi-user.target",
    ):
        assert f"\n{line}\n" in unit, line


def test_directories_outside_the_home_are_writable_and_mounted_first() -> None:
    settings = UnitSettings(EXAMPLE.executable, EXAMPLE.spec, "nvidia", "/home/nvidia", ("/data/models", "/srv/s"))
    unit = render_unit(settings)
    # '-': a directory missing at start (say, an unmounted disk) must not stop the loop from reporting it.
    assert "\nReadWritePaths=/home/nvidia -/data/models -/srv/s\n" in unit
    assert "\nRequiresMountsFor=/home/nvidia /data/models /srv/s\n" in unit


def test_settings_for_the_shipped_spec_use_this_venv_and_an_absolute_spec(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)
    settings = settings_for("specs/deployment.yaml", ME.pw_name)
    assert settings.spec == str(SPEC_PATH)
    assert settings.executable == str(Path(sys.prefix) / "bin" / "reconciler")
    assert (settings.user, settings.home) == (ME.pw_name, ME.pw_dir)
    assert settings.extra_writable == ()


def test_settings_list_the_heads_directories_outside_the_home(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, "/srv/spark/state", "/data/models/DeepSeek-V4.1-Flash-Spark")
    settings = settings_for(str(spec), ME.pw_name)
    # The key file lives in the state dir by default: listed once.
    assert settings.extra_writable == ("/data/models/DeepSeek-V4.1-Flash-Spark", "/srv/spark/state")


def test_home_relative_directories_expand_against_the_service_users_home(tmp_path: Path) -> None:
    spec = write_spec(tmp_path, "~/state", "~/models/x")
    assert settings_for(str(spec), "root").extra_writable == ()


def test_an_unknown_user_is_an_error_with_a_hint() -> None:
    with pytest.raises(ReconcilerError, match="no user named 'no-such-user-here'"):
        settings_for(str(SPEC_PATH), "no-such-user-here")


def test_a_path_the_unit_would_have_to_escape_is_refused(tmp_path: Path) -> None:
    folder = tmp_path / "my specs"
    folder.mkdir()
    spec = write_spec(folder, "~/state", "~/models/x")
    with pytest.raises(ReconcilerError, match=r"the spec path .* has characters"):
        settings_for(str(spec), ME.pw_name)


# One of each kind of character a unit file reads as something other than itself.
ODD_CHARACTERS = {
    "a space": " ",
    "a tab": "\t",
    "a newline": "\n",
    "a carriage return": "\r",
    "a control character": "\x1b",
    "a specifier": "%",
    "an expansion": "$",
    "a double quote": '"',
    "a single quote": "'",
    "a backslash": "\\",
    "a command separator": ";",
    "non-ASCII": "é",
}
BAD_USER_NAMES = [
    "two words",
    "line\nbreak",
    "per%cent",
    "dollar$",
    "ünïcode",
    "-dash",
    "1digit",
    "dot.ted",
    "x" * 32,
    "nul\x00",
]


def _refused(
    error: pytest.ExceptionInfo[ReconcilerError], role: str, value: str, char: str, hint: str = "move or rename it"
) -> None:
    assert f"{role} path {value!r} has characters a unit file would read differently: {char!r}" in error.value.message
    assert hint in error.value.hint


@pytest.mark.parametrize("kind", sorted(ODD_CHARACTERS))
def test_a_spec_path_with_an_odd_character_is_refused(tmp_path: Path, kind: str) -> None:
    char = ODD_CHARACTERS[kind]
    folder = tmp_path / f"specs{char}x"
    folder.mkdir()
    spec = write_spec(folder, "~/state", "~/models/x")
    with pytest.raises(ReconcilerError) as caught:
        settings_for(str(spec), ME.pw_name)
    _refused(caught, "the spec", str(spec), char)


@pytest.mark.parametrize("kind", sorted(ODD_CHARACTERS))
def test_a_writable_directory_with_an_odd_character_is_refused_naming_its_field(tmp_path: Path, kind: str) -> None:
    char = ODD_CHARACTERS[kind]
    state = f"/srv/state{char}"
    spec = write_spec(tmp_path, json.dumps(state), "~/models/x")
    with pytest.raises(ReconcilerError) as caught:
        settings_for(str(spec), ME.pw_name)
    if isinstance(caught.value, SpecError):  # the spec refuses quotes and control characters itself
        assert [problem.path for problem in caught.value.problems] == ["state_dir"]
    else:
        _refused(caught, "state_dir", state, char)


@pytest.mark.parametrize("kind", sorted(ODD_CHARACTERS))
def test_an_executable_with_an_odd_character_even_last_is_refused(monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    char = ODD_CHARACTERS[kind]
    executable = f"/opt/venv/bin/reconciler{char}"  # last: a regex `$` lets a trailing newline through
    monkeypatch.setattr(service, "reconciler_executable", lambda: executable)
    with pytest.raises(ReconcilerError) as caught:
        settings_for(str(SPEC_PATH), ME.pw_name)
    _refused(caught, "the reconciler executable", executable, char, "make a venv at a path of letters")


@pytest.mark.parametrize("kind", sorted(ODD_CHARACTERS))
def test_a_home_with_an_odd_character_is_refused(monkeypatch: pytest.MonkeyPatch, kind: str) -> None:
    char = ODD_CHARACTERS[kind]
    home = f"/home/{ME.pw_name}{char}"
    account = pwd.struct_passwd((ME.pw_name, "x", ME.pw_uid, ME.pw_gid, "", home, "/bin/sh"))
    monkeypatch.setattr(pwd, "getpwnam", lambda _: account)
    with pytest.raises(ReconcilerError) as caught:
        settings_for(str(SPEC_PATH), ME.pw_name)
    _refused(caught, f"{ME.pw_name}'s home", home, char, "pass --user")


@pytest.mark.parametrize("name", BAD_USER_NAMES)
def test_a_user_name_systemd_would_not_take_as_written_is_refused(name: str) -> None:
    with pytest.raises(ReconcilerError) as caught:
        settings_for(str(SPEC_PATH), name)
    assert f"the service user {name!r} is not a plain user name" in caught.value.message
    assert "pass --user" in caught.value.hint


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("executable", "bin/reconciler", "the reconciler executable path 'bin/reconciler' is not absolute"),
        ("spec", "/s\nExecStartPre=/bin/rm", "the spec path '/s\\nExecStartPre=/bin/rm' has characters"),
        ("user", "root\nUser=nvidia", "the service user 'root\\nUser=nvidia' is not a plain user name"),
        ("home", "/home/%u", "nvidia's home path '/home/%u' has characters"),
        ("extra_writable", ("/data/a b",), "a writable directory path '/data/a b' has characters"),
    ],
)
def test_unit_settings_refuse_what_the_unit_could_not_hold(field: str, value: object, message: str) -> None:
    with pytest.raises(ReconcilerError) as caught:
        UnitSettings(**{**EXAMPLE.__dict__, field: value})
    assert message in caught.value.message


def test_under_sudo_the_service_runs_as_the_user_who_typed_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(os, "getuid", lambda: 0)
    monkeypatch.setenv("SUDO_USER", "nvidia")
    assert service.invoking_user() == "nvidia"
    monkeypatch.delenv("SUDO_USER")
    assert service.invoking_user() == "root"


def test_install_writes_the_unit_then_reloads_enables_and_restarts(tmp_path: Path) -> None:
    systemctl = FakeSystemctl()
    report = install(my_settings(), dry_run=False, unit_dir=tmp_path, systemd_running=True, run=systemctl)
    unit_file = tmp_path / UNIT_NAME
    assert unit_file.read_text(encoding="utf-8") == report.unit
    assert unit_file.stat().st_mode & 0o777 == 0o644
    assert report.written
    assert report.changed
    assert systemctl.commands == [
        "systemctl daemon-reload",
        f"systemctl enable {UNIT_NAME}",
        f"systemctl restart --no-block {UNIT_NAME}",
    ]
    assert report.ran == systemctl.commands


def test_installing_an_unchanged_unit_only_makes_sure_it_is_enabled_and_started(tmp_path: Path) -> None:
    install(my_settings(), dry_run=False, unit_dir=tmp_path, systemd_running=True, run=FakeSystemctl())
    systemctl = FakeSystemctl()
    report = install(my_settings(), dry_run=False, unit_dir=tmp_path, systemd_running=True, run=systemctl)
    assert not report.written
    assert systemctl.commands == [f"systemctl enable {UNIT_NAME}", f"systemctl start --no-block {UNIT_NAME}"]


def test_without_a_running_systemd_install_says_what_to_run(tmp_path: Path) -> None:
    systemctl = FakeSystemctl()
    report = install(my_settings(), dry_run=False, unit_dir=tmp_path, systemd_running=False, run=systemctl)
    assert report.written
    assert systemctl.commands == []
    assert report.next_steps[0] == "systemctl daemon-reload"
    assert "systemd is not running here" in service.render_report(report)


def test_a_failing_systemctl_is_reported_with_its_message(tmp_path: Path) -> None:
    with pytest.raises(ReconcilerError, match=r"`systemctl enable spark-reconciler\.service` failed.*Access denied"):
        install(my_settings(), dry_run=False, unit_dir=tmp_path, systemd_running=True, run=FakeSystemctl("enable"))


def test_dry_run_writes_and_runs_nothing(tmp_path: Path) -> None:
    systemctl = FakeSystemctl()
    report = install(my_settings(), dry_run=True, unit_dir=tmp_path, systemd_running=True, run=systemctl)
    assert not (tmp_path / UNIT_NAME).exists()
    assert systemctl.commands == []
    assert service.render_report(report) == report.unit


def test_install_creates_missing_writable_directories_for_the_service_user(tmp_path: Path) -> None:
    data = tmp_path / "data" / "models"
    install(my_settings((str(data),)), dry_run=False, unit_dir=tmp_path, systemd_running=False)
    assert data.is_dir()
    assert (data.stat().st_uid, data.parent.stat().st_uid) == (ME.pw_uid, ME.pw_uid)


def test_a_path_behind_a_private_directory_is_unreachable_for_another_user(tmp_path: Path) -> None:
    private = tmp_path / "private"
    private.mkdir(mode=0o700)
    target = private / "reconciler"
    target.write_text("#!/bin/sh\n", encoding="utf-8")
    target.chmod(0o755)
    owner = private.stat().st_uid
    assert service._reachable(str(target), os.X_OK, owner, set())
    assert not service._reachable(str(target), os.X_OK, owner + 1, set())


def test_cli_dry_run_prints_the_unit_for_this_machine(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["install-service", "--spec", str(SPEC_PATH), "--user", ME.pw_name, "--dry-run"])
    out = capsys.readouterr().out
    assert code == 0
    assert f"\nExecStart={Path(sys.prefix) / 'bin' / 'reconciler'} run --spec {SPEC_PATH}\n" in out
    assert f"\nUser={ME.pw_name}\n" in out


def test_cli_json_reports_the_unit_and_what_would_happen(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["install-service", "--spec", str(SPEC_PATH), "--user", ME.pw_name, "--dry-run", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 0
    assert report["dry_run"] is True
    assert report["written"] is False
    assert report["unit_path"] == f"/etc/systemd/system/{UNIT_NAME}"
    assert report["unit"].startswith("# spark-reconciler:")


def test_cli_dry_run_refuses_an_odd_spec_path_with_the_fix(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / "100%"
    folder.mkdir()
    spec = write_spec(folder, "~/state", "~/models/x")
    code = main(["install-service", "--spec", str(spec), "--user", ME.pw_name, "--dry-run"])
    err = capsys.readouterr().err
    assert code == 1
    assert f"error: the spec path {str(spec)!r} has characters a unit file would read differently: '%'\n" in err
    assert "hint: move or rename it" in err
    assert "internal error" not in err


@pytest.mark.parametrize("name", ["two words", "line\nbreak", "nul\x00byte"])
def test_cli_dry_run_refuses_an_odd_user_name(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["install-service", "--spec", str(SPEC_PATH), f"--user={name}", "--dry-run", "--json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 1
    assert report["message"] == (
        f"the service user {name!r} is not a plain user name "
        "(a letter or '_', then letters, digits, '_' or '-', at most 31 characters)"
    )


if __name__ == "__main__":
    EXAMPLE_PATH.write_text(render_unit(EXAMPLE), encoding="utf-8")
    print(f"wrote {EXAMPLE_PATH}")
