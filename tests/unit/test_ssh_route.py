"""The ssh config applied to a spec's target: precedence, jump hosts, host-key names, located errors,
and the same route handed to OpenSSH for rsync."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from reconciler.errors import SshConfigError
from reconciler.spec import SshTarget, parse_spec
from reconciler.transport.sshroute import (
    CONFIG_ENV,
    SshConfigText,
    SshRoute,
    openssh_command,
    read_ssh_config,
    resolve_route,
)

CONFIG = """\
# the user's own config
Host spark2
    HostName 10.10.10.12
    User nvidia
    Port 2222
    IdentityFile ~/.ssh/spark_ed25519
    IdentityFile %d/.ssh/id_%r_%h
    ConnectTimeout 4
    UserKnownHostsFile ~/.ssh/known_hosts.sparks ~/.ssh/known_hosts

Host bastion
    HostName 203.0.113.7
    User jump
    IdentityFile ~/.ssh/jump_key
    IdentitiesOnly yes

Host spark3
    HostName 10.10.10.13
    ProxyJump bastion,ops@relay:2200

Host *
    ServerAliveInterval 30
"""


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """`~` and `%d` expand to this directory, never to the machine's real home."""
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv(CONFIG_ENV, raising=False)
    return tmp_path


def route(target: SshTarget, text: str = CONFIG, path: str = "/cfg/ssh_config") -> SshRoute:
    return resolve_route("spark-worker", target, SshConfigText(path, text), "me")


def error_of(target: SshTarget, text: str) -> SshConfigError:
    with pytest.raises(SshConfigError) as caught:
        route(target, text)
    return caught.value


def spec_target(ssh: str) -> SshTarget:
    """A target as the spec loader builds it, so 'set explicitly' means 'written in the YAML'."""
    text = f"nodes:\n  - name: spark-head\n    role: head\n  - name: spark-worker\n    ssh: {ssh}\n"
    target = parse_spec(text, "spec.yaml").deployment.nodes[1].ssh
    assert target is not None
    return target


def test_an_alias_takes_address_user_port_keys_timeout_and_known_hosts_from_the_config(home: Path) -> None:
    resolved = route(spec_target("{host: spark2}"))
    target = resolved.target
    assert (target.name, target.hostname, target.port, target.user) == ("spark2", "10.10.10.12", 2222, "nvidia")
    assert target.identity_files == (f"{home}/.ssh/spark_ed25519", f"{home}/.ssh/id_nvidia_10.10.10.12")
    assert not target.identities_only
    assert resolved.connect_timeout_s == 4.0
    assert resolved.known_hosts == (f"{home}/.ssh/known_hosts.sparks", f"{home}/.ssh/known_hosts")
    assert target.host_key_name == "[10.10.10.12]:2222"
    assert resolved.entries == ("/cfg/ssh_config:2: Host spark2", "/cfg/ssh_config:21: Host *")
    assert (resolved.jumps, resolved.proxy_command, resolved.notes) == ((), None, ())


def test_fields_the_spec_sets_win_even_when_they_equal_the_defaults(home: Path) -> None:
    ssh = "{host: spark2, port: 22, user: root, identity_file: /k/id, known_hosts: ~/kh, connect_timeout_s: 10}"
    resolved = route(spec_target(ssh))
    target = resolved.target
    assert (target.hostname, target.port, target.user) == ("10.10.10.12", 22, "root")
    assert (target.identity_files, target.identities_only) == (("/k/id",), True)
    assert (resolved.known_hosts, resolved.connect_timeout_s) == ((f"{home}/kh",), 10.0)
    assert target.host_key_name == "10.10.10.12"


def test_the_config_tokens_expand_to_the_values_the_spec_sets(home: Path) -> None:
    target = route(spec_target("{host: spark2, user: root}")).target
    assert target.identity_files[1] == f"{home}/.ssh/id_root_10.10.10.12"


def test_defaults_fill_what_neither_the_spec_nor_the_config_gives(home: Path) -> None:
    resolved = route(spec_target("{host: 10.10.10.11}"))
    target = resolved.target
    assert (target.hostname, target.port, target.user, target.identity_files) == ("10.10.10.11", 22, "me", ())
    assert (resolved.known_hosts, resolved.connect_timeout_s) == ((f"{home}/.ssh/known_hosts",), 10.0)
    assert resolved.entries == ("/cfg/ssh_config:21: Host *",)
    assert resolve_route("w", SshTarget(host="10.10.10.11"), None, "me").config_path is None


def test_host_key_alias_names_the_key_as_openssh_files_it() -> None:
    text = "Host spark2\n  HostName 10.10.10.12\n  Port 2222\n  HostKeyAlias spark2-key\n"
    assert route(SshTarget(host="spark2"), text).target.host_key_name == "spark2-key"


def test_proxy_jump_hops_are_resolved_through_the_config_in_order() -> None:
    resolved = route(SshTarget(host="spark3"))
    bastion, relay = resolved.jumps
    assert (bastion.name, bastion.hostname, bastion.port, bastion.user) == ("bastion", "203.0.113.7", 22, "jump")
    assert bastion.identities_only
    assert (relay.name, relay.hostname, relay.port, relay.user) == ("relay", "relay", 2200, "ops")
    assert resolved.target.hostname == "10.10.10.13"
    assert resolved.describe() == "me@10.10.10.13:22 (spark3) via jump@203.0.113.7:22 (bastion), ops@relay:2200"


def test_the_first_hops_own_jumps_come_first_and_none_ends_the_chain() -> None:
    text = (
        "Host node\n  ProxyJump a\nHost a\n  ProxyJump ssh://u@b:23\nHost b\n  ProxyJump none\nHost *\n  ProxyJump z\n"
    )
    resolved = route(SshTarget(host="node"), text)
    assert [(hop.name, hop.user, hop.port) for hop in resolved.jumps] == [("b", "u", 23), ("a", "me", 22)]


def test_a_proxy_command_carries_the_first_connection() -> None:
    text = "Host spark2\n  HostName 10.0.0.2\n  ProxyCommand nc -X 5 -x proxy:1080 %h %p\n"
    resolved = route(SshTarget(host="spark2"), text)
    assert resolved.proxy_command == "nc -X 5 -x proxy:1080 10.0.0.2 22"


@pytest.mark.parametrize(
    ("text", "where", "says"),
    [
        ("Host spark2\n  Port\n", ":2:", "cannot parse this line"),
        ('Host "spark2\n  Port 22\n', ":1:", "cannot parse this line"),
        (
            "Host spark2\n  HostName 10.0.0.2\n  Port twenty\n",
            ":3:",
            "Port 'twenty' (for spark2, HostName 10.0.0.2) is not a port number",
        ),
        ("Host spark2\n  Port 70000\n", ":2:", "Port '70000' (for spark2) is not a port number"),
        # Digits to str.isdigit, not to int(): a superscript or another script's digits.
        ("Host spark2\n  Port \u00b2\n", ":2:", "Port '\u00b2' (for spark2) is not a port number"),
        ("Host spark2\n  ConnectTimeout \u00b3\n", ":2:", "ConnectTimeout '\u00b3'"),
        ("Host spark2\n  ProxyJump b:\u0663\n", ":2:", "is not [user@]host[:port]"),
        ("Host *\n\n  ConnectTimeout 5s\n", ":3:", "ConnectTimeout '5s'"),
        (
            "Host spark2\n  HostName 10.0.0.2;reboot\n",
            ":2:",
            "HostName '10.0.0.2;reboot' (for spark2) is not a host name",
        ),
        ("Host spark2\n  ProxyJump a,,b\n", ":2:", "ProxyJump hop '' (for spark2) is not [user@]host[:port]"),
        ("Host spark2\n  ProxyJump -oProxyCommand=x\n", ":2:", "is not [user@]host[:port]"),
        ("Host spark2\n  ProxyJump b:99999\n", ":2:", "has no valid port"),
        ("Host spark2\n  ProxyJump spark2\n", ":2:", "more than 8 hops deep: a loop"),
        ("Host spark2\n  ProxyJump b\n  ProxyCommand nc %h %p\n", ":2:", "both ProxyJump and ProxyCommand"),
        ("Host *\n  UserKnownHostsFile none\n", ":2:", "names no file the reconciler can check host keys"),
    ],
)
def test_a_malformed_entry_is_located_with_its_fix(text: str, where: str, says: str) -> None:
    error = error_of(SshTarget(host="spark2"), text)
    assert error.message.startswith(f"spark-worker: /cfg/ssh_config{where} ")
    assert says in error.message
    assert error.hint


def test_loose_host_key_checking_and_include_are_reported_not_followed() -> None:
    text = (
        "Include ~/.orbstack/ssh/config\n"
        "Host spark3\n  ProxyJump bastion\n"
        "Host *\n  StrictHostKeyChecking no\n  UserKnownHostsFile /dev/null\n"
    )
    resolved = route(SshTarget(host="spark3"), text)
    assert resolved.notes == (
        "/cfg/ssh_config:5: StrictHostKeyChecking no (for spark3, bastion) is ignored: "
        "the reconciler always checks host keys and never adds one",
        "/cfg/ssh_config:1: Include ~/.orbstack/ssh/config is not read by the reconciler; "
        "settings for the nodes must be in this file",
    )
    assert resolved.known_hosts == ("/dev/null",)


def test_negated_host_patterns_do_not_apply() -> None:
    text = "Host * !spark2\n  Port 2200\nHost spark?\n  User nvidia\n"
    resolved = route(SshTarget(host="spark2"), text)
    assert resolved.entries == ("/cfg/ssh_config:3: Host spark?",)
    assert (resolved.target.port, resolved.target.user) == (22, "nvidia")


# ---------------------------------------------------------------- the same route for OpenSSH


def option(argv: list[str], name: str) -> list[str]:
    return [
        argv[i + 1].split("=", 1)[1]
        for i, arg in enumerate(argv[:-1])
        if arg == "-o" and argv[i + 1].startswith(name + "=")
    ]


def test_openssh_gets_every_resolved_value_explicitly(home: Path) -> None:
    argv = openssh_command(route(spec_target("{host: spark2}")))
    assert argv[:7] == ["ssh", "-F", "/cfg/ssh_config", "-p", "2222", "-l", "nvidia"]
    assert option(argv, "HostName") == ["10.10.10.12"]
    assert option(argv, "StrictHostKeyChecking") == ["yes"]
    assert option(argv, "BatchMode") == ["yes"]
    assert option(argv, "ConnectTimeout") == ["4"]
    assert option(argv, "UserKnownHostsFile") == [f"{home}/.ssh/known_hosts.sparks {home}/.ssh/known_hosts"]
    assert option(argv, "ProxyCommand") == ["none"]
    assert [argv[i + 1] for i, arg in enumerate(argv) if arg == "-i"] == [
        f"{home}/.ssh/spark_ed25519",
        f"{home}/.ssh/id_nvidia_10.10.10.12",
    ]
    bare = openssh_command(resolve_route("w", SshTarget(host="10.0.0.9", identity_file="/k/%id"), None, "me"))
    assert bare[:3] == ["ssh", "-F", "none"]
    assert "/k/%%id" in bare
    assert option(bare, "IdentitiesOnly") == ["yes"]


def test_jumps_become_nested_ssh_w_commands_with_the_same_checks() -> None:
    argv = openssh_command(route(SshTarget(host="spark3", known_hosts="/kh")))
    (outer,) = option(argv, "ProxyCommand")
    relay = shlex.split(outer)
    assert relay[-3:] == ["-W", "10.10.10.13:22", "relay"]
    assert relay[relay.index("-p") + 1] == "2200"
    assert relay[relay.index("-l") + 1] == "ops"
    assert option(relay, "UserKnownHostsFile") == ["/kh"]
    assert option(relay, "StrictHostKeyChecking") == ["yes"]
    (inner,) = option(relay, "ProxyCommand")
    bastion = shlex.split(inner)
    assert bastion[-3:] == ["-W", "relay:2200", "bastion"]
    assert option(bastion, "HostName") == ["203.0.113.7"]
    assert option(bastion, "ProxyCommand") == ["none"]
    assert option(bastion, "UserKnownHostsFile") == ["/kh"]
    assert option(bastion, "IdentitiesOnly") == ["yes"]


# ---------------------------------------------------------------- which file


def test_the_config_file_is_the_users_or_the_one_named_or_none(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert read_ssh_config("w") is None
    (home / ".ssh").mkdir()
    (home / ".ssh/config").write_text("Host x\n  Port 2\n", encoding="utf-8")
    default = read_ssh_config("w")
    assert default is not None
    assert default.path == f"{home}/.ssh/config"
    other = home / "other_config"
    other.write_text("Host y\n", encoding="utf-8")
    monkeypatch.setenv(CONFIG_ENV, str(other))
    named = read_ssh_config("w")
    assert named is not None
    assert (named.path, named.text) == (str(other), "Host y\n")
    monkeypatch.setenv(CONFIG_ENV, "none")
    assert read_ssh_config("w") is None


def test_a_config_file_that_cannot_be_read_is_an_error(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(CONFIG_ENV, str(home / "missing"))
    with pytest.raises(SshConfigError, match=f"w: {home}/missing: cannot read the ssh config"):
        read_ssh_config("w")
    binary = home / "binary"
    binary.write_bytes(b"Host x\n\xff\xfe\n")
    monkeypatch.setenv(CONFIG_ENV, str(binary))
    with pytest.raises(SshConfigError, match=f"w: {binary}:2: the ssh config is not valid UTF-8"):
        read_ssh_config("w")


def test_a_quoted_known_hosts_path_with_spaces_is_one_file_and_a_plain_list_is_several() -> None:
    quoted = route(SshTarget(host="spark2"), 'Host spark2\n  UserKnownHostsFile "/my dir/known_hosts"\n')
    assert quoted.known_hosts == ("/my dir/known_hosts",)
    listed = route(SshTarget(host="spark2"), "Host spark2\n  UserKnownHostsFile /a/kh /b/kh\n")
    assert listed.known_hosts == ("/a/kh", "/b/kh")
    mixed = route(SshTarget(host="spark2"), 'Host spark2\n  UserKnownHostsFile "/my dir/kh" /b/kh\n')
    assert mixed.known_hosts == ("/my dir/kh", "/b/kh")
