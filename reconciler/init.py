"""`reconciler init`: a first spec written from what the nodes say, every choice with its reason.

Writing the first spec by hand is where most setups go wrong: the fabric port, its address and
HCAs, the home a `~` means on each node, a model dir on a disk too small for the checkpoint.
Init probes every node once (the doctor's probe, over the same transports as every pass) and
drafts the spec from the answers. Each value it writes carries a comment saying what it saw;
what it cannot decide (two candidate fabric interfaces, no ACTIVE RoCE port, too little disk)
is marked REVIEW, with the candidates commented out, never guessed.

Two halves, so the interesting one is tested on fixture data: `draft(request, probed)` is pure
and turns probe answers into spec text; `probe_nodes(request)` is the only I/O. SSH host keys
are checked as everywhere: each node's route through the user's ssh config is resolved as the
transport resolves it, and a hop whose key is not in the route's known_hosts stops init with the
commands that add it after the fingerprint is verified; init never adds one itself.

Every value init writes that a node reported (interface, address, HCAs) is first checked against
the spec's own patterns, so a node cannot smuggle a second value or a key into the file; one the
spec would refuse is a REVIEW note, never a value.
"""

from __future__ import annotations

import ipaddress
import os
import re
import shlex
import textwrap
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any, Literal

import paramiko
from pydantic import TypeAdapter, ValidationError

from reconciler.components.assessment import FULL_SIZE_HEAD, FULL_SIZE_WORKER, human_bytes
from reconciler.doctor import doctor_input
from reconciler.errors import NodeUnreachableError, ReconcilerError, SpecError, SshConfigError, YamlError
from reconciler.facts.fabric import FabricFacts, subnet_mismatches
from reconciler.facts.gather import NodeProbe, probe_every_node
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
from reconciler.transport.base import Transport
from reconciler.transport.connect import transport_for
from reconciler.transport.sshconnect import known_host_keys
from reconciler.transport.sshroute import SshRoute, openssh_command, route_for
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


def ssh_target(
    text: str, option: str, *, port: int | None, identity_file: str | None, known_hosts: str | None
) -> SshTarget:
    """`[user@]host` as given to --head / --worker, checked as the spec would check it.

    Only what the user gave is set: a field set in the spec overrides the ssh config for good,
    so an option left out must stay out and let ~/.ssh/config apply (`model_fields_set`)."""
    user, at, host = text.rpartition("@")
    given = {"port": port, "identity_file": identity_file, "known_hosts": known_hosts}
    fields: dict[str, Any] = {"host": host, **{key: value for key, value in given.items() if value is not None}}
    if at:
        fields["user"] = user
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
    route: SshRoute | None = None  # the target through the ssh config, when init resolved it


def provisional(request: InitRequest) -> Deployment:
    """A deployment to probe with: the nodes as given, the spec's defaults for the rest.
    Names are placeholders; the drafted spec names each node after its hostname."""
    nodes: list[dict[str, Any]] = []
    for index, (role, target) in enumerate(request.targets):
        node: dict[str, Any] = {"name": f"node-{index}", "role": role, "model_dir": request.model_dir}
        if target is not None:
            # Unset, not default: an explicit `--ssh-port 22` must still win over the config's Port.
            node["ssh"] = target.model_dump(exclude_unset=True)
        nodes.append(node)
    return Deployment.model_validate({"nodes": nodes})


def probed_from_answers(
    request: InitRequest, answers: dict[str, NodeProbe], routes: list[SshRoute | None] | None = None
) -> list[Probed]:
    """Pure: the probes' raw answers (keyed by the provisional names) -> per-node findings."""
    deployment = provisional(request)
    facts = doctor_input(deployment, answers).facts
    routed = routes if routes is not None else [None] * len(deployment.nodes)
    return [
        Probed(role, target, _text(answers[node.name].host.get("user")), facts.nodes[node.name], route)
        for (role, target), node, route in zip(request.targets, deployment.nodes, routed, strict=True)
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
    """`value` as a block-context YAML value: plain when the spec loader reads it back as this very
    string, else double-quoted."""
    try:
        plain = load_located(f"k: {value}\n").data
    except YamlError:
        plain = None
    if isinstance(plain, dict) and plain.get("k") == value and "#" not in value and value.isprintable():
        return value
    return quoted(value)


def flow_scalar(value: str) -> str:
    """`value` as an item of a `[a, b]` list: there `,` `[` `]` `{` `}` `:` end or nest a plain
    value, so only names of the plainest characters stay plain."""
    return value if re.fullmatch(r"[A-Za-z0-9_.-]+", value) and scalar(value) == value else quoted(value)


def quoted(value: str) -> str:
    """A YAML double-quoted string holding exactly `value`, on one line of printable ASCII:
    everything else is escaped (a raw line break would be folded into a space, and U+2028 or NEL
    would end the line for some readers)."""
    parts = ['"']
    for char in value:
        code = ord(char)
        if char in '"\\':
            parts.append("\\" + char)
        elif 0x20 <= code < 0x7F:
            parts.append(char)
        elif code <= 0xFF:
            parts.append(f"\\x{code:02x}")
        elif code <= 0xFFFF:
            parts.append(f"\\u{code:04x}")
        else:
            parts.append(f"\\U{code:08x}")
    return "".join(parts) + '"'


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
        "`reconciler doctor`, `reconciler plan` and `reconciler apply`. Every key left out takes its "
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
    """Only what the user gave: anything else written here would override ~/.ssh/config for good."""
    given = target.model_fields_set
    out.key(4, "ssh")
    _ssh_host_comment(out, where, target.host, item)
    out.key(6, "host", target.host)
    if "port" in given:
        out.key(6, "port", target.port)
    if target.user:
        out.key(6, "user", target.user)
    else:
        out.comment(
            6,
            "no user given: the ssh config's User, else the user running the reconciler "
            f"({item.user or 'unknown'} answered)",
        )
    if target.identity_file:
        out.key(6, "identity_file", target.identity_file)
    if "known_hosts" in given:
        out.comment(6, "host keys are checked against this file on every connection, never added")
        out.key(6, "known_hosts", target.known_hosts)
    else:
        out.comment(
            6,
            "port, key and known_hosts left out: the ssh config's for this host, else the defaults; host keys are "
            "checked on every connection, never added",
        )


def _ssh_host_comment(out: _Lines, where: str, host: str, item: Probed) -> None:
    """The checkpoint copy (some 470 GB) runs over ssh.host: it should be the fabric address."""
    fabric = item.facts.fabric
    address = item.route.target.hostname if item.route is not None else host
    leads = "" if address == host else f" (HostName {address} in the ssh config)"
    if leads and item.route is not None:
        out.comment(6, f"{host} leads to {_leads_to(item.route)} by the ssh config")
    try:
        ipaddress.IPv4Address(address)
    except ValueError:
        fabric_ip = f" ({fabric.ip})" if fabric.ip else ""
        out.comment(6, f"a name: it should resolve to the node's fabric address{fabric_ip}, which carries the copy")
        return
    if address == fabric.ip:
        out.comment(6, "the node's fabric address: the checkpoint copy (rsync over SSH) takes the fabric")
    elif fabric.ip is not None:
        out.review(
            6,
            f"{where}.ssh.host",
            f"{host}{leads} is not the node's fabric address ({fabric.ip}): the checkpoint copy (rsync over SSH, "
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
    if free is None or free < 0:
        # A negative count is no measurement (a failed statvfs, a broken probe): unknown, not "too little".
        said = "" if free is None else f" (the node reported {free})"
        out.review(
            4,
            f"{where}.model_dir",
            f"free space at {path} unknown{said}; {what} (~{human_bytes(need)})",
        )
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


def refused(field_name: str, value: object) -> str | None:
    """Why the spec would refuse a node-reported `fabric.<field_name>`, or None. Only values the
    spec accepts are written, so a name a node made up (`a, b`, a line break) can never become
    two values or a key; the rest is reported for review."""
    try:
        Fabric.model_validate({field_name: value})
    except ValidationError as exc:
        return str(exc.errors()[0]["msg"])
    return None


def _fabric(out: _Lines, fabric: FabricFacts, where: str) -> None:
    here = f"{where}.fabric"
    bad_ifname = refused("ifname", fabric.ifname) if fabric.ifname is not None else None
    if fabric.ifname is None or bad_ifname is not None:
        _fabric_undecided(out, fabric, here, bad_ifname)
        return
    out.key(4, "fabric")
    bad_ip = refused("ip", fabric.ip) if fabric.ip is not None else None
    if fabric.ip is None or bad_ip is not None:
        problem = bad_ip and f"the node reports an address the spec refuses ({bad_ip})"
        _fabric_address_undecided(out, fabric, fabric.ifname, here, problem)
    else:
        _fabric_decided(out, fabric, fabric.ifname, fabric.ip, here)


def _fabric_address_undecided(out: _Lines, fabric: FabricFacts, ifname: str, here: str, problem: str | None) -> None:
    out.comment(6, f"detected: {ifname} is on an ACTIVE RoCE port{_hcas_text(fabric)}")
    out.key(6, "ifname", ifname)
    out.review(
        6,
        f"{here}.ip",
        f"{problem or fabric.problem or 'no address'}. Uncomment the address the other nodes reach (same subnet):",
    )
    out.lines += [f"      # ip: {scalar(candidate)}" for candidate in fabric.candidates]


def _fabric_decided(out: _Lines, fabric: FabricFacts, ifname: str, ip: str, here: str) -> None:
    cidr = f"{ip}/{fabric.prefixlen}" if fabric.prefixlen is not None else ip
    mtu = f"; MTU {fabric.mtu}" if fabric.mtu is not None else ""
    out.comment(6, f"detected: {ifname} carries {cidr} and is RoCE-capable{_hcas_text(fabric)}{mtu}")
    out.key(6, "ifname", ifname)
    out.key(6, "ip", ip)
    bad_hcas = refused("hcas", fabric.hcas) if fabric.hcas else None
    if fabric.hcas and bad_hcas is None:
        out.raw(f"      hcas: [{', '.join(flow_scalar(hca) for hca in fabric.hcas)}]")
    elif bad_hcas is not None:
        out.review(
            6,
            f"{here}.hcas",
            f"the node reports HCAs the spec refuses ({bad_hcas}), so NCCL_IB_HCA stays unset (NCCL chooses). "
            "List the RDMA devices by hand (`rdma link`): hcas: [...].",
        )
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


def _fabric_undecided(out: _Lines, fabric: FabricFacts, here: str, bad_ifname: str | None) -> None:
    """No interface decided: the whole `fabric:` block stays commented, so the spec still loads
    (detection then runs each pass and blocks the rank group, saying the same)."""
    if fabric.candidates and bad_ifname is None:
        out.review(
            4,
            here,
            f"{fabric.problem}. Uncomment `fabric:` and the one interface cabled to the other nodes (the same QSFP "
            "port on every node); its address and HCAs follow from it:",
        )
        out.raw("    # fabric:")
        out.lines += [f"    #   ifname: {scalar(candidate)}" for candidate in fabric.candidates]
        return
    if bad_ifname is not None:
        what = f"the node reports a fabric interface the spec refuses ({bad_ifname}). Fill in"
    else:
        problem = fabric.problem or "no fabric interface detected"
        what = f"{problem}. Fix the link and run `reconciler init` again, or fill in"
    out.review(4, here, f"{what} the QSFP port and its address (`rdma link`, `ip -br addr`):")
    out.raw("    # fabric:")
    out.raw("    #   ifname: <the interface, e.g. enp1s0f1np1>")
    out.raw("    #   ip: <its IPv4>")


def _memory(out: _Lines, facts: NodeFacts, where: str) -> None:
    memory = facts.memory
    if memory is None or memory.total_kib <= 0 or memory.available_kib < 0:
        # MemTotal 0 would make every availability look sufficient: a reading that cannot be
        # true is unknown, never "detected".
        why = (
            "/proc/meminfo unreadable"
            if memory is None
            else f"/proc/meminfo says MemTotal {memory.total_kib} kB, MemAvailable {memory.available_kib} kB"
        )
        out.review(2, where, f"memory unknown ({why}): `reconciler doctor` checks it again")
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
        fabric = item.facts.fabric
        if fabric.ip is not None and refused("ip", fabric.ip) is None:
            addresses[name] = (fabric.ip, fabric.prefixlen)
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
    out.comment(2, "the default serving image, pinned by digest so every rank runs the same bytes")
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
    routes = routes_for(request)
    missing = [problem for route in routes if route is not None for problem in unknown_host_keys(route)]
    if missing:
        raise NodeUnreachableError(
            "; ".join(message for message, _ in missing),
            "; ".join(dict.fromkeys(hint for _, hint in missing)) + "; then run init again",
        )
    deployment = provisional(request)
    transports = {node.name: transport_of(node) for node in deployment.nodes}
    try:
        answers = probe_every_node(deployment, transports, doctor=True)
    finally:
        for transport in transports.values():
            transport.close()
    given = [target for _, target in request.targets]
    failed = [
        (target, name, answer)
        for target, (name, answer) in zip(given, answers.items(), strict=True)
        if answer.raw is None
    ]
    if failed:
        # The probe's error names the node as init named it; the message names the login.
        errors = [
            f"{_where(target)}: {(answer.error or '').removeprefix(f'{name}: ')}" for target, name, answer in failed
        ]
        raise NodeUnreachableError(
            "; ".join(errors),
            "; ".join(dict.fromkeys(answer.hint for _, _, answer in failed if answer.hint)) or "check the nodes",
        )
    return probed_from_answers(request, answers, routes)


def _where(target: SshTarget | None) -> str:
    return "this machine" if target is None else login(target)


def routes_for(request: InitRequest) -> list[SshRoute | None]:
    """Each node's route through the user's ssh config, resolved as the transport resolves it
    (aliases, HostName, Port, UserKnownHostsFile, ProxyJump); None for this machine."""
    return [None if target is None else route_for(login(target), target) for _, target in request.targets]


def unknown_host_keys(route: SshRoute) -> list[tuple[str, str]]:
    """(message, hint) for each hop of the route, jump hosts included, whose key none of the
    route's known_hosts files holds under the name the transport looks it up by; each hint the
    exact commands that add it once its fingerprint is checked. A key that is present but wrong
    is the transport's to refuse."""
    files = ", ".join(route.known_hosts)
    keys: paramiko.HostKeys | None = None
    if not any(os.path.exists(path) for path in route.known_hosts):
        held = (
            f"{files} does not exist, so it holds no host key"
            if len(route.known_hosts) == 1
            else f"none of {files} exists, so none holds a host key"
        )
    else:
        try:
            keys = known_host_keys(route)
        except SshConfigError as exc:
            return [(exc.message, "check that file (--known-hosts, or UserKnownHostsFile in the ssh config)")]
        held = f"{files} holds no host key" if len(route.known_hosts) == 1 else f"none of {files} holds a host key"
    problems = []
    for index, hop in enumerate(route.hops):
        if keys is not None and keys.lookup(hop.host_key_name) is not None:
            continue
        message = f"{route.node}: {held} for {hop.host_key_name}{_hop_text(route, index)}"
        problems.append((f"{message}; init never trusts an unseen host key", _add_key_hint(route, index)))
    return problems


def _hop_text(route: SshRoute, index: int) -> str:
    hop = route.hops[index]
    if hop is not route.target:
        return f" (jump host {hop.describe()} on the way to {route.target.name})"
    if hop.name != hop.hostname or hop.host_key_alias or route.jumps or route.proxy_command:
        return f" ({hop.name} is {_leads_to(route)} by the ssh config)"
    return ""


def _leads_to(route: SshRoute) -> str:
    """Where the route's name leads, and how it is reached."""
    via = f" via {', '.join(jump.describe() for jump in route.jumps)}" if route.jumps else ""
    return f"{route.target.address}{via}{' over its ProxyCommand' if route.proxy_command else ''}"


def _add_key_hint(route: SshRoute, index: int) -> str:
    """Scan the hop's key from where the route reaches it, show its fingerprint, and file it in
    the first known_hosts file under the name the transport looks up (HostKeyAlias, if set)."""
    hop = route.hops[index]
    scan = ["ssh-keyscan", "-p", str(hop.port), hop.hostname]
    if index:
        # Behind a jump host the hop is reachable only from there: scan over the route to it.
        previous = route.hops[index - 1]
        scan = [*openssh_command(replace(route, target=previous, jumps=route.hops[: index - 1])), previous.name, *scan]
    shown = shlex.join(scan)
    filed = shown + (f" | sed {shlex.quote(f's|^[^ ]*|{hop.host_key_alias}|')}" if hop.host_key_alias else "")
    add = f"`{filed} >> {shlex.quote(route.known_hosts[0])}`"
    if index == 0 and route.proxy_command:
        return (
            f"{hop.hostname} is reached through the ProxyCommand, which ssh-keyscan cannot use: run "
            f"`{shlex.join(scan)}` where {hop.hostname} is reachable, check the fingerprint against "
            f"`ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub` on {hop.hostname} itself, and append the line to "
            f"{route.known_hosts[0]}" + (f" under the name {hop.host_key_alias}" if hop.host_key_alias else "")
        )
    return (
        f"check {hop.hostname}'s host key, then add it: `{shown} | ssh-keygen -lf -` shows the fingerprints it "
        "offers; compare them with `ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub` run on that host itself, "
        f"and only if they match: {add}"
    )
