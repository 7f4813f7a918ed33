"""Fabric detection: parsers on verbatim Spark outputs, selection rules, and what the plan makes of them."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from reconciler.cli import main as cli_main
from reconciler.components.fabric import node_contexts
from reconciler.facts.fabric import (
    FabricFacts,
    RdmaPort,
    fabric_from_probe,
    gid_ipv4,
    merge_ports,
    parse_ip_addr,
    parse_rdma_link,
    ports_from_sysfs,
    select_fabric,
    subnet_mismatches,
)
from reconciler.facts.node import Facts, load_facts
from reconciler.nodeside import probe as node_probe
from reconciler.plan import plan
from reconciler.serving import render_group
from reconciler.spec import Deployment, load_spec
from reconciler.transport.base import run_program
from reconciler.transport.local import LocalTransport
from tests.scenarios import CONVERGED_FACTS, FIXTURES, ROOT, empty_facts, reference_deployment, with_node
from tests.testbed import fakesys

FABRIC = FIXTURES / "fabric"
HEAD, WORKER = "spark-head", "spark-worker"
TWINS = ["enp1s0f1np1", "enP2p1s0f1np1"]


def fixture(name: str) -> str:
    return (FABRIC / name).read_text(encoding="utf-8")


def sysfs(tmp_path: Path, tree_file: str | None) -> dict[str, Any] | None:
    """The probe's own reader run over a fixture tree written to disk."""
    if tree_file is None:
        return None
    root = fakesys.write_tree(tmp_path / "sys", json.loads(fixture(tree_file)))
    return node_probe.infiniband(str(root), 3)


def observe(
    tmp_path: Path,
    tree_file: str | None,
    ip_addr: str,
    rdma_link: str = "",
    *,
    ifname: str | None = None,
    ip: str | None = None,
) -> FabricFacts:
    raw = {"infiniband": sysfs(tmp_path, tree_file), "ip_addr": ip_addr, "rdma_link": rdma_link}
    return fabric_from_probe(raw, ifname=ifname, ip=ip)


# ---------------------------------------------------------------- parsers


def test_padded_and_single_spaced_rdma_link_parse_alike() -> None:
    padded = parse_rdma_link(fixture("3d-rdma-link-padded.txt"))
    assert padded == parse_rdma_link(fixture("3e-rdma-link-single-spaced.txt"))
    assert [(p.hca, p.port, p.state, p.netdevs) for p in padded] == [
        ("rocep1s0f0", 1, "ACTIVE", ["enp1s0f0np0"]),
        ("rocep1s0f1", 1, "ACTIVE", ["enp1s0f1np1"]),
        ("roceP2p1s0f0", 1, "ACTIVE", ["enP2p1s0f0np0"]),
        ("roceP2p1s0f1", 1, "ACTIVE", ["enP2p1s0f1np1"]),
    ]


def test_mixed_rdma_link_goes_by_state_not_physical_state() -> None:
    ports = parse_rdma_link(fixture("3f-rdma-link-mixed.txt"))
    assert {p.hca: p.state for p in ports}["roceP2p1s0f0"] == "DOWN"  # its physical_state says LINK_UP
    active = [netdev for p in ports if p.active for netdev in p.netdevs]
    assert active == TWINS
    for capture in ("3c-ibdev2netdev-playbook.txt", "3c-ibdev2netdev-eugr.txt"):
        up = re.findall(r"==> (\S+) \(Up\)", fixture(capture))
        assert sorted(up) == sorted(active), "ibdev2netdev and rdma link agree on the twins"


def test_an_unplugged_node_prints_nothing_and_has_no_ports() -> None:
    assert parse_rdma_link(fixture("unplugged-rdma-link.txt")) == []


def test_rdma_json_reads_like_the_text() -> None:
    from_json = parse_rdma_link(json.dumps(fakesys.rdma_link_json()))
    from_text = parse_rdma_link(
        "link rocep1s0f1/1 state ACTIVE physical_state LINK_UP netdev enp1s0f1np1\n"
        "link roceP2p1s0f1/1 state DOWN physical_state DISABLED netdev enP2p1s0f1np1\n"
    )
    assert from_json == from_text


def test_ip_brief_of_an_unconfigured_spark() -> None:
    netdevs = parse_ip_addr(fixture("3a-ip-br-addr.txt"))
    names = ["lo", "enP7s7", "enp1s0f0np0", "enp1s0f1np1", "enP2p1s0f0np0", "enP2p1s0f1np1", "wlP9s9", "docker0"]
    assert list(netdevs) == names
    fabric = netdevs["enp1s0f1np1"]
    assert fabric.up
    assert [str(a) for a in fabric.ipv4] == ["169.254.127.30/16"]
    assert fabric.usable == (), "link-local is what an unconfigured port carries"
    assert [str(a) for a in netdevs["enP7s7"].usable] == ["192.168.1.163/24"]
    assert netdevs["enP2p1s0f1np1"].ipv4 == ()
    assert not netdevs["docker0"].up
    links = parse_ip_addr(fixture("3a-ip-br-link.txt"))
    assert {n.name: n.up for n in links.values()} == {n.name: n.up for n in netdevs.values()}


def test_ip_brief_of_configured_fabric_lines() -> None:
    head = parse_ip_addr(fixture("3b-head-ip-br-addr.txt"))["enp1s0f1np1"]
    worker = parse_ip_addr(fixture("3b-worker-ip-br-addr.txt"))["enp1s0f1np1"]
    assert (str(head.usable[0]), str(worker.usable[0])) == ("192.168.100.10/24", "192.168.100.11/24")


def test_ip_json_carries_mtu_and_addresses() -> None:
    netdevs = parse_ip_addr(fixture("ip-j-addr-playbook-node1.json"))
    assert (netdevs["enp1s0f1np1"].mtu, netdevs["enP7s7"].mtu) == (9000, 1500)
    assert [str(a) for a in netdevs["enP2p1s0f1np1"].usable] == ["192.168.101.10/24"]
    assert not netdevs["enp1s0f0np0"].up


@pytest.mark.parametrize(
    ("gid", "ipv4"),
    [
        ("0000:0000:0000:0000:0000:ffff:c0a8:640a", "192.168.100.10"),
        ("0000:0000:0000:0000:0000:0000:0000:0000", None),
        ("fe80:0000:0000:0000:4ebb:47ff:fe2f:9113", None),
        ("not a gid", None),
        (None, None),
    ],
)
def test_gid_to_ipv4(gid: str | None, ipv4: str | None) -> None:
    assert gid_ipv4(gid) == ipv4


def test_sysfs_reader_reads_state_gid_and_type(tmp_path: Path) -> None:
    ports = {p.hca: p for p in ports_from_sysfs(sysfs(tmp_path, "sysfs-port1-twins-addressed.json") or {})}
    assert (ports["rocep1s0f1"].state, ports["rocep1s0f1"].gid_type) == ("ACTIVE", "RoCE v2")
    assert ports["rocep1s0f1"].gid_ipv4 == "192.168.100.10"
    assert (ports["rocep1s0f0"].state, ports["rocep1s0f0"].gid_type, ports["rocep1s0f0"].gid_ipv4) == (
        "DOWN",
        None,
        None,
    )


def test_hcas_are_ordered_alike_on_every_node() -> None:
    names = ["roceP2p1s0f1", "mlx5_10", "rocep1s0f1", "mlx5_2", "roceP2p1s0f0", "rocep1s0f0"]
    merged = merge_ports([RdmaPort(hca=name, state="ACTIVE") for name in names], [])
    assert [p.hca for p in merged] == [
        "mlx5_2",
        "mlx5_10",
        "rocep1s0f0",
        "rocep1s0f1",
        "roceP2p1s0f0",
        "roceP2p1s0f1",
    ]


def test_rdma_link_names_the_netdev_sysfs_cannot_pin() -> None:
    sysfs_port = RdmaPort(hca="rocep1s0f1", state="ACTIVE", netdevs=["enp1s0f1np1", "other"], gid="x")
    rdma_port = RdmaPort(hca="rocep1s0f1", state="DOWN", netdevs=["enp1s0f1np1"])
    (merged,) = merge_ports([sysfs_port], [rdma_port])
    assert (merged.state, merged.netdevs, merged.gid) == ("ACTIVE", ["enp1s0f1np1"], "x")


# ---------------------------------------------------------------- selection


def test_both_twins_addressed_is_ambiguous_and_lists_both_hcas(tmp_path: Path) -> None:
    found = observe(
        tmp_path,
        "sysfs-port1-twins-addressed.json",
        fixture("ip-j-addr-playbook-node1.json"),
        fixture("3f-rdma-link-mixed.txt"),
    )
    assert (found.ifname, found.ip) == (None, None)
    assert found.problem is not None
    assert "ambiguous" in found.problem
    assert "enp1s0f1np1 (192.168.100.10/24), enP2p1s0f1np1 (192.168.101.10/24)" in found.problem
    assert found.candidates == TWINS
    assert found.hcas == ["rocep1s0f1", "roceP2p1s0f1"]


def test_an_ifname_override_picks_its_address_and_keeps_both_twins(tmp_path: Path) -> None:
    found = observe(
        tmp_path,
        "sysfs-port1-twins-addressed.json",
        fixture("ip-j-addr-playbook-node1.json"),
        fixture("3f-rdma-link-mixed.txt"),
        ifname="enp1s0f1np1",
    )
    assert (found.ifname, found.ip, found.prefixlen, found.mtu) == ("enp1s0f1np1", "192.168.100.10", 24, 9000)
    assert found.hcas == ["rocep1s0f1", "roceP2p1s0f1"]
    assert found.problem is None


def test_a_link_local_port_is_never_the_fabric(tmp_path: Path) -> None:
    found = observe(
        tmp_path, "sysfs-port1-link-local.json", fixture("3a-ip-br-addr.txt"), fixture("3f-rdma-link-mixed.txt")
    )
    assert (found.ifname, found.ip, found.hcas) == (None, None, [])
    assert found.problem == (
        "no fabric interface: enp1s0f1np1 has only 169.254.127.30/16 (link-local: the port has no configured "
        "address); enP2p1s0f1np1 has no IPv4 address"
    )


def test_management_wifi_and_docker0_are_never_candidates(tmp_path: Path) -> None:
    found = observe(tmp_path, "sysfs-port1-link-local.json", fixture("3a-ip-br-addr.txt"))
    assert found.problem is not None
    for other in ("enP7s7", "wlP9s9", "docker0", "192.168.1.163", "172.17.0.1"):
        assert other not in found.problem
    assert found.candidates == []


@pytest.mark.parametrize(
    ("tree", "rdma", "hcas"),
    [
        ("sysfs-port1-one-twin-addressed.json", "3f-rdma-link-mixed.txt", ["rocep1s0f1"]),
        ("sysfs-all-four-up.json", "3d-rdma-link-padded.txt", ["rocep1s0f1"]),
        ("sysfs-all-four-up.json", "3e-rdma-link-single-spaced.txt", ["rocep1s0f1"]),
        ("sysfs-mofed.json", "unplugged-rdma-link.txt", ["mlx5_1"]),
    ],
)
def test_one_addressed_twin_selects_it_and_only_the_hcas_whose_gid_carries_it(
    tmp_path: Path, tree: str, rdma: str, hcas: list[str]
) -> None:
    found = observe(tmp_path, tree, fixture("3b-head-ip-br-addr.txt"), fixture(rdma))
    assert (found.ifname, found.ip, found.prefixlen) == ("enp1s0f1np1", "192.168.100.10", 24)
    assert found.hcas == hcas, "never every ACTIVE port: a wrong HCA list ends in QP timeouts"
    assert found.problem is None


def test_an_unplugged_node_says_no_port_is_active(tmp_path: Path) -> None:
    found = observe(tmp_path, "sysfs-unplugged.json", fixture("3a-ip-br-addr.txt"), fixture("unplugged-rdma-link.txt"))
    assert found.problem is not None
    assert found.problem.startswith("no fabric interface: no ACTIVE RoCE port (rocep1s0f0/1 DOWN, rocep1s0f1/1 DOWN")
    assert "cable" in found.problem


def test_a_node_without_rdma_devices_says_so(tmp_path: Path) -> None:
    found = observe(tmp_path, None, fixture("3a-ip-br-addr.txt"), fixture("unplugged-rdma-link.txt"))
    assert found.problem == (
        "no fabric interface: no RDMA device (no /sys/class/infiniband entries, `rdma link` lists nothing)"
    )


def test_an_ip_override_finds_its_interface_even_without_rdma(tmp_path: Path) -> None:
    found = observe(tmp_path, None, fixture("ip-j-addr-testbed-head.json"), ip="198.18.10.13")
    assert (found.ifname, found.ip, found.prefixlen, found.mtu, found.hcas) == (
        "enp1s0f1np1",
        "198.18.10.13",
        24,
        9000,
        [],
    )


def test_an_ifname_override_that_does_not_exist_is_a_problem(tmp_path: Path) -> None:
    found = observe(tmp_path, "sysfs-port1-one-twin-addressed.json", fixture("3b-head-ip-br-addr.txt"), ifname="enp9")
    assert found.problem == "enp9 (the spec's fabric.ifname) does not exist on this node"


def test_two_addresses_on_the_fabric_interface_are_ambiguous() -> None:
    ports = [RdmaPort(hca="rocep1s0f1", state="ACTIVE", netdevs=["enp1s0f1np1"])]
    netdevs = parse_ip_addr("enp1s0f1np1      UP             10.0.0.1/24 10.0.1.1/24\n")
    found = select_fabric(ports, netdevs)
    assert (found.ifname, found.ip, found.candidates) == ("enp1s0f1np1", None, ["10.0.0.1", "10.0.1.1"])


def test_without_ip_output_the_problem_says_why() -> None:
    found = fabric_from_probe({"ip_addr": None, "ip_error": "ip not found"}, ifname=None, ip=None)
    assert found.problem == "cannot list addresses: ip not found"


def test_subnet_mismatches_name_addresses_and_prefixes() -> None:
    assert subnet_mismatches({HEAD: ("192.168.100.10", 24), WORKER: ("192.168.100.11", 24)}) == []
    assert subnet_mismatches({HEAD: ("192.168.100.10", 24), WORKER: ("192.168.101.11", 24)}) == [
        (WORKER, "fabric addresses are not on one subnet: spark-head 192.168.100.10/24, spark-worker 192.168.101.11/24")
    ]
    assert subnet_mismatches({HEAD: ("10.0.0.1", None), WORKER: ("10.0.1.1", 16)}) == []


# ---------------------------------------------------------------- the testbed's tree, end to end


def bed_deployment() -> Deployment:
    return load_spec(ROOT / "specs/testbed.yaml").deployment


def bed_fabric(tmp_path: Path, node: str, fabric_ip: str) -> FabricFacts:
    """Run the real probe over the node's fixture tree (RECONCILER_SYSFS_ROOT), then select with the
    testbed netns's `ip -j addr` in place of this machine's."""
    root = fakesys.write_node_sysfs(tmp_path / node, fabric_ip)
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RECONCILER_SYSFS_ROOT", str(root))
        patch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-docker.sock")
        args = {"state_dir": str(tmp_path / "state"), "model_dir": str(tmp_path / "model"), "manifest": "m"}
        raw = run_program(LocalTransport(node), "probe", "print_probe", {**args, "exl3_plan": "p", "label": "x=y"})
    observed = raw["fabric"]
    assert observed["sysfs_root"] == str(root)
    assert observed["rdma_error"] is None, "rdma -j link output comes from rdma-link.json beside the tree"
    netns = fixture("ip-j-addr-testbed-head.json").replace("198.18.10.13", fabric_ip)
    return fabric_from_probe({**observed, "ip_addr": netns}, ifname=None, ip=None)


def test_the_testbed_tree_selects_the_fabric_port_and_exactly_one_hca(tmp_path: Path) -> None:
    found = bed_fabric(tmp_path, HEAD, "198.18.10.13")
    assert (found.ifname, found.ip, found.prefixlen, found.mtu) == ("enp1s0f1np1", "198.18.10.13", 24, 9000)
    assert found.hcas == [fakesys.ACTIVE_HCA]
    assert [(p.hca, p.state) for p in found.ports] == [("rocep1s0f1", "ACTIVE"), ("roceP2p1s0f1", "DOWN")]


def test_the_testbed_rank_environment_names_the_fabric_not_mgmt_or_docker0(tmp_path: Path) -> None:
    deployment = bed_deployment()
    assert all(node.fabric.ip is None and node.fabric.ifname is None for node in deployment.nodes)
    facts = empty_facts()
    for node, ip in ((HEAD, "198.18.10.13"), (WORKER, "198.18.10.11")):
        facts = with_node(facts, node, fabric=bed_fabric(tmp_path, node, ip))
    contexts, blockers = node_contexts(deployment, facts)
    assert blockers == []
    ranks = {rank.rank: rank.env_dict for rank in render_group(deployment, contexts)}
    for rank, ip in ((0, "198.18.10.13"), (1, "198.18.10.11")):
        env = ranks[rank]
        assert env["NCCL_SOCKET_IFNAME"] == env["GLOO_SOCKET_IFNAME"] == "enp1s0f1np1"
        assert (env["NCCL_IB_HCA"], env["NCCL_IB_GID_INDEX"], env["VLLM_HOST_IP"]) == ("rocep1s0f1", "3", ip)
        assert not {"enP7s7", "docker0"} & set(env.values())


# ---------------------------------------------------------------- the plan


def plan_with_worker(fabric: FabricFacts, facts: Facts | None = None) -> tuple[list[str], list[str]]:
    result = plan(reference_deployment(), with_node(facts or empty_facts(), WORKER, fabric=fabric))
    ranks = [b for b in result.blockers if b.component == "ranks" and b.node == WORKER]
    return [b.message for b in ranks], [b.hint for b in ranks]


def test_an_ambiguous_fabric_blocks_naming_candidates_and_the_override(tmp_path: Path) -> None:
    found = observe(tmp_path, "sysfs-port1-twins-addressed.json", fixture("ip-j-addr-playbook-node1.json"))
    messages, hints = plan_with_worker(found)
    assert messages == [found.problem]
    assert hints == [
        "set nodes[spark-worker].fabric.ifname to one of enp1s0f1np1, enP2p1s0f1np1 (the same QSFP port on "
        "every node); the rest is then derived from it"
    ]


def test_a_link_local_worker_blocks_with_the_netplan_hint(tmp_path: Path) -> None:
    found = observe(tmp_path, "sysfs-port1-link-local.json", fixture("3a-ip-br-addr.txt"))
    messages, hints = plan_with_worker(found)
    assert "169.254.127.30/16 (link-local" in messages[0]
    assert "netplan" in hints[0]
    assert "nodes[spark-worker].fabric.ifname and .ip" in hints[0]


def test_fabric_addresses_on_two_subnets_block_the_group() -> None:
    head = FabricFacts(ifname="enp1s0f1np1", ip="10.10.10.13", prefixlen=24, hcas=["rocep1s0f1"])
    worker = FabricFacts(ifname="enp1s0f1np1", ip="10.10.11.11", prefixlen=24, hcas=["rocep1s0f1"])
    facts = with_node(with_node(empty_facts(), HEAD, fabric=head), WORKER, fabric=worker)
    result = plan(reference_deployment(), facts)
    blocker = next(b for b in result.blockers if b.component == "ranks")
    assert blocker.node == WORKER
    assert blocker.message == (
        "fabric addresses are not on one subnet: spark-head 10.10.10.13/24, spark-worker 10.10.11.11/24"
    )
    assert "one subnet" in blocker.hint
    assert not any(a.component == "ranks" for a in result.actions)


def test_a_moved_cable_shows_as_a_group_restart_with_the_cause() -> None:
    """Port 1 -> port 0 on the worker, seen through detection: new interface and HCA, same address."""
    rdma = "link rocep1s0f0/1 state ACTIVE physical_state LINK_UP netdev enp1s0f0np0\n"
    rdma += "link rocep1s0f1/1 state DOWN physical_state DISABLED netdev enp1s0f1np1\n"
    gid = "0000:0000:0000:0000:0000:ffff:0a0a:0a0b"  # 10.10.10.11
    ports = [p.model_copy(update={"gid": gid if p.active else None}) for p in parse_rdma_link(rdma)]
    netdevs = parse_ip_addr("enp1s0f0np0      UP             10.10.10.11/24\nenp1s0f1np1      DOWN           \n")
    moved = select_fabric(ports, netdevs)
    assert (moved.ifname, moved.hcas) == ("enp1s0f0np0", ["rocep1s0f0"])
    result = plan(reference_deployment(), with_node(load_facts(CONVERGED_FACTS), WORKER, fabric=moved))
    start = next(a for a in result.actions if a.id == "ranks.start-dsv41-r1@spark-worker")
    assert "NCCL_SOCKET_IFNAME enp1s0f1np1 -> enp1s0f0np0" in start.cause
    assert "NCCL_IB_HCA rocep1s0f1,roceP2p1s0f1 -> rocep1s0f0" in start.cause
    stop = next(a for a in result.actions if a.id == "ranks.stop-dsv41-r0@spark-head")
    assert stop.cause.startswith("group restart: dsv41-r1 on spark-worker: config changed")


def test_an_ip_override_on_no_interface_still_names_the_interface_candidates(tmp_path: Path) -> None:
    found = observe(
        tmp_path, "sysfs-port1-twins-addressed.json", fixture("ip-j-addr-playbook-node1.json"), ip="10.9.9.9"
    )
    assert (found.ifname, found.ip, found.candidates) == (None, "10.9.9.9", TWINS)
    assert found.problem is not None
    assert found.problem.startswith("10.9.9.9 (the spec's fabric.ip) is on no interface; fabric interface ambiguous")


def test_unreadable_tool_output_is_a_fabric_problem_not_a_crash() -> None:
    found = fabric_from_probe({"ip_addr": "[{not json", "rdma_link": ""}, ifname=None, ip=None)
    assert found.problem is not None
    assert found.problem.startswith("cannot read the fabric observations: JSONDecodeError")


def test_two_configured_sparks_pass_the_subnet_check_and_render_the_heads_master_addr(tmp_path: Path) -> None:
    head = observe(tmp_path / "h", "sysfs-port1-one-twin-addressed.json", fixture("3b-head-ip-br-addr.txt"))
    worker = observe(tmp_path / "w", "sysfs-port1-one-twin-addressed-worker.json", fixture("3b-worker-ip-br-addr.txt"))
    assert (worker.ip, worker.hcas) == ("192.168.100.11", ["rocep1s0f1"])
    facts = with_node(with_node(empty_facts(), HEAD, fabric=head), WORKER, fabric=worker)
    deployment = reference_deployment()
    contexts, blockers = node_contexts(deployment, facts)
    assert blockers == []
    for rank in render_group(deployment, contexts):
        assert rank.command[rank.command.index("--master-addr") + 1] == "192.168.100.10"


def test_every_fabric_fixture_is_used_here() -> None:
    source = Path(__file__).read_text(encoding="utf-8")
    unused = [path.name for path in FABRIC.iterdir() if path.suffix != ".md" and path.name not in source]
    assert unused == []


@pytest.mark.parametrize(
    ("field", "value", "words"),
    [
        ("prefixlen", 99, "fabric.prefixlen: Input should be less than or equal to 32"),
        ("prefixlen", -1, "fabric.prefixlen: Input should be greater than or equal to 0"),
        ("ip", "10.10.10.x", "fabric.ip: Value error, '10.10.10.x' is not an IPv4 address"),
        ("ip", "10.10.10.13/24", "fabric.ip: Value error, '10.10.10.13/24' is not an IPv4 address"),
    ],
)
def test_fabric_prefixlen_out_of_range_is_a_located_error(
    capsys: pytest.CaptureFixture[str], tmp_path: Path, field: str, value: object, words: str
) -> None:
    """The subnet check computes networks from a snapshot's address and prefix length: an impossible
    one is refused where the snapshot is read, naming the file and the field."""
    document = json.loads(CONVERGED_FACTS.read_text(encoding="utf-8"))
    for node in document["nodes"].values():
        node["fabric"].update({"ip": "10.10.10.13", "prefixlen": 24})
    document["nodes"][HEAD]["fabric"][field] = value
    path = tmp_path / "facts.json"
    path.write_text(json.dumps(document), encoding="utf-8")
    code = cli_main(["plan", "--spec", str(ROOT / "specs/deployment.yaml"), "--facts", str(path)])
    err = capsys.readouterr().err
    assert code == 1
    assert "internal error" not in err
    assert f"{path}: nodes.{HEAD}.{words}" in err
    assert "hint:" in err


def _ip_j_addr(**changes: object) -> str:
    address: dict[str, object] = {"family": "inet", "local": "10.10.10.13", "prefixlen": 24}
    netdev: dict[str, object] = {"ifname": "enp1s0f1np1", "operstate": "UP", "mtu": 9000}
    for key, value in changes.items():
        (address if key in address else netdev)[key] = value
    return json.dumps([{**netdev, "addr_info": [address]}]).replace('"INF"', "Infinity")


@pytest.mark.parametrize(
    ("ip_addr", "words"),
    [
        (_ip_j_addr(prefixlen=99), "ValueError: 10.10.10.13/99: an IPv4 prefix length is 0..32"),
        (_ip_j_addr(local="10.10.10.x"), "ValueError: '10.10.10.x' is not an IPv4 address"),
        (_ip_j_addr(mtu="INF"), "ValueError: Infinity is not a number JSON allows"),
        ("enp1s0f1np1      UP             10.10.10.13/99\n", "ValueError: 10.10.10.13/99: an IPv4 prefix length"),
    ],
)
def test_an_impossible_address_in_ip_output_is_a_fabric_problem_not_a_crash(ip_addr: str, words: str) -> None:
    rdma = "link rocep1s0f1/1 state ACTIVE physical_state LINK_UP netdev enp1s0f1np1\n"
    found = fabric_from_probe({"ip_addr": ip_addr, "rdma_link": rdma}, ifname=None, ip=None)
    assert found.problem is not None
    assert found.problem.startswith(f"cannot read the fabric observations: {words}")
    assert (found.ip, found.prefixlen, found.mtu) == (None, None, None)
