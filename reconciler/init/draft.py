"""The draft (pure): probe answers turned into spec text, each value with the reason it was
chosen, what init cannot decide marked REVIEW with the candidates commented out, never guessed.

Every value init writes that a node reported (interface, address, HCAs) is first checked against
the spec's own patterns, so a node cannot smuggle a second value or a key into the file; one the
spec would refuse is a REVIEW note, never a value.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import Any

from pydantic import ValidationError

from reconciler.components.assessment import FULL_SIZE_HEAD, FULL_SIZE_WORKER
from reconciler.errors import ReconcilerError, SpecError
from reconciler.facts.fabric import FabricFacts, subnet_mismatches
from reconciler.facts.memory import KIB_PER_GIB
from reconciler.facts.node import NodeFacts
from reconciler.fsutil import human_bytes
from reconciler.init.probe import leads_to
from reconciler.init.request import DEFAULT_STATE_DIR, REVIEW, InitRequest, Probed
from reconciler.init.yamltext import Lines, Note, flow_scalar, flow_value, scalar, single_line
from reconciler.spec import (
    GROUP_RESTART,
    REFERENCE_IMAGE,
    REFERENCE_RESTART,
    Deployment,
    Fabric,
    LoadedSpec,
    Model,
    Serving,
    SshTarget,
    expand_home,
    parse_spec,
)

# The probe reads the GID at the default index; the drafted spec says so explicitly.
GID_INDEX: int = Fabric.model_fields["gid_index"].default


@dataclass(frozen=True)
class Draft:
    text: str
    names: list[str]
    notes: list[Note]


def draft(request: InitRequest, probed: list[Probed], *, schema_ref: str | None = None) -> Draft:
    """The spec text for these nodes, with a reason on every choice and REVIEW on the undecided."""
    out = Lines()
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


def _header(out: Lines, schema_ref: str | None, count: int) -> None:
    if schema_ref is not None:
        out.raw(f"# yaml-language-server: $schema={schema_ref}", "#")
    out.comment(
        0,
        f"Written by `reconciler init` from what it found on the {count} nodes. Each value says why it was "
        f"chosen; lines marked {REVIEW} are what init could not decide: settle them, then run "
        "`reconciler doctor`, `reconciler plan` and `reconciler apply`. Every key left out takes its "
        "default: the serving section at the end lists its fields, commented out, and `reconciler schema "
        "--markdown --out -` prints what every key means. No secret is written here: the API key is "
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


def _node(out: Lines, request: InitRequest, item: Probed, name: str, why: str) -> None:
    where = f"nodes[{name}]"
    out.comment(2, _who(item))
    _memory(out, item.facts, where)
    out.raw(f"  - name: {scalar(name)}  # {single_line(why)}")
    out.key(4, "role", item.role)
    if item.target is not None:
        _ssh(out, where, item.target, item)
    _model_dir(out, request, item, where)
    if item.role == "worker":
        out.comment(4, "copy the checkpoint from the head over the fabric (rsync over ssh.host); or: hub")
        out.key(4, "model_source", "peer")
        _image_source(out, item)
    _fabric(out, item.facts.fabric, where)


def _image_source(out: Lines, item: Probed) -> None:
    """A worker that could not reach the image's registry takes the image from its peers."""
    reach = item.facts.registry
    if reach is None or reach.error is None:
        return
    out.comment(4, single_line(f"cannot reach the image's registry {reach.address} ({reach.error}):"))
    out.comment(4, "the head sends the image over the fabric")
    out.key(4, "image_source", "peer")


def _who(item: Probed) -> str:
    reached = "this machine (no ssh:)" if item.target is None else f"{item.target.login} over SSH"
    facts = item.facts
    user = f" ({item.user}'s)" if item.user else ""
    home = f"home {facts.home}{user}" if facts.home else "home unknown"
    return f"{item.role}: {reached}; hostname {facts.hostname or 'unknown'}; {home}"


def _ssh(out: Lines, where: str, target: SshTarget, item: Probed) -> None:
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


def _ssh_host_comment(out: Lines, where: str, host: str, item: Probed) -> None:
    """The checkpoint copy (some 470 GB) runs over ssh.host: it should be the fabric address."""
    fabric = item.facts.fabric
    address = item.route.target.hostname if item.route is not None else host
    leads = "" if address == host else f" (HostName {address} in the ssh config)"
    if leads and item.route is not None:
        out.comment(6, f"{host} leads to {leads_to(item.route)} by the ssh config")
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


def _model_dir(out: Lines, request: InitRequest, item: Probed, where: str) -> None:
    facts = item.facts
    need = FULL_SIZE_HEAD if item.role == "head" else FULL_SIZE_WORKER
    free = facts.checkpoint.disk_free
    path = expand_home(request.model_dir, facts.home) if facts.home else request.model_dir
    what = (
        "the head downloads and reassembles the checkpoint here"
        if item.role == "head"
        else "the checkpoint is copied here"
    )
    if free is not None and free >= need:
        out.comment(4, f"detected: {human_bytes(free)} free at {path}; {what} (~{human_bytes(need)})")
    elif free is None or free < 0:
        # A negative count is no measurement (a failed statvfs, a broken probe): unknown, not "too little".
        said = "" if free is None else f" (the node reported {free})"
        out.review(4, f"{where}.model_dir", f"free space at {path} unknown{said}; {what} (~{human_bytes(need)})")
    else:
        out.review(
            4,
            f"{where}.model_dir",
            f"only {human_bytes(free)} free at {path}; {what} and needs ~{human_bytes(need)}. Point model_dir at a "
            "larger disk: edit it here, or move this file aside and run init again with --model-dir PATH.",
        )
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


def _fabric(out: Lines, fabric: FabricFacts, where: str) -> None:
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


def _fabric_address_undecided(out: Lines, fabric: FabricFacts, ifname: str, here: str, problem: str | None) -> None:
    out.comment(6, f"detected: {ifname} is on an ACTIVE RoCE port{_hcas_text(fabric)}")
    out.key(6, "ifname", ifname)
    out.review(
        6,
        f"{here}.ip",
        f"{problem or fabric.problem or 'no address'}. Uncomment the address the other nodes reach (same subnet):",
    )
    out.raw(*(f"      # ip: {scalar(candidate)}" for candidate in fabric.candidates))


def _fabric_decided(out: Lines, fabric: FabricFacts, ifname: str, ip: str, here: str) -> None:
    cidr = f"{ip}/{fabric.prefixlen}" if fabric.prefixlen is not None else ip
    mtu = f"; MTU {fabric.mtu}" if fabric.mtu is not None else ""
    out.comment(6, f"detected: {ifname} carries {cidr} and is RoCE-capable{_hcas_text(fabric)}{mtu}")
    out.key(6, "ifname", ifname)
    out.key(6, "ip", ip)
    bad_hcas = refused("hcas", fabric.hcas) if fabric.hcas else None
    if fabric.hcas and bad_hcas is None:
        out.raw(f"      hcas: [{', '.join(flow_scalar(hca) for hca in fabric.hcas)}]")
    else:
        unset = "so NCCL_IB_HCA stays unset (NCCL chooses)"
        if bad_hcas is not None:
            why = f"the node reports HCAs the spec refuses ({bad_hcas}), {unset}. List the RDMA devices by hand "
            why += "(`rdma link`): hcas: [...]."
        else:
            why = f"no ACTIVE port's GID {GID_INDEX} holds ::ffff:{ip}, {unset}. Find the GID index holding it "
            why += "(`cat /sys/class/infiniband/*/ports/1/gids/*`) and set gid_index, or list hcas: [...] by hand."
        out.review(6, f"{here}.hcas", why)
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


def _fabric_undecided(out: Lines, fabric: FabricFacts, here: str, bad_ifname: str | None) -> None:
    """No interface decided: the whole `fabric:` block stays commented, so the spec still loads
    (detection then runs each pass and blocks the rank group, saying the same)."""
    if fabric.candidates and bad_ifname is None:
        out.review(
            4,
            here,
            f"{fabric.problem}. Uncomment `fabric:` and the one interface cabled to the other nodes (the same QSFP "
            "port on every node); its address and HCAs follow from it:",
        )
        out.raw("    # fabric:", *(f"    #   ifname: {scalar(candidate)}" for candidate in fabric.candidates))
        return
    if bad_ifname is not None:
        what = f"the node reports a fabric interface the spec refuses ({bad_ifname}). Fill in"
    else:
        problem = fabric.problem or "no fabric interface detected"
        what = f"{problem}. Fix the link and run `reconciler init` again, or fill in"
    out.review(4, here, f"{what} the QSFP port and its address (`rdma link`, `ip -br addr`):")
    out.raw("    # fabric:", "    #   ifname: <the interface, e.g. enp1s0f1np1>", "    #   ip: <its IPv4>")


def _memory(out: Lines, facts: NodeFacts, where: str) -> None:
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


def _cross_node(out: Lines, probed: list[Probed], names: list[tuple[str, str]]) -> None:
    """What only several nodes together show: fabric addresses on different subnets, unequal MTUs."""
    addresses: dict[str, tuple[str, int | None]] = {}
    mtus: dict[str, int] = {}
    for item, (name, _) in zip(probed, names, strict=True):
        fabric = item.facts.fabric
        if fabric.ip is not None and refused("ip", fabric.ip) is None:
            addresses[name] = (fabric.ip, fabric.prefixlen)
        if fabric.mtu is not None:
            mtus[name] = fabric.mtu
    for _, message in subnet_mismatches(addresses):
        out.review(2, "nodes", f"{message}: give every node's QSFP port an address in one subnet (netplan)")
    if len(set(mtus.values())) > 1:
        listed = ", ".join(f"{name} {mtu}" for name, mtu in mtus.items())
        out.review(2, "nodes", f"fabric MTUs differ ({listed}): set the same on every node (netplan `mtu: 9000`)")


def _rest(out: Lines) -> None:
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
    out.raw("")
    _serving(out)


# The one serving key written as a value: a section needs one (with comments alone it is null).
# The profile states what the drafted image.ref serves with, so it is the one to spell out.
SERVING_KEY = "profile"
# A default whose one-line form is longer than this is described instead of offered as a line.
LONGEST_LINE = 100


def _serving(out: Lines) -> None:
    """`serving:` with every field at its default under its description, commented out, so that
    uncommenting one line changes that field alone. Read off the model (its fields, defaults and
    the schema's descriptions), so the list never drifts from what the spec accepts."""
    schema = Serving.model_json_schema()
    defaults = Serving().model_dump(mode="json")
    restarts = GROUP_RESTART.removesuffix(".")
    out.comment(
        0,
        "How the ranks are started, each field at its default: uncomment a line to change that field. "
        f"{restarts}, unless the field's comment says otherwise.",
    )
    out.key(0, "serving")
    for name in Serving.model_fields:
        prop = schema["properties"][name]
        ref = prop.get("$ref")
        if isinstance(ref, str):
            _serving_section(out, name, schema["$defs"][ref.rsplit("/", 1)[-1]], defaults[name])
        else:
            _serving_field(out, name, prop["description"], defaults[name])


def _serving_field(out: Lines, name: str, description: str, default: object) -> None:
    out.comment(2, _without_restart(description))
    line = f"{name}: {flow_value(default)}"
    if name == SERVING_KEY:
        out.raw(f"  {line}")
    elif len(line) <= LONGEST_LINE:
        out.raw(f"  # {line}")
    else:
        what = f"{len(default)} entries" if isinstance(default, dict | list) else "a long value"
        out.comment(2, f"{name} is not listed here: {what} by default, which the schema lists; setting it replaces it.")


def _without_restart(description: str) -> str:
    """A serving field's description without the group restart most of them share, which the
    section's comment says once; a field only the reference profile renders says so instead."""
    return description.replace(f" {REFERENCE_RESTART}", " Profile reference only.").replace(f" {GROUP_RESTART}", "")


def _serving_section(out: Lines, name: str, section: dict[str, Any], defaults: dict[str, Any]) -> None:
    """A nested section: its description, then its fields commented below `name:` (uncomment both)."""
    out.comment(2, f"{section['description']} Uncomment `{name}:` with the lines you change.")
    out.raw(f"  # {name}:", *(f"  #   {field}: {flow_value(value)}" for field, value in defaults.items()))


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
