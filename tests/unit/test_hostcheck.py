"""The host underneath the group: its facts as the probe reads them, doctor's verdicts on them,
and the plan's one blocker before a group (re)start on a broken fabric."""

from __future__ import annotations

from typing import Any

from reconciler.actions import StartRank, StopRank
from reconciler.components import hostcheck
from reconciler.facts.fabric import RdmaPort
from reconciler.facts.host import host_from_probe
from reconciler.facts.node import Facts, load_facts
from reconciler.plan import plan
from tests.scenarios import CONVERGED_FACTS, empty_facts, reference_deployment, with_container, with_node
from tests.testbed import fakesys
from tests.unit.test_doctor import SPARK_IPS, find, host_facts, infiniband, ip_addr, probe, raw_probe, run_doctor

HEAD, WORKER = "spark-head", "spark-worker"
BAD_KERNEL = "7.0.0-1019-nvidia"


def worker_doctor(**changes: Any) -> Any:
    return run_doctor(worker=probe(raw_probe(SPARK_IPS[WORKER], **changes)))


# ---------------------------------------------------------------- facts


def test_host_facts_keep_what_each_names_and_drop_odd_answers() -> None:
    found = host_from_probe(host_facts())
    assert (found.kernel, found.driver, found.docker, found.toolkit) == (
        "6.17.0-1032-nvidia",
        "580.142",
        "29.2.1",
        "1.17.8",
    )
    assert found.boot_id == "0f1e2d3c-4b5a-4968-8776-a5b4c3d2e1f0"
    hostile = host_from_probe(
        {"kernel": "6.17\x1b[31m evil", "boot_id": "x" * 5000, "nvidia_driver": 7, "docker": None, "toolkit": []}
    )
    assert hostile.model_dump() == dict.fromkeys(("kernel", "boot_id", "driver", "docker", "toolkit"))
    assert host_from_probe("not a mapping").kernel is None


def test_ports_carry_rate_link_speed_firmware_mtu_and_the_gids_in_use() -> None:
    facts = doctor_facts()
    port = next(p for p in facts.nodes[HEAD].fabric.ports if p.active)
    assert (port.rate_gbps, port.link_gbps, port.firmware, port.mtu) == (200.0, 200.0, "28.45.1020", 9000)


# ---------------------------------------------------------------- doctor


def test_a_kernel_on_the_known_bad_list_fails_with_its_source_and_fix() -> None:
    report = worker_doctor(host_facts=host_facts(kernel=f"{BAD_KERNEL}\n"))
    check = find(report, WORKER, "kernel")
    assert check.status == "FAIL"
    assert "ibv_reg_mr" in check.message
    assert "6.17.0-1032-nvidia works" in check.message
    assert "docs/sources.md" in check.message, "the source of the entry"
    assert "GRUB" in check.fix
    assert find(report, HEAD, "kernel").status == "PASS"
    assert find(report, "all nodes", "same kernel").status == "WARN"


def test_a_gid_that_moved_to_another_index_fails_naming_the_new_index() -> None:
    ip = SPARK_IPS[WORKER]
    moved = infiniband(ip)
    port = moved["rocep1s0f1"]["ports"]["1"]
    # After a firmware update index 3 holds the address as RoCE v1, and its v2 entry is at 5;
    # index 4 holds it as v1 again on the twin's table shape: only a v2 index is advice.
    mapped = fakesys.mapped_gid(ip) + "\n"
    port["gid"], port["gid_type"] = mapped, "IB/RoCE v1\n"
    port["gids"] = {"3": [mapped, "IB/RoCE v1\n"], "4": [mapped, "IB/RoCE v1\n"], "5": [mapped, "RoCE v2\n"]}
    fabric = {"sysfs_root": "/sys", "infiniband": moved, "ip_addr": ip_addr(ip), "rdma_link": None}
    check = find(worker_doctor(fabric=fabric), WORKER, "roce gid")
    assert check.status == "FAIL"
    assert "RoCE GID 3 no longer holds the fabric address 192.168.100.11 as RoCE v2" in check.message
    assert "(IB/RoCE v1)" in check.message
    assert "the RoCE v2 GID is at index 5 now" in check.message
    assert check.fix == "set nodes[spark-worker].fabric.gid_index: 5 (NCCL_IB_GID_INDEX)"


def test_differing_driver_and_firmware_and_a_slow_port_warn() -> None:
    ip = SPARK_IPS[WORKER]
    slow = infiniband(ip)
    slow["rocep1s0f1"]["ports"]["1"]["rate"] = "100 Gb/sec (2X HDR)\n"
    slow["rocep1s0f1"]["firmware"] = "28.43.2026\n"
    fabric = {"sysfs_root": "/sys", "infiniband": slow, "ip_addr": ip_addr(ip), "rdma_link": None}
    driver = "NVRM version: NVIDIA UNIX Open Kernel Module for aarch64  580.126.09  Release Build\n"
    report = worker_doctor(fabric=fabric, host_facts=host_facts(nvidia_driver=driver))
    assert not report.failed, [c for c in report.checks if c.status == "FAIL"]
    assert (
        find(report, "all nodes", "same gpu driver").message
        == "gpu driver differs: spark-head 580.142, spark-worker 580.126.09"
    )
    assert find(report, "all nodes", "same firmware").status == "WARN"
    rate = find(report, WORKER, "port rate")
    assert rate.status == "WARN"
    assert rate.message == "rocep1s0f1/1 carries 100 Gb/s over a link that negotiated 200 Gb/s"


def test_differing_mtu_fails() -> None:
    ip = SPARK_IPS[WORKER]
    fabric = {"sysfs_root": "/sys", "infiniband": infiniband(ip), "ip_addr": ip_addr(ip, mtu=1500), "rdma_link": None}
    check = find(worker_doctor(fabric=fabric), "all nodes", "mtu")
    assert check.status == "FAIL"
    assert "spark-worker enp1s0f1np1 1500" in check.message
    assert "MTU 9000" in check.fix


# ---------------------------------------------------------------- the plan


def doctor_facts(**worker_changes: Any) -> Facts:
    from reconciler.doctor import doctor_input

    deployment = reference_deployment()
    probes = {
        HEAD: probe(raw_probe(SPARK_IPS[HEAD])),
        WORKER: probe(raw_probe(SPARK_IPS[WORKER], **worker_changes)),
    }
    return doctor_input(deployment, probes).facts


def fabric_of(facts: Facts, node: str, *, mtu: int, gid_ip: str | None = None) -> Facts:
    """`node`'s fabric as converged, with its port and MTU as the probe reads them."""
    fabric = facts.nodes[node].fabric
    ip = gid_ip or fabric.ip or ""
    port = RdmaPort(
        hca="rocep1s0f1", state="ACTIVE", netdevs=[fabric.ifname or ""], gid=fakesys.mapped_gid(ip), mtu=mtu
    )
    return with_node(facts, node, fabric=fabric.model_copy(update={"mtu": mtu, "ports": [port]}))


def converged(worker_mtu: int = 9000) -> Facts:
    facts = fabric_of(load_facts(CONVERGED_FACTS), HEAD, mtu=9000)
    return fabric_of(facts, WORKER, mtu=worker_mtu)


def restarts(result: Any) -> list[object]:
    return [a for a in result.actions if isinstance(a.payload, (StartRank, StopRank))]


def test_a_running_group_on_a_differing_mtu_is_left_running() -> None:
    result = plan(reference_deployment(), converged(worker_mtu=1500))
    assert not result.blockers, "nothing to start: doctor says it, the plan leaves a serving group alone"
    assert not result.has_changes


def test_a_rank_exit_on_a_differing_mtu_is_one_blocker_and_no_restart() -> None:
    facts = with_container(converged(worker_mtu=1500), WORKER, status="exited", exit_code=1)
    result = plan(reference_deployment(), facts)
    assert restarts(result) == [], "a start would fail, and the next one too"
    (blocker,) = [b for b in result.blockers if b.component == "ranks"]
    assert "MTU differs: spark-head enp1s0f1np1 9000, spark-worker enp1s0f1np1 1500" in blocker.message
    assert "netplan" in blocker.hint
    assert with_container(converged(), WORKER, status="exited", exit_code=1).nodes[WORKER].fabric.mtu == 9000
    healed = plan(reference_deployment(), with_container(converged(), WORKER, status="exited", exit_code=1))
    assert restarts(healed), "the same exit on a sound fabric restarts the group"


def test_a_first_start_on_a_known_bad_kernel_is_blocked_with_the_fix() -> None:
    facts = empty_facts()
    host = facts.nodes[WORKER].host.model_copy(update={"kernel": BAD_KERNEL})
    result = plan(reference_deployment(), with_node(facts, WORKER, host=host))
    assert not [a for a in result.actions if isinstance(a.payload, StartRank)]
    (blocker,) = [b for b in result.blockers if b.component == "ranks"]
    assert blocker.node == WORKER
    assert f"kernel {BAD_KERNEL} is known to break the fabric" in blocker.message
    assert "GRUB" in blocker.hint
    steps = {str(a.step) for a in result.actions}
    assert {"checkpoint.download", "image.pull", "memguard.start"} <= steps, "the rest of a bring-up goes ahead"


def test_a_gid_read_as_another_address_blocks_a_restart() -> None:
    facts = fabric_of(converged(), WORKER, mtu=9000, gid_ip="10.10.10.99")
    facts = with_container(facts, WORKER, status="exited", exit_code=1)
    (blocker,) = [b for b in plan(reference_deployment(), facts).blockers if b.component == "ranks"]
    assert "RoCE GID 3 no longer holds the fabric address 10.10.10.11 as RoCE v2" in blocker.message


def test_the_specs_hcas_may_be_twins_each_holding_its_own_address() -> None:
    """`fabric.hcas` lists both CX-7 twins, each port's GID its own address: no fault; a twin
    whose GID at the index holds no IPv4 at all is one."""
    deployment = reference_deployment()
    worker = deployment.node(WORKER)
    hcas = ["rocep1s0f1", "roceP2p1s0f1"]
    twins = worker.model_copy(update={"fabric": worker.fabric.model_copy(update={"hcas": hcas})})
    nodes = [twins if node.name == WORKER else node for node in deployment.nodes]
    deployment = deployment.model_copy(update={"nodes": nodes})
    facts = converged()
    fabric = facts.nodes[WORKER].fabric
    ports = [
        RdmaPort(hca=hcas[0], state="ACTIVE", netdevs=["enp1s0f1np1"], gid=fakesys.mapped_gid("10.10.10.11")),
        RdmaPort(hca=hcas[1], state="ACTIVE", netdevs=["enP2p1s0f1np1"], gid=fakesys.mapped_gid("10.10.11.11")),
    ]
    facts = with_node(facts, WORKER, fabric=fabric.model_copy(update={"ports": ports}))
    assert hostcheck.fabric_faults(deployment, facts) == []
    ports[1] = ports[1].model_copy(update={"gid": fakesys.ZERO_GID})
    facts = with_node(facts, WORKER, fabric=fabric.model_copy(update={"ports": ports}))
    (fault,) = hostcheck.fabric_faults(deployment, facts)
    assert "no longer holds the port's IPv4 address as RoCE v2: roceP2p1s0f1" in fault.message


def test_the_known_bad_list_reads() -> None:
    listed = hostcheck.known_bad().kernels
    assert BAD_KERNEL in [entry.release for entry in listed]
    assert all(entry.fix and entry.source and entry.works for entry in listed)


# ---------------------------------------------------------------- reboots and updates under a rank

BOOT_A, BOOT_B = "11111111-2222-4333-8444-555555555555", "99999999-8888-4777-8666-555555555555"


def started_on(facts: Facts, node: str, **host: str) -> Facts:
    """The node's rank labelled with the host it started on (as the start executor writes)."""
    from reconciler.components.ranks import host_labels
    from reconciler.facts.host import HostFacts

    containers = [
        c.model_copy(update={"labels": {**c.labels, **host_labels(HostFacts(**host))}})
        if c.name.startswith("dsv41-r")
        else c
        for c in facts.nodes[node].containers
    ]
    return with_node(facts, node, containers=containers)


def on_host(facts: Facts, node: str, **host: str) -> Facts:
    return with_node(facts, node, host=facts.nodes[node].host.model_copy(update=host))


def test_a_rank_gone_with_its_nodes_boot_names_the_reboot_as_the_cause() -> None:
    from reconciler import incidents

    facts = started_on(load_facts(CONVERGED_FACTS), WORKER, boot_id=BOOT_A)
    facts = on_host(with_container(facts, WORKER, status="exited", exit_code=137), WORKER, boot_id=BOOT_B)
    facts = with_container(facts, HEAD, status="exited", exit_code=0)  # rank 0 exits on its lost peer first
    result = plan(reference_deployment(), facts)
    cause = incidents.unplanned_cause(result)
    assert cause == "dsv41-r1 on spark-worker: spark-worker rebooted since it started (boot id 11111111 -> 99999999)"
    (found,) = incidents.detect(reference_deployment(), facts, result)
    assert found.kind == "reboot"
    same_boot = on_host(with_container(facts, WORKER, status="exited", exit_code=137), WORKER, boot_id=BOOT_A)
    cause = str(incidents.unplanned_cause(plan(reference_deployment(), same_boot)))
    assert "rebooted" not in cause
    assert "exited with code" in cause


def test_the_loop_names_a_node_whose_boot_id_changed_since_the_last_pass() -> None:
    from reconciler.loop import rebooted_nodes

    before = on_host(load_facts(CONVERGED_FACTS), WORKER, boot_id=BOOT_A)
    after = on_host(before, WORKER, boot_id=BOOT_B)
    assert rebooted_nodes(before, after) == ["spark-worker rebooted since the last pass (boot id 11111111 -> 99999999)"]
    assert rebooted_nodes(before, before) == []
    assert rebooted_nodes(None, after) == [], "the first pass has nothing to compare with"


def test_status_names_a_kernel_or_driver_changed_since_the_group_started() -> None:
    from reconciler.components.ranks import host_changes

    facts = started_on(load_facts(CONVERGED_FACTS), HEAD, kernel="6.17.0-1032-nvidia", driver="580.142")
    facts = on_host(facts, HEAD, kernel="6.17.0-1040-nvidia", driver="580.142")
    container = next(c for c in facts.nodes[HEAD].containers if c.name == "dsv41-r0")
    assert host_changes(container, facts.nodes[HEAD].host) == ["kernel 6.17.0-1032-nvidia -> 6.17.0-1040-nvidia"]
    assert not plan(reference_deployment(), facts).has_changes, "a label of the host is never drift"


def test_status_text_shows_each_hosts_versions_and_changes() -> None:
    from reconciler.cli.observe import _host_lines

    host = {"kernel": "6.17.0-1032-nvidia", "driver": "580.142", "docker": "29.2.1", "toolkit": None, "boot_id": BOOT_A}
    report = {"nodes": {HEAD: {"host": host, "host_changes": ["kernel a -> b since dsv41-r0 started"]}}}
    assert _host_lines(report) == [
        "host spark-head: kernel 6.17.0-1032-nvidia, driver 580.142, Docker 29.2.1, boot 11111111",
        "! spark-head: kernel a -> b since dsv41-r0 started",
    ]


def test_hostile_port_numbers_are_left_out_never_an_error() -> None:
    from reconciler.facts.fabric import ports_from_sysfs

    tree = infiniband("10.10.10.11")
    device = tree["rocep1s0f1"]
    device["speeds"] = {"enp1s0f1np1": "9" * 5000}
    device["ports"]["1"]["gids"] = {"\u00b2": ["x", "RoCE v2"], "99999999999999999999": ["y", "RoCE v2"], "2": "odd"}
    device["ports"]["1"]["rate"] = "9" * 400 + " Gb/sec"
    (port, _) = ports_from_sysfs(tree)
    assert (port.link_gbps, port.gids) == (None, {})


def test_known_mtus_are_compared_even_beside_one_nobody_could_read() -> None:
    from reconciler.facts.fabric import FabricFacts
    from reconciler.facts.node import NodeFacts
    from reconciler.serving import ResolvedFabric

    def facts(*mtus: int | None) -> Facts:
        nodes = {f"n{i}": NodeFacts(fabric=FabricFacts(ifname="enp1s0f1np1", mtu=mtu)) for i, mtu in enumerate(mtus)}
        return Facts(nodes=nodes)

    resolved = {
        f"n{i}": ResolvedFabric(ifname="enp1s0f1np1", ip=f"10.0.0.{i + 1}", hcas=(), gid_index=3) for i in range(3)
    }
    (differs,) = hostcheck.mtu_findings(resolved, facts(9000, None, 1500))
    assert (differs.severity, differs.message) == (
        "FAIL",
        "MTU differs: n0 enp1s0f1np1 9000, n1 enp1s0f1np1 ?, n2 enp1s0f1np1 1500",
    )
    (unknown,) = hostcheck.mtu_findings(resolved, facts(9000, None, 9000))
    assert unknown.severity == "WARN"
    assert hostcheck.mtu_findings(resolved, facts(9000, 9000, 9000)) == []
