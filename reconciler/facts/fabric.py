"""Fabric facts: which interface, address and RDMA devices carry tensor-parallel traffic.

Wrong interface or HCA selection is the most common two-Spark failure (see docs/sources.md), so
the selection is strict and explains itself. The probe collects raw observations (the
infiniband sysfs tree, `ip -j addr`, `rdma -j link`); everything here is pure and tested on
verbatim Spark outputs.

The rules, per node:
- the fabric interface is an UP netdev of an ACTIVE RoCE port carrying a non-link-local IPv4
  (so never the management port, Wi-Fi or docker0: those belong to no RDMA device);
- the HCAs are the ACTIVE ports whose GID at the node's GID index holds the IPv4-mapped
  address of one of the node's fabric addresses (both CX-7 twins when both carry addresses);
- the spec's overrides constrain the choice (an `ifname` picks its address, an `ip` its
  interface); nothing found, or more than one candidate, is a problem naming the candidates,
  never a silent pick.
"""

from __future__ import annotations

import ipaddress
import json
import re
from collections.abc import Callable
from typing import Annotated, Any, NoReturn, TypeVar

from pydantic import AfterValidator, Field

from reconciler.facts.base import FactsModel
from reconciler.record import Record

ACTIVE = "ACTIVE"
T = TypeVar("T")
IPV4_PREFIX_BITS = 32


def _check_ipv4(value: str) -> str:
    if not _is_ipv4(value):
        raise ValueError(f"{value!r:.60} is not an IPv4 address (four numbers, e.g. 10.10.10.11)")
    return value


# What a snapshot may say of an address: the subnet check computes networks from both.
IPv4Text = Annotated[str, AfterValidator(_check_ipv4)]
PrefixLength = Annotated[int, Field(ge=0, le=IPV4_PREFIX_BITS)]


class RdmaPort(FactsModel):
    """One port of an RDMA device, merged from sysfs and `rdma link`."""

    hca: str
    port: int = 1
    state: str
    netdevs: list[str] = Field(default_factory=lambda: [])
    # The GID at the node's GID index as sysfs prints it, and its type ("RoCE v2").
    gid: str | None = None
    gid_type: str | None = None
    # The GIDs in use at the head of the table (index -> GID, and -> type where readable), to
    # say where one moved.
    gids: dict[int, str] = Field(default_factory=lambda: {})
    gid_types: dict[int, str] = Field(default_factory=lambda: {})
    # The HCA's firmware, the port's RDMA rate and its netdev's negotiated speed (Gb/s), and
    # that netdev's MTU: a link that negotiated 200G can carry far less on some driver and
    # firmware pairs, and a reboot can reset one side's MTU.
    firmware: str | None = None
    rate_gbps: float | None = None
    link_gbps: float | None = None
    mtu: int | None = None

    @property
    def active(self) -> bool:
        return self.state == ACTIVE

    @property
    def gid_ipv4(self) -> str | None:
        return gid_ipv4(self.gid)


class FabricFacts(FactsModel):
    """The fabric selection of a node (None where nothing was selected) and what it was made from.

    `problem` says why `ifname` or `ip` is None and names the `candidates` when there were
    several; `ports` are the RDMA ports seen, for `doctor`.
    """

    ifname: str | None = None
    ip: IPv4Text | None = None
    hcas: list[str] = Field(default_factory=lambda: [])
    prefixlen: PrefixLength | None = None
    mtu: int | None = None
    ports: list[RdmaPort] = Field(default_factory=lambda: [])
    problem: str | None = None
    candidates: list[str] = Field(default_factory=lambda: [])


class Address(Record):
    ip: str
    prefixlen: int

    def __str__(self) -> str:
        return f"{self.ip}/{self.prefixlen}"

    @property
    def usable(self) -> bool:
        """Link-local (169.254/16) is what an unconfigured port carries; it cannot be the fabric."""
        address = ipaddress.IPv4Address(self.ip)
        return not (address.is_link_local or address.is_loopback or address.is_unspecified or address.is_multicast)


def _address(ip: str, prefixlen: int) -> Address:
    """An address `ip addr` listed; one no kernel prints makes the output unreadable (ValueError)."""
    _check_ipv4(ip)
    if not 0 <= prefixlen <= IPV4_PREFIX_BITS:
        raise ValueError(f"{ip}/{prefixlen}: an IPv4 prefix length is 0..{IPV4_PREFIX_BITS}")
    return Address(ip, prefixlen)


class Netdev(Record):
    """A network interface as `ip addr` shows it (IPv4 only)."""

    name: str
    up: bool
    mtu: int | None
    ipv4: tuple[Address, ...]

    @property
    def usable(self) -> tuple[Address, ...]:
        return tuple(address for address in self.ipv4 if address.usable)


# ---------------------------------------------------------------- parsers


def parse_rdma_link(text: str) -> list[RdmaPort]:
    """`rdma -j link` (JSON) or `rdma link` text, padded or single-spaced; empty output = no ports.

    The `state` field decides, never `physical_state`: real output puts LINK_UP on DOWN lines.
    """
    return _json_or_lines(text, _port_from_json, _port_from_line)


def _json_or_lines(
    text: str, from_json: Callable[[dict[str, Any]], T], from_line: Callable[[str], T | None]
) -> list[T]:
    """The items of a tool's `-j` output (a JSON list), or of its text output, one line each."""
    stripped = text.strip()
    if stripped.startswith("["):
        return [from_json(item) for item in json.loads(stripped, parse_constant=_no_constant)]
    return [item for line in text.splitlines() if (item := from_line(line)) is not None]


def _no_constant(name: str) -> NoReturn:
    # int() of Infinity raises OverflowError, which no reader of node output expects.
    raise ValueError(f"{name} is not a number JSON allows")


def _port_from_json(item: dict[str, Any]) -> RdmaPort:
    port, state, netdevs = int(item.get("port", 1)), str(item.get("state", "")), _list(item.get("netdev"))
    return RdmaPort(hca=str(item["ifname"]), port=port, state=state, netdevs=netdevs)


def _port_from_line(line: str) -> RdmaPort | None:
    tokens = line.split()
    if len(tokens) < 2 or tokens[0] != "link" or "/" not in tokens[1]:
        return None
    hca, _, port = tokens[1].partition("/")
    fields = dict(zip(tokens[2::2], tokens[3::2], strict=False))
    number = int(port) if port.isdigit() else 1
    return RdmaPort(hca=hca, port=number, state=fields.get("state", ""), netdevs=_list(fields.get("netdev")))


def _list(value: object) -> list[str]:
    return [str(value)] if value else []


def parse_ip_addr(text: str) -> dict[str, Netdev]:
    """`ip -j addr` (what the probe runs, with MTUs) or `ip -br addr` text (what users paste, and
    the captures of real Sparks in tests/fixtures/fabric/ are)."""
    return {netdev.name: netdev for netdev in _json_or_lines(text, _netdev_from_json, _netdev_from_brief)}


def _netdev_from_json(item: dict[str, Any]) -> Netdev:
    flags = set(item.get("flags") or [])
    up = item.get("operstate") == "UP" or (item.get("operstate") == "UNKNOWN" and {"UP", "LOWER_UP"} <= flags)
    addresses = tuple(
        _address(str(info["local"]), int(info["prefixlen"]))
        for info in item.get("addr_info") or []
        if info.get("family") == "inet" and "local" in info
    )
    mtu = item.get("mtu")
    return Netdev(str(item["ifname"]), up, int(mtu) if mtu is not None else None, addresses)


def _netdev_from_brief(line: str) -> Netdev | None:
    tokens = line.split()
    if len(tokens) < 2 or line.startswith(("$", " ")):
        return None
    name = tokens[0].split("@", 1)[0]
    cidrs = (token.partition("/") for token in tokens[2:])
    ipv4 = ((ip, prefix) for ip, slash, prefix in cidrs if slash and prefix.isdigit() and _is_ipv4(ip))
    addresses = (_address(ip, int(prefix)) for ip, prefix in ipv4)
    return Netdev(name, tokens[1] == "UP", None, tuple(addresses))


def _is_ipv4(text: str) -> bool:
    try:
        ipaddress.IPv4Address(text)
    except ValueError:
        return False
    return True


def ports_from_sysfs(tree: dict[str, Any]) -> list[RdmaPort]:
    """The probe's reading of /sys/class/infiniband: {hca: {"ports": {n: {state, gid, gid_type}}, "netdevs"}}.

    A port's state file reads "4: ACTIVE"; an unused GID entry reads all zeros and its type
    file cannot be read (None).
    """
    return [
        RdmaPort(
            hca=hca,
            port=int(number),
            state=(port.get("state") or "").strip().split(":", 1)[-1].strip(),
            netdevs=list(device.get("netdevs") or []),
            gid=(port.get("gid") or "").strip() or None,
            gid_type=(port.get("gid_type") or "").strip() or None,
            gids=_gids(port.get("gids"), 0),
            gid_types=_gids(port.get("gids"), 1),
            firmware=_firmware(device.get("firmware")),
            rate_gbps=_rate_gbps(port.get("rate")),
            link_gbps=_link_gbps(device.get("speeds"), list(device.get("netdevs") or [])),
        )
        for hca, device in tree.items()
        for number, port in (device.get("ports") or {}).items()
    ]


_RATE_RE = re.compile(r"\s*(\d+(?:\.\d+)?)\s*Gb/sec")
_FIRMWARE_RE = re.compile(r"[\w.+-]{1,40}")
# The GID table holds 256 entries; an index past it is no observation.
_MAX_GID_INDEX = 255


def _gids(raw: object, field: int) -> dict[int, str]:
    """index -> GID (field 0) or its type (field 1) for the entries the probe found in use;
    odd entries are left out."""
    found: dict[int, str] = {}
    for index, entry in (raw if isinstance(raw, dict) else {}).items():
        value = entry[field] if isinstance(entry, list) and len(entry) > field else None
        if _small_number(index) and int(index) <= _MAX_GID_INDEX and isinstance(value, str) and value.strip():
            found[int(index)] = value.strip()[:64]
    return found


def _small_number(text: object, digits: int = 9) -> bool:
    """Decimal digits only, few enough for int(): untrusted text such as "²" or a million 9s is not."""
    return isinstance(text, str) and 0 < len(text) <= digits and text.isascii() and text.isdecimal()


def _firmware(raw: object) -> str | None:
    """The HCA's fw_ver ("28.45.1020")."""
    text = raw.strip() if isinstance(raw, str) else ""
    return text if _FIRMWARE_RE.fullmatch(text) else None


def _rate_gbps(raw: object) -> float | None:
    """A port's sysfs rate, "200 Gb/sec (4X HDR)", in Gb/s."""
    match = _RATE_RE.match(raw) if isinstance(raw, str) else None
    return float(match.group(1)) if match else None


def _link_gbps(speeds: object, netdevs: list[str]) -> float | None:
    """The fastest negotiated speed of the port's netdevs (sysfs `speed`, Mb/s; -1 = unknown)."""
    found = speeds if isinstance(speeds, dict) else {}
    texts = [text.strip() for name in netdevs if isinstance(text := found.get(name), str)]
    values = [int(text) for text in texts if _small_number(text)]
    positive = [value for value in values if value > 0]
    return max(positive) / 1000 if positive else None


def merge_ports(sysfs: list[RdmaPort], rdma: list[RdmaPort]) -> list[RdmaPort]:
    """sysfs is the truth for state and GIDs; `rdma link` names the exact netdev of each port
    (a device's `device/net` lists every netdev of its PCI function)."""
    by_key = {(port.hca, port.port): port for port in sysfs}
    for port in rdma:
        known = by_key.get((port.hca, port.port), port)  # a port sysfs lacks is taken as `rdma link` shows it
        update = {"netdevs": port.netdevs or known.netdevs, "state": known.state or port.state}
        by_key[(port.hca, port.port)] = known.model_copy(update=update)
    return sorted(by_key.values(), key=lambda port: (_natural(port.hca), port.port))


def _natural(name: str) -> list[tuple[int, str]]:
    """Case-insensitive, digits as numbers: the same HCA order on every node (NCCL pairs HCAs by
    list position across ranks), e.g. rocep1s0f0 < rocep1s0f1 < roceP2p1s0f0, mlx5_2 < mlx5_10."""
    return [(int(part), "") if part.isdigit() else (0, part.lower()) for part in re.split(r"(\d+)", name) if part]


def gid_ipv4(gid: str | None) -> str | None:
    """The IPv4 inside an IPv4-mapped GID (::ffff:a.b.c.d), else None."""
    if not gid:
        return None
    try:
        mapped = ipaddress.IPv6Address(gid).ipv4_mapped
    except ValueError:
        return None
    return str(mapped) if mapped is not None else None


# ---------------------------------------------------------------- selection


class _Choice(Record):
    ifname: str | None = None
    address: Address | None = None
    ip: str | None = None
    problem: str | None = None
    candidates: tuple[str, ...] = ()


def select_fabric(
    ports: list[RdmaPort], netdevs: dict[str, Netdev], *, ifname: str | None = None, ip: str | None = None
) -> FabricFacts:
    """Apply the module's rules; `ifname` / `ip` are the spec's overrides (None = detect)."""
    active = [port for port in ports if port.active]
    candidates = _candidates(active, netdevs)
    choice = _choose(candidates, netdevs, active, ports, ifname=ifname, ip=ip)
    fabric_ips = {address.ip for _, address in candidates} | ({choice.ip} if choice.ip else set())
    hcas = list(dict.fromkeys(port.hca for port in active if port.gid_ipv4 in fabric_ips))
    chosen = netdevs.get(choice.ifname) if choice.ifname else None
    ports = [_with_mtu(port, netdevs) for port in ports]
    return FabricFacts(
        ifname=choice.ifname,
        ip=choice.ip,
        hcas=hcas,
        prefixlen=choice.address.prefixlen if choice.address else None,
        mtu=chosen.mtu if chosen else None,
        ports=ports,
        problem=choice.problem,
        candidates=list(choice.candidates),
    )


def _with_mtu(port: RdmaPort, netdevs: dict[str, Netdev]) -> RdmaPort:
    """The port's MTU is its netdev's (RoCE carries the netdev's MTU less its headers)."""
    mtus = [found.mtu for name in port.netdevs if (found := netdevs.get(name)) is not None and found.mtu]
    return port.model_copy(update={"mtu": mtus[0]}) if mtus else port


def _candidates(active: list[RdmaPort], netdevs: dict[str, Netdev]) -> list[tuple[str, Address]]:
    found: list[tuple[str, Address]] = []
    for port in active:
        for name in port.netdevs:
            netdev = netdevs.get(name)
            if netdev is not None and netdev.up:
                found += [(name, address) for address in netdev.usable if (name, address) not in found]
    return found


def _choose(
    candidates: list[tuple[str, Address]],
    netdevs: dict[str, Netdev],
    active: list[RdmaPort],
    ports: list[RdmaPort],
    *,
    ifname: str | None,
    ip: str | None,
) -> _Choice:
    if ip is not None:
        return _by_ip(ip, ifname, candidates, netdevs, active, ports)
    if ifname is not None:
        return _by_ifname(ifname, netdevs)
    names = list(dict.fromkeys(name for name, _ in candidates))
    if not names:
        return _Choice(problem="no fabric interface: " + why_none(ports, active, netdevs))
    if len(names) > 1:
        listed = ", ".join(f"{name} ({address})" for name, address in candidates)
        return _Choice(
            problem=f"fabric interface ambiguous: {listed} all qualify (UP, IPv4, on an ACTIVE RoCE port)",
            candidates=tuple(names),
        )
    return _single_address(names[0], [address for _, address in candidates])


def _by_ip(
    ip: str,
    ifname: str | None,
    candidates: list[tuple[str, Address]],
    netdevs: dict[str, Netdev],
    active: list[RdmaPort],
    ports: list[RdmaPort],
) -> _Choice:
    holder = next(((n.name, a) for n in netdevs.values() for a in n.ipv4 if a.ip == ip), None)
    if ifname is not None:
        address = holder[1] if holder is not None and holder[0] == ifname else None
        return _Choice(ifname=ifname, address=address, ip=ip)
    if holder is not None:
        return _Choice(ifname=holder[0], address=holder[1], ip=ip)
    detected = _choose(candidates, netdevs, active, ports, ifname=None, ip=None)
    if detected.ifname is None:
        problem = f"{ip} (the spec's fabric.ip) is on no interface; {detected.problem}"
        return _Choice(ip=ip, problem=problem, candidates=detected.candidates)
    return _Choice(ifname=detected.ifname, ip=ip)


def _by_ifname(ifname: str, netdevs: dict[str, Netdev]) -> _Choice:
    netdev = netdevs.get(ifname)
    if netdev is None:
        return _Choice(ifname=ifname, problem=f"{ifname} (the spec's fabric.ifname) does not exist on this node")
    if not netdev.usable:
        return _Choice(ifname=ifname, problem=f"{ifname} (the spec's fabric.ifname) {_no_address(netdev)}")
    return _single_address(ifname, list(netdev.usable))


def _single_address(ifname: str, addresses: list[Address]) -> _Choice:
    if len(addresses) > 1:
        return _Choice(
            ifname=ifname,
            problem=f"fabric address ambiguous: {ifname} carries {', '.join(map(str, addresses))}",
            candidates=tuple(address.ip for address in addresses),
        )
    return _Choice(ifname=ifname, address=addresses[0], ip=addresses[0].ip)


def why_none(ports: list[RdmaPort], active: list[RdmaPort], netdevs: dict[str, Netdev]) -> str:
    """Why no interface qualifies, in the terms of `rdma link` and `ip -br addr`."""
    if not ports:
        return "no RDMA device (no /sys/class/infiniband entries, `rdma link` lists nothing)"
    if not active:
        states = ", ".join(f"{port.hca}/{port.port} {port.state or 'unknown'}" for port in ports)
        return f"no ACTIVE RoCE port ({states}): is the QSFP cable plugged in and the peer up?"
    reasons = []
    for port in active:
        for name in port.netdevs or ["(no netdev)"]:
            netdev = netdevs.get(name)
            if netdev is None:
                reasons.append(f"{port.hca}'s netdev {name} is not listed by `ip addr`")
            elif not netdev.up:
                reasons.append(f"{name} is DOWN")
            else:
                reasons.append(f"{name} {_no_address(netdev)}")
    return "; ".join(reasons)


def _no_address(netdev: Netdev) -> str:
    if netdev.ipv4:
        only = ", ".join(map(str, netdev.ipv4))
        return f"has only {only} (link-local: the port has no configured address)"
    return "has no IPv4 address"


def fabric_from_probe(raw: dict[str, Any] | None, *, ifname: str | None, ip: str | None) -> FabricFacts:
    """The probe's raw fabric observations -> the selection (with the spec's overrides).

    Output a parser cannot read becomes the node's fabric problem, never an error of the pass.
    """
    if not raw:
        return FabricFacts(problem="no fabric observations from the node (probe too old?)")
    try:
        ports = merge_ports(ports_from_sysfs(raw.get("infiniband") or {}), parse_rdma_link(raw.get("rdma_link") or ""))
        netdevs = parse_ip_addr(raw["ip_addr"]) if raw.get("ip_addr") is not None else None
    except (ValueError, KeyError, TypeError, AttributeError, ArithmeticError) as exc:
        return FabricFacts(problem=f"cannot read the fabric observations: {type(exc).__name__}: {exc}")
    if netdevs is None:
        return FabricFacts(ports=ports, problem=f"cannot list addresses: {raw.get('ip_error')}")
    return select_fabric(ports, netdevs, ifname=ifname, ip=ip)


# ---------------------------------------------------------------- across nodes


def subnet_mismatches(addresses: dict[str, tuple[str, int | None]]) -> list[tuple[str, str]]:
    """(node, message) for every node whose fabric address and the first node's are not on one subnet.

    `addresses` maps node -> (ip, prefix length), the head first; an unknown prefix length
    (an override address on no interface) checks only the other direction.
    """
    if not addresses:
        return []
    (first_node, (first_ip, first_prefix)), *others = addresses.items()
    first = f"fabric addresses are not on one subnet: {first_node} {_cidr(first_ip, first_prefix)}"
    return [
        (node, f"{first}, {node} {_cidr(ip, prefix)}")
        for node, (ip, prefix) in others
        if not (_contains(first_ip, first_prefix, ip) and _contains(ip, prefix, first_ip))
    ]


def _contains(ip: str, prefix: int | None, other: str) -> bool:
    if prefix is None:
        return True
    return ipaddress.IPv4Address(other) in ipaddress.IPv4Interface(f"{ip}/{prefix}").network


def _cidr(ip: str, prefix: int | None) -> str:
    return f"{ip}/{prefix}" if prefix is not None else f"{ip} (prefix length unknown)"
