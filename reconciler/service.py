"""The systemd unit that runs `reconciler run` at boot on the head, and its installation.

The unit's text is a pure function of a few facts about this machine (the reconciler
executable, the spec, the service user and the head's writable directories), so it is
rendered and tested like a plan; `systemd/reconciler.service` is that rendering for an
example machine. Installing is the thin edge: an atomic write, `daemon-reload`, enable and
start, each only when it changes something, so running `install-service` twice is a no-op.
"""

from __future__ import annotations

import grp
import os
import pwd
import re
import shutil
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from reconciler import constants
from reconciler.constants import UNIT_NAME
from reconciler.errors import ReconcilerError
from reconciler.fsutil import atomic_write
from reconciler.spec import Deployment, expand_home, load_spec

UNIT_DIR = Path(constants.UNIT_DIR)
# sd_booted(3): this directory exists only while systemd is the running init.
SYSTEMD_RUNTIME_DIR = Path("/run/systemd/system")
# Characters every directive the unit uses takes literally: anything else (a space, %, $, a quote,
# a backslash, a newline, non-ASCII) is a specifier, an expansion, a separator or an escape in some
# of them, each with its own rules, so such a value is refused with a clear error instead.
_PLAIN_PATH_CHARS = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._@+,:=~/-")
# systemd's strict rule for user names: outside it User= warns (make service-check fails on any
# warning), and a `%` or a quote in the name would be read as a specifier or quoting anyway.
_USER_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_-]{0,30}")
_MOVE_HINT = (
    "move or rename it to a path of letters, digits and ._-/ (or make a symlink without such characters "
    "point at it and give that), then run install-service again"
)

Runner = Callable[[Sequence[str]], subprocess.CompletedProcess[str]]


@dataclass(frozen=True)
class UnitSettings:
    """Everything the unit depends on; the rest of its text is the same on every head."""

    executable: str
    spec: str
    user: str
    home: str
    # Outside the home directory (which is always writable): the head's state and model dirs.
    extra_writable: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        """Every value the unit holds is one systemd reads as written: no settings, no such unit."""
        check_user_name(self.user)
        check_plain(
            self.executable,
            "the reconciler executable",
            "a venv's scripts keep the path it was made at: make a venv at a path of letters, digits and ._-/ "
            "(python3 -m venv /opt/spark-reconciler), install into it and run its reconciler install-service",
        )
        check_plain(self.spec, "the spec")
        check_plain(self.home, f"{self.user}'s home", "run the service as another user: pass --user")
        for path in self.extra_writable:
            check_plain(path, "a writable directory")


@dataclass
class InstallReport:
    """What install-service rendered, wrote and ran, as data for text or JSON output."""

    unit_path: str
    unit: str
    dry_run: bool
    changed: bool = False
    written: bool = False
    systemd_running: bool = False
    created_dirs: list[str] = field(default_factory=list)
    ran: list[str] = field(default_factory=list)
    next_steps: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """Every field in order (next_steps as "next"), but the long unit text last."""
        named = {("next" if key == "next_steps" else key): value for key, value in asdict(self).items()}
        return {"ok": True, **{key: value for key, value in named.items() if key != "unit"}, "unit": self.unit}


def render_unit(settings: UnitSettings) -> str:
    """The unit file. Comments say why each choice was made: `systemctl cat` shows them."""
    writable = " ".join([settings.home, *(f"-{path}" for path in settings.extra_writable)])
    mounts = " ".join([settings.home, *settings.extra_writable])
    return _UNIT_TEMPLATE.format(**asdict(settings), writable=writable, mounts=mounts)


_UNIT_TEMPLATE = """\
# spark-reconciler: `reconciler run` keeps the deployment in the spec converged.
# Written by `reconciler install-service`; run it again after moving the spec or the venv.
[Unit]
Description=spark-reconciler: keep the DeepSeek-V4.1-Flash deployment converged
# The first pass needs the head's Docker and SSH to the workers.
Wants=network-online.target docker.service
After=network-online.target docker.service
RequiresMountsFor={mounts}
# Never give up: a fixed spec or a node that comes back must be picked up without a human.
StartLimitIntervalSec=0

[Service]
Type=notify
NotifyAccess=main
User={user}
WorkingDirectory={home}
Environment=HOME={home} PYTHONUNBUFFERED=1
ExecStart={executable} run --spec {spec}
Restart=always
RestartSec=15s
# READY=1 follows the first pass, which can include hours of checkpoint download.
TimeoutStartSec=infinity
# The loop sends WATCHDOG=1 every 30 s; a loop stuck for 60 s is killed and restarted.
WatchdogSec=60s
# The head's memory guard is a detached child of the loop: stopping or restarting the
# reconciler must not take the guard down while the ranks (Docker's, not ours) keep running.
KillMode=process
TimeoutStopSec=90s

# Hardening: the OS is read-only; the user's home and the deployment's directories are not.
# The Docker socket and SSH stay usable. Docker access is root-equivalent, so this guards
# against accidents, not against the service itself.
ProtectSystem=strict
ReadWritePaths={writable}
PrivateTmp=yes
NoNewPrivileges=yes
ProtectKernelTunables=yes
ProtectKernelModules=yes
ProtectKernelLogs=yes
ProtectControlGroups=yes
ProtectClock=yes
ProtectHostname=yes
RestrictNamespaces=yes
RestrictRealtime=yes
RestrictSUIDSGID=yes
LockPersonality=yes
RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6 AF_NETLINK
SystemCallArchitectures=native
SystemCallFilter=@system-service
SystemCallErrorNumber=EPERM

[Install]
WantedBy=multi-user.target
"""


# --- settings for this machine ------------------------------------------------------------


def settings_for(spec_path: str, user: str | None) -> UnitSettings:
    """The unit settings for this machine: this venv's reconciler, the spec, the service user."""
    spec = str(Path(spec_path).absolute())
    deployment = load_spec(spec).deployment
    account = _account(user or invoking_user())
    extra = _extra_writable(deployment, account.pw_dir)
    for path, what in extra:  # checked here to name the spec's field; UnitSettings checks the rest
        check_plain(path, what)
    return UnitSettings(
        reconciler_executable(), spec, account.pw_name, account.pw_dir, tuple(path for path, _ in extra)
    )


def invoking_user() -> str:
    """The user who ran the command: under sudo, the one who typed it, not root."""
    sudo_user = os.environ.get("SUDO_USER")
    if os.getuid() == 0 and sudo_user:
        return sudo_user
    return pwd.getpwuid(os.getuid()).pw_name


def reconciler_executable() -> str:
    """This installation's `reconciler` script: the venv's when running from one, else PATH's."""
    candidate = Path(sys.prefix) / "bin" / "reconciler"
    if candidate.is_file() and os.access(candidate, os.X_OK):
        return str(candidate.absolute())
    found = shutil.which("reconciler")
    if found is None:
        raise ReconcilerError(
            f"cannot find the reconciler executable (not at {candidate}, not on PATH)",
            "install spark-reconciler (pip install -e .) and run install-service with that installation's reconciler",
        )
    return str(Path(found).absolute())


def _account(name: str) -> pwd.struct_passwd:
    check_user_name(name)
    try:
        return pwd.getpwnam(name)
    except KeyError:
        raise ReconcilerError(f"no user named {name!r} on this machine", "pass --user with an existing user") from None


def _extra_writable(deployment: Deployment, home: str) -> list[tuple[str, str]]:
    """The head's directories the loop writes that lie outside the home (which is writable)."""
    head = deployment.head
    wanted = [
        (expand_home(deployment.state_dir, home), "state_dir"),
        (expand_home(head.model_dir, home), f"nodes[{head.name}].model_dir"),
        (str(Path(expand_home(deployment.key_file(), home)).parent), "api.key_file's directory"),
    ]
    unique = {os.path.normpath(path): what for path, what in reversed(wanted)}
    return sorted(
        (path, what) for path, what in unique.items() if os.path.commonpath([path, home]) != os.path.normpath(home)
    )


def check_plain(path: str, what: str, hint: str = _MOVE_HINT) -> None:
    """Refuse a path the unit file would not hold as written; `what` names its role in the error."""
    if not path.startswith("/"):
        raise ReconcilerError(f"{what} path {path!r} is not absolute", "give an absolute path")
    odd = sorted({char for char in path if char not in _PLAIN_PATH_CHARS})
    if odd:
        raise ReconcilerError(
            f"{what} path {path!r} has characters a unit file would read differently: "
            + " ".join(repr(char) for char in odd),
            hint,
        )


def check_user_name(name: str) -> None:
    """User= holds the name as written, so only a name systemd reads as such without a warning."""
    if not _USER_NAME.fullmatch(name):
        raise ReconcilerError(
            f"the service user {name!r} is not a plain user name (a letter or '_', then letters, digits, "
            "'_' or '-', at most 31 characters)",
            "pass --user with such a user (create one with useradd if needed), then run install-service again",
        )


def user_problems(settings: UnitSettings) -> tuple[list[str], list[str]]:
    """What the service user lacks: paths it cannot reach (the unit would fail at its first
    start), and the docker group (the service reaches Docker as its user: without it, it cannot)."""
    if settings.user == "root":
        return [], []
    account = pwd.getpwnam(settings.user)
    groups = set(os.getgrouplist(account.pw_name, account.pw_gid))
    interpreter = os.path.realpath(sys.executable)
    wanted = [(settings.executable, os.X_OK), (interpreter, os.X_OK), (settings.spec, os.R_OK)]
    unreachable = [
        f"{settings.user} cannot {'run' if mode == os.X_OK else 'read'} {path}"
        for path, mode in wanted
        if not _reachable(path, mode, account.pw_uid, groups)
    ]
    try:
        docker_gid = grp.getgrnam("docker").gr_gid
    except KeyError:
        return unreachable, ["there is no docker group on this machine: is Docker installed on the head?"]
    if docker_gid in groups:
        return unreachable, []
    fix = f"sudo usermod -aG docker {settings.user}"
    return unreachable, [f"{settings.user} is not in the docker group, so the service cannot reach Docker: {fix}"]


def _reachable(path: str, mode: int, uid: int, groups: set[int]) -> bool:
    """Whether a user with these ids can search every parent of `path` and use it with `mode`."""
    target = Path(path)
    steps = [(parent, os.X_OK) for parent in reversed(target.parents)] + [(target, mode)]
    return all(_permits(step, want, uid, groups) for step, want in steps)


def _permits(path: Path, want: int, uid: int, groups: set[int]) -> bool:
    try:
        stat = path.stat()
    except OSError:
        return False
    shift = 6 if stat.st_uid == uid else 3 if stat.st_gid in groups else 0
    return (stat.st_mode >> shift) & want == want


# --- installation ---------------------------------------------------------------------------


def install(
    settings: UnitSettings,
    *,
    dry_run: bool,
    unit_dir: Path = UNIT_DIR,
    systemd_running: bool | None = None,
    run: Runner | None = None,
) -> InstallReport:
    """Render the unit and, unless dry_run, write it, create its directories and start it."""
    unit_path = unit_dir / UNIT_NAME
    report = InstallReport(str(unit_path), render_unit(settings), dry_run)
    problems, warnings = user_problems(settings)
    if problems and not dry_run:
        raise ReconcilerError(
            "the service could not start: " + "; ".join(problems),
            "install spark-reconciler where that user can read it (e.g. a venv in its home), or pass --user",
        )
    report.warnings = problems + warnings
    report.changed = _current(unit_path) != report.unit
    if dry_run:
        return report
    report.created_dirs = _create_dirs(settings)
    if report.changed:
        _write_atomically(unit_path, report.unit)
        report.written = True
    report.systemd_running = SYSTEMD_RUNTIME_DIR.is_dir() if systemd_running is None else systemd_running
    commands = activation_commands(report.changed)
    if not report.systemd_running:
        report.next_steps = [" ".join(command) for command in commands]
        return report
    for command in commands:
        _systemctl(command, run or _run)
        report.ran.append(" ".join(command))
    return report


def uninstall(
    unit_path: Path, *, systemd_running: bool | None = None, run: Runner | None = None, as_root: bool | None = None
) -> list[str]:
    """Stop and disable the service, remove its unit; the commands run. Not root, each goes
    through `sudo -n` (check_can_remove has made sure sudo answers without a question)."""
    running = SYSTEMD_RUNTIME_DIR.is_dir() if systemd_running is None else systemd_running
    root = os.geteuid() == 0 if as_root is None else as_root
    prefix = [] if root else ["sudo", "-n"]
    commands = [["systemctl", "disable", "--now", UNIT_NAME]] if running else []
    commands.append(["rm", "-f", str(unit_path)])
    commands += [["systemctl", "daemon-reload"]] if running else []
    ran = []
    for command in commands:
        _systemctl([*prefix, *command], run or _run, "uninstall is safe to rerun")
        ran.append(" ".join([*prefix, *command]))
    return ran


def check_can_remove(unit_path: Path, *, run: Runner | None = None, interactive: bool | None = None) -> None:
    """Before uninstall removes anything: root, or sudo answering (a terminal may be asked for
    the password once, here); else nothing is removed and the owner is told what to run."""
    if os.geteuid() == 0:
        return
    runner = run or _run
    if runner(["sudo", "-n", "true"]).returncode == 0:
        return
    asked = sys.stdin.isatty() if interactive is None else interactive
    if asked and subprocess.run(["sudo", "-v"], check=False).returncode == 0:
        return
    raise ReconcilerError(
        f"removing {unit_path} needs root, and sudo did not answer; nothing was removed",
        f"run `sudo systemctl disable --now {UNIT_NAME} && sudo rm {unit_path}`, then `reconciler uninstall` again",
    )


def loops_running(spec_path: str, proc: Path = Path("/proc")) -> list[int]:
    """The pids of `reconciler run` processes on this machine whose spec is this one (the
    process's --spec, or the default spec path, read against its working directory)."""
    wanted = Path(spec_path).resolve()
    found = []
    for entry in proc.iterdir() if proc.is_dir() else []:
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().decode("utf-8", "replace").split("\0")
            cwd = Path(os.readlink(entry / "cwd"))
        except OSError:
            continue
        spec = _loop_spec(argv)
        if spec is not None and (cwd / spec).resolve() == wanted:
            found.append(int(entry.name))
    return found


def _loop_spec(argv: list[str]) -> str | None:
    """The spec a `reconciler run` command line serves; None for any other command line."""
    words = [word for word in argv if word]
    runs = any(Path(word).name == "reconciler" for word in words) and "run" in words
    if not runs or words.index("run") < 1:
        return None
    if "--spec" in words and words.index("--spec") + 1 < len(words):
        return words[words.index("--spec") + 1]
    spec = next((word.removeprefix("--spec=") for word in words if word.startswith("--spec=")), None)
    return spec or os.environ.get(constants.SPEC_PATH_ENV) or constants.DEFAULT_SPEC_PATH


def activation_commands(changed: bool) -> list[list[str]]:
    """`enable --now`, except that a changed unit is reloaded and restarted, not just started.

    --no-block: READY=1 follows the first pass, which can take hours; install must not wait.
    """
    commands = [["systemctl", "daemon-reload"]] if changed else []
    commands.append(["systemctl", "enable", UNIT_NAME])
    commands.append(["systemctl", "restart" if changed else "start", "--no-block", UNIT_NAME])
    return commands


def _current(unit_path: Path) -> str | None:
    try:
        return unit_path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return None


def _create_dirs(settings: UnitSettings) -> list[str]:
    """ReadWritePaths must exist when the service starts, or the loop could never create them."""
    account = pwd.getpwnam(settings.user)
    created = []
    for directory in map(Path, settings.extra_writable):
        missing = [path for path in reversed([directory, *directory.parents]) if not path.exists()]
        directory.mkdir(parents=True, exist_ok=True)
        for path in missing:
            os.chown(path, account.pw_uid, account.pw_gid)
        created += [str(path) for path in missing]
    return created


def _write_atomically(path: Path, text: str) -> None:
    if not path.parent.is_dir():
        raise ReconcilerError(f"{path.parent} does not exist", "is systemd installed? (apt-get install systemd)")
    try:
        atomic_write(str(path), text.encode("utf-8"), 0o644)  # systemd and `systemctl cat` read it
    except PermissionError:
        raise ReconcilerError(
            f"cannot write {path}: permission denied", "run it with sudo, or --dry-run to print the unit"
        ) from None


def _systemctl(command: Sequence[str], run: Runner, rerun: str = "install-service is safe to rerun") -> None:
    result = run(command)
    if result.returncode != 0:
        raise ReconcilerError(
            f"`{' '.join(command)}` failed (exit {result.returncode}): {result.stderr.strip()}",
            f"see `systemctl status {UNIT_NAME}` and `journalctl -u {UNIT_NAME}`; {rerun}",
        )


def _run(command: Sequence[str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(command), capture_output=True, text=True, check=False)


# --- text output ----------------------------------------------------------------------------


def render_report(report: InstallReport) -> str:
    """What happened and what to do next; the unit itself only for --dry-run."""
    if report.dry_run:
        return report.unit
    state = "written" if report.written else "unchanged"
    lines = [f"{report.unit_path}: {state}"]
    lines += [f"created {path}" for path in report.created_dirs]
    lines += [f"ran: {command}" for command in report.ran]
    if report.next_steps:
        lines.append("systemd is not running here; where it runs (or after a reboot into it), run:")
        lines += [f"  {command}" for command in report.next_steps]
    else:
        lines.append(f"follow it: systemctl status {UNIT_NAME}; journalctl -u {UNIT_NAME} -f")
    return "\n".join(lines) + "\n"
