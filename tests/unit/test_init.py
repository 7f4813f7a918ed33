"""`reconciler init`: the spec drafted from probe answers (pure), its checks, and the command's edges."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import paramiko
import pytest

from reconciler import init
from reconciler.cli.init import cmd_init
from reconciler.cli.parser import build_parser
from reconciler.doctor import NodeProbe
from reconciler.errors import NodeUnreachableError, ReconcilerError
from reconciler.nodeside import probe as node_probe
from reconciler.spec import REFERENCE_IMAGE, Deployment, Node, SshTarget, parse_spec
from reconciler.transport.base import CommandResult, LineSink
from reconciler.yamlpos import load_located
from tests.scenarios import FIXTURES, INIT_GOLDEN, init_answer, init_two_sparks, spark_infiniband, spark_ip_addr
from tests.testbed import fakesys

WORKER = SshTarget(host="192.168.100.11", user="nvidia")
HEAD_IP, WORKER_IP = "192.168.100.10", "192.168.100.11"


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


def test_values_the_loader_would_misread_are_quoted() -> None:
    assert init.scalar("enp1s0f1np1") == "enp1s0f1np1"
    assert init.scalar("~/models/x") == "~/models/x"
    for value in ("123", "true", "null", "a #b", "x: y", "[1]", "*x", '"quoted"'):
        assert init.scalar(value).startswith('"'), value
    for value in ("123", "true", "a #b", "x: y", "*x", '"quoted"', 'say "hi"', "back\\slash", "\\"):
        assert load_located(f"k: {init.scalar(value)}\n").data == {"k": value}, value


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


def target(known_hosts: Path, host: str = WORKER_IP, port: int = 22) -> SshTarget:
    return SshTarget(host=host, user="nvidia", port=port, known_hosts=str(known_hosts))


def test_a_missing_host_key_gives_the_exact_commands_that_add_it(tmp_path: Path) -> None:
    known = tmp_path / "known_hosts"
    write_known_hosts(known, "192.168.100.99")
    message, hint = init.unknown_host_key(target(known)) or ("", "")
    assert (
        message
        == f"nvidia@{WORKER_IP}: {known} holds no host key for {WORKER_IP}; init never trusts an unseen host key"
    )
    assert f"`ssh -o UserKnownHostsFile={known} nvidia@{WORKER_IP} true`" in hint
    assert f"`ssh-keyscan {WORKER_IP} >> {known}`" in hint
    assert "ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub" in hint


def test_a_host_key_on_another_port_is_looked_up_as_ssh_writes_it(tmp_path: Path) -> None:
    known = tmp_path / "known_hosts"
    write_known_hosts(known, WORKER_IP)
    message, hint = init.unknown_host_key(target(known, port=2222)) or ("", "")
    assert f"no host key for [{WORKER_IP}]:2222" in message
    assert f"`ssh-keyscan -p 2222 {WORKER_IP} >> {known}`" in hint
    write_known_hosts(known, f"[{WORKER_IP}]:2222")
    assert init.unknown_host_key(target(known, port=2222)) is None


def test_a_hashed_known_hosts_entry_counts(tmp_path: Path) -> None:
    known = tmp_path / "known_hosts"
    write_known_hosts(known, WORKER_IP, hashed=True)
    assert WORKER_IP not in known.read_text(encoding="utf-8")
    assert init.unknown_host_key(target(known)) is None


def test_a_missing_known_hosts_file_says_so(tmp_path: Path) -> None:
    message, _ = init.unknown_host_key(target(tmp_path / "absent")) or ("", "")
    assert f"{tmp_path / 'absent'} does not exist" in message


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
    monkeypatch.chdir(Path(__file__).parent)  # no schemas/ here: no modeline
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
    assert not out.read_text(encoding="utf-8").startswith("# yaml-language-server")


def test_the_editor_modeline_points_at_this_checkout_s_schema(
    probed_pair: list[init.InitRequest], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = Path(__file__).resolve().parents[2]
    monkeypatch.chdir(root)
    out = tmp_path / "deployment.yaml"
    assert run_init(["--worker", WORKER_IP, "--out", str(out)]) == 0
    assert len(probed_pair) == 1
    first = out.read_text(encoding="utf-8").splitlines()[0]
    assert first.startswith("# yaml-language-server: $schema=")
    assert (out.parent / first.split("=", 1)[1]).resolve() == root / "schemas/deployment.schema.json"


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


def test_init_needs_a_worker(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as caught:
        run_init([])
    assert caught.value.code == 1  # a usage error, like every command's
    assert "--worker" in capsys.readouterr().err


def test_the_golden_spec_loads_with_only_the_branch_warning() -> None:
    loaded = parse_spec(INIT_GOLDEN.read_text(encoding="utf-8"), str(INIT_GOLDEN))
    assert [warning.path for warning in loaded.warnings] == ["model.revision"]
    assert loaded.deployment.nodes[0].fabric.ip == HEAD_IP
