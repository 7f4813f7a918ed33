"""`reconciler doctor` and fabric detection on the testbed, end to end.

The spec has no fabric overrides: each node's probe reads the node's Spark-shaped RDMA fixture
tree (RECONCILER_SYSFS_ROOT: node-exec on the head, sshd SetEnv on the worker) together with
its namespace's real `ip -j addr`. The testbed has no GPU, NVIDIA runtime or driver, and far
less memory than a Spark: the doctor must say so (FAIL/WARN), and pass everything else.
The first doctor runs on a reset bed (nothing deployed); the ranks' tests converge first.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.e2e.conftest import Bed

pytestmark = pytest.mark.testbed

HEAD, WORKER = "spark-head", "spark-worker"
FABRIC_IP = {HEAD: "198.18.10.13", WORKER: "198.18.10.11"}
RANK = {HEAD: "dsv41-r0", WORKER: "dsv41-r1"}
ALL_NODES = "all nodes"
PASSING = ["ssh", "python3", "rsync", "docker", "kernel", "image", "rdma port", "fabric address", "roce gid", "disk"]
PASSING += ["port rate"]
BAD_KERNEL = "7.0.0-1019-nvidia"


def doctor(bed: Bed) -> dict[tuple[str, str], dict[str, str]]:
    result = bed.reconciler("doctor", "--json", check=False)
    assert result.returncode == 1, f"the testbed has no NVIDIA runtime: doctor must fail\n{result.stdout}"
    report: Any = json.loads(result.stdout)
    assert report["ok"] is False
    return {(check["node"], check["check"]): check for check in report["checks"]}


def test_doctor_checks_every_node_and_fails_only_what_the_testbed_lacks(bed: Bed) -> None:
    bed.fresh()
    checks = doctor(bed)
    for node in (HEAD, WORKER):
        for name in PASSING:
            assert checks[(node, name)]["status"] == "PASS", checks[(node, name)]
        assert checks[(node, "rdma port")]["message"].startswith("ACTIVE: rocep1s0f1/1 (enp1s0f1np1)")
        assert f"/{node}/fake-sys, RECONCILER_SYSFS_ROOT)" in checks[(node, "rdma port")]["message"]
        assert checks[(node, "fabric address")]["message"] == f"enp1s0f1np1 {FABRIC_IP[node]}/24"
        assert checks[(node, "roce gid")]["message"] == f"NCCL_IB_HCA rocep1s0f1: GID 3 = ::ffff:{FABRIC_IP[node]}"
        runtime = checks[(node, "nvidia runtime")]
        assert runtime["status"] == "FAIL"
        assert "install nvidia-container-toolkit" in runtime["fix"]
        assert checks[(node, "gpu driver")]["status"] == "FAIL"
        memory = checks[(node, "memory")]
        assert memory["status"] in {"WARN", "FAIL"}, "a testbed node cannot hold a rank's weights"
        assert "the published checkpoint's size, assumed" in memory["message"]
        rate = "rocep1s0f1/1 rate 200 Gb/s, link 200 Gb/s, MTU 9000, firmware 28.45.1020"
        assert checks[(node, "port rate")]["message"] == rate
    assert checks[(WORKER, "ssh")]["message"].startswith("root@198.18.10.11:22 answered; host keys match")
    assert checks[(HEAD, "kernel")]["message"] != checks[(WORKER, "kernel")]["message"], "each node boots on its own"
    for name in ("same subnet", "mtu", "same kernel", "same firmware", "clock skew"):
        assert checks[(ALL_NODES, name)]["status"] == "PASS", checks[(ALL_NODES, name)]
    assert checks[(ALL_NODES, "same subnet")]["message"] == "spark-head 198.18.10.13/24, spark-worker 198.18.10.11/24"
    assert checks[(ALL_NODES, "mtu")]["message"] == "spark-head enp1s0f1np1 9000, spark-worker enp1s0f1np1 9000"
    failed = {key for key, check in checks.items() if check["status"] == "FAIL"}
    honest = {(node, name) for node in (HEAD, WORKER) for name in ("nvidia runtime", "gpu driver", "memory")}
    assert failed <= honest, f"unexpected failures: {failed - honest}"


def test_doctor_text_output_lists_every_node_with_fixes(bed: Bed) -> None:
    result = bed.reconciler("doctor", check=False)
    assert result.returncode == 1
    lines = result.stdout.splitlines()
    assert {HEAD, WORKER, ALL_NODES} <= set(lines)
    assert "fix: install nvidia-container-toolkit" in result.stdout
    assert lines[-1].startswith("Doctor: ")


def test_facts_carry_the_detected_fabric(bed: Bed) -> None:
    facts: Any = json.loads(bed.reconciler("facts").stdout)
    for node in (HEAD, WORKER):
        fabric = facts["nodes"][node]["fabric"]
        assert (fabric["ifname"], fabric["ip"], fabric["hcas"]) == ("enp1s0f1np1", FABRIC_IP[node], ["rocep1s0f1"])
        assert (fabric["prefixlen"], fabric["mtu"]) == (24, 9000)
        assert "problem" not in fabric


def test_the_ranks_bind_to_the_detected_fabric_not_mgmt_or_docker0(converged: Bed) -> None:
    bed = converged
    for node in (HEAD, WORKER):
        listed = bed.docker_json(node, "inspect", "--format", "{{json .Config.Env}}", RANK[node])
        assert isinstance(listed, list)
        env = dict(item.split("=", 1) for item in listed)
        assert env["NCCL_SOCKET_IFNAME"] == "enp1s0f1np1"
        assert env["GLOO_SOCKET_IFNAME"] == "enp1s0f1np1"
        assert env["NCCL_IB_HCA"] == "rocep1s0f1"
        assert env["NCCL_IB_GID_INDEX"] == "3"
        assert env["VLLM_HOST_IP"] == FABRIC_IP[node]
        assert not {"enP7s7", "docker0"} & set(env.values())
        command = bed.docker_json(node, "inspect", "--format", "{{json .Config.Cmd}}", RANK[node])
        assert isinstance(command, list)
        assert command[command.index("--master-addr") + 1] == FABRIC_IP[HEAD]


def test_doctor_after_apply_sees_the_ranks_running(converged: Bed) -> None:
    checks = doctor(converged)
    for node in (HEAD, WORKER):
        memory = checks[(node, "memory")]
        assert memory["status"] == "PASS"
        assert memory["message"].startswith(f"{RANK[node]} running, weights loaded")
    # The front is the head's one expected listener beyond sshd; rank 0's own port is on loopback.
    listeners = checks[(HEAD, "listeners")]
    assert "(expected: sshd :22, the front :8000)" in listeners["message"] or listeners["status"] == "PASS"
    assert ":18000" not in listeners["message"], listeners
    assert "haproxy" not in listeners["message"], listeners


def test_a_kernel_on_the_known_bad_list_fails_doctor_and_blocks_the_first_start(bed: Bed) -> None:
    """The worker reports 7.0.0-1019-nvidia (bound over its /proc/sys/kernel/osrelease): doctor
    FAILs it with the fix, and the plan of a bring-up downloads and copies but starts no rank."""
    bed.fresh()
    bed.testbed.fake_kernel(WORKER, BAD_KERNEL)
    try:
        checks = doctor(bed)
        kernel = checks[(WORKER, "kernel")]
        assert kernel["status"] == "FAIL", kernel
        assert "ibv_reg_mr" in kernel["message"]
        assert "6.17.0-1032-nvidia" in kernel["fix"]
        assert checks[(HEAD, "kernel")]["status"] == "PASS"
        assert checks[(ALL_NODES, "same kernel")]["status"] == "WARN"
        planned = json.loads(bed.reconciler("plan", "--json", check=False).stdout)
        ranks = [blocker for blocker in planned["blockers"] if blocker["component"] == "ranks"]
        assert len(ranks) == 1, ranks
        assert f"kernel {BAD_KERNEL} is known to break the fabric" in ranks[0]["message"]
        steps = {action["step"] for action in planned["actions"]}
        assert "ranks.start" not in steps
        assert "checkpoint.download" in steps, "the rest of a bring-up goes ahead"
    finally:
        bed.testbed.fake_kernel(WORKER, None)
    assert bed.node(WORKER, "cat", "/proc/sys/kernel/osrelease").stdout.strip() != BAD_KERNEL
