"""A throwaway machine booted by a real systemd, for testing the unit: systemd-nspawn --boot.

Why not debootstrap: the unit must run this checkout's reconciler from this venv, and this
host's /usr already holds systemd and the interpreters. So the machine is a skeleton root
(a few files in /etc, made in a temporary directory in milliseconds) with /usr, the checkout
and the venv's base interpreter bound read-only: nothing to download, nothing to cache, and
it boots in about a second. Whatever its services write lands in the skeleton (deleted
afterwards) or in its tmpfs; --private-network leaves it nothing but its own loopback.

Commands run inside with nsenter into the machine's systemd (PID 1 there), because without
a running systemd on the host there is no machined for `machinectl shell`.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

# Inside the machine, commands get a clean environment: nothing of the test runner's leaks in.
MACHINE_ENV = ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin", "HOME=/root", "LANG=C.UTF-8"]
# Debian's merged /usr: the top-level directories are links into it.
USR_LINKS = {"bin": "usr/bin", "sbin": "usr/sbin", "lib": "usr/lib", "lib64": "usr/lib64"}


class MachineError(RuntimeError):
    """The machine did not boot or a command inside it failed; the message has its output."""


def nspawn_available() -> bool:
    return os.geteuid() == 0 and shutil.which("systemd-nspawn") is not None and shutil.which("nsenter") is not None


def make_root(root: Path, files: dict[str, str], masked: Sequence[str] = ()) -> None:
    """A skeleton OS tree: just enough /etc for systemd to boot without a first-boot wizard.

    `masked` units never start, whatever wants them: the host's /usr may ship docker.service.
    """
    for directory in ("usr", "etc/systemd/system", "root", "tmp", "var/tmp", "srv"):
        (root / directory).mkdir(parents=True, exist_ok=True)
    for name, target in USR_LINKS.items():
        (root / name).symlink_to(target)
    shutil.copyfile("/usr/lib/os-release", root / "etc/os-release")
    # A machine id means "not the first boot": no preset run, no interactive systemd-firstboot.
    skeleton = {
        "etc/machine-id": uuid.uuid4().hex + "\n",
        "etc/passwd": "root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n",
        "etc/group": "root:x:0:\nnogroup:x:65534:\n",
        "etc/nsswitch.conf": "passwd: files\ngroup: files\nhosts: files\n",
        "etc/hosts": "127.0.0.1 localhost\n",
    }
    for name, text in {**skeleton, **files}.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    for unit in masked:
        (root / "etc/systemd/system" / unit).symlink_to("/dev/null")


def read_only_binds() -> list[Path]:
    """This checkout (venv included) and, when it lives outside /usr, the venv's base Python."""
    checkout = Path(__file__).resolve().parents[2]
    interpreter = Path(os.path.realpath(sys.executable)).parents[1]
    binds = [checkout]
    if not interpreter.is_relative_to("/usr") and not interpreter.is_relative_to(checkout):
        binds.append(interpreter)
    return binds


@dataclass
class Machine:
    """A booted machine; `leader` is its systemd's PID as this host sees it."""

    root: Path
    process: subprocess.Popen[bytes]
    leader: int
    console: Path

    def run(self, argv: Sequence[str], *, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess[str]:
        command = ["nsenter", "-t", str(self.leader), "-a", "-r", "-w", "env", "-i", *MACHINE_ENV, *argv]
        result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, check=False)
        if check and result.returncode != 0:
            raise MachineError(f"{' '.join(argv)}: exit {result.returncode}\n{result.stdout}{result.stderr}")
        return result

    def show(self, unit: str, *properties: str) -> dict[str, str]:
        """`systemctl show` as a dict: systemd's own view of the unit."""
        output = self.run(["systemctl", "show", unit, "-p", ",".join(properties)]).stdout
        return dict(line.split("=", 1) for line in output.splitlines() if "=" in line)

    def journal(self, unit: str) -> str:
        return self.run(["journalctl", "--no-pager", "-o", "short-monotonic", "-u", unit], check=False).stdout


@contextlib.contextmanager
def booted(root: Path, binds: Sequence[Path], *, timeout_s: float = 60) -> Iterator[Machine]:
    """Boot the skeleton with systemd as PID 1; power it off (or kill it) afterwards."""
    console = root.parent / "console.log"
    argv = [
        "systemd-nspawn",
        f"--directory={root}",
        f"--machine=spark-svc-{os.getpid()}",
        "--register=no",  # no machined on a host without a running systemd
        "--keep-unit",
        "--private-network",
        "--console=pipe",
        "--bind-ro=/usr",
        *(f"--bind-ro={path}" for path in binds),
        "--boot",
        "--",
        # Debug logging makes PID 1 journal every notification (READY=1, WATCHDOG=1, STOPPING=1).
        "--log-level=debug",
    ]
    with console.open("wb") as sink:
        process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=sink, stderr=subprocess.STDOUT)
    machine = Machine(root, process, 0, console)
    try:
        machine.leader = _find_leader(process, timeout_s)
        _wait_until_booted(machine, timeout_s)
        yield machine
    finally:
        _power_off(process, machine.leader)


def _find_leader(process: subprocess.Popen[bytes], timeout_s: float) -> int:
    """nspawn's descendant that is PID 1 in its own PID namespace: the machine's systemd."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise MachineError(f"systemd-nspawn exited with {process.returncode} before booting")
        for pid in _descendants(process.pid):
            if _namespace_pid(pid) == 1:
                return pid
        time.sleep(0.05)
    raise MachineError(f"no systemd inside the machine after {timeout_s:.0f} s")


def _wait_until_booted(machine: Machine, timeout_s: float) -> None:
    """`is-system-running --wait` answers "offline" at once until PID 1 has its bus up."""
    deadline = time.monotonic() + timeout_s
    state = "offline"
    while state == "offline" and time.monotonic() < deadline:
        time.sleep(0.05)
        result = machine.run(["systemctl", "is-system-running", "--wait"], check=False, timeout=timeout_s)
        state = result.stdout.strip() or "offline"
    if state not in ("running", "degraded"):
        raise MachineError(f"the machine did not finish booting: {state}\n{machine.console.read_text()[-3000:]}")


def _descendants(pid: int) -> list[int]:
    parents: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(OSError, ValueError, IndexError):
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            parents.setdefault(int(fields[1]), []).append(int(entry.name))
    found, queue = [], [pid]
    while queue:
        children = parents.get(queue.pop(), [])
        found += children
        queue += children
    return found


def _namespace_pid(pid: int) -> int | None:
    with contextlib.suppress(OSError):
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("NSpid:"):
                return int(line.split()[-1])
    return None


def _power_off(process: subprocess.Popen[bytes], leader: int) -> None:
    """Orderly if possible, certain in any case: no machine may outlive its test.

    The first SIGTERM makes nspawn ask the machine's systemd to power off; a systemd still
    booting may not have its handler yet, so a second SIGTERM ends the machine at once, and
    SIGKILL to its PID 1 (which takes its whole PID namespace along) backs both up.
    """
    for signal_number, grace_s in ((signal.SIGTERM, 20), (signal.SIGTERM, 10), (signal.SIGKILL, 10)):
        if process.poll() is not None:
            break
        process.send_signal(signal_number)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=grace_s)
    if leader and _namespace_pid(leader) == 1:
        with contextlib.suppress(ProcessLookupError):
            os.kill(leader, signal.SIGKILL)
