"""The testbed itself: isolation, SSH, Docker and fabric behave like two separate Sparks.

The session's bring-up (tests/e2e/conftest.py), reset for the module; its teardown's leftover
check at the session's end fails the run if anything is left behind.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.testbed import images
from tests.testbed.testbed import Testbed

pytestmark = pytest.mark.testbed

HEAD, WORKER = "spark-head", "spark-worker"
FABRIC_IP = {HEAD: "198.18.10.13", WORKER: "198.18.10.11"}
NODE_LINKS = {"lo", "enP7s7", "enp1s0f1np1", "docker0"}

PARAMIKO_SCRIPT = """
import os, paramiko
client = paramiko.SSHClient()
client.load_host_keys(os.environ["KNOWN_HOSTS"])
client.set_missing_host_key_policy(paramiko.RejectPolicy())
client.connect("198.18.10.11", username="root", key_filename=os.path.expanduser("~/.ssh/id_ed25519"),
               look_for_keys=False, allow_agent=False, timeout=5)
_, out, _ = client.exec_command("hostname; echo $DOCKER_HOST")
print(out.read().decode().strip())
client.close()
"""

DOCKER_SCRIPT = """
import json, docker
local = docker.from_env().info()
remote = docker.DockerClient(base_url="ssh://root@198.18.10.11").info()
print(json.dumps({"id": local["ID"], "name": local["Name"], "ssh_worker_name": remote["Name"]}))
"""


def _say(config: pytest.Config, line: str) -> None:
    """Print past pytest's output capture, so timings show without -s."""
    capture = config.pluginmanager.get_plugin("capturemanager")
    if capture is None:
        print(line)
        return
    with capture.global_and_fixture_disabled():
        print(line, flush=True)


@pytest.fixture(scope="module")
def testbed(shared_testbed: Testbed, pytestconfig: pytest.Config) -> Testbed:
    started = time.monotonic()
    shared_testbed.reset()
    _say(pytestconfig, f"\ntestbed reset: {time.monotonic() - started:.1f} s")
    return shared_testbed


def ping(bed: Testbed, node: str, ip: str, wait_s: int = 2) -> bool:
    result = bed.exec(node, ["/bin/busybox", "ping", "-c", "1", "-W", str(wait_s), ip], check=False)
    return result.returncode == 0


def test_ssh_from_head_to_worker_with_strict_host_keys(testbed: Testbed) -> None:
    assert testbed.exec(HEAD, ["ssh", "root@198.18.10.11", "hostname"]).stdout.strip() == WORKER
    # The same login with no known host key must be refused, proving strict checking is on.
    unknown = testbed.exec(
        HEAD, ["ssh", "-o", "UserKnownHostsFile=/dev/null", "root@198.18.10.11", "true"], check=False
    )
    assert unknown.returncode != 0
    assert "Host key verification failed" in unknown.stderr


def test_paramiko_from_head_with_reject_policy(testbed: Testbed) -> None:
    known_hosts = str(testbed.layout.known_hosts)
    out = testbed.exec(HEAD, [sys.executable, "-c", PARAMIKO_SCRIPT], env={"KNOWN_HOSTS": known_hosts})
    hostname, docker_host = out.stdout.split()
    assert hostname == WORKER
    assert docker_host == testbed.docker_host(WORKER)


def test_docker_from_env_sees_only_its_own_node(testbed: Testbed) -> None:
    seen = {}
    for node in (HEAD, WORKER):
        out = testbed.exec(node, [sys.executable, "-c", DOCKER_SCRIPT]).stdout
        seen[node] = json.loads(out)
        assert seen[node]["name"] == node
        assert seen[node]["ssh_worker_name"] == WORKER  # docker-py ssh:// through the node's HOME
    assert seen[HEAD]["id"] != seen[WORKER]["id"]


def test_fabric_ips_ping_and_ip_addr_shows_only_node_links(testbed: Testbed) -> None:
    assert ping(testbed, HEAD, FABRIC_IP[WORKER])
    assert ping(testbed, WORKER, FABRIC_IP[HEAD])
    host_links = set(os.listdir("/sys/class/net")) - NODE_LINKS
    for node in (HEAD, WORKER):
        links = {link["ifname"]: link for link in json.loads(testbed.exec(node, ["ip", "-j", "addr"]).stdout)}
        assert set(links) == NODE_LINKS
        assert not host_links & set(links)
        fabric = links["enp1s0f1np1"]
        assert fabric["mtu"] == 9000
        assert [a["local"] for a in fabric["addr_info"] if a["family"] == "inet"] == [FABRIC_IP[node]]


def test_sysfs_lists_only_node_interfaces(testbed: Testbed) -> None:
    for node in (HEAD, WORKER):
        assert set(testbed.exec(node, ["ls", "/sys/class/net"]).stdout.split()) == NODE_LINKS


@pytest.mark.parametrize("directory", ["/srv/spark", "/dev/shm"])
def test_private_directories_per_node(testbed: Testbed, directory: str) -> None:
    name = f"{directory}/probe-{uuid.uuid4().hex}"
    testbed.exec(HEAD, ["sh", "-c", f"echo head > {name}"])
    try:
        assert testbed.exec(HEAD, ["cat", name]).stdout.strip() == "head"
        assert testbed.exec(WORKER, ["test", "-e", name], check=False).returncode == 1
        assert not Path(name).exists()  # nor on the host
    finally:
        testbed.exec(HEAD, ["rm", "-f", name])


def test_engine_image_runs_on_worker(testbed: Testbed) -> None:
    ref = testbed.images()["engine"]
    argv = ["docker", "run", "--rm", "--network", "host", ref, "python3", "-c", "import ssl, zlib, json, http.server"]
    testbed.exec(WORKER, argv)
    assert testbed.exec(WORKER, ["docker", "run", "--rm", ref, "vllm", "--help"]).returncode == 0


def test_link_down_breaks_the_fabric_and_up_restores_it(testbed: Testbed) -> None:
    assert ping(testbed, HEAD, FABRIC_IP[WORKER])
    testbed.link(WORKER, up=False)
    try:
        assert not ping(testbed, HEAD, FABRIC_IP[WORKER], wait_s=1)
    finally:
        testbed.link(WORKER, up=True)
    deadline = time.monotonic() + 10
    while not ping(testbed, HEAD, FABRIC_IP[WORKER], wait_s=1):
        assert time.monotonic() < deadline, "fabric did not come back within 10 s of link up"


def test_image_digests_are_reproducible(testbed: Testbed, tmp_path: Path) -> None:
    # Snapshot the engine code first, so an edit in between cannot pass for non-determinism.
    engine = shutil.copytree(images.ENGINE_DIR, tmp_path / "engine")
    first = images.build(tmp_path / "a", engine).refs()
    second = images.build(tmp_path / "b", engine).refs()
    assert first == second
    # The base inputs did not change since bring-up, so the pushed base digest is the same too.
    assert first["pybase"] == testbed.images()["pybase"]
