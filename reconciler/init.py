"""`reconciler init`: a first spec written from what the nodes say, every choice with its reason.

Writing the first spec by hand is where most setups go wrong: the fabric port, its address and
HCAs, the home a `~` means on each node, a model dir on a disk too small for the checkpoint.
Init probes every node once (the doctor's probe, over the same transports as every pass) and
drafts the spec from the answers. Each value it writes carries a comment saying what it saw;
what it cannot decide (two candidate fabric interfaces, no ACTIVE RoCE port, too little disk)
is marked REVIEW, with the candidates commented out, never guessed.

Two halves, so the interesting one is tested on fixture data: `draft(request, probed)` is pure
and turns probe answers into spec text; `probe_nodes(request)` is the only I/O. SSH host keys
are checked as everywhere: a node whose key is not in known_hosts stops init with the command
that adds it after the fingerprint is verified; init never adds one itself.
"""

from __future__ import annotations

import ipaddress
import os
import re
import shlex
import textwrap
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Literal

import paramiko
from pydantic import TypeAdapter, ValidationError

from reconciler.components.checkpoint import FULL_SIZE_HEAD, FULL_SIZE_WORKER, human_bytes
from reconciler.doctor import NodeProbe, doctor_input
from reconciler.errors import NodeUnreachableError, ReconcilerError, SpecError, YamlError
from reconciler.facts.fabric import FabricFacts, subnet_mismatches
from reconciler.facts.gather import probe_args
from reconciler.facts.memory import KIB_PER_GIB
from reconciler.facts.node import NodeFacts
from reconciler.spec import (
    REFERENCE_IMAGE,
    Deployment,
    Fabric,
    HostPath,
    LoadedSpec,
    Model,
    Node,
    Serving,
    SshTarget,
    expand_home,
    parse_spec,
)
from reconciler.transport.base import Transport, run_program
from reconciler.transport.connect import transport_for
from reconciler.yamlpos import load_located

DEFAULT_MODEL_DIR: str = Node.model_fields["model_dir"].default
DEFAULT_STATE_DIR: str = Deployment.model_fields["state_dir"].default
# The probe reads the GID at the default index; the drafted spec says so explicitly.
GID_INDEX: int = Fabric.model_fields["gid_index"].default
REVIEW = "REVIEW"
Role = Literal["head", "worker"]


# ---------------------------------------------------------------- what the user asked for


@dataclass(frozen=True)
class InitRequest:
    """The nodes to probe, head first; `None` for the head means the machine running init."""

    head: SshTarget | None
    workers: tuple[SshTarget, ...]
    model_dir: str = DEFAULT_MODEL_DIR

    @property
    def targets(self) -> list[tuple[Role, SshTarget | None]]:
        return [("head", self.head), *(("worker", target) for target in self.workers)]


def ssh_target(text: str, option: str, *, port: int, identity_file: str | None, known_hosts: str) -> SshTarget:
    """`[user@]host` as given to --head / --worker, checked as the spec would check it."""
    user, at, host = text.rpartition("@")
    fields: dict[str, Any] = {"host": host, "port": port, "known_hosts": known_hosts}
    if at:
        fields["user"] = user
    if identity_file is not None:
        fields["identity_file"] = identity_file
    try:
        return SshTarget.model_validate(fields)
    except ValidationError as exc:
        raise _option_error(option, text, exc) from None


def checked_model_dir(text: str) -> str:
    try:
        return str(TypeAdapter(HostPath).validate_python(text))
    except ValidationError as exc:
        raise _option_error("--model-dir", text, exc) from None


def _option_error(option: str, text: str, exc: ValidationError) -> ReconcilerError:
    error = exc.errors()[0]
    hint = str((error.get("ctx") or {}).get("hint") or "see `reconciler init --help`")
    where = ".".join(str(part) for part in error["loc"])
    return ReconcilerError(f"{option} {text!r}: {where + ': ' if where else ''}{error['msg']}", hint)


def check_distinct(request: InitRequest) -> None:
    seen: set[tuple[str, int]] = set()
    for _, target in request.targets:
        if target is None:
            continue
        key = (target.host, target.port)
        if key in seen:
            raise ReconcilerError(f"{login(target)} is given twice", "name each node once (--head or --worker)")
        seen.add(key)


def login(target: SshTarget) -> str:
    return f"{target.user + '@' if target.user else ''}{target.host}"


# ---------------------------------------------------------------- what the nodes said


@dataclass(frozen=True)
class Probed:
    """One node's answer: who logged in and the facts built from its probe (the plan's own parsers)."""

    role: Role
    target: SshTarget | None
    user: str | None
    facts: NodeFacts


def provisional(request: InitRequest) -> Deployment:
    """A deployment to probe with: the nodes as given, the reference defaults for the rest.
    Names are placeholders; the drafted spec names each node after its hostname."""
    nodes: list[dict[str, Any]] = []
    for index, (role, target) in enumerate(request.targets):
        node: dict[str, Any] = {"name": f"node-{index}", "role": role, "model_dir": request.model_dir}
        if target is not None:
            node["ssh"] = target.model_dump(exclude_defaults=True)
        nodes.append(node)
    return Deployment.model_validate({"nodes": nodes})


def probed_from_answers(request: InitRequest, answers: dict[str, NodeProbe]) -> list[Probed]:
    """Pure: the probes' raw answers (keyed by the provisional names) -> per-node findings."""
    deployment = provisional(request)
    facts = doctor_input(deployment, answers).facts
    return [
        Probed(role, target, _text(answers[node.name].host.get("user")), facts.nodes[node.name])
        for (role, target), node in zip(request.targets, deployment.nodes, strict=True)
    ]


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None


# ---------------------------------------------------------------- the draft (pure)


@dataclass(frozen=True)
class Note:
    """Something init could not decide: where in the spec, and what to do."""

    where: str
    message: str

    def to_dict(self) -> dict[str, str]:
        return {"where": self.where, "message": self.message}


@dataclass(frozen=True)
class Draft:
    text: str
    names: list[str]
    notes: list[Note]


@dataclass
class _Lines:
    """Spec text under construction; every comment is made safe to hold node-supplied text."""

    lines: list[str] = field(default_factory=list)
    notes: list[Note] = field(default_factory=list)

    def comment(self, indent: int, text: str, *, width: int = 100) -> None:
        pad = " " * indent + "# "
        for line in textwrap.wrap(_safe(text), width=max(40, width - len(pad))) or [""]:
            self.lines.append((pad + line).rstrip())

    def review(self, indent: int, where: str, text: str) -> None:
        self.notes.append(Note(where, _safe(text)))
        self.comment(indent, f"{REVIEW}: {text}")

    def key(self, indent: int, name: str, value: str | int | None = None) -> None:
        rendered = "" if value is None else f" {value}" if isinstance(value, int) else f" {scalar(value)}"
        self.lines.append(f"{' ' * indent}{name}:{rendered}")

    def raw(self, line: str) -> None:
        self.lines.append(line)


def _safe(text: str) -> str:
    """One line of printable text: a hostname or message from a node can never end the comment."""
    return "".join(char if char.isprintable() else " " for char in text)


def scalar(value: str) -> str:
    """`value` as YAML: plain when the spec loader reads it back as this very string, else quoted."""
    try:
        plain = load_located(f"k: {value}\n").data
    except YamlError:
        plain = None
    if isinstance(plain, dict) and plain.get("k") == value and "#" not in value:
        return value
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


def draft(request: InitRequest, probed: list[Probed], *, schema_ref: str | None = None) -> Draft:
    """The spec text for these nodes, with a reason on every choice and REVIEW on the undecided."""
    out = _Lines()
    names = node_names(probed)
    _header(out, schema_ref, len(probed))
    out.key(0, "name", Deployment.model_fields["name"].default)
    out.comment(0, "on every node; '~' is each node's own home (its login user's)")
    out.key(0, "state_dir", DEFAULT_STATE_DIR)
    out.raw("")
    out.key(0, "nodes")
    _cross_node(out, probed, names)
    for item, (name, why) in zip(probed, names, strict=True):
        _node(out, request, item, name, why)
    out.raw("")
    _rest(out)
    return Draft("\n".join(out.lines) + "\n", [name for name, _ in names], out.notes)


def _header(out: _Lines, schema_ref: str | None, count: int) -> None:
    if schema_ref is not None:
        out.raw(f"# yaml-language-server: $schema={schema_ref}")
        out.raw("#")
    out.comment(
        0,
        f"Written by `reconciler init` from what it found on the {count} nodes. Each value says why it was "
        f"chosen; lines marked {REVIEW} are what init could not decide: settle them, then run "
        "`reconciler doctor`, `reconciler plan` and `reconciler apply`. Every key left out takes the reference "
        "default (schemas/deployment.schema.json describes each). No secret is written here: the API key is "
        "created on the head (api.key_file), the Hub token comes from $HF_TOKEN or model.token_file.",
    )


def node_names(probed: list[Probed]) -> list[tuple[str, str]]:
    """(name, why) per node: its hostname made a valid, unique spec name."""
    taken: set[str] = set()
    result = []
    for index, item in enumerate(probed):
        hostname = item.facts.hostname or ""
        base = _name_from(hostname)
        why = "its hostname" if base == hostname else f"from its hostname {hostname!r}"
        if not base:
            base = "head" if item.role == "head" else f"worker-{index}"
            why = "its hostname is unknown or unusable as a name"
        name, suffix = base, 2
        while name in taken:
            name = f"{base[: 60 - len(str(suffix))]}-{suffix}"
            suffix += 1
        if name != base:
            why += f" ({base} is another node's)"
        taken.add(name)
        result.append((name, why))
    return result


def _name_from(hostname: str) -> str:
    first = hostname.split(".", 1)[0].lower()
    return re.sub(r"-+", "-", re.sub(r"[^a-z0-9-]", "-", first)).strip("-")[:63].strip("-")


def _node(out: _Lines, request: InitRequest, item: Probed, name: str, why: str) -> None:
    where = f"nodes[{name}]"
    out.comment(2, _who(item))
    _memory(out, item.facts, where)
    out.raw(f"  - name: {scalar(name)}  # {_safe(why)}")
    out.key(4, "role", item.role)
    if item.target is not None:
        _ssh(out, where, item.target, item)
    _model_dir(out, request, item, where)
    if item.role == "worker":
        out.comment(4, "copy the checkpoint from the head over the fabric (rsync over ssh.host); or: hub")
        out.key(4, "model_source", "peer")
    _fabric(out, item.facts.fabric, where)


def _who(item: Probed) -> str:
    reached = "this machine (no ssh:)" if item.target is None else f"{login(item.target)} over SSH"
    facts = item.facts
    user = f" ({item.user}'s)" if item.user else ""
    home = f"home {facts.home}{user}" if facts.home else "home unknown"
    return f"{item.role}: {reached}; hostname {facts.hostname or 'unknown'}; {home}"


def _ssh(out: _Lines, where: str, target: SshTarget, item: Probed) -> None:
    out.key(4, "ssh")
    _ssh_host_comment(out, where, target.host, item.facts.fabric)
    out.key(6, "host", target.host)
    if target.port != SshTarget.model_fields["port"].default:
        out.key(6, "port", target.port)
    if target.user:
        out.key(6, "user", target.user)
    else:
        out.comment(6, f"no user given: the user running the reconciler ({item.user or 'unknown'} answered)")
    if target.identity_file:
        out.key(6, "identity_file", target.identity_file)
    out.comment(6, "host keys are checked against this file on every connection, never added")
    out.key(6, "known_hosts", target.known_hosts)


def _ssh_host_comment(out: _Lines, where: str, host: str, fabric: FabricFacts) -> None:
    """The checkpoint copy (some 470 GB) runs over ssh.host: it should be the fabric address."""
    try:
        ipaddress.IPv4Address(host)
    except ValueError:
        fabric_ip = f" ({fabric.ip})" if fabric.ip else ""
        out.comment(6, f"a name: it should resolve to the node's fabric address{fabric_ip}, which carries the copy")
        return
    if host == fabric.ip:
        out.comment(6, "the node's fabric address: the checkpoint copy (rsync over SSH) takes the fabric")
    elif fabric.ip is not None:
        out.review(
            6,
            f"{where}.ssh.host",
            f"{host} is not the node's fabric address ({fabric.ip}): the checkpoint copy (rsync over SSH, "
            f"~{human_bytes(FULL_SIZE_WORKER)}) would take the slower network. Use {fabric.ip} (its host key must "
            "be in known_hosts too), or keep this one knowingly.",
        )


def _model_dir(out: _Lines, request: InitRequest, item: Probed, where: str) -> None:
    facts = item.facts
    need = FULL_SIZE_HEAD if item.role == "head" else FULL_SIZE_WORKER
    free = facts.checkpoint.disk_free
    path = expand_home(request.model_dir, facts.home) if facts.home else request.model_dir
    what = (
        "the head downloads and reassembles the checkpoint here"
        if item.role == "head"
        else "the checkpoint is copied here"
    )
    if free is None:
        out.review(4, f"{where}.model_dir", f"free space at {path} unknown; {what} (~{human_bytes(need)})")
    elif free < need:
        out.review(
            4,
            f"{where}.model_dir",
            f"only {human_bytes(free)} free at {path}; {what} and needs ~{human_bytes(need)}. Point model_dir at a "
            "larger disk: edit it here, or move this file aside and run init again with --model-dir PATH.",
        )
    else:
        out.comment(4, f"detected: {human_bytes(free)} free at {path}; {what} (~{human_bytes(need)})")
    out.key(4, "model_dir", request.model_dir)


def _fabric(out: _Lines, fabric: FabricFacts, where: str) -> None:
    here = f"{where}.fabric"
    if fabric.ifname is None:
        _fabric_undecided(out, fabric, here)
        return
    out.key(4, "fabric")
    if fabric.ip is None:
        _fabric_address_undecided(out, fabric, fabric.ifname, here)
    else:
        _fabric_decided(out, fabric, fabric.ifname, fabric.ip, here)


def _fabric_address_undecided(out: _Lines, fabric: FabricFacts, ifname: str, here: str) -> None:
    out.comment(6, f"detected: {ifname} is on an ACTIVE RoCE port{_hcas_text(fabric)}")
    out.key(6, "ifname", ifname)
    out.review(
        6, f"{here}.ip", f"{fabric.problem or 'no address'}. Uncomment the address the other nodes reach (same subnet):"
    )
    out.lines += [f"      # ip: {scalar(_safe(candidate))}" for candidate in fabric.candidates]


def _fabric_decided(out: _Lines, fabric: FabricFacts, ifname: str, ip: str, here: str) -> None:
    cidr = f"{ip}/{fabric.prefixlen}" if fabric.prefixlen is not None else ip
    mtu = f"; MTU {fabric.mtu}" if fabric.mtu is not None else ""
    out.comment(6, f"detected: {ifname} carries {cidr} and is RoCE-capable{_hcas_text(fabric)}{mtu}")
    out.key(6, "ifname", ifname)
    out.key(6, "ip", ip)
    if fabric.hcas:
        out.raw(f"      hcas: [{', '.join(scalar(hca) for hca in fabric.hcas)}]")
    else:
        out.review(
            6,
            f"{here}.hcas",
            f"no ACTIVE port's GID {GID_INDEX} holds ::ffff:{ip}, so NCCL_IB_HCA stays unset (NCCL chooses). "
            f"Find the GID index holding it (`cat /sys/class/infiniband/*/ports/1/gids/*`) and set gid_index, or "
            "list hcas: [...] by hand.",
        )
    out.key(6, "gid_index", GID_INDEX)


def _hcas_text(fabric: FabricFacts) -> str:
    ports = [port for port in fabric.ports if port.hca in fabric.hcas]
    if not ports:
        return ""
    described = [
        f"{port.hca} ACTIVE, GID {GID_INDEX} = ::ffff:{port.gid_ipv4}" + (f" {port.gid_type}" if port.gid_type else "")
        for port in ports
    ]
    return f" ({'; '.join(described)})"


def _fabric_undecided(out: _Lines, fabric: FabricFacts, here: str) -> None:
    """No interface decided: the whole `fabric:` block stays commented, so the spec still loads
    (detection then runs each pass and blocks the rank group, saying the same)."""
    if fabric.candidates:
        out.review(
            4,
            here,
            f"{fabric.problem}. Uncomment `fabric:` and the one interface cabled to the other nodes (the same QSFP "
            "port on every node); its address and HCAs follow from it:",
        )
        out.raw("    # fabric:")
        out.lines += [f"    #   ifname: {scalar(_safe(candidate))}" for candidate in fabric.candidates]
        return
    out.review(
        4,
        here,
        f"{fabric.problem or 'no fabric interface detected'}. Fix the link and run `reconciler init` again, or "
        "fill in the QSFP port and its address (`rdma link`, `ip -br addr`):",
    )
    out.raw("    # fabric:")
    out.raw("    #   ifname: <the interface, e.g. enp1s0f1np1>")
    out.raw("    #   ip: <its IPv4>")


def _memory(out: _Lines, facts: NodeFacts, where: str) -> None:
    memory = facts.memory
    if memory is None:
        out.review(2, where, "memory unknown (/proc/meminfo unreadable): `reconciler doctor` checks it again")
        return
    util = Serving.model_fields["gpu_util"].default
    total = memory.total_kib / KIB_PER_GIB
    need = util * total
    text = (
        f"MemTotal {total:.1f} GiB, MemAvailable {memory.available_gib:.1f} GiB; vLLM starts only with "
        f"serving.gpu_util {util} x MemTotal = {need:.1f} GiB available"
    )
    if memory.available_gib < need:
        out.review(2, where, f"{text}: something holds memory now (`docker ps`, `free -h`), or lower serving.gpu_util")
    else:
        out.comment(2, f"detected: {text}")


def _cross_node(out: _Lines, probed: list[Probed], names: list[tuple[str, str]]) -> None:
    """What only several nodes together show: fabric addresses on different subnets, unequal MTUs."""
    addresses: dict[str, tuple[str, int | None]] = {}
    for item, (name, _) in zip(probed, names, strict=True):
        if item.facts.fabric.ip is not None:
            addresses[name] = (item.facts.fabric.ip, item.facts.fabric.prefixlen)
    for _, message in subnet_mismatches(addresses):
        out.review(2, "nodes", f"{message}: give every node's QSFP port an address in one subnet (netplan)")
    mtus = {
        name: item.facts.fabric.mtu
        for item, (name, _) in zip(probed, names, strict=True)
        if item.facts.fabric.mtu is not None
    }
    if len(set(mtus.values())) > 1:
        listed = ", ".join(f"{name} {mtu}" for name, mtu in mtus.items())
        out.review(2, "nodes", f"fabric MTUs differ ({listed}): set the same on every node (netplan `mtu: 9000`)")


def _rest(out: _Lines) -> None:
    model = Model()
    out.key(0, "model")
    out.key(2, "repo", model.repo)
    out.comment(
        2,
        "a branch is resolved once and pinned on the head (`apply --update-revision` moves it); "
        "a 40-hex commit serves exactly it",
    )
    out.key(2, "revision", model.revision)
    out.raw("")
    out.key(0, "image")
    out.comment(2, "the reference image, pinned by digest so every rank runs the same bytes")
    out.key(2, "ref", REFERENCE_IMAGE)


# ---------------------------------------------------------------- validation and the next steps


def validated(text: str, path: str) -> LoadedSpec:
    """The draft through the real spec loader; a refusal names the option it came from."""
    try:
        return parse_spec(text, path)
    except SpecError as exc:
        problems = "; ".join(problem.render().replace("\n", " ") for problem in exc.problems)
        raise ReconcilerError(
            f"the drafted spec does not validate, so nothing was written: {problems}",
            "fix the option the value came from (--head, --worker, --model-dir, ...), "
            "or report it if a detected value is refused",
        ) from None


def next_steps(spec_option: str) -> list[str]:
    return [f"reconciler {command}{spec_option}" for command in ("doctor", "plan", "apply")]


# ---------------------------------------------------------------- probing (the only I/O)


def probe_nodes(request: InitRequest, transport_of: Callable[[Node], Transport] = transport_for) -> list[Probed]:
    """One doctor probe per node, in parallel; any node that does not answer stops init, every
    such node named (a spec drafted without a node's fabric would only move the failure later)."""
    missing = [problem for _, target in request.targets if target and (problem := unknown_host_key(target))]
    if missing:
        raise NodeUnreachableError("; ".join(message for message, _ in missing), "; ".join(hint for _, hint in missing))
    deployment = provisional(request)
    transports = {node.name: transport_of(node) for node in deployment.nodes}
    try:
        with ThreadPoolExecutor(max_workers=len(deployment.nodes)) as pool:
            futures = {
                node.name: pool.submit(_probe, deployment, node, transports[node.name]) for node in deployment.nodes
            }
            answers = {name: future.result() for name, future in futures.items()}
    finally:
        for transport in transports.values():
            transport.close()
    given = [target for _, target in request.targets]
    failed = [(target, answer) for target, answer in zip(given, answers.values(), strict=True) if answer.raw is None]
    if failed:
        raise NodeUnreachableError(
            "; ".join(f"{_where(target)}: {answer.error}" for target, answer in failed),
            "; ".join(dict.fromkeys(answer.hint for _, answer in failed if answer.hint)) or "check the nodes",
        )
    return probed_from_answers(request, answers)


def _where(target: SshTarget | None) -> str:
    return "this machine" if target is None else login(target)


def _probe(deployment: Deployment, node: Node, transport: Transport) -> NodeProbe:
    try:
        raw = run_program(transport, "probe", "print_probe", {**probe_args(deployment, node), "doctor": True})
    except ReconcilerError as exc:
        return NodeProbe(error=exc.message.removeprefix(f"{node.name}: "), hint=exc.hint)
    if not isinstance(raw, dict):
        return NodeProbe(error="the probe's answer is not a JSON object", hint="check python3 on the node")
    return NodeProbe(raw=raw)


def unknown_host_key(target: SshTarget) -> tuple[str, str] | None:
    """(message, hint) when known_hosts holds no key for the target: the exact commands that add it,
    after its fingerprint is checked. A key that is present but wrong is the transport's to refuse."""
    path = os.path.expanduser(target.known_hosts)
    entry = target.host if target.port == 22 else f"[{target.host}]:{target.port}"
    try:
        keys = paramiko.HostKeys(path)
    except FileNotFoundError:
        why = f"{target.known_hosts} does not exist"
    except (OSError, paramiko.SSHException, ValueError) as exc:
        return f"{login(target)}: cannot read {target.known_hosts}: {exc}", "check the file given to --known-hosts"
    else:
        if keys.lookup(entry) is not None:
            return None
        why = f"{target.known_hosts} holds no host key for {entry}"
    port = ["-p", str(target.port)] if target.port != 22 else []
    ssh = shlex.join(["ssh", *port, "-o", f"UserKnownHostsFile={path}", login(target), "true"])
    keyscan = shlex.join(["ssh-keyscan", *port, target.host])
    hint = (
        f"check the node's host key and add it: `{ssh}` shows its fingerprint; compare it with "
        f"`ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub` run on the node itself, and answer yes only if they "
        f"match (or, once verified: `{keyscan} >> {shlex.quote(path)}`); then run init again"
    )
    return f"{login(target)}: {why}; init never trusts an unseen host key", hint
