"""`reconciler doctor`: every check on probe outputs shaped like a Spark pair and like the testbed."""

from __future__ import annotations

import json
from typing import Any

import pytest

from reconciler import doctor
from reconciler.cli import main
from reconciler.doctor import Check, DoctorInput, Report, checkpoint_weight_bytes, doctor_input
from reconciler.facts.gather import NodeProbe
from reconciler.facts.node import load_facts
from reconciler.spec import Deployment, SshTarget
from reconciler.transport.sshroute import SshConfigText, resolve_route
from tests.scenarios import COMMIT, CONVERGED_FACTS, FIXTURES, SPEC_PATH, empty_facts, reference_deployment
from tests.testbed import fakesys

HEAD, WORKER = "spark-head", "spark-worker"
SPARK_IPS = {HEAD: "192.168.100.10", WORKER: "192.168.100.11"}
DRIVER_580_142 = "NVRM version: NVIDIA UNIX Open Kernel Module for aarch64  580.142  Release Build  (dvs-builder@U22)\n"
IMAGE = reference_deployment().image.ref
KIB_PER_GIB = 1024 * 1024


def infiniband(ip: str, *, active: bool = True) -> dict[str, Any]:
    """The probe's reading of a Spark's port-1 twins: rocep1s0f1 carrying `ip`, its twin DOWN."""
    gid = fakesys.mapped_gid(ip)
    state = "4: ACTIVE\n" if active else "1: DOWN\n"
    return {
        "rocep1s0f1": {
            "ports": {"1": {"state": state, "gid": gid, "gid_type": "RoCE v2\n", "rate": "200 Gb/sec (2X NDR)\n"}},
            "netdevs": ["enp1s0f1np1"],
            "firmware": "28.45.1020\n",
            "speeds": {"enp1s0f1np1": "200000\n"},
        },
        "roceP2p1s0f1": {"ports": {"1": {"state": "1: DOWN\n", "gid": fakesys.ZERO_GID}}, "netdevs": ["enP2p1s0f1np1"]},
    }


def host_facts(**changes: str) -> dict[str, str]:
    """What the probe reads of a DGX OS host (verbatim shapes: /proc files, `nvidia-ctk --version`)."""
    return {
        "kernel": "6.17.0-1032-nvidia\n",
        "boot_id": "0f1e2d3c-4b5a-4968-8776-a5b4c3d2e1f0\n",
        "nvidia_driver": DRIVER_580_142,
        "docker": "29.2.1",
        "toolkit": "NVIDIA Container Toolkit CLI version 1.17.8\ncommit: f202b80a9b9d0db00d9b1d73c0128c8962c55f4d\n",
        **changes,
    }


def ip_addr(ip: str, mtu: int = 9000) -> str:
    text = (FIXTURES / "fabric/ip-j-addr-testbed-head.json").read_text(encoding="utf-8")
    return text.replace("198.18.10.13", ip).replace('"mtu": 9000', f'"mtu": {mtu}')


def raw_probe(ip: str, **changes: Any) -> dict[str, Any]:
    """A doctor probe's output from a healthy Spark; `changes` override top-level or host keys."""
    host = {
        "time": 1000.1,
        "python": "3.12.3",
        "user": "nvidia",
        "tools": {"python3": "/usr/bin/python3", "rsync": "/usr/bin/rsync", "nvidia-ctk": "/usr/bin/nvidia-ctk"},
        "docker_info": {"runtimes": ["nvidia", "runc"], "default_runtime": "runc", "server_version": "29.2.1"},
        "nvidia_driver": DRIVER_580_142,
        # sshd on every address, an engine port on loopback, the copy daemon on the fabric address.
        "listeners": [
            ["0.0.0.0", 22, "sshd"],
            ["::", 22, "sshd"],
            ["127.0.0.1", 18000, "vllm"],
            [ip, 40123, "rsync"],
        ],
    }
    raw: dict[str, Any] = {
        "hostname": "spark",
        "home": "/home/nvidia",
        "meminfo": meminfo(total_gib=121.6, available_gib=118.0),
        "checkpoint": {"link": None, "legacy": None, "legacy_commit": None, "revisions": {}, "record": None},
        "hash_cache": {},
        "hub_listings": [],
        "disk_free": 2 * 10**12,
        "key_file": None,
        "guard_running": False,
        "guard_config": None,
        "guard_trip": None,
        "hold": None,
        "docker": {"containers": [], "images": [IMAGE]},
        "fabric": {"sysfs_root": "/sys", "infiniband": infiniband(ip), "ip_addr": ip_addr(ip), "rdma_link": None},
        "host_facts": host_facts(),
    }
    for key, value in changes.items():
        (host if key in host else raw)[key] = value
    return {**raw, "host": host}


def meminfo(total_gib: float, available_gib: float) -> str:
    return f"MemTotal: {int(total_gib * KIB_PER_GIB)} kB\nMemAvailable: {int(available_gib * KIB_PER_GIB)} kB\n"


def probe(raw: dict[str, Any]) -> NodeProbe:
    return NodeProbe(raw=raw, sent_at=1000.0, received_at=1000.2)


def run_doctor(
    head: NodeProbe | None = None, worker: NodeProbe | None = None, deployment: Deployment | None = None
) -> Report:
    deployment = deployment or reference_deployment()
    probes = {
        HEAD: head or probe(raw_probe(SPARK_IPS[HEAD])),
        WORKER: worker or probe(raw_probe(SPARK_IPS[WORKER])),
    }
    return doctor.check_all(deployment, doctor_input(deployment, probes))


def verdicts(report: Report, node: str) -> dict[str, str]:
    return {check.name: check.status for check in report.checks if check.node == node}


def find(report: Report, node: str, name: str) -> Check:
    return next(check for check in report.checks if check.node == node and check.name == name)


def test_a_healthy_spark_pair_has_no_failure() -> None:
    report = run_doctor()
    assert not report.failed
    passing = ["ssh", "python3", "rsync", "docker", "nvidia runtime", "gpu driver", "kernel", "image", "rdma port"]
    expected = dict.fromkeys([*passing, "fabric address", "roce gid", "port rate", "disk", "listeners"], "PASS")
    for node in (HEAD, WORKER):
        assert verdicts(report, node) == {**expected, "memory": "WARN"}
    alike = ["same kernel", "same gpu driver", "same firmware"]
    assert verdicts(report, doctor.ALL_NODES) == dict.fromkeys(["same subnet", "mtu", *alike, "clock skew"], "PASS")
    assert find(report, HEAD, "kernel").message.startswith("6.17.0-1032-nvidia, boot 0f1e2d3c")
    rate = "rocep1s0f1/1 rate 200 Gb/s, link 200 Gb/s, MTU 9000, firmware 28.45.1020"
    assert find(report, HEAD, "port rate").message == rate
    assert find(report, WORKER, "ssh").message == "nvidia@10.10.10.11:22 answered; host keys match ~/.ssh/known_hosts"
    assert find(report, HEAD, "fabric address").message == "enp1s0f1np1 192.168.100.10/24"
    assert find(report, HEAD, "roce gid").message == "NCCL_IB_HCA rocep1s0f1: GID 3 = ::ffff:192.168.100.10"
    assert find(report, doctor.ALL_NODES, "mtu").message == "spark-head enp1s0f1np1 9000, spark-worker enp1s0f1np1 9000"


def test_listeners_beyond_the_fabric_are_named_with_a_firewall_fix() -> None:
    """vLLM binds some internal ports on every address; the doctor names them and how to shut them."""
    assert find(run_doctor(), HEAD, "listeners").message == (
        "beyond loopback and the fabric only sshd :22, the front :8000"
    )
    raw = raw_probe(SPARK_IPS[HEAD])
    raw["host"]["listeners"] += [
        ["0.0.0.0", 8000, "haproxy"],
        ["0.0.0.0", 29655, "python3"],
        ["::", 5557, None],
        ["192.168.1.20", 8001, "x"],
    ]
    raw["host"]["listeners"] += [["not an address", "22", None], "junk"]
    listeners = find(run_doctor(head=probe(raw)), HEAD, "listeners")
    assert listeners.status == "WARN"
    assert listeners.message == (
        "listening beyond loopback and the fabric: 0.0.0.0:29655 (python3), 192.168.1.20:8001 (x), [::]:5557 (?) "
        "(expected: sshd :22, the front :8000)"
    )
    assert 'iifname != { "lo", "enp1s0f1np1" } tcp dport { 5557, 8001, 29655 } drop' in listeners.fix
    on_worker = raw_probe(SPARK_IPS[WORKER])
    on_worker["host"]["listeners"].append(["0.0.0.0", 8000, "python3"])
    assert find(run_doctor(worker=probe(on_worker)), WORKER, "listeners").status == "WARN"
    unlisted = raw_probe(SPARK_IPS[HEAD])
    del unlisted["host"]["listeners"]
    assert find(run_doctor(head=probe(unlisted)), HEAD, "listeners").status == "WARN"


def test_memory_applies_vllms_start_check_and_the_weights_rule_saying_what_it_assumed() -> None:
    memory = find(run_doctor(), HEAD, "memory")
    assert memory.status == "WARN"
    assert "vLLM's start check needs gpu_util 0.88 x MemTotal = 107.0 GiB" in memory.message
    assert "(462.0 GB / 2 ranks, the published checkpoint's size, assumed: no node holds a complete one yet)" in (
        memory.message
    )
    assert "+ 12 GiB margin = 227.1 GiB" in memory.message
    held = probe(raw_probe(SPARK_IPS[HEAD], meminfo=meminfo(total_gib=121.6, available_gib=90.0)))
    starved = find(run_doctor(head=held), HEAD, "memory")
    assert starved.status == "FAIL"
    assert "drop_caches" in starved.fix


def test_memory_while_the_ranks_run_reports_the_loaded_state() -> None:
    labels = {"io.spark-reconciler.owner": "spark-reconciler", "io.spark-reconciler.deployment": "dsv41"}
    config: dict[str, Any] = {"Image": IMAGE, "Labels": labels, "Env": [], "Cmd": [], "Entrypoint": []}
    container = {"Id": "a" * 64, "Name": "/dsv41-r0", "Config": config, "State": {"Status": "running"}}
    raw = raw_probe(SPARK_IPS[HEAD], meminfo=meminfo(121.6, 2.5), docker={"containers": [container], "images": [IMAGE]})
    memory = find(run_doctor(head=probe(raw)), HEAD, "memory")
    assert (memory.status, memory.message) == ("PASS", "dsv41-r0 running, weights loaded; MemAvailable 2.5 GiB")


def test_weights_come_from_a_complete_checkpoint_when_one_exists() -> None:
    deployment = reference_deployment()
    size, basis = checkpoint_weight_bytes(deployment, load_facts(CONVERGED_FACTS))
    files = load_facts(CONVERGED_FACTS).nodes[HEAD].checkpoint.revisions[COMMIT].files
    assert (size, basis) == (sum(f.size for f in files.values()), "the size of the checkpoint on spark-head")
    assert checkpoint_weight_bytes(deployment, empty_facts())[0] == doctor.REFERENCE_CHECKPOINT_BYTES


def like_the_testbed(ip: str) -> NodeProbe:
    """No NVIDIA runtime, toolkit or driver; a small machine's memory (as on the testbed)."""
    return probe(
        raw_probe(
            ip,
            docker_info={"runtimes": ["io.containerd.runc.v2", "runc"], "server_version": "20.10.24"},
            tools={"python3": "/usr/bin/python3", "rsync": "/usr/bin/rsync"},
            nvidia_driver=None,
            meminfo=meminfo(total_gib=23.0, available_gib=19.0),
        )
    )


def test_gpu_checks_fail_honestly_without_nvidia_runtime_and_driver() -> None:
    report = run_doctor(head=like_the_testbed(SPARK_IPS[HEAD]), worker=like_the_testbed(SPARK_IPS[WORKER]))
    assert report.failed
    for node in (HEAD, WORKER):
        runtime = find(report, node, "nvidia runtime")
        assert runtime.status == "FAIL"
        assert runtime.message.startswith("Docker has no nvidia runtime (runtimes: io.containerd.runc.v2, runc)")
        assert "install nvidia-container-toolkit" in runtime.fix
        assert find(report, node, "gpu driver").status == "FAIL"
        memory = find(report, node, "memory")
        assert memory.status == "FAIL"  # 19.0 GiB available < 0.88 x 23.0 GiB
        assert "published checkpoint's size, assumed" in memory.message
        assert find(report, node, "fabric address").status == "PASS"


def test_a_registered_toolkit_is_only_a_warning_and_an_old_driver_too() -> None:
    raw = raw_probe(SPARK_IPS[HEAD], docker_info={"runtimes": ["runc"], "server_version": "29.2.1"})
    raw["host"]["nvidia_driver"] = DRIVER_580_142.replace("580.142", "580.126")
    report = run_doctor(head=probe(raw))
    runtime = find(report, HEAD, "nvidia runtime")
    assert runtime.status == "WARN"
    assert runtime.fix == "sudo nvidia-ctk runtime configure --runtime=docker && sudo systemctl restart docker"
    driver = find(report, HEAD, "gpu driver")
    assert (driver.status, driver.message) == ("WARN", "driver 580.126 caps the CX-7 at ~13 Gbps (fixed in 580.142)")


def test_docker_permission_denied_names_the_group_fix_and_skips_what_needs_docker() -> None:
    error = "PermissionError: [Errno 13] Permission denied"
    raw = raw_probe(SPARK_IPS[WORKER], docker={"error": error}, docker_info={"error": error})
    report = run_doctor(worker=probe(raw))
    docker = find(report, WORKER, "docker")
    assert docker.status == "FAIL"
    assert docker.fix == "sudo usermod -aG docker nvidia, then log in again"
    assert find(report, WORKER, "nvidia runtime").message == "not checked: Docker does not answer"
    assert find(report, WORKER, "image").status == "WARN"
    assert find(report, WORKER, "fabric address").status == "PASS", "the rest is still checked"


def test_an_unreachable_node_fails_ssh_with_the_transports_hint() -> None:
    unreachable = NodeProbe(
        error="spark-worker: the host key of nvidia@10.10.10.11:22 does not match ~/.ssh/known_hosts",
        hint="the node was reinstalled, or something intercepts the connection: verify the fingerprint first",
        ssh_failed=True,
    )
    report = run_doctor(worker=unreachable)
    ssh = find(report, WORKER, "ssh")
    assert (ssh.status, ssh.fix) == ("FAIL", unreachable.hint)
    assert verdicts(report, WORKER) == {"ssh": "FAIL", "other checks": "WARN"}
    assert find(report, doctor.ALL_NODES, "same subnet").message == "not checked: no fabric address on spark-worker"
    assert find(report, doctor.ALL_NODES, "clock skew").status == "WARN"


def test_the_ssh_check_names_the_route_and_the_config_entries_that_applied() -> None:
    config = SshConfigText("/home/nvidia/.ssh/config", "Host spark2\n  HostName 10.10.10.11\n  User nvidia\n")
    target = SshTarget(host="spark2", known_hosts="/home/nvidia/.ssh/known_hosts")
    route = resolve_route(WORKER, target, config, "nvidia")
    report = run_doctor(worker=NodeProbe(raw=raw_probe(SPARK_IPS[WORKER]), route=route))
    ssh = find(report, WORKER, "ssh")
    assert (ssh.status, ssh.message) == (
        "PASS",
        "nvidia@10.10.10.11:22 (spark2) answered; host keys match /home/nvidia/.ssh/known_hosts; "
        "ssh config: /home/nvidia/.ssh/config:1: Host spark2",
    )


def test_the_ssh_check_warns_of_config_settings_the_reconciler_does_not_follow() -> None:
    text = "Host spark2\n  HostName 10.10.10.11\nHost *\n  StrictHostKeyChecking no\n"
    target = SshTarget(host="spark2", known_hosts="/kh")
    route = resolve_route(WORKER, target, SshConfigText("/c", text), "nvidia")
    ssh = find(run_doctor(worker=NodeProbe(raw=raw_probe(SPARK_IPS[WORKER]), route=route)), WORKER, "ssh")
    assert ssh.status == "WARN"
    assert ssh.message.endswith(
        "/c:4: StrictHostKeyChecking no (for spark2) is ignored: the reconciler always checks host keys and never "
        "adds one"
    )
    assert ssh.fix == "remove or fix those lines to silence this; host keys are checked either way"


def test_a_missing_python3_is_reported_as_such() -> None:
    missing = NodeProbe(error="spark-worker: probe.print_probe failed (exit 127): python3: not found", hint="x")
    report = run_doctor(worker=missing)
    assert verdicts(report, WORKER) == {"ssh": "PASS", "python3": "FAIL"}


def test_link_local_only_fails_the_fabric_address_with_the_override_to_set() -> None:
    raw = raw_probe(SPARK_IPS[WORKER])
    raw["fabric"]["ip_addr"] = ip_addr("169.254.127.30")
    raw["fabric"]["infiniband"] = infiniband("169.254.127.30")
    report = run_doctor(worker=probe(raw))
    fabric = find(report, WORKER, "fabric address")
    assert fabric.status == "FAIL"
    assert "169.254.127.30/24 (link-local" in fabric.message
    assert "nodes[spark-worker].fabric.ifname and .ip" in fabric.fix
    assert find(report, WORKER, "rdma port").status == "PASS"


def test_an_unplugged_cable_fails_the_rdma_port() -> None:
    raw = raw_probe(SPARK_IPS[WORKER])
    raw["fabric"]["infiniband"] = infiniband(SPARK_IPS[WORKER], active=False)
    rdma = find(run_doctor(worker=probe(raw)), WORKER, "rdma port")
    assert rdma.status == "FAIL"
    assert rdma.message == "no ACTIVE RDMA port: rocep1s0f1/1 DOWN, roceP2p1s0f1/1 DOWN"


def test_an_injected_sysfs_root_is_named() -> None:
    raw = raw_probe(SPARK_IPS[HEAD])
    raw["fabric"]["sysfs_root"] = "/tmp/testbed/spark-head/fake-sys"
    message = find(run_doctor(head=probe(raw)), HEAD, "rdma port").message
    assert message.endswith("(sysfs read from /tmp/testbed/spark-head/fake-sys, RECONCILER_SYSFS_ROOT)")


def test_cross_node_subnet_mtu_and_clock() -> None:
    other_subnet = raw_probe("192.168.101.11")
    report = run_doctor(worker=probe(other_subnet))
    subnet = find(report, doctor.ALL_NODES, "same subnet")
    assert subnet.status == "FAIL"
    assert "spark-head 192.168.100.10/24, spark-worker 192.168.101.11/24" in subnet.message
    small_mtu = raw_probe(SPARK_IPS[WORKER])
    small_mtu["fabric"]["ip_addr"] = ip_addr(SPARK_IPS[WORKER], mtu=1500)
    mtu = find(run_doctor(worker=probe(small_mtu)), doctor.ALL_NODES, "mtu")
    assert (mtu.status, mtu.message) == (
        "FAIL",
        "MTU differs: spark-head enp1s0f1np1 9000, spark-worker enp1s0f1np1 1500",
    )
    late = raw_probe(SPARK_IPS[WORKER], time=1005.1)
    clock = find(run_doctor(worker=probe(late)), doctor.ALL_NODES, "clock skew")
    assert (clock.status, clock.message) == ("WARN", "clocks differ by 5.00 s (± 0.20 s)")
    assert "timedatectl set-ntp true" in clock.fix


def test_disk_uses_the_hub_listing_like_the_checkpoint_preflight() -> None:
    names = ["config.json", "model.safetensors.index.json", "sha256-manifest.txt", "exl3/plan/J268-ho-v31-K5n.json"]
    names += [f"model-0000{index}-of-00006.safetensors" for index in range(1, 5)]
    names += [f"model-0000{index}-of-00006.safetensors.part0{part}" for index in (5, 6) for part in (0, 1)]
    listing = {"commit": "c" * 40, "files": {name: {"size": 30 * 10**9} for name in names}}
    pinned = {"repo": "0xSero/DeepSeek-V4.1-Flash-Spark", "resolved": {"revision": "main", "commit": "c" * 40}}
    checkpoint = {"link": None, "legacy": None, "legacy_commit": None, "revisions": {}, "record": pinned}
    tight = raw_probe(SPARK_IPS[HEAD], hub_listings=[listing], checkpoint=checkpoint, disk_free=100 * 10**9)
    disk = find(run_doctor(head=probe(tight)), HEAD, "disk")
    assert disk.status == "FAIL"
    assert disk.message.startswith("360.0 GB needed (Hub listing), 100.0 GB free in ~/models/")
    unknown = find(run_doctor(head=probe(raw_probe(SPARK_IPS[HEAD], disk_free=500 * 10**9))), HEAD, "disk")
    assert (unknown.status, unknown.message.split(",")[0]) == (
        "FAIL",
        "700.0 GB needed (full size ~700.0 GB assumed: no Hub listing)",
    )


def test_render_text_groups_by_node_and_shows_fixes() -> None:
    report = run_doctor(head=like_the_testbed(SPARK_IPS[HEAD]))
    text = doctor.render_text(report)
    lines = text.splitlines()
    assert lines[0] == HEAD
    assert "  FAIL  nvidia runtime  Docker has no nvidia runtime" in text
    assert "fix: install nvidia-container-toolkit" in text
    assert doctor.ALL_NODES in lines
    assert lines[-1].startswith("Doctor: ")
    assert report.to_dict()["ok"] is False


@pytest.mark.parametrize(("head", "code"), [(None, 0), ("testbed", 1)])
def test_cli_exits_1_on_any_fail_and_prints_json(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, head: str | None, code: int
) -> None:
    deployment = reference_deployment()
    probes = {
        HEAD: like_the_testbed(SPARK_IPS[HEAD]) if head else probe(raw_probe(SPARK_IPS[HEAD])),
        WORKER: probe(raw_probe(SPARK_IPS[WORKER])),
    }

    def fake_gather(*_: object) -> DoctorInput:
        return doctor_input(deployment, probes)

    monkeypatch.setattr(doctor, "gather_doctor", fake_gather)
    assert main(["doctor", "--spec", str(SPEC_PATH), "--json"]) == code
    data = json.loads(capsys.readouterr().out)
    assert data["ok"] is (code == 0)
    assert {"node", "check", "status", "message", "fix"} == set(data["checks"][0])
    assert main(["doctor", "--spec", str(SPEC_PATH)]) == code
    assert "Doctor: " in capsys.readouterr().out
