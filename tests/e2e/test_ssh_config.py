"""The head user's ssh config on the testbed: a Host alias and a ProxyJump reach the worker, for the
control connection and for rsync alike, and host keys stay checked on every hop.

The worker's spec entry is only `ssh: {host: <alias>}`: address, user, key and known_hosts all
come from an ssh config written here and named by RECONCILER_SSH_CONFIG (the head's own
~/.ssh/config belongs to the testbed). The jump goes through the head's own sshd on its
management address to the worker's fabric address.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.conftest import RECONCILER, ROOT, Bed

pytestmark = pytest.mark.testbed

WORKER, WORKER_IP, HEAD_MGMT_IP = "spark-worker", "198.18.10.11", "198.19.0.13"
PYTHON = str(ROOT / ".venv/bin/python")
# Prints the route the reconciler resolves for an alias, and the rsync argv it would run for it.
ROUTE_AND_RSYNC = """
import json, sys
from reconciler.components.rsync import rsync_argv
from reconciler.spec import SshTarget
from reconciler.transport.sshroute import route_for
route = route_for("spark-worker", SshTarget(host=sys.argv[1]))
hops = [{"hostname": h.hostname, "port": h.port, "user": h.user} for h in route.hops]
print(json.dumps({"hops": hops, "rsync": rsync_argv(route, sys.argv[2], sys.argv[3], None)}))
"""


def ssh_config(bed: Bed, directory: Path) -> Path:
    keys = bed.testbed.layout
    key, known = keys.client_key, keys.known_hosts
    (directory / "no_known_hosts").write_text("", encoding="utf-8")
    login = f"    User root\n    IdentityFile {key}\n"
    text = (
        f"Host worker-alias\n    HostName {WORKER_IP}\n{login}    UserKnownHostsFile {known}\n\n"
        f"Host worker-via-head\n    HostName {WORKER_IP}\n{login}    UserKnownHostsFile {known}\n"
        "    ProxyJump head-jump\n\n"
        f"Host head-jump\n    HostName {HEAD_MGMT_IP}\n{login}\n"
        f"Host worker-filed-as-head\n    HostName {WORKER_IP}\n    HostKeyAlias spark-head\n{login}"
        f"    UserKnownHostsFile {known}\n\n"
        f"Host worker-unknown\n    HostName {WORKER_IP}\n{login}    UserKnownHostsFile {directory / 'no_known_hosts'}\n"
        "    StrictHostKeyChecking no\n\n"
        f"Host worker-via-unknown-jump\n    HostName {WORKER_IP}\n{login}    UserKnownHostsFile {known}\n"
        "    ProxyJump unknown-jump\n\n"
        f"Host unknown-jump\n    HostName {HEAD_MGMT_IP}\n    HostKeyAlias nobody-knows-this-host\n{login}"
    )
    path = directory / "ssh_config"
    path.write_text(text, encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def config(bed: Bed) -> Path:
    return ssh_config(bed, bed.spec.parent)


def spec_for(bed: Bed, alias: str) -> Path:
    """The testbed spec with the worker's whole ssh: block replaced by just the alias."""
    text = bed.spec.read_text(encoding="utf-8")
    block = re.compile(rf"(?m)^    ssh:\n      host: {re.escape(WORKER_IP)}.*?\n(      .*\n)*")
    replaced, count = block.subn(f"    ssh: {{host: {alias}}}\n", text)
    assert count == 1, "the testbed spec's worker ssh: block moved"
    path = bed.spec.parent / f"spec-{alias}.yaml"
    path.write_text(replaced, encoding="utf-8")
    return path


def on_head(bed: Bed, config: Path, argv: list[str], timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return bed.testbed.exec(
        "spark-head", argv, env={"RECONCILER_SSH_CONFIG": str(config)}, check=False, timeout=timeout
    )


def reconciler(bed: Bed, config: Path, alias: str, *args: str) -> subprocess.CompletedProcess[str]:
    return on_head(bed, config, [RECONCILER, *args, "--spec", str(spec_for(bed, alias))])


def worker_ssh_check(bed: Bed, config: Path, alias: str) -> dict[str, str]:
    result = reconciler(bed, config, alias, "doctor", "--json")
    report: Any = json.loads(result.stdout)
    return next(c for c in report["checks"] if c["node"] == WORKER and c["check"] == "ssh")


@pytest.mark.parametrize("alias", ["worker-alias", "worker-via-head"])
def test_plan_reaches_the_worker_through_the_ssh_config(bed: Bed, config: Path, alias: str) -> None:
    result = reconciler(bed, config, alias, "plan", "--detailed-exitcode")
    assert result.returncode == 2, f"a fresh bed has changes and no blocker\n{result.stdout}\n{result.stderr}"
    assert "node unreachable" not in result.stdout


def test_doctor_names_the_route_and_the_config_entry(bed: Bed, config: Path) -> None:
    known = bed.testbed.layout.known_hosts
    check = worker_ssh_check(bed, config, "worker-alias")
    assert check["status"] == "PASS", check
    assert check["message"] == (
        f"root@{WORKER_IP}:22 (worker-alias) answered; host keys match {known}; "
        f"ssh config: {config}:1: Host worker-alias"
    )
    jumped = worker_ssh_check(bed, config, "worker-via-head")
    assert jumped["status"] == "PASS", jumped
    assert jumped["message"].startswith(
        f"root@{WORKER_IP}:22 (worker-via-head) via root@{HEAD_MGMT_IP}:22 (head-jump) answered"
    )


@pytest.mark.parametrize("alias", ["worker-alias", "worker-via-head"])
def test_rsync_takes_the_route_the_control_connection_takes(bed: Bed, config: Path, alias: str) -> None:
    source, destination = "/srv/spark/ssh-config-source", f"/srv/spark/ssh-config-{alias}"
    bed.node("spark-head", "sh", "-c", f"mkdir -p {source} && echo {alias} > {source}/file")
    resolved = on_head(bed, config, [PYTHON, "-c", ROUTE_AND_RSYNC, alias, source, destination])
    assert resolved.returncode == 0, resolved.stderr
    answer = json.loads(resolved.stdout)
    assert answer["hops"][-1] == {"hostname": WORKER_IP, "port": 22, "user": "root"}
    copied = on_head(bed, config, answer["rsync"])
    assert copied.returncode == 0, copied.stderr
    assert bed.node(WORKER, "cat", f"{destination}/file").stdout == f"{alias}\n"


def test_openssh_reads_the_same_values_from_the_same_file(bed: Bed, config: Path) -> None:
    """`ssh -G` with the options rsync gets: what OpenSSH itself makes of the route."""
    resolved = on_head(bed, config, [PYTHON, "-c", ROUTE_AND_RSYNC, "worker-via-head", "/a", "/b"])
    rsync = json.loads(resolved.stdout)["rsync"]
    ssh = rsync[rsync.index("-e") + 1]
    shown = on_head(bed, config, ["sh", "-c", f"{ssh} -G worker-via-head"])
    assert shown.returncode == 0, shown.stderr
    settings = dict(line.split(" ", 1) for line in shown.stdout.splitlines() if " " in line)
    assert (settings["hostname"], settings["port"], settings["user"]) == (WORKER_IP, "22", "root")
    assert settings["stricthostkeychecking"] == "true"
    assert f"-W {WORKER_IP}:22 head-jump" in settings["proxycommand"]
    assert "proxyjump" not in settings


@pytest.mark.parametrize(
    ("alias", "says"),
    [
        ("worker-filed-as-head", f"root@{WORKER_IP}:22 (worker-filed-as-head): the host key does not match spark-head"),
        ("worker-unknown", f"root@{WORKER_IP}:22 (worker-unknown): no host key for {WORKER_IP} in"),
        ("worker-via-unknown-jump", f"jump host root@{HEAD_MGMT_IP}:22 (unknown-jump): no host key for nobody-knows"),
    ],
)
def test_host_keys_stay_checked_whatever_the_config_says(bed: Bed, config: Path, alias: str, says: str) -> None:
    result = reconciler(bed, config, alias, "plan", "--detailed-exitcode")
    assert result.returncode == 1, result.stdout
    assert "node unreachable" in result.stdout
    assert says in result.stdout
    check = worker_ssh_check(bed, config, alias)
    assert check["status"] == "FAIL"
    assert says in check["message"]
