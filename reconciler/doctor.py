"""`reconciler doctor`: every prerequisite on every node, PASS / WARN / FAIL, each with its fix.

Most two-Spark failures are a missing prerequisite found twelve minutes into a boot (a wrong
fabric port, no NVIDIA runtime, memory held by something else). The doctor checks them all up
front. Its checks are pure functions of what `gather_doctor` collects in one probe round trip
per node (the plan's probe plus host details: clock, tools, Docker runtimes, NVIDIA driver),
so they are tested on fixtures. A check whose evidence could not be gathered says so; it never
passes by default. Fabric checks use the plan's own resolution, so doctor and plan agree.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Literal

from reconciler.actions import Blocker
from reconciler.clock import utc_iso
from reconciler.components import hostcheck
from reconciler.components.assessment import (
    FULL_SIZE_HEAD,
    FULL_SIZE_WORKER,
    GB,
    assess,
    checkpoint_on,
    is_part,
)
from reconciler.components.fabric import resolve_fabric
from reconciler.components.ranks import owned_containers
from reconciler.errors import SshConfigError
from reconciler.facts.fabric import RdmaPort, subnet_mismatches
from reconciler.facts.gather import NodeProbe, probe_every_node, probe_facts, with_hub_listing
from reconciler.facts.memory import KIB_PER_GIB
from reconciler.facts.node import Facts, NodeFacts
from reconciler.fsutil import human_bytes
from reconciler.record import replace
from reconciler.serving import ResolvedFabric
from reconciler.spec import Deployment, Node
from reconciler.spec.imageref import local_name
from reconciler.transport.base import Transport
from reconciler.transport.sshroute import SshRoute, route_for

Status = Literal["PASS", "WARN", "FAIL"]
ALL_NODES = "all nodes"
# The Hub repo's size (about 462 GB), assumed while no node holds a complete checkpoint.
REFERENCE_CHECKPOINT_BYTES = 462 * GB
# A pre-boot rule from practice: MemAvailable >= per-rank weight bytes + this margin (see docs/sources.md).
BOOT_MARGIN_GIB = 12.0
# Driver 580.126 capped the CX-7 at ~13 Gbps; fixed in 580.142 (see docs/sources.md).
FIXED_DRIVER = (580, 142)
CLOCK_SKEW_S = 1.0
_DRIVER_RE = re.compile(r"\b(\d{3})\.(\d+)(?:\.\d+)?\b")


@dataclass(frozen=True)
class Check:
    """One prerequisite on one node (or across all nodes): its verdict, evidence and fix."""

    node: str
    name: str
    status: Status
    message: str
    fix: str = ""

    def to_dict(self) -> dict[str, str]:
        return {"node": self.node, "check": self.name, "status": self.status, "message": self.message, "fix": self.fix}


@dataclass(frozen=True)
class DoctorInput:
    """Everything the checks look at: each node's probe and the facts built from it."""

    probes: dict[str, NodeProbe]
    facts: Facts


@dataclass
class Report:
    deployment: str
    checks: list[Check] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        return any(check.status == "FAIL" for check in self.checks)

    def counts(self) -> dict[str, int]:
        return {status: sum(c.status == status for c in self.checks) for status in ("PASS", "WARN", "FAIL")}

    def to_dict(self) -> dict[str, object]:
        return {
            "ok": not self.failed,
            "deployment": self.deployment,
            "summary": self.counts(),
            "checks": [check.to_dict() for check in self.checks],
        }


# ---------------------------------------------------------------- gathering (the only I/O)


def run(deployment: Deployment, transports: dict[str, Transport]) -> Report:
    return check_all(deployment, gather_doctor(deployment, transports))


def gather_doctor(deployment: Deployment, transports: dict[str, Transport]) -> DoctorInput:
    """One doctor probe per node, in parallel; then the Hub listing, as a plan pass does."""
    answers = probe_every_node(deployment, transports, doctor=True)
    probes = {
        name: replace(probe, route=_route(deployment.node(name))) if probe.raw is not None else probe
        for name, probe in answers.items()
    }
    data = doctor_input(deployment, probes)
    head = deployment.head.name
    nodes = {**data.facts.nodes, head: with_hub_listing(deployment, data.facts.nodes[head])}
    return DoctorInput(probes, data.facts.model_copy(update={"nodes": nodes}))


def doctor_input(deployment: Deployment, probes: dict[str, NodeProbe]) -> DoctorInput:
    """Facts from each node's probe output (pure)."""
    nodes = {node.name: probe_facts(node, probes[node.name], without_docker=True) for node in deployment.nodes}
    return DoctorInput(probes, Facts(taken_at=utc_iso(), nodes=nodes))


def _route(node: Node) -> SshRoute | None:
    """The route the transport just logged in along; resolving it again costs one small file read."""
    if node.ssh is None:
        return None
    try:
        return route_for(node.name, node.ssh)
    except SshConfigError:
        return None  # the config changed since the login; the ssh check falls back to the spec


# ---------------------------------------------------------------- checks (pure)


def check_all(deployment: Deployment, data: DoctorInput) -> Report:
    checks = [check for _, node in deployment.ranked_nodes for check in node_checks(deployment, node, data)]
    return Report(deployment.name, [*checks, *cross_node_checks(deployment, data)])


@dataclass(frozen=True)
class _Subject:
    """One node as the per-node checks see it."""

    deployment: Deployment
    node: Node
    probe: NodeProbe
    facts: Facts

    @property
    def observed(self) -> NodeFacts:
        return self.facts.nodes[self.node.name]

    def check(self, name: str, status: Status, message: str, fix: str = "") -> Check:
        return Check(self.node.name, name, status, message, fix)


def node_checks(deployment: Deployment, node: Node, data: DoctorInput) -> list[Check]:
    subject = _Subject(deployment, node, data.probes[node.name], data.facts)
    probe = subject.probe
    if probe.ssh_failed:
        skipped = subject.check("other checks", "WARN", "not checked: the node did not answer", "fix SSH first")
        return [subject.check("ssh", "FAIL", probe.error or "no answer", probe.hint), skipped]
    checks = [_ssh(subject)]
    if probe.raw is None:
        return [*checks, subject.check("python3", "FAIL", probe.error or "the probe failed", probe.hint)]
    return checks + [check(subject) for check in _NODE_CHECKS]


def _ssh(subject: _Subject) -> Check:
    target = subject.node.ssh
    if target is None:
        return subject.check("ssh", "PASS", "the machine running the reconciler (no ssh: in the spec)")
    route = subject.probe.route
    if route is None:
        message = f"{target.login}:{target.port} answered; host keys match {target.known_hosts}"
        return subject.check("ssh", "PASS", message)
    message = f"{route.describe()} answered; host keys match {', '.join(route.known_hosts)}"
    if route.entries:
        message += f"; ssh config: {'; '.join(route.entries)}"
    if route.notes:
        fix = "remove or fix those lines to silence this; host keys are checked either way"
        return subject.check("ssh", "WARN", f"{message}; {'; '.join(route.notes)}", fix)
    return subject.check("ssh", "PASS", message)


def _python(subject: _Subject) -> Check:
    return subject.check("python3", "PASS", f"python3 {subject.probe.host.get('python', '?')} ran the probe")


def _rsync(subject: _Subject) -> Check:
    found = (subject.probe.host.get("tools") or {}).get("rsync")
    if found:
        return subject.check("rsync", "PASS", str(found))
    return subject.check("rsync", "FAIL", "rsync not found", "sudo apt install rsync (copying to peers uses it)")


def _docker(subject: _Subject) -> Check:
    error = subject.probe.docker_error
    user = subject.probe.host.get("user", "the user")
    if error is None:
        version = (subject.probe.host.get("docker_info") or {}).get("server_version") or "?"
        return subject.check("docker", "PASS", f"Docker {version} answers to {user}")
    if "PermissionError" in error or "Permission denied" in error:
        fix = f"sudo usermod -aG docker {user}, then log in again"
        return subject.check("docker", "FAIL", f"{user} may not use Docker: {error}", fix)
    return subject.check("docker", "FAIL", f"Docker does not answer: {error}", "sudo systemctl enable --now docker")


def _nvidia_runtime(subject: _Subject) -> Check:
    info = subject.probe.host.get("docker_info") or {}
    if "error" in info or subject.probe.docker_error:
        return subject.check("nvidia runtime", "WARN", "not checked: Docker does not answer", "fix Docker first")
    runtimes = list(info.get("runtimes") or [])
    listed = ", ".join(runtimes)
    if "nvidia" in runtimes:
        return subject.check("nvidia runtime", "PASS", f"Docker runtimes: {listed}")
    configure = "sudo nvidia-ctk runtime configure --runtime=docker && sudo systemctl restart docker"
    gpus_off = subject.deployment.serving.gpus == "none"
    note = " (serving.gpus is none in this spec, so its ranks start without it)" if gpus_off else ""
    tools = subject.probe.host.get("tools") or {}
    if tools.get("nvidia-ctk") or tools.get("nvidia-container-runtime-hook"):
        message = f"nvidia-container-toolkit is installed but not a Docker runtime (runtimes: {listed})"
        return subject.check("nvidia runtime", "WARN", message + note, configure)
    message = f"Docker has no nvidia runtime (runtimes: {listed or 'none'}) and no nvidia-container-toolkit"
    return subject.check(
        "nvidia runtime", "FAIL", message + note, f"install nvidia-container-toolkit, then {configure}"
    )


def _gpu_driver(subject: _Subject) -> Check:
    text = subject.probe.host.get("nvidia_driver")
    if not text:
        message = "no NVIDIA driver loaded (/proc/driver/nvidia/version is absent)"
        return subject.check("gpu driver", "FAIL", message, "install the DGX OS NVIDIA driver, 580.142 or later")
    match = _DRIVER_RE.search(str(text))
    if match is None:
        return subject.check("gpu driver", "WARN", f"unrecognised driver version: {str(text).strip()[:80]}")
    version = (int(match.group(1)), int(match.group(2)))
    if version < FIXED_DRIVER:
        message = f"driver {match.group(0)} caps the CX-7 at ~13 Gbps (fixed in 580.142)"
        return subject.check("gpu driver", "WARN", message, "upgrade the NVIDIA driver to 580.142 or later")
    return subject.check("gpu driver", "PASS", f"NVIDIA driver {match.group(0)}")


def _rdma_port(subject: _Subject) -> Check:
    ports = subject.observed.fabric.ports
    active = [f"{p.hca}/{p.port} ({', '.join(p.netdevs) or 'no netdev'})" for p in ports if p.active]
    root = ((subject.probe.raw or {}).get("fabric") or {}).get("sysfs_root")
    source = f" (sysfs read from {root}, RECONCILER_SYSFS_ROOT)" if root and root != "/sys" else ""
    if active:
        return subject.check("rdma port", "PASS", f"ACTIVE: {', '.join(active)}{source}")
    if ports:
        states = ", ".join(f"{p.hca}/{p.port} {p.state or 'unknown'}" for p in ports)
        fix = "plug the QSFP cable into the same port on every node; `rdma link` must show state ACTIVE"
        return subject.check("rdma port", "FAIL", f"no ACTIVE RDMA port: {states}{source}", fix)
    fix = "load the CX-7 drivers (mlx5_core, mlx5_ib); `rdma link` lists the ports"
    return subject.check("rdma port", "FAIL", f"no RDMA device{source}", fix)


def _fabric_address(subject: _Subject) -> Check:
    resolved = resolve_fabric(subject.node, subject.facts)
    if isinstance(resolved, Blocker):
        return subject.check("fabric address", "FAIL", resolved.message, resolved.hint)
    prefix = _prefix(subject.facts, subject.node.name, resolved)
    where = f"{resolved.ip}/{prefix}" if prefix is not None else resolved.ip
    origin = " (from the spec)" if subject.node.fabric.ip or subject.node.fabric.ifname else ""
    return subject.check("fabric address", "PASS", f"{resolved.ifname} {where}{origin}")


def _roce_gid(subject: _Subject) -> Check:
    resolved = resolve_fabric(subject.node, subject.facts)
    index = subject.node.fabric.gid_index
    if isinstance(resolved, Blocker):
        return subject.check("roce gid", "WARN", "not checked: no fabric address", "fix the fabric address first")
    moved = [
        f
        for f in hostcheck.fabric_faults(subject.deployment, subject.facts)
        if f.node == subject.node.name and f.check == "roce gid"
    ]
    if moved:
        return subject.check("roce gid", "FAIL", moved[0].message, moved[0].fix)
    if subject.node.fabric.hcas is not None:
        return subject.check("roce gid", "PASS", f"HCAs from the spec: {', '.join(resolved.hcas)}")
    if not resolved.hcas:
        message = f"no ACTIVE port's GID {index} holds ::ffff:{resolved.ip}: NCCL_IB_HCA stays unset (NCCL chooses)"
        fix = (
            f"`cat /sys/class/infiniband/*/ports/1/gids/{index}`; set nodes[{subject.node.name}].fabric.gid_index "
            "to the index holding the IPv4-mapped address, or .hcas"
        )
        return subject.check("roce gid", "WARN", message, fix)
    ports = [p for p in subject.observed.fabric.ports if p.hca in resolved.hcas]
    odd = [f"{p.hca} ({p.gid_type})" for p in ports if p.gid_type and p.gid_type != "RoCE v2"]
    if odd:
        message = f"GID {index} is not RoCE v2 on {', '.join(odd)}"
        return subject.check("roce gid", "WARN", message, "use the GID index whose type is RoCE v2 (fabric.gid_index)")
    return subject.check(
        "roce gid", "PASS", f"NCCL_IB_HCA {','.join(resolved.hcas)}: GID {index} = ::ffff:{resolved.ip}"
    )


def _disk(subject: _Subject) -> Check:
    """Free space for what the checkpoint still needs, computed as the checkpoint plan's preflight."""
    observed = subject.observed.checkpoint
    if observed.disk_free is None:
        return subject.check("disk", "WARN", f"free space in {subject.node.model_dir} unknown")
    tree, expect = checkpoint_on(subject.deployment, subject.facts, subject.node)
    files = tree.files if tree is not None else {}
    state = assess(files, expect)
    free = human_bytes(observed.disk_free)
    if not (state.missing or state.corrupt or state.assemblable):
        return subject.check("disk", "PASS", f"checkpoint complete; {free} free")
    full = FULL_SIZE_HEAD if subject.node.role == "head" else FULL_SIZE_WORKER
    present = sum(info.size for info in files.values())
    need = state.missing_bytes if state.sizes_known else max(full - present, 0)
    basis = " (Hub listing)" if state.sizes_known else f" (full size ~{human_bytes(full)} assumed: no Hub listing)"
    message = f"{human_bytes(need)} needed{basis}, {free} free in {subject.node.model_dir}"
    if need > observed.disk_free:
        return subject.check("disk", "FAIL", message, "free space, or point nodes[].model_dir at a larger disk")
    return subject.check("disk", "PASS", message)


def _memory(subject: _Subject) -> Check:
    memory = subject.observed.memory
    if memory is None:
        return subject.check("memory", "WARN", "MemAvailable unknown (/proc/meminfo unreadable)")
    available = memory.available_gib
    running = [
        c.name for c in owned_containers(subject.deployment, subject.facts, subject.node.name) if c.status == "running"
    ]
    if running:
        message = f"{', '.join(running)} running, weights loaded; MemAvailable {available:.1f} GiB"
        return subject.check("memory", "PASS", message)
    util = subject.deployment.serving.gpu_util
    vllm_need = util * memory.total_kib / KIB_PER_GIB
    weights, basis = checkpoint_weight_bytes(subject.deployment, subject.facts)
    per_rank = weights / len(subject.deployment.nodes) / 1024**3
    rule_need = per_rank + BOOT_MARGIN_GIB
    message = (
        f"MemAvailable {available:.1f} GiB; vLLM's start check needs gpu_util {util} x MemTotal = {vllm_need:.1f} GiB; "
        f"per-rank weights {per_rank:.1f} GiB ({human_bytes(weights)} / {len(subject.deployment.nodes)} ranks, "
        f"{basis}) + {BOOT_MARGIN_GIB:g} GiB margin = {rule_need:.1f} GiB"
    )
    if available < vllm_need:
        fix = (
            "stop what holds memory (`docker ps`, `free -h`), drop the page cache "
            "(`sync; echo 3 | sudo tee /proc/sys/vm/drop_caches`), or lower serving.gpu_util"
        )
        return subject.check("memory", "FAIL", message, fix)
    if available < rule_need:
        fix = (
            "free memory before the ranks start (stop other containers, drop the page cache); the estimate counts "
            "every checkpoint byte as resident, lazy loading and disk-resident Engram tables keep part on disk"
        )
        return subject.check("memory", "WARN", message, fix)
    return subject.check("memory", "PASS", message)


def checkpoint_weight_bytes(deployment: Deployment, facts: Facts) -> tuple[int, str]:
    """Bytes of a complete checkpoint found on a node (its own files), else the Hub checkpoint's 462 GB."""
    for _, node in deployment.ranked_nodes:
        tree, expect = checkpoint_on(deployment, facts, node)
        if tree is not None and tree.files and assess(tree.files, expect).complete:
            size = sum(info.size for name, info in tree.files.items() if not is_part(name))
            return size, f"the size of the checkpoint on {node.name}"
    return REFERENCE_CHECKPOINT_BYTES, "the published checkpoint's size, assumed: no node holds a complete one yet"


def _image(subject: _Subject) -> Check:
    ref = subject.deployment.image.ref
    if subject.probe.docker_error:
        return subject.check("image", "WARN", "not checked: Docker does not answer", "fix Docker first")
    if local_name(subject.observed.images, ref) is not None:
        return subject.check("image", "PASS", f"{ref} present")
    return subject.check(
        "image", "WARN", f"{ref} not pulled yet", f"`reconciler apply` pulls it (or: docker pull {ref})"
    )


def _listeners(subject: _Subject) -> Check:
    """What a LAN neighbour can connect to: every listener not on loopback or the fabric address,
    beyond sshd and (on the head) the front."""
    listed = subject.probe.host.get("listeners")
    if not isinstance(listed, list):
        return subject.check("listeners", "WARN", "not checked: the node did not list its listening sockets")
    fabric = resolve_fabric(subject.node, subject.facts)
    fabric_ip = None if isinstance(fabric, Blocker) else fabric.ip
    expected = _expected_ports(subject)
    exposed = sorted(
        {
            (address, port, program or "?")
            for address, port, program in _valid_listeners(listed)
            if not _local_only(address, fabric_ip) and port not in expected
        }
    )
    allowed = ", ".join(f"{what} :{port}" for port, what in sorted(expected.items()))
    if not exposed:
        return subject.check("listeners", "PASS", f"beyond loopback and the fabric only {allowed}")
    shown = ", ".join(f"{_host(address)}:{port} ({program})" for address, port, program in exposed[:8])
    more = f" and {len(exposed) - 8} more" if len(exposed) > 8 else ""
    message = f"listening beyond loopback and the fabric: {shown}{more} (expected: {allowed})"
    return subject.check("listeners", "WARN", message, _firewall_fix(fabric, sorted({p for _, p, _ in exposed})))


def _expected_ports(subject: _Subject) -> dict[int, str]:
    ssh = subject.node.ssh.port if subject.node.ssh is not None else 22
    expected = {ssh: "sshd"}
    if subject.node.role == "head":
        expected[subject.deployment.serving.port] = "the front"
    return expected


def _valid_listeners(listed: list[object]) -> list[tuple[str, int, str | None]]:
    """The probe's [address, port, program] entries that have that shape (node output is untrusted)."""
    valid = []
    for entry in listed:
        if isinstance(entry, list) and len(entry) == 3 and isinstance(entry[0], str) and isinstance(entry[1], int):
            program = entry[2] if isinstance(entry[2], str) else None
            valid.append((entry[0][:64], entry[1], program[:32] if program else None))
    return valid


def _local_only(address: str, fabric_ip: str | None) -> bool:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    return ip.is_loopback or (fabric_ip is not None and address == fabric_ip)


def _host(address: str) -> str:
    return f"[{address}]" if ":" in address else address


def _firewall_fix(fabric: ResolvedFabric | Blocker, ports: list[int]) -> str:
    ifname = "<fabric port>" if isinstance(fabric, Blocker) else fabric.ifname
    listed = ", ".join(str(port) for port in ports)
    return (
        "bind them to the fabric address or loopback if the program allows it; else drop them on every other "
        "interface: sudo nft add table inet spark && sudo nft 'add chain inet spark input { type filter hook input "
        f'priority 0 ; }}\' && sudo nft \'add rule inet spark input iifname != {{ "lo", "{ifname}" }} tcp dport '
        f"{{ {listed} }} drop'"
    )


def _kernel(subject: _Subject) -> Check:
    """A kernel on the known-bad list FAILs with its fix; any other is named (with the boot)."""
    host = subject.observed.host
    if host.kernel is None:
        return subject.check("kernel", "WARN", "kernel release unknown (/proc/sys/kernel/osrelease unreadable)")
    found = [f for f in hostcheck.fabric_faults(subject.deployment, subject.facts) if f.node == subject.node.name]
    bad = next((finding for finding in found if finding.check == "kernel"), None)
    if bad is not None:
        return subject.check("kernel", "FAIL", bad.message, bad.fix)
    booted = f", boot {host.boot_id[:8]}" if host.boot_id else ""
    return subject.check("kernel", "PASS", f"{host.kernel}{booted} (not on the known-bad list)")


def _port_rate(subject: _Subject) -> Check:
    """The fabric ports' RDMA rate against their links' negotiated speed, with MTU and firmware."""
    slow = [
        finding
        for finding in hostcheck.host_warnings(subject.deployment, subject.facts)
        if finding.node == subject.node.name and finding.check == "port rate"
    ]
    if slow:
        return subject.check("port rate", "WARN", "; ".join(f.message for f in slow), slow[0].fix)
    ports = [port for port in subject.observed.fabric.ports if port.active]
    if not ports:
        return subject.check("port rate", "WARN", "not checked: no ACTIVE RDMA port")
    return subject.check("port rate", "PASS", "; ".join(_port_line(port) for port in ports))


def _port_line(port: RdmaPort) -> str:
    def gbps(value: float | None) -> str:
        return f"{value:g} Gb/s" if value is not None else "?"

    return (
        f"{port.hca}/{port.port} rate {gbps(port.rate_gbps)}, link {gbps(port.link_gbps)}, "
        f"MTU {port.mtu or '?'}, firmware {port.firmware or '?'}"
    )


_NODE_CHECKS: list[Callable[[_Subject], Check]] = [
    _python,
    _rsync,
    _docker,
    _nvidia_runtime,
    _gpu_driver,
    _kernel,
    _image,
    _rdma_port,
    _fabric_address,
    _roce_gid,
    _port_rate,
    _disk,
    _memory,
    _listeners,
]


# ---------------------------------------------------------------- across nodes


def cross_node_checks(deployment: Deployment, data: DoctorInput) -> list[Check]:
    answered = [node for _, node in deployment.ranked_nodes if data.probes[node.name].raw is not None]
    fabrics = {node.name: resolve_fabric(node, data.facts) for node in answered}
    resolved = {name: fabric for name, fabric in fabrics.items() if not isinstance(fabric, Blocker)}
    missing = ", ".join(node.name for node in deployment.nodes if node.name not in resolved)
    if missing:
        message = f"not checked: no fabric address on {missing}"
        checks = [Check(ALL_NODES, name, "WARN", message) for name in ("same subnet", "mtu")]
    else:
        checks = [_same_subnet(resolved, data.facts), _mtu(resolved, data.facts)]
    return [*checks, *_host_differences(deployment, data.facts), _clock(deployment, data)]


def _host_differences(deployment: Deployment, facts: Facts) -> list[Check]:
    """Kernel, driver and firmware the same on every node (a WARN each when not)."""
    warned = {finding.check: finding for finding in hostcheck.host_warnings(deployment, facts)}
    checks = []
    for what, value in (("kernel", "kernel"), ("gpu driver", "driver"), ("firmware", None)):
        finding = warned.get(what)
        if finding is not None:
            checks.append(Check(ALL_NODES, f"same {what}", "WARN", finding.message, finding.fix))
            continue
        seen = {
            node.name: (getattr(facts.nodes[node.name].host, value) if value else hostcheck.firmware_of(node, facts))
            for _, node, _ in facts.answering(deployment.ranked_nodes)
        }
        listed = ", ".join(f"{name} {found or '?'}" for name, found in seen.items())
        checks.append(Check(ALL_NODES, f"same {what}", "PASS", listed))
    return checks


def _same_subnet(resolved: dict[str, ResolvedFabric], facts: Facts) -> Check:
    addresses = {name: (fabric.ip, _prefix(facts, name, fabric)) for name, fabric in resolved.items()}
    problems = subnet_mismatches(addresses)
    if problems:
        fix = "give every node's QSFP port an address in one subnet (netplan), or fix nodes[].fabric.ip"
        return Check(ALL_NODES, "same subnet", "FAIL", "; ".join(message for _, message in problems), fix)
    listed = ", ".join(
        f"{name} {ip}/{prefix if prefix is not None else '?'}" for name, (ip, prefix) in addresses.items()
    )
    return Check(ALL_NODES, "same subnet", "PASS", listed)


def _prefix(facts: Facts, node: str, fabric: ResolvedFabric) -> int | None:
    detected = facts.nodes[node].fabric
    return detected.prefixlen if detected.ip == fabric.ip else None


def _mtu(resolved: dict[str, ResolvedFabric], facts: Facts) -> Check:
    found = hostcheck.mtu_findings(resolved, facts)
    if found:
        return Check(ALL_NODES, "mtu", found[0].severity, found[0].message, found[0].fix)
    listed = ", ".join(
        f"{name} {fabric.ifname} {hostcheck.mtu_of(facts, name, fabric.ifname)}" for name, fabric in resolved.items()
    )
    return Check(ALL_NODES, "mtu", "PASS", listed)


def _clock(deployment: Deployment, data: DoctorInput) -> Check:
    """Each node's offset from this machine, bounded by half the round trip; skew = spread of offsets."""
    probes = [data.probes[node.name] for node in deployment.nodes]
    if not all(isinstance(probe.host.get("time"), int | float) for probe in probes):
        return Check(ALL_NODES, "clock skew", "WARN", "not checked: not every node answered")
    offsets = [float(probe.host["time"]) - (probe.sent_at + probe.received_at) / 2 for probe in probes]
    skew = max(offsets) - min(offsets)
    uncertainty = sum(sorted((probe.received_at - probe.sent_at) / 2 for probe in probes)[-2:])
    message = f"clocks differ by {skew:.2f} s (± {uncertainty:.2f} s)"
    if skew - uncertainty > CLOCK_SKEW_S:
        return Check(
            ALL_NODES, "clock skew", "WARN", message, "enable NTP on every node: sudo timedatectl set-ntp true"
        )
    return Check(ALL_NODES, "clock skew", "PASS", message)


# ---------------------------------------------------------------- rendering


def render_text(report: Report) -> str:
    lines: list[str] = []
    for node in dict.fromkeys(check.node for check in report.checks):
        lines.append(node)
        for check in (c for c in report.checks if c.node == node):
            lines.append(f"  {check.status}  {check.name:<15} {check.message}")
            if check.fix and check.status != "PASS":
                lines.append(f"        {'':<15} fix: {check.fix}")
    counts = report.counts()
    lines.append("")
    warnings = f"{counts['WARN']} warning" + ("" if counts["WARN"] == 1 else "s")
    lines.append(f"Doctor: {counts['FAIL']} failed, {warnings}, {counts['PASS']} passed.")
    return "\n".join(lines) + "\n"
