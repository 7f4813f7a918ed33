"""`reconciler init`: the spec drafted from probe answers (pure), its checks, and the command's edges."""

from __future__ import annotations

import dataclasses
import json
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlparse
from urllib.request import url2pathname

import paramiko
import pytest
import yaml
from pydantic import BaseModel

from reconciler import init
from reconciler.cli.init import _schema_ref, cmd_init
from reconciler.cli.parser import build_parser
from reconciler.errors import NodeUnreachableError, ReconcilerError
from reconciler.facts.gather import NodeProbe
from reconciler.init.yamltext import flow_value
from reconciler.nodeside import probe as node_probe
from reconciler.spec import REFERENCE_IMAGE, Deployment, Node, Serving, SshTarget, parse_spec, schema_text
from reconciler.spec import schema as schema_module
from reconciler.transport.base import CommandResult, LineSink
from reconciler.transport.sshroute import Endpoint, SshRoute, route_for
from reconciler.yamlpos import load_located
from tests.scenarios import (
    FIXTURES,
    INIT_GOLDEN,
    ROOT,
    init_answer,
    init_two_sparks,
    spark_infiniband,
    spark_ip_addr,
)
from tests.testbed import fakesys

WORKER = SshTarget(host="192.168.100.11", user="nvidia")
HEAD_IP, WORKER_IP = "192.168.100.10", "192.168.100.11"


@pytest.fixture(autouse=True)
def no_ssh_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """This machine's own ~/.ssh never takes part: HOME is a fresh directory, and no ssh config
    is read unless a test writes one there (`ssh_config`)."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("RECONCILER_SSH_CONFIG", "none")
    return home


def ssh_config(home: Path, monkeypatch: pytest.MonkeyPatch, text: str) -> None:
    """`text` as the user's ~/.ssh/config, found where OpenSSH would find it."""
    (home / ".ssh/config").write_text(text, encoding="utf-8")
    monkeypatch.delenv("RECONCILER_SSH_CONFIG")


def drafted(
    answers: dict[str, dict[str, Any]], request: init.InitRequest | None = None
) -> tuple[init.Draft, Deployment]:
    request = request or init.InitRequest(head=None, workers=(WORKER,))
    probed = init.probed_from_answers(request, {name: NodeProbe(raw=raw) for name, raw in answers.items()})
    result = init.draft(request, probed)
    return result, parse_spec(result.text, "drafted.yaml").deployment


def pair(**worker_changes: Any) -> dict[str, dict[str, Any]]:
    return {
        "node-0": init_answer("spark-a1b2", HEAD_IP),
        "node-1": init_answer("spark-c3d4", WORKER_IP, **worker_changes),
    }


def twins_fabric(tmp_path: Path) -> dict[str, Any]:
    """A Spark configured as NVIDIA's playbook says: both twins of port 1 addressed, on two subnets."""
    tree = json.loads((FIXTURES / "fabric/sysfs-port1-twins-addressed.json").read_text(encoding="utf-8"))
    root = fakesys.write_tree(tmp_path / "sys", tree)
    return {
        "sysfs_root": "/sys",
        "infiniband": node_probe.infiniband(str(root), 3),
        "ip_addr": (FIXTURES / "fabric/ip-j-addr-playbook-node1.json").read_text(encoding="utf-8"),
        "rdma_link": (FIXTURES / "fabric/3f-rdma-link-mixed.txt").read_text(encoding="utf-8"),
    }


# ---------------------------------------------------------------- the draft


def test_a_configured_pair_drafts_the_golden_spec() -> None:
    request, answers = init_two_sparks()
    probed = init.probed_from_answers(request, {name: NodeProbe(raw=raw) for name, raw in answers.items()})
    text = init.draft(request, probed, schema_ref="../schemas/deployment.schema.json").text
    assert text == INIT_GOLDEN.read_text(encoding="utf-8")


def test_detected_values_are_written_each_with_its_reason() -> None:
    result, deployment = drafted(pair())
    head, worker = deployment.nodes
    assert (head.name, head.role, head.ssh) == ("spark-a1b2", "head", None)
    assert (worker.name, worker.role, worker.model_source) == ("spark-c3d4", "worker", "peer")
    assert worker.ssh is not None
    assert (worker.ssh.host, worker.ssh.user, worker.ssh.known_hosts) == (WORKER_IP, "nvidia", "~/.ssh/known_hosts")
    assert worker.ssh.model_fields_set == {"host", "user"}, "the rest keeps coming from ~/.ssh/config"
    for node, ip in ((head, HEAD_IP), (worker, WORKER_IP)):
        assert (node.fabric.ifname, node.fabric.ip, node.fabric.hcas) == ("enp1s0f1np1", ip, ["rocep1s0f1"])
        assert node.model_dir == init.DEFAULT_MODEL_DIR
    flat = " ".join(line.strip("# ") for line in result.text.splitlines())
    assert f"detected: enp1s0f1np1 carries {HEAD_IP}/24 and is RoCE-capable (rocep1s0f1 ACTIVE" in flat
    assert "detected: 3.0 TB free at /home/nvidia/models/DeepSeek-V4.1-Flash-Spark" in flat
    assert "home /home/nvidia (nvidia's)" in flat
    assert "the node's fabric address: the checkpoint copy (rsync over SSH) takes the fabric" in flat
    assert result.notes == []
    assert f"{init.REVIEW}:" not in result.text


def test_the_management_address_and_docker0_are_never_written() -> None:
    result, _ = drafted(pair())
    assert "192.168.1.50" not in result.text
    assert "172.17.0.1" not in result.text
    assert "enP7s7" not in result.text


def test_two_candidate_interfaces_stay_commented_and_uncommenting_one_settles_it(tmp_path: Path) -> None:
    result, deployment = drafted(pair(fabric=twins_fabric(tmp_path)))
    worker = deployment.nodes[1]
    assert worker.fabric.ifname is None, "nothing guessed"
    assert worker.fabric.hcas is None
    assert [note.where for note in result.notes] == ["nodes[spark-c3d4].fabric"]
    assert "fabric interface ambiguous" in result.notes[0].message
    assert "    # fabric:\n    #   ifname: enp1s0f1np1\n    #   ifname: enP2p1s0f1np1\n" in result.text
    edited = result.text.replace(
        "    # fabric:\n    #   ifname: enp1s0f1np1\n    #   ifname: enP2p1s0f1np1\n",
        "    fabric:\n      ifname: enp1s0f1np1\n",
    )
    assert parse_spec(edited, "edited.yaml").deployment.nodes[1].fabric.ifname == "enp1s0f1np1"


def test_no_active_roce_port_is_a_review_note_not_a_guess() -> None:
    unplugged = spark_infiniband(WORKER_IP)
    unplugged["rocep1s0f1"]["ports"]["1"]["state"] = "1: DOWN\n"
    fabric = {"sysfs_root": "/sys", "infiniband": unplugged, "ip_addr": spark_ip_addr(WORKER_IP), "rdma_link": None}
    result, deployment = drafted(pair(fabric=fabric))
    assert deployment.nodes[1].fabric.ifname is None
    (note,) = result.notes
    assert note.where == "nodes[spark-c3d4].fabric"
    assert "no ACTIVE RoCE port" in note.message
    assert "#   ifname: <the interface, e.g. enp1s0f1np1>" in result.text


def test_two_addresses_on_the_fabric_port_write_the_port_and_comment_the_addresses() -> None:
    answers = pair()
    listed = json.loads(answers["node-1"]["fabric"]["ip_addr"])
    port = next(item for item in listed if item["ifname"] == "enp1s0f1np1")
    port["addr_info"].append({"family": "inet", "local": "192.168.100.21", "prefixlen": 24})
    answers["node-1"]["fabric"]["ip_addr"] = json.dumps(listed)
    result, deployment = drafted(answers)
    fabric = deployment.nodes[1].fabric
    assert (fabric.ifname, fabric.ip) == ("enp1s0f1np1", None)
    assert [note.where for note in result.notes] == ["nodes[spark-c3d4].fabric.ip"]
    assert "      # ip: 192.168.100.11\n      # ip: 192.168.100.21\n" in result.text


def test_no_gid_holding_the_address_leaves_hcas_to_nccl_and_says_so() -> None:
    answers = pair()
    port = answers["node-1"]["fabric"]["infiniband"]["rocep1s0f1"]["ports"]["1"]
    port["gid"], port["gid_type"] = fakesys.ZERO_GID + "\n", None
    result, deployment = drafted(answers)
    fabric = deployment.nodes[1].fabric
    assert (fabric.ifname, fabric.ip, fabric.hcas) == ("enp1s0f1np1", WORKER_IP, None)
    (note,) = result.notes
    assert note.where == "nodes[spark-c3d4].fabric.hcas"
    assert f"no ACTIVE port's GID 3 holds ::ffff:{WORKER_IP}" in note.message


def test_too_little_disk_for_the_checkpoint_is_a_review_note_naming_both_sizes() -> None:
    result, deployment = drafted(pair(disk_free=100 * 10**9))
    assert deployment.nodes[1].model_dir == init.DEFAULT_MODEL_DIR
    (note,) = result.notes
    assert note.where == "nodes[spark-c3d4].model_dir"
    assert "only 100.0 GB free at /home/nvidia/models/DeepSeek-V4.1-Flash-Spark" in note.message
    assert "needs ~470.0 GB" in note.message
    assert "--model-dir" in note.message


def test_unknown_free_space_is_never_taken_for_enough() -> None:
    result, _ = drafted(pair(disk_free=None))
    assert [note.where for note in result.notes] == ["nodes[spark-c3d4].model_dir"]
    assert "free space at" in result.notes[0].message


def test_model_dir_is_taken_as_given_and_expanded_per_node_for_the_disk_check() -> None:
    request = init.InitRequest(head=None, workers=(WORKER,), model_dir="/data/models/dsv41")
    result, deployment = drafted(pair(home="/root", user="root"), request)
    assert {node.model_dir for node in deployment.nodes} == {"/data/models/dsv41"}
    assert "free at /data/models/dsv41" in result.text


def test_a_worker_reached_over_the_management_network_is_a_review_note() -> None:
    request = init.InitRequest(head=None, workers=(SshTarget(host="192.168.1.51", user="nvidia"),))
    result, deployment = drafted(pair(), request)
    assert deployment.nodes[1].ssh is not None
    assert deployment.nodes[1].ssh.host == "192.168.1.51"
    (note,) = result.notes
    assert note.where == "nodes[spark-c3d4].ssh.host"
    assert f"192.168.1.51 is not the node's fabric address ({WORKER_IP})" in note.message


def test_a_worker_that_cannot_reach_the_registry_takes_the_image_from_its_peers() -> None:
    answers = pair()
    answers["node-1"]["registry"] = {"address": "ghcr.io:443", "error": "No route to host"}
    result, deployment = drafted(answers)
    assert deployment.nodes[1].image_source == "peer"
    assert deployment.nodes[0].image_source is None
    assert "cannot reach the image's registry ghcr.io:443 (No route to host)" in result.text
    _, reachable = drafted(pair())
    assert reachable.nodes[1].image_source is None, "a worker that reaches it pulls itself, as before"


def test_fabric_addresses_on_two_subnets_are_a_review_note() -> None:
    answers = {"node-0": init_answer("spark-a1b2", HEAD_IP), "node-1": init_answer("spark-c3d4", "192.168.101.11")}
    request = init.InitRequest(head=None, workers=(SshTarget(host="192.168.101.11", user="nvidia"),))
    result, _ = drafted(answers, request)
    assert [note.where for note in result.notes] == ["nodes"]
    assert "not on one subnet" in result.notes[0].message


def test_memory_held_by_something_else_is_a_review_note() -> None:
    result, _ = drafted(pair(available_gib=40.0))
    (note,) = result.notes
    assert note.where == "nodes[spark-c3d4]"
    assert "MemAvailable 40.0 GiB" in note.message
    assert "107.0 GiB" in note.message


def test_a_remote_head_gets_an_ssh_target_and_an_ssh_port_is_written() -> None:
    head = SshTarget(host=HEAD_IP, user="nvidia", port=2222)
    worker = SshTarget(host=WORKER_IP, user="nvidia", port=2222, identity_file="~/.ssh/spark")
    _, deployment = drafted(pair(), init.InitRequest(head=head, workers=(worker,)))
    assert deployment.head.ssh == head
    assert deployment.nodes[1].ssh == worker


def test_three_nodes_take_ranks_in_the_order_given() -> None:
    third = SshTarget(host="192.168.100.12", user="nvidia")
    answers = {**pair(), "node-2": init_answer("spark-e5f6", "192.168.100.12")}
    _, deployment = drafted(answers, init.InitRequest(head=None, workers=(WORKER, third)))
    assert [(rank, node.name) for rank, node in deployment.ranked_nodes] == [
        (0, "spark-a1b2"),
        (1, "spark-c3d4"),
        (2, "spark-e5f6"),
    ]


def test_hostnames_become_valid_unique_names() -> None:
    answers = {"node-0": init_answer("Spark_One.local", HEAD_IP), "node-1": init_answer("spark-one", WORKER_IP)}
    result, deployment = drafted(answers)
    assert [node.name for node in deployment.nodes] == ["spark-one", "spark-one-2"]
    assert "from its hostname 'Spark_One.local'" in result.text


@pytest.mark.parametrize("newline", ["\n", "\r", "\x85", "\u2028", "\u2029"])
def test_a_hostname_cannot_inject_keys_into_the_spec(newline: str) -> None:
    """YAML readers take NEL and the Unicode line separators as line breaks too."""
    answers = pair()
    answers["node-1"]["hostname"] = f"x{newline}image:{newline}  ref: evil.example/x:latest{newline}#"
    result, deployment = drafted(answers)
    assert deployment.image.ref == REFERENCE_IMAGE
    lines = result.text.splitlines()  # splits at every line break a YAML reader knows, and more
    assert sum(line.startswith("image:") for line in lines) == 1
    assert not any(line.lstrip().startswith("ref: evil") for line in lines)
    assert deployment.nodes[1].name == "x-image-ref-evil"


def test_disk_free_the_node_cannot_have_is_unknown_not_too_little() -> None:
    result, _ = drafted(pair(disk_free=-1))
    (note,) = result.notes
    assert note.where == "nodes[spark-c3d4].model_dir"
    assert "free space at /home/nvidia/models/DeepSeek-V4.1-Flash-Spark unknown (the node reported -1)" in note.message
    assert "only -1" not in result.text


@pytest.mark.parametrize("meminfo", ["MemTotal: 0 kB\nMemAvailable: 0 kB\n", "MemTotal: 0 kB\nMemAvailable: 5 kB\n"])
def test_a_memtotal_of_zero_is_unknown_memory_not_detected(meminfo: str) -> None:
    answers = pair()
    answers["node-1"]["meminfo"] = meminfo
    result, _ = drafted(answers)
    (note,) = result.notes
    assert note.where == "nodes[spark-c3d4]"
    assert note.message.startswith("memory unknown (/proc/meminfo says MemTotal 0 kB")
    worker_part = result.text.split("# worker:", 1)[1]
    assert "detected: MemTotal" not in worker_part


def test_values_the_loader_would_misread_are_quoted() -> None:
    assert init.scalar("enp1s0f1np1") == "enp1s0f1np1"
    assert init.scalar("~/models/x") == "~/models/x"
    for value in ("123", "true", "null", "a #b", "x: y", "[1]", "*x", '"quoted"'):
        assert init.scalar(value).startswith('"'), value
    for value in ("123", "true", "a #b", "x: y", "*x", '"quoted"', 'say "hi"', "back\\slash", "\\"):
        assert load_located(f"k: {init.scalar(value)}\n").data == {"k": value}, value


HOSTILE = [
    *(f"rocep1s0f1{char}mlx5_evil" for char in ",][{}#:&*!|>'\"%@\\"),
    "rocep1s0f1, mlx5_evil",
    "rocep1s0f1]\n      gid_index: 9\n      x: [y",
    "a\nimage:\n  ref: evil",
    "a\u2028b",
    "a\x85b",
    " leading",
    "trailing ",
    "- x",
    "",
]
# Names the spec accepts but YAML would read as something else when written plainly.
MISREADABLE = ["123", "1e3", "true", "null", "0o17", "0x1f", ".inf", "NaN"]


@pytest.mark.parametrize("value", HOSTILE + MISREADABLE + ['say "hi"', "back\\slash", "\U0001f600"])
def test_every_quoted_value_reads_back_as_exactly_that_value(value: str) -> None:
    for rendered in (init.scalar(value), init.quoted(value)):
        assert "\n" not in rendered
        assert rendered.isprintable()
        assert yaml.safe_load(f"k: {rendered}\n") == {"k": value}
    items = f"[{init.flow_scalar(value)}, {init.flow_scalar('rocep1s0f1')}]"
    assert yaml.safe_load(f"k: {items}\n") == {"k": [value, "rocep1s0f1"]}
    if value.isprintable():  # the spec loader refuses control characters and line breaks, quoted or not
        assert load_located(f"k: {init.scalar(value)}\n").data == {"k": value}
        assert load_located(f"k: {items}\n").data == {"k": [value, "rocep1s0f1"]}


def with_worker(probed: list[init.Probed], user: str | None = None, **facts: Any) -> list[init.Probed]:
    """The pair, with the worker reporting `facts` (top-level or `fabric_*`) and `user`."""
    worker = probed[1]
    fabric = {key.removeprefix("fabric_"): value for key, value in facts.items() if key.startswith("fabric_")}
    node = {key: value for key, value in facts.items() if not key.startswith("fabric_")}
    updated = worker.facts.model_copy(update={**node, "fabric": worker.facts.fabric.model_copy(update=fabric)})
    return [probed[0], dataclasses.replace(worker, facts=updated, user=user or worker.user)]


def fixture_pair() -> tuple[init.InitRequest, list[init.Probed]]:
    request = init.InitRequest(head=None, workers=(WORKER,))
    return request, init.probed_from_answers(request, {name: NodeProbe(raw=raw) for name, raw in pair().items()})


@pytest.mark.parametrize("value", HOSTILE)
def test_what_a_node_says_reads_back_exactly_or_is_left_for_review(value: str) -> None:
    """Every value a node supplies, rendered, parsed back and compared: a fabric value is in
    the spec exactly as the node said it or not at all (then REVIEW); hostname, home and user
    only reach comments, so the spec means the same as without them."""
    request, probed = fixture_pair()
    baseline = parse_spec(init.draft(request, probed).text, "x").deployment
    cases: list[tuple[dict[str, Any], str]] = [
        ({"hostname": value}, ""),
        ({"home": "/home/" + value}, ""),
        ({"user": value}, ""),
        ({"fabric_ifname": value}, "nodes[{name}].fabric"),
        ({"fabric_ip": value}, "nodes[{name}].fabric.ip"),
        ({"fabric_hcas": [value]}, "nodes[{name}].fabric.hcas"),
        ({"fabric_hcas": ["rocep1s0f1", value]}, "nodes[{name}].fabric.hcas"),
    ]
    for change, where in cases:
        user = change.pop("user", None)
        result = init.draft(request, with_worker(probed, user, **change))
        deployment = parse_spec(result.text, "x").deployment
        head, worker = deployment.nodes
        assert head == baseline.nodes[0], change
        assert worker.name == result.names[1], change
        fabric = worker.fabric
        said = {"fabric_ifname": fabric.ifname, "fabric_ip": fabric.ip, "fabric_hcas": fabric.hcas}
        for key, reported in change.items():
            if key in said:
                assert said[key] in (reported, None), change
                if said[key] is None:
                    assert where.format(name=worker.name) in [note.where for note in result.notes], change
        expected = baseline.nodes[1].model_copy(update={"name": worker.name, "fabric": fabric})
        assert worker == expected, change
        assert deployment.image == baseline.image
        assert deployment.model == baseline.model


@pytest.mark.parametrize("hcas", [["123", "true"], ["mlx5_0", "mlx5_1"]])
def test_hca_names_yaml_would_misread_are_written_quoted_and_read_back(hcas: list[str]) -> None:
    request, probed = fixture_pair()
    result = init.draft(request, with_worker(probed, fabric_hcas=hcas))
    assert parse_spec(result.text, "x").deployment.nodes[1].fabric.hcas == hcas
    assert result.notes == []


def test_a_node_cannot_add_an_hca_with_a_comma() -> None:
    request, probed = fixture_pair()
    result = init.draft(request, with_worker(probed, fabric_hcas=["rocep1s0f1, mlx5_evil"]))
    assert parse_spec(result.text, "x").deployment.nodes[1].fabric.hcas is None
    (note,) = result.notes
    assert note.where == "nodes[spark-c3d4].fabric.hcas"
    assert "'rocep1s0f1, mlx5_evil' is not an RDMA device name" in note.message
    assert [line for line in result.text.splitlines() if "mlx5_evil" in line.split("#", 1)[0]] == []


# ---------------------------------------------------------------- options and validation


def test_a_bad_login_is_refused_naming_the_option() -> None:
    with pytest.raises(ReconcilerError) as caught:
        init.ssh_target("root@bad host", "--worker", port=22, identity_file=None, known_hosts="~/.ssh/known_hosts")
    assert caught.value.message.startswith("--worker 'root@bad host': host: 'bad host' is not a host name")
    assert "fabric address" in caught.value.hint


def test_a_model_dir_the_spec_refuses_is_refused_before_probing() -> None:
    with pytest.raises(ReconcilerError) as caught:
        init.checked_model_dir("/data:models")
    assert caught.value.message.startswith("--model-dir '/data:models': ")
    assert "holds ':'" in caught.value.message


def test_a_node_given_twice_is_refused() -> None:
    with pytest.raises(ReconcilerError, match="given twice"):
        init.check_distinct(init.InitRequest(head=WORKER, workers=(WORKER,)))


def test_a_draft_the_loader_refuses_is_never_written() -> None:
    with pytest.raises(ReconcilerError) as caught:
        init.validated("name: dsv41\nnodes: []\n", "specs/deployment.yaml")
    assert "nothing was written" in caught.value.message
    assert "specs/deployment.yaml:2:" in caught.value.message


# ---------------------------------------------------------------- host keys and probing


def write_known_hosts(path: Path, *entries: str, hashed: bool = False) -> None:
    key = paramiko.ECDSAKey.generate()
    keys = paramiko.HostKeys()
    for entry in entries:
        keys.add(paramiko.HostKeys.hash_host(entry) if hashed else entry, key.get_name(), key)
    keys.save(str(path))


def target(known_hosts: Path | None = None, host: str = WORKER_IP, port: int | None = None) -> SshTarget:
    """A target with only the fields `--worker`, `--known-hosts` and `--ssh-port` would set."""
    given = {"known_hosts": None if known_hosts is None else str(known_hosts), "port": port}
    return SshTarget.model_validate({"host": host, "user": "nvidia", **{k: v for k, v in given.items() if v}})


def problems(known_hosts: Path | None = None, host: str = WORKER_IP, port: int | None = None) -> list[tuple[str, str]]:
    given = target(known_hosts, host, port)
    return init.unknown_host_keys(route_for(given.login, given))


def test_a_missing_host_key_gives_the_exact_commands_that_add_it(tmp_path: Path) -> None:
    known = tmp_path / "known_hosts"
    write_known_hosts(known, "192.168.100.99")
    ((message, hint),) = problems(known)
    assert (
        message
        == f"nvidia@{WORKER_IP}: {known} holds no host key for {WORKER_IP}; init never trusts an unseen host key"
    )
    assert f"`ssh-keyscan -p 22 {WORKER_IP} | ssh-keygen -lf -`" in hint
    assert f"`ssh-keyscan -p 22 {WORKER_IP} >> {known}`" in hint
    assert "ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub" in hint


def test_a_host_key_on_another_port_is_looked_up_as_ssh_writes_it(tmp_path: Path) -> None:
    known = tmp_path / "known_hosts"
    write_known_hosts(known, WORKER_IP)
    ((message, hint),) = problems(known, port=2222)
    assert f"no host key for [{WORKER_IP}]:2222" in message
    assert f"`ssh-keyscan -p 2222 {WORKER_IP} >> {known}`" in hint
    write_known_hosts(known, f"[{WORKER_IP}]:2222")
    assert problems(known, port=2222) == []


def test_a_hashed_known_hosts_entry_counts(tmp_path: Path) -> None:
    known = tmp_path / "known_hosts"
    write_known_hosts(known, WORKER_IP, hashed=True)
    assert WORKER_IP not in known.read_text(encoding="utf-8")
    assert problems(known) == []


def test_a_missing_known_hosts_file_says_so(tmp_path: Path) -> None:
    ((message, hint),) = problems(tmp_path / "absent")
    assert f"{tmp_path / 'absent'} does not exist, so it holds no host key for {WORKER_IP}" in message
    assert f">> {tmp_path / 'absent'}`" in hint


def test_a_known_hosts_file_that_is_not_one_is_named(tmp_path: Path) -> None:
    known = tmp_path / "known_hosts"
    known.write_text("not a key line\n", encoding="utf-8")
    ((message, hint),) = problems(known)
    assert f"{known} is not a known_hosts file" in message
    assert "--known-hosts" in hint


def test_an_ssh_config_alias_is_looked_up_under_its_hostname_and_port(
    no_ssh_config: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--worker spark2` with `Host spark2 / HostName 127.0.0.1 / Port 2222`: the key is filed as
    [127.0.0.1]:2222 in ~/.ssh/known_hosts, as ssh filed it, and the hint scans exactly there."""
    ssh_config(no_ssh_config, monkeypatch, "Host spark2\n  HostName 127.0.0.1\n  Port 2222\n")
    known = no_ssh_config / ".ssh/known_hosts"
    write_known_hosts(known, "spark2", "127.0.0.1")
    ((message, hint),) = problems(host="spark2")
    assert message == (
        f"nvidia@spark2: {known} holds no host key for [127.0.0.1]:2222 (spark2 is nvidia@127.0.0.1:2222 by the "
        "ssh config); init never trusts an unseen host key"
    )
    assert f"`ssh-keyscan -p 2222 127.0.0.1 >> {known}`" in hint
    write_known_hosts(known, "[127.0.0.1]:2222")
    assert problems(host="spark2") == []


def test_the_config_s_known_hosts_file_applies_unless_one_is_given(
    no_ssh_config: Path, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    shared = tmp_path / "shared_known_hosts"
    ssh_config(no_ssh_config, monkeypatch, f"Host *\n  UserKnownHostsFile {shared}\n")
    write_known_hosts(shared, WORKER_IP)
    assert problems() == []
    ((message, _),) = problems(tmp_path / "given")
    assert f"{tmp_path / 'given'} does not exist" in message, "an explicit --known-hosts wins"


def test_every_hop_of_a_proxy_jump_needs_its_key_and_is_scanned_from_where_it_is_reached(
    no_ssh_config: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = "Host spark2\n  HostName 10.0.0.2\n  ProxyJump admin@bastion:2200\n"
    ssh_config(no_ssh_config, monkeypatch, config)
    known = no_ssh_config / ".ssh/known_hosts"
    write_known_hosts(known, "spark2")
    (bastion, node) = problems(host="spark2")
    assert "no host key for [bastion]:2200 (jump host admin@bastion:2200 on the way to spark2)" in bastion[0]
    assert f"`ssh-keyscan -p 2200 bastion >> {known}`" in bastion[1]
    assert "no host key for 10.0.0.2 (spark2 is nvidia@10.0.0.2:22 via admin@bastion:2200" in node[0]
    scan = node[1].split("only if they match: `", 1)[1].split("`", 1)[0]
    assert scan.startswith("ssh -F ")
    assert f"UserKnownHostsFile={known}" in scan
    assert "StrictHostKeyChecking=yes" in scan
    assert scan.endswith(f" -o ProxyCommand=none bastion ssh-keyscan -p 22 10.0.0.2 >> {known}")
    write_known_hosts(known, "[bastion]:2200", "10.0.0.2")
    assert problems(host="spark2") == []


def test_a_host_key_alias_is_the_name_looked_up_and_filed(no_ssh_config: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ssh_config(no_ssh_config, monkeypatch, "Host spark2\n  HostName 10.0.0.2\n  HostKeyAlias spark2-key\n")
    known = no_ssh_config / ".ssh/known_hosts"
    write_known_hosts(known, "10.0.0.2")
    ((message, hint),) = problems(host="spark2")
    assert "no host key for spark2-key" in message
    assert f"`ssh-keyscan -p 22 10.0.0.2 | sed 's|^[^ ]*|spark2-key|' >> {known}`" in hint
    write_known_hosts(known, "spark2-key")
    assert problems(host="spark2") == []


def routed(host: str, hostname: str) -> SshRoute:
    return SshRoute(
        node=f"nvidia@{host}", target=Endpoint(host, hostname, 22, "nvidia"), known_hosts=("k",), connect_timeout_s=10.0
    )


def test_an_alias_is_judged_by_the_address_it_leads_to() -> None:
    request = init.InitRequest(head=None, workers=(SshTarget(host="spark2", user="nvidia"),))
    answers = {name: NodeProbe(raw=raw) for name, raw in pair().items()}
    for hostname, review in ((WORKER_IP, False), ("192.168.1.51", True)):
        probed = init.probed_from_answers(request, answers, [None, routed("spark2", hostname)])
        result = init.draft(request, probed)
        flat = " ".join(line.strip().lstrip("# ") for line in result.text.splitlines())
        assert f"spark2 leads to nvidia@{hostname}:22 by the ssh config" in flat
        assert [note.where for note in result.notes] == (["nodes[spark-c3d4].ssh.host"] if review else [])
        if review:
            assert "spark2 (HostName 192.168.1.51 in the ssh config) is not the node's fabric address" in flat
        else:
            assert "the node's fabric address: the checkpoint copy (rsync over SSH) takes the fabric" in flat


class FakeTransport:
    """Answers the probe program with a fixture answer, or fails like an unreachable node."""

    def __init__(self, node: str, answer: dict[str, Any] | None, sent: list[bytes]) -> None:
        self.node = node
        self.answer = answer
        self.sent = sent
        self.round_trips = 0
        self.closed = False

    def run(
        self,
        argv: Sequence[str],
        *,
        stdin: bytes | None = None,
        timeout: float = 120.0,
        on_line: LineSink | None = None,
    ) -> CommandResult:
        assert list(argv) == ["python3", "-"]
        assert timeout > 0
        assert on_line is None, "the probe's answer is read whole, not streamed"
        self.sent.append(stdin or b"")
        if self.answer is None:
            raise NodeUnreachableError(f"{self.node}: SSH authentication to x failed", "check nodes[].ssh.user")
        return CommandResult(0, json.dumps(self.answer).encode(), b"")

    def docker(self) -> Any:
        raise AssertionError("init needs no Docker API")

    def close(self) -> None:
        self.closed = True


def test_probing_runs_the_doctor_probe_once_per_node_and_closes_the_transports(tmp_path: Path) -> None:
    known = tmp_path / "known_hosts"
    write_known_hosts(known, WORKER_IP)
    request = init.InitRequest(head=None, workers=(target(known),))
    answers = pair()
    sent: list[bytes] = []
    made: list[FakeTransport] = []

    def transport_of(node: Node) -> FakeTransport:
        made.append(FakeTransport(node.name, answers[node.name], sent))
        return made[-1]

    probed = init.probe_nodes(request, transport_of)
    assert [item.facts.hostname for item in probed] == ["spark-a1b2", "spark-c3d4"]
    assert [item.user for item in probed] == ["nvidia", "nvidia"]
    assert len(sent) == 2
    calls = [program.decode().rsplit("\n\n", 1)[-1] for program in sent]
    assert all(call.startswith("print_probe(json.loads(") for call in calls)
    assert all('\\"doctor\\": true' in call for call in calls)
    assert all(transport.closed for transport in made)


def test_an_unknown_host_key_stops_init_before_any_connection(tmp_path: Path) -> None:
    known = tmp_path / "known_hosts"
    write_known_hosts(known, HEAD_IP)
    request = init.InitRequest(head=None, workers=(target(known),))

    def transport_of(_node: Node) -> FakeTransport:
        raise AssertionError("no connection may be made")

    with pytest.raises(NodeUnreachableError) as caught:
        init.probe_nodes(request, transport_of)
    assert "ssh-keyscan" in caught.value.hint


def test_every_node_that_does_not_answer_is_named(tmp_path: Path) -> None:
    known = tmp_path / "known_hosts"
    write_known_hosts(known, WORKER_IP, "192.168.100.12")
    workers = (target(known), target(known, host="192.168.100.12"))
    answers = {"node-0": init_answer("spark-a1b2", HEAD_IP), "node-1": None, "node-2": None}

    def transport_of(node: Node) -> FakeTransport:
        return FakeTransport(node.name, answers[node.name], [])

    with pytest.raises(NodeUnreachableError) as caught:
        init.probe_nodes(init.InitRequest(head=None, workers=workers), transport_of)
    assert caught.value.message == (
        f"nvidia@{WORKER_IP}: SSH authentication to x failed; nvidia@192.168.100.12: SSH authentication to x failed"
    )
    assert caught.value.hint == "check nodes[].ssh.user"


def test_an_alias_probes_along_the_route_the_transport_takes(
    no_ssh_config: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The repro of `--worker spark2`: its key is in known_hosts as ssh filed it, so init probes."""
    ssh_config(no_ssh_config, monkeypatch, "Host spark2\n  HostName 127.0.0.1\n  Port 2222\n")
    write_known_hosts(no_ssh_config / ".ssh/known_hosts", "[127.0.0.1]:2222")
    request = init.InitRequest(head=None, workers=(SshTarget(host="spark2", user="nvidia"),))
    given: list[Node] = []

    def transport_of(node: Node) -> FakeTransport:
        given.append(node)
        return FakeTransport(node.name, pair()[node.name], [])

    probed = init.probe_nodes(request, transport_of)
    assert [node.ssh.model_dump(exclude_unset=True) if node.ssh else None for node in given] == [
        None,
        {"host": "spark2", "user": "nvidia"},
    ], "nothing the config sets is pinned for the transport"
    route = probed[1].route
    assert route is not None
    assert (route.target.hostname, route.target.port) == ("127.0.0.1", 2222)
    text = init.draft(request, probed).text
    assert "# spark2 leads to nvidia@127.0.0.1:2222 by the ssh config" in text
    assert not re.search(r"^\s+port:", text, re.MULTILINE), "no port is written (serving's is a comment)"


# ---------------------------------------------------------------- the command


def run_init(argv: list[str]) -> int:
    """`reconciler init ARGV` through the real parser and the command's handler (turning a raised
    ReconcilerError into exit 1 is the CLI's, tested there)."""
    return cmd_init(build_parser().parse_args(["init", *argv]))


@pytest.fixture
def probed_pair(monkeypatch: pytest.MonkeyPatch) -> list[init.InitRequest]:
    """`init` with the probing replaced by the fixture pair; records each request it got."""
    requests: list[init.InitRequest] = []

    def fake(request: init.InitRequest, *_: Any) -> list[init.Probed]:
        requests.append(request)
        answers = pair()
        return init.probed_from_answers(request, {name: NodeProbe(raw=raw) for name, raw in answers.items()})

    monkeypatch.setattr(init, "probe_nodes", fake)
    monkeypatch.chdir(Path(__file__).parent)  # the modeline must not depend on where init runs
    return requests


@pytest.mark.usefixtures("probed_pair")
def test_init_writes_a_valid_spec_and_prints_the_next_steps(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "new" / "deployment.yaml"
    code = run_init(["--worker", f"nvidia@{WORKER_IP}", "--out", str(out), "--known-hosts", "/etc/kh"])
    assert code == 0
    assert parse_spec(out.read_text(encoding="utf-8"), str(out)).deployment.nodes[1].ssh == SshTarget(
        host=WORKER_IP, user="nvidia", known_hosts="/etc/kh"
    )
    assert out.stat().st_mode & 0o777 == 0o644
    printed = capsys.readouterr().out
    assert f"Wrote {out}." in printed
    for command in ("doctor", "plan", "apply"):
        assert f"  reconciler {command} --spec {out}\n" in printed


def modeline_schema(spec: Path) -> str:
    first = spec.read_text(encoding="utf-8").splitlines()[0]
    assert first.startswith("# yaml-language-server: $schema="), first
    return first.split("=", 1)[1]


def test_a_spec_outside_the_checkout_names_the_installed_schema_by_uri(
    probed_pair: list[init.InitRequest], tmp_path: Path
) -> None:
    out = tmp_path / "deployment.yaml"
    assert run_init(["--worker", WORKER_IP, "--out", str(out)]) == 0
    assert len(probed_pair) == 1
    uri = modeline_schema(out)
    shipped = ROOT / "reconciler/data/deployment.schema.json"
    assert uri == shipped.as_uri()
    assert Path(url2pathname(urlparse(uri).path)).read_text(encoding="utf-8") == schema_text()


def test_a_spec_inside_the_checkout_names_its_schema_relatively() -> None:
    """As the committed specs do: right wherever the checkout is moved or cloned."""
    assert _schema_ref(ROOT / "specs" / "mine.yaml") == "../schemas/deployment.schema.json"
    assert _schema_ref(ROOT / "deployment.yaml") == "schemas/deployment.schema.json"


def test_an_installed_reconciler_names_its_own_schema_even_under_a_path_with_spaces(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pip or pipx install has no schemas/ beside the package: the package's copy, as a URI
    (the YAML language server reads the modeline's value up to the first space)."""
    shipped = tmp_path / "my venv/lib/python3.12/site-packages/reconciler/data/deployment.schema.json"
    shipped.parent.mkdir(parents=True)
    shipped.write_text(schema_text(), encoding="utf-8")
    monkeypatch.setattr(schema_module, "shipped_schema", lambda: shipped)
    ref = _schema_ref(tmp_path / "specs" / "deployment.yaml")
    assert ref is not None
    assert ref.startswith("file:///")
    assert " " not in ref
    assert "/my%20venv/" in ref
    assert Path(url2pathname(urlparse(ref).path)) == shipped
    monkeypatch.setattr(schema_module, "shipped_schema", lambda: None)
    assert _schema_ref(tmp_path / "deployment.yaml") is None


# ---------------------------------------------------------------- the serving section


def serving_lines(text: str) -> list[str]:
    """The drafted spec's lines from `serving:` to its end."""
    lines = text.splitlines()
    return lines[lines.index("serving:") :]


def test_the_draft_lists_every_serving_field_at_its_default() -> None:
    lines = serving_lines(INIT_GOLDEN.read_text(encoding="utf-8"))
    for name in Serving.model_fields:
        shown = [line for line in lines if re.match(rf"  (# )?{name}(:| is not listed)", line)]
        assert len(shown) == 1, name


@pytest.mark.parametrize(
    "value", [None, True, 0.88, -1, "32g", "0", "a b", ["all"], [], {}, {"CUDA_VISIBLE_DEVICES": "0", "X": "a, b"}]
)
def test_a_default_is_written_on_one_line_that_reads_back_as_itself(value: object) -> None:
    line = flow_value(value)
    assert "\n" not in line
    assert yaml.safe_load(f"key: {line}\n") == {"key": value}


def test_uncommenting_one_serving_line_sets_that_field_to_the_default_it_shows() -> None:
    """The section is read off the model: each line, uncommented (a nested field with its
    section's line), validates and leaves serving at its defaults, now set by the owner."""
    text = INIT_GOLDEN.read_text(encoding="utf-8")
    lines = text.splitlines()
    start = lines.index("serving:")
    defaults = Serving()
    nested = [value for name in Serving.model_fields if isinstance(value := getattr(defaults, name), BaseModel)]
    names = {*Serving.model_fields, *(name for section in nested for name in type(section).model_fields)}
    tried = 0
    for index, line in enumerate(lines[start:], start):
        match = re.match(r"  # (  )?([a-z_]+): ", line)
        if match is None or match.group(2) not in names:  # a description's line, not a field's
            continue
        edited = list(lines)
        edited[index] = line.replace("# ", "", 1)
        section = None
        if match.group(1):
            section = next(i for i in range(index, start, -1) if re.match(r"  # [a-z_]+:$", lines[i]))
            edited[section] = lines[section].replace("# ", "", 1)
        serving = parse_spec("\n".join(edited) + "\n", "uncommented.yaml").deployment.serving
        assert serving == Serving(), line
        field = match.group(2) if section is None else lines[section].split()[-1].rstrip(":")
        assert field in serving.model_fields_set, line
        tried += 1
    not_offered = 2  # profile is written as a value; env (29 entries) is described, not listed
    offered = len(Serving.model_fields) - len(nested) - not_offered
    assert tried == offered + sum(len(type(section).model_fields) for section in nested)


@pytest.mark.usefixtures("probed_pair")
def test_a_draft_that_does_not_validate_is_not_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(init, "draft", lambda *_, **__: init.Draft("nodes: []\n", [], []))
    out = tmp_path / "deployment.yaml"
    with pytest.raises(ReconcilerError, match="the drafted spec does not validate, so nothing was written"):
        run_init(["--worker", WORKER_IP, "--out", str(out)])
    assert not out.exists()


def test_init_refuses_to_overwrite_and_probes_nothing(probed_pair: list[init.InitRequest], tmp_path: Path) -> None:
    out = tmp_path / "deployment.yaml"
    out.write_text("mine\n", encoding="utf-8")
    with pytest.raises(ReconcilerError) as caught:
        run_init(["--worker", WORKER_IP, "--out", str(out)])
    assert caught.value.message == f"{out} exists; init never overwrites a spec"
    assert "--out PATH" in caught.value.hint
    assert out.read_text(encoding="utf-8") == "mine\n"
    assert probed_pair == []


@pytest.mark.usefixtures("probed_pair")
def test_init_json_lists_the_nodes_and_what_to_review(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "deployment.yaml"
    assert run_init(["--worker", "192.168.1.51", "--out", str(out), "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["ok"] is True
    assert report["path"] == str(out)
    assert [(node["name"], node["fabric"]["ifname"]) for node in report["nodes"]] == [
        ("spark-a1b2", "enp1s0f1np1"),
        ("spark-c3d4", "enp1s0f1np1"),
    ]
    assert [item["where"] for item in report["review"]] == ["nodes[spark-c3d4].ssh.host"]
    assert report["next"] == [f"reconciler {command} --spec {out}" for command in ("doctor", "plan", "apply")]
    assert [warning["path"] for warning in report["warnings"]] == ["model.revision"]


@pytest.mark.usefixtures("probed_pair")
def test_relative_key_paths_become_absolute_in_the_spec(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    argv = [
        "--worker",
        WORKER_IP,
        "--identity-file",
        "keys/id",
        "--known-hosts",
        "keys/kh",
        "--ssh-port",
        "2222",
    ]
    assert run_init(argv) == 0
    written = parse_spec((tmp_path / "specs/deployment.yaml").read_text(encoding="utf-8"), "x").deployment
    assert written.nodes[1].ssh == SshTarget(
        host=WORKER_IP, port=2222, identity_file=f"{tmp_path}/keys/id", known_hosts=f"{tmp_path}/keys/kh"
    )


@pytest.mark.usefixtures("probed_pair")
def test_secrets_in_the_environment_never_reach_the_spec_or_the_output(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    token, key = "hf_" + "Q" * 34, "sk-" + "K" * 40
    monkeypatch.setenv("HF_TOKEN", token)
    monkeypatch.setenv("DSV41_API_KEY", key)
    out = tmp_path / "deployment.yaml"
    assert run_init(["--worker", WORKER_IP, "--out", str(out), "--json"]) == 0
    written = out.read_text(encoding="utf-8") + capsys.readouterr().out
    assert token not in written
    assert key not in written
    deployment = parse_spec(out.read_text(encoding="utf-8"), "x").deployment
    assert deployment.model.token_file is None
    assert deployment.api.key_file is None


@pytest.mark.usefixtures("probed_pair")
def test_ssh_options_left_out_are_left_out_of_the_spec(tmp_path: Path) -> None:
    """A port or known_hosts in the spec overrides ~/.ssh/config for good: only given ones are written."""
    out = tmp_path / "deployment.yaml"
    assert run_init(["--worker", f"nvidia@{WORKER_IP}", "--out", str(out)]) == 0
    text = out.read_text(encoding="utf-8")
    written = [key for key in ("port", "known_hosts", "identity_file") if re.search(rf"^\s+{key}:", text, re.M)]
    assert written == []  # serving's port is there, commented out
    ssh = parse_spec(text, str(out)).deployment.nodes[1].ssh
    assert ssh is not None
    assert ssh.model_fields_set == {"host", "user"}


def test_an_ssh_port_given_is_written_even_if_it_is_the_default(
    probed_pair: list[init.InitRequest], tmp_path: Path
) -> None:
    out = tmp_path / "deployment.yaml"
    assert run_init(["--worker", WORKER_IP, "--ssh-port", "22", "--known-hosts", "/etc/kh", "--out", str(out)]) == 0
    ssh = parse_spec(out.read_text(encoding="utf-8"), str(out)).deployment.nodes[1].ssh
    assert ssh is not None
    assert {"port", "known_hosts"} <= ssh.model_fields_set
    (request,) = probed_pair
    probing = init.provisional(request).nodes[1].ssh
    assert probing is not None
    assert "port" in probing.model_fields_set, "so the route takes 22 over the config's Port"


def test_init_help_names_the_defaults_the_ssh_config_supplies(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        build_parser().parse_args(["init", "--help"])
    flat = " ".join(capsys.readouterr().out.split())
    assert "(default: the ssh config's Port for the host, else 22)" in flat
    assert "(default: the ssh config's UserKnownHostsFile, else ~/.ssh/known_hosts)" in flat
    assert "(default: the ssh config's IdentityFile, else ssh-agent and ~/.ssh)" in flat


@pytest.mark.parametrize(
    ("out", "message"),
    [
        ("", "--out is empty"),
        ("  ", "--out is empty"),
        (".", "--out '.' names a directory"),
        ("{tmp}", "--out '{tmp}' names a directory"),
        ("{tmp}/new/", "--out '{tmp}/new/' names a directory"),
    ],
)
def test_an_out_that_is_no_file_path_is_refused_before_probing(
    probed_pair: list[init.InitRequest], tmp_path: Path, out: str, message: str
) -> None:
    with pytest.raises(ReconcilerError) as caught:
        run_init(["--worker", WORKER_IP, "--out", out.format(tmp=tmp_path)])
    assert caught.value.message == message.format(tmp=tmp_path)
    assert "--out " in caught.value.hint
    assert probed_pair == []


def test_an_out_under_a_file_is_refused_before_probing(probed_pair: list[init.InitRequest], tmp_path: Path) -> None:
    (tmp_path / "file").write_text("", encoding="utf-8")
    out = tmp_path / "file/sub/deployment.yaml"
    with pytest.raises(ReconcilerError) as caught:
        run_init(["--worker", WORKER_IP, "--out", str(out)])
    assert caught.value.message == f"cannot write {out}: {tmp_path / 'file'} is not a directory"
    assert probed_pair == []


@pytest.mark.parametrize("missing", ["", "new/deeper/"])
def test_an_out_in_a_directory_this_user_cannot_write_is_refused_before_probing(
    probed_pair: list[init.InitRequest], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, missing: str
) -> None:
    """os.access answers for this user (root passes any mode bits, so the answer is stubbed)."""
    locked = tmp_path / "locked"
    locked.mkdir()
    real = os.access
    monkeypatch.setattr(os, "access", lambda path, mode: Path(path) != locked and real(path, mode))
    out = locked / f"{missing}deployment.yaml"
    with pytest.raises(ReconcilerError) as caught:
        run_init(["--worker", WORKER_IP, "--out", str(out)])
    doing = f"cannot write {out}" if not missing else f"cannot create {out.parent} for {out}"
    assert caught.value.message == f"{doing}: {locked} is not writable by this user"
    assert "--out PATH" in caught.value.hint
    assert probed_pair == []


@pytest.mark.usefixtures("probed_pair")
def test_missing_parent_directories_are_created(tmp_path: Path) -> None:
    out = tmp_path / "a/b/c/deployment.yaml"
    assert run_init(["--worker", WORKER_IP, "--out", str(out)]) == 0
    assert out.is_file()


def test_init_needs_a_worker(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        run_init([])
    assert caught.value.code == 1  # a usage error, like every command's
    assert "--worker" in capsys.readouterr().err


def test_the_golden_spec_loads_with_only_the_branch_warning() -> None:
    loaded = parse_spec(INIT_GOLDEN.read_text(encoding="utf-8"), str(INIT_GOLDEN))
    assert [warning.path for warning in loaded.warnings] == ["model.revision"]
    assert loaded.deployment.nodes[0].fabric.ip == HEAD_IP
