"""Where a node's `ssh:` target leads: the user's ssh config applied the way OpenSSH applies it.

The peer copy runs the head's `ssh` (under rsync), which reads ~/.ssh/config; the control
connection is paramiko, which reads nothing by itself. Both must reach the same machine the same
way, so both start from one route resolved here. A field the spec sets explicitly wins (as an
OpenSSH command-line option does), then the first value the config gives for the name, then the
built-in default. A route is the jump hosts in order and the node, each with its address, port,
user, keys and the name its host key is filed under; paramiko connects along it
(`sshconnect.py`), and rsync's `ssh` gets all of it as explicit options (`openssh_command`), so
the two cannot read the config file differently.

Host keys are checked against the route's known_hosts files on every hop, always: a
`StrictHostKeyChecking no` in the config is reported (`SshRoute.notes`) and has no effect.

The config file is `~/.ssh/config`, or `$RECONCILER_SSH_CONFIG` (`none`: read no config).
"""

from __future__ import annotations

import fnmatch
import functools
import getpass
import math
import os
import re
import shlex
from dataclasses import dataclass
from typing import Any

from paramiko.config import SSHConfig
from paramiko.ssh_exception import ConfigParseError, CouldNotCanonicalize

from reconciler.errors import SshConfigError, UntrustedTextError
from reconciler.fsutil import read_untrusted_text
from reconciler.spec import SshTarget

CONFIG_ENV = "RECONCILER_SSH_CONFIG"
DEFAULT_CONFIG = "~/.ssh/config"
# Paramiko's lookup is linear in the file (a glob compiled per Host pattern): 256 KiB, thousands
# of hosts, is still a second or two per lookup, and far beyond any hand-kept config.
MAX_CONFIG_BYTES = 256 * 1024
SSH_PORT = 22
# OpenSSH's own limit on chained ProxyJump lookups is far higher; eight hops is already absurd,
# and anything deeper is a loop in the config.
MAX_JUMP_DEPTH = 8
_LOOSE_CHECKING = {"no", "off", "accept-new"}
# How paramiko splits a config line into keyword and value.
_SETTING = re.compile(r"(\w+)(?:\s*=\s*|\s+)(.+)")
_KEYWORDS = {"hostname": "HostName", "hostkeyalias": "HostKeyAlias"}
_NAME = re.compile(r"[^\s\x00-\x1f\x7f'\"`$;&|<>()\\]+")


@dataclass(frozen=True)
class SshConfigText:
    path: str  # absolute: shown in messages and handed to OpenSSH with -F
    text: str


@dataclass(frozen=True)
class Endpoint:
    """One SSH login on the way: a jump host or the node itself."""

    name: str  # as written in the spec or in ProxyJump; config entries match it
    hostname: str
    port: int
    user: str
    identity_files: tuple[str, ...] = ()
    identities_only: bool = False
    host_key_alias: str | None = None

    @property
    def host_key_name(self) -> str:
        """The name OpenSSH files this host's key under in known_hosts."""
        if self.host_key_alias:
            return self.host_key_alias
        return self.hostname if self.port == SSH_PORT else f"[{self.hostname}]:{self.port}"

    @property
    def address(self) -> str:
        return f"{self.user}@{self.hostname}:{self.port}"

    def describe(self) -> str:
        return self.address if self.name == self.hostname else f"{self.address} ({self.name})"


@dataclass(frozen=True)
class SshRoute:
    """How to reach one node: through `jumps` in order (the first one over `proxy_command`, if
    any), then `target`; every hop's host key checked against `known_hosts`."""

    node: str
    target: Endpoint
    known_hosts: tuple[str, ...]
    connect_timeout_s: float
    jumps: tuple[Endpoint, ...] = ()
    proxy_command: str | None = None
    config_path: str | None = None
    entries: tuple[str, ...] = ()  # the config's Host lines that match the node's name
    notes: tuple[str, ...] = ()  # config settings the reconciler does not follow

    @property
    def hops(self) -> tuple[Endpoint, ...]:
        return (*self.jumps, self.target)

    def describe(self) -> str:
        text = self.target.describe()
        if self.jumps:
            text += " via " + ", ".join(jump.describe() for jump in self.jumps)
        if self.proxy_command:
            text += f" over ProxyCommand {self.proxy_command!r}"
        return text


# ---------------------------------------------------------------- the file (the only I/O)


def route_for(node: str, target: SshTarget) -> SshRoute:
    """The route to `node` through this user's ssh config."""
    return resolve_route(node, target, read_ssh_config(node), getpass.getuser())


def read_ssh_config(node: str) -> SshConfigText | None:
    """`$RECONCILER_SSH_CONFIG`, else ~/.ssh/config if it exists; None when there is none to read."""
    setting = os.environ.get(CONFIG_ENV, "").strip()
    if setting.lower() == "none":
        return None
    path = os.path.abspath(os.path.expanduser(setting or DEFAULT_CONFIG))
    if not setting and not os.path.lexists(path):
        return None
    try:
        return SshConfigText(path, read_untrusted_text(path, what="ssh config", limit=MAX_CONFIG_BYTES))
    except UntrustedTextError as exc:
        where = f"{path}:{exc.line}" if exc.hint else path
        raise SshConfigError(
            f"{node}: {where}: {exc.message}",
            exc.hint or f"fix the file, or point {CONFIG_ENV} at another one (`none` reads no ssh config)",
        ) from None


# ---------------------------------------------------------------- resolution (pure)


def resolve_route(node: str, target: SshTarget, config: SshConfigText | None, local_user: str) -> SshRoute:
    """The route the spec's target takes through `config`: explicit spec fields first, then the
    config's first value for the name, then the defaults."""
    resolver = _Resolver(node, config, local_user)
    explicit = target.model_fields_set
    port = target.port if "port" in explicit else None
    options = resolver.lookup(target.host, port=port, user=target.user)
    identity = (os.path.expanduser(target.identity_file),) if target.identity_file else None
    endpoint = resolver.endpoint(target.host, options, identity=identity)
    jumps, proxy = resolver.jumps_to(target.host, options, depth=0)
    if "known_hosts" in explicit:
        known_hosts: tuple[str, ...] = (os.path.expanduser(target.known_hosts),)
    else:
        known_hosts = resolver.known_hosts(options, target.host, default=target.known_hosts)
    timeout = target.connect_timeout_s if "connect_timeout_s" in explicit else resolver.timeout(options, target.host)
    return SshRoute(
        node=node,
        target=endpoint,
        known_hosts=known_hosts,
        connect_timeout_s=timeout if timeout is not None else target.connect_timeout_s,
        jumps=jumps,
        proxy_command=proxy,
        config_path=config.path if config else None,
        entries=resolver.entries(target.host),
        notes=resolver.notes(),
    )


@dataclass(frozen=True)
class _Line:
    number: int
    key: str  # lower case, as paramiko keys its options
    value: str


class _Resolver:
    """Lookups in one config file, with the file's lines kept to say where a bad value is."""

    def __init__(self, node: str, config: SshConfigText | None, local_user: str) -> None:
        self.node = node
        self.path = config.path if config else None
        self.text = config.text if config else ""
        self.local_user = local_user
        self.lines = _lines(self.text)
        self._loose: dict[tuple[int | None, str], list[str]] = {}

    def error(self, number: int | None, message: str, hint: str) -> SshConfigError:
        where = f"{self.path}:{number}" if number else str(self.path)
        return SshConfigError(f"{self.node}: {where}: {message}", hint)

    def line_of(self, key: str, value: str | None = None) -> int | None:
        """The first line setting `key` (to `value`, if given): where a resolved value came from."""
        found = [line for line in self.lines if line.key == key]
        exact = [line for line in found if value is not None and _unquote(line.value).lower() == value.lower()]
        chosen = exact or found
        return chosen[0].number if chosen else None

    def lookup(self, name: str, *, port: int | None, user: str | None) -> dict[str, Any]:
        """Paramiko's lookup of `name`, with `port` and `user` taking precedence like command-line
        options (so `%p` and `%r` in the config expand to them, as OpenSSH would)."""
        first = "".join(f"    {key} {value}\n" for key, value in (("Port", port), ("User", user)) if value)
        try:
            options = dict(_parsed(f"Host *\n{first}" + self.text if first else self.text).lookup(name))
        except ConfigParseError as exc:
            raise self.error(
                _unparsable_line(self.text),
                f"cannot parse this line: {exc}",
                "write `Keyword value` (see man ssh_config)",
            ) from None
        except CouldNotCanonicalize:
            raise self.error(
                self.line_of("canonicalizehostname"),
                f"'{name}' could not be canonicalized (CanonicalizeFallbackLocal no)",
                "fix CanonicalDomains, or allow the fallback",
            ) from None
        except ImportError:
            raise self.error(
                self.line_of("match"), "a `Match exec` needs the Python package invoke", "pip install invoke"
            ) from None
        checking = str(options.get("stricthostkeychecking", ""))
        if checking.lower() in _LOOSE_CHECKING:
            self._loose.setdefault((self.line_of("stricthostkeychecking", checking), checking), []).append(name)
        return options

    def endpoint(self, name: str, options: dict[str, Any], *, identity: tuple[str, ...] | None) -> Endpoint:
        hostname = self.name_value(options, "hostname", name, name)
        identities = identity if identity is not None else tuple(_strings(options.get("identityfile")))
        alias = options.get("hostkeyalias")
        return Endpoint(
            name=name,
            hostname=hostname,
            port=self.port(options, name),
            user=str(options.get("user") or self.local_user),
            identity_files=identities,
            identities_only=identity is not None or str(options.get("identitiesonly", "")).lower() == "yes",
            host_key_alias=self.name_value(options, "hostkeyalias", str(alias), name) if alias else None,
        )

    def name_value(self, options: dict[str, Any], key: str, default: str, name: str) -> str:
        value = str(options.get(key) or default)
        if not _NAME.fullmatch(value) or value.startswith("-"):
            raise self.error(
                self.line_of(key),
                f"{_KEYWORDS[key]} '{value}' (for {name}) is not a host name",
                "write a host name or address without spaces, quotes or shell characters",
            )
        return value

    def port(self, options: dict[str, Any], name: str) -> int:
        value = str(options.get("port", SSH_PORT))
        problem = f"Port '{value}' (for {_subject(name, options)}) is not a port number"
        hint = "write a number from 1 to 65535, or set nodes[].ssh.port in the spec (the spec wins)"
        return self.whole_number("port", value, 65535, problem, hint)

    def timeout(self, options: dict[str, Any], name: str) -> float | None:
        value = options.get("connecttimeout")
        if value is None or str(value).lower() == "none":
            return None
        text = str(value)
        problem = f"ConnectTimeout '{text}' (for {_subject(name, options)}) is not a number of seconds from 1 to 600"
        hint = "write whole seconds, or set nodes[].ssh.connect_timeout_s in the spec (the spec wins)"
        return float(self.whole_number("connecttimeout", text, 600, problem, hint))

    def whole_number(self, key: str, text: str, high: int, problem: str, hint: str) -> int:
        """`text` as a number from 1 to `high`, else the error at the line setting `key`. ASCII
        digits only: `str.isdigit` also takes `²`, which `int` then refuses."""
        if not re.fullmatch(r"[0-9]{1,6}", text) or not 1 <= int(text) <= high:
            raise self.error(self.line_of(key, text), problem, hint)
        return int(text)

    def known_hosts(self, options: dict[str, Any], name: str, *, default: str) -> tuple[str, ...]:
        value = options.get("userknownhostsfile")
        if value is None:
            return (os.path.expanduser(default),)
        files = self.file_list(str(value))
        if not files or any(name.lower() == "none" or "%" in name for name in files):
            raise self.error(
                self.line_of("userknownhostsfile"),
                f"UserKnownHostsFile '{value}' (for {_subject(name, options)}) names no file the reconciler "
                "can check host keys against",
                "name the known_hosts file(s) without %-tokens, or set nodes[].ssh.known_hosts in the spec",
            )
        return tuple(os.path.expanduser(name) for name in files)

    def file_list(self, value: str) -> list[str]:
        """The files of a UserKnownHostsFile value. Paramiko drops the quotes around a value that is
        quoted as a whole (`"/my dir/known_hosts"`), so the line as written says whether the
        spaces in it separate files or belong to one name."""
        written = [line.value.strip() for line in self.lines if line.key == "userknownhostsfile"]
        if any(_unquote(raw) == value and raw != value for raw in written):
            return [value]
        try:
            return shlex.split(value)
        except ValueError:
            return []

    def jumps_to(self, name: str, options: dict[str, Any], *, depth: int) -> tuple[tuple[Endpoint, ...], str | None]:
        """The jump hosts to `name` and the ProxyCommand that carries the first connection.

        As with `ssh -J a,b`: the first hop's own config may route it further (its jumps come
        first), the later hops are reached through the earlier ones whatever their config says.
        """
        jump = options.get("proxyjump")
        command = options.get("proxycommand")
        jump = None if jump is None or str(jump).lower() == "none" else str(jump)
        if jump and command:
            raise self.error(
                self.line_of("proxyjump"),
                f"both ProxyJump and ProxyCommand apply to {_subject(name, options)}",
                "keep one of them for this host (OpenSSH would use whichever it reads first)",
            )
        if not jump:
            return (), str(command) if command else None
        if depth >= MAX_JUMP_DEPTH:
            raise self.error(
                self.line_of("proxyjump"),
                f"ProxyJump for {name} goes more than {MAX_JUMP_DEPTH} hops deep: a loop",
                "end the chain: give the first jump host `ProxyJump none`",
            )
        looked_up = [self.hop(part.strip(), name) for part in jump.split(",")]
        hops = [self.endpoint(host, hop_options, identity=None) for host, hop_options in looked_up]
        first_jumps, proxy = self.jumps_to(*looked_up[0], depth=depth + 1)
        return (*first_jumps, *hops), proxy

    def hop(self, text: str, name: str) -> tuple[str, dict[str, Any]]:
        """A ProxyJump hop, `[user@]host[:port]` or `ssh://[user@]host[:port]`, and its options."""
        bare = text.removeprefix("ssh://").rstrip("/")
        user, _, hostport = bare.rpartition("@")
        match = re.fullmatch(r"\[([^\]]+)\](?::([0-9]{1,5}))?|([^:\[\]]+)(?::([0-9]{1,5}))?", hostport)
        host = (match.group(1) or match.group(3)) if match else ""
        port = (match.group(2) or match.group(4)) if match else None
        if not host or not _NAME.fullmatch(host) or host.startswith("-") or (user and not _NAME.fullmatch(user)):
            raise self.error(
                self.line_of("proxyjump"),
                f"ProxyJump hop '{text}' (for {name}) is not [user@]host[:port]",
                "separate hops with commas: ProxyJump user@bastion:22,other-hop",
            )
        if port is not None and not 1 <= int(port) <= 65535:
            raise self.error(
                self.line_of("proxyjump"), f"ProxyJump hop '{text}' (for {name}) has no valid port", "use 1-65535"
            )
        return host, self.lookup(host, port=int(port) if port else None, user=user or None)

    def entries(self, name: str) -> tuple[str, ...]:
        """The Host lines whose patterns match `name` (Match blocks are evaluated, not listed)."""
        return tuple(
            f"{self.path}:{line.number}: Host {line.value}"
            for line in self.lines
            if line.key == "host" and _host_matches(line.value, name)
        )

    def notes(self) -> tuple[str, ...]:
        includes = [
            f"{self.path}:{line.number}: Include {line.value} is not read by the reconciler; "
            "settings for the nodes must be in this file"
            for line in self.lines
            if line.key == "include"
        ]
        loose = [
            f"{self.path}:{number}: StrictHostKeyChecking {value} (for {', '.join(dict.fromkeys(names))}) is "
            "ignored: the reconciler always checks host keys and never adds one"
            for (number, value), names in self._loose.items()
        ]
        return (*loose, *includes)


@functools.lru_cache(maxsize=8)
def _parsed(text: str) -> SSHConfig:
    """Parsed once per text: every node and hop looks up the same file (or it with the same
    Port/User lines in front), and parsing is most of a lookup's time. Lookups do not change it."""
    return SSHConfig.from_text(text)


def _lines(text: str) -> list[_Line]:
    """The setting lines (a comment's `#` is no keyword character, so comments never match)."""
    matches = [(number, _SETTING.match(raw.strip())) for number, raw in enumerate(text.splitlines(), start=1)]
    return [_Line(number, match.group(1).lower(), match.group(2)) for number, match in matches if match]


def _unparsable_line(text: str) -> int | None:
    """Paramiko's parse errors do not say where; each line fails or passes on its own."""
    for number, raw in enumerate(text.splitlines(), start=1):
        try:
            SSHConfig.from_text(raw)
        except ConfigParseError:
            return number
    return None


def _subject(name: str, options: dict[str, Any]) -> str:
    """The name being resolved, and the address it resolved to so far."""
    hostname = options.get("hostname")
    return f"{name}, HostName {hostname}" if hostname and hostname != name else name


def _unquote(value: str) -> str:
    return value[1:-1] if len(value) > 1 and value.startswith('"') and value.endswith('"') else value


def _strings(value: object) -> list[str]:
    return [str(item) for item in value] if isinstance(value, list) else []


def _host_matches(value: str, name: str) -> bool:
    """OpenSSH's Host matching: any pattern matches and no negated one does."""
    try:
        patterns = shlex.split(value)
    except ValueError:
        return False
    if any(p.startswith("!") and fnmatch.fnmatch(name, p[1:]) for p in patterns):
        return False
    return any(not p.startswith("!") and fnmatch.fnmatch(name, p) for p in patterns)


# ---------------------------------------------------------------- the same route for OpenSSH (pure)


def openssh_command(route: SshRoute) -> list[str]:
    """`ssh` with options that make OpenSSH take exactly this route to `route.target.name`.

    Everything resolved is passed explicitly, and the same config file with -F (or `none`), so
    what OpenSSH reads on its own can only add options, never move the connection. Jumps become
    nested `ssh -W` ProxyCommands, so each hop gets the route's known_hosts and strict checking
    too (`-J` would leave the hops to the config's own settings).
    """
    return ["ssh", *_options(route, len(route.jumps))]


def _options(route: SshRoute, index: int) -> list[str]:
    endpoint = route.hops[index]
    known = " ".join(_quoted(_literal(path)) for path in route.known_hosts)
    argv = ["-F", route.config_path or "none", "-p", str(endpoint.port), "-l", endpoint.user]
    argv += ["-o", f"HostName={_literal(endpoint.hostname)}", "-o", f"UserKnownHostsFile={known}"]
    argv += ["-o", "StrictHostKeyChecking=yes", "-o", "BatchMode=yes"]
    argv += ["-o", f"ConnectTimeout={math.ceil(route.connect_timeout_s)}"]
    if endpoint.host_key_alias:
        argv += ["-o", f"HostKeyAlias={endpoint.host_key_alias}"]
    for identity in endpoint.identity_files:
        argv += ["-i", _literal(identity)]
    if endpoint.identities_only:
        argv += ["-o", "IdentitiesOnly=yes"]
    proxy = _proxy(route, index)
    return [*argv, "-o", f"ProxyCommand={_literal(proxy) if proxy else 'none'}"]


def _proxy(route: SshRoute, index: int) -> str | None:
    """What carries the connection to hop `index`: an `ssh -W` through the hop before it."""
    if index == 0:
        return route.proxy_command
    previous, here = route.hops[index - 1], route.hops[index]
    host = f"[{here.hostname}]" if ":" in here.hostname else here.hostname
    return shlex.join(["ssh", *_options(route, index - 1), "-W", f"{host}:{here.port}", previous.name])


def _literal(text: str) -> str:
    """OpenSSH expands %-tokens in these values; ours are already final."""
    return text.replace("%", "%%")


def _quoted(path: str) -> str:
    return f'"{path}"' if any(c.isspace() for c in path) else path
