"""The spec's value types: each constrained string, number and path a field may hold, checked
with a located problem and a hint (never a traceback), and the limits they share."""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Callable
from typing import Annotated

from pydantic import AfterValidator, BeforeValidator, Field, WithJsonSchema
from pydantic_core import PydanticCustomError

# Pattern strings, not compiled objects: `re` compiles each on first use (and caches it), so a
# command that never validates that field never pays for it.
_REPO_RE = r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$"
_DIGEST_RE = r"@sha256:[0-9a-f]{64}$"
_COMMIT_RE = r"^[0-9a-f]{40}$"
_SIZE_RE = r"^[1-9][0-9]{0,15}[bkmg]?$"

MAX_PATH = 1024
MAX_ARG = 256
MAX_TEXT = 4096
# Sizes that make sense on a Spark: one node has 128 GB of memory; nobody runs 64 of them.
MAX_NODES = 64
GIB = 1024**3


def _problem(kind: str, message: str, hint: str, **context: object) -> PydanticCustomError:
    return PydanticCustomError(kind, message, {"hint": hint.format(**context), **context})


def _pattern(
    pattern: str, kind: str, message: str, hint: str, *, refuse: Callable[[str], bool] | None = None
) -> AfterValidator:
    """A check refusing, with one problem, a value that `pattern` does not match or that `refuse`
    holds for; `{value}` in the message and hint stands for the value."""

    def check(value: str) -> str:
        if not re.match(pattern, value) or (refuse is not None and refuse(value)):
            raise _problem(kind, message, hint, value=value)
        return value

    return AfterValidator(check)


def _check_host_path(value: str) -> str:
    if not (value.startswith("/") or value == "~" or value.startswith("~/")):
        raise _problem(
            "path",
            "'{value}' is not an absolute path",
            "write an absolute path (/data/models/...) or one under the node's home (~/...)",
            value=value,
        )
    if any(not char.isprintable() for char in value):
        raise _problem("path", "the path holds a control character", "remove it", value=value)
    if any(char in value for char in "'\"\\"):
        raise _problem(
            "path",
            "'{value}' holds a quote or a backslash",
            "rename the directory, or point the spec at a symlink without them (ssh and systemd read them differently)",
            value=value,
        )
    if ":" in value:
        raise _problem(
            "path",
            "'{value}' holds ':', which Docker reads as the end of a bind mount's source",
            "rename the directory, or point the spec at a symlink without ':'",
            value=value,
        )
    if ".." in value.split("/"):
        raise _problem(
            "path",
            "'{value}' has a '..' component",
            "write the path without '..' (where it leads depends on symlinks on each node)",
            value=value,
        )
    if len(value) > MAX_PATH:
        raise _problem("path", "the path is longer than {limit} characters", "shorten it", value=value, limit=MAX_PATH)
    return value


def _check_arg_value(value: str) -> str:
    """A value rendered as one `vllm serve` argument: never mistaken for a flag, never split."""
    if (
        not value
        or len(value) > MAX_ARG
        or value.startswith("-")
        or any(not c.isprintable() or c.isspace() for c in value)
    ):
        raise _problem(
            "arg_value",
            "'{value}' cannot be passed as a `vllm serve` value",
            "use 1-{limit} printable characters without spaces, not starting with '-'",
            value=value,
            limit=MAX_ARG,
        )
    return value


def _ipv4(value: str, hint: str) -> ipaddress.IPv4Address:
    try:
        return ipaddress.IPv4Address(value)
    except ValueError:
        raise _problem("ipv4", "'{value}' is not an IPv4 address", hint, value=value) from None


def _check_fabric_ip(value: str) -> str:
    address = _ipv4(value, "write the fabric address as four numbers, e.g. 10.10.10.11 (see `ip -br addr`)")
    reasons = {
        "loopback": address.is_loopback,
        "link-local (169.254.0.0/16, an unconfigured port)": address.is_link_local,
        "unspecified": address.is_unspecified,
        "multicast": address.is_multicast,
        "broadcast": address == ipaddress.IPv4Address("255.255.255.255"),
    }
    for reason, applies in reasons.items():
        if applies:
            raise _problem(
                "fabric_ip",
                "'{value}' is " + reason + " and cannot carry tensor-parallel traffic",
                "give the QSFP port a static address (netplan) and use that; `ip -br addr` shows it",
                value=value,
            )
    return value


def _check_bind_ip(value: str) -> str:
    _ipv4(value, "use 0.0.0.0 for every interface, or one address of the head")
    return value


def _check_listen(value: str) -> str:
    """`off`, or an IP address and port to serve on (`127.0.0.1:9464`, `[::1]:9464`, `0.0.0.0:9464`)."""
    if value == "off":
        return value
    host, _, port = value.rpartition(":")
    bracketed = host.startswith("[") and host.endswith("]")
    try:
        address = ipaddress.ip_address(host[1:-1] if bracketed else host)
        number = int(port) if port.isdigit() else 0
    except ValueError:
        address, number = None, 0
    if address is None or not 1 <= number <= 65535 or (address.version == 6) != bracketed:
        raise _problem(
            "listen",
            "'{value}' is not an address:port to listen on",
            "write e.g. 127.0.0.1:9464 (this machine only), [::1]:9464, 0.0.0.0:9464 (the API key then "
            "required), or off",
            value=value,
        )
    return value


# A byte count as people write it: 2700000000, "2.7GB" or "2.7G" (powers of 1000, as disks and
# vLLM's own figures are given), "2.5GiB" (powers of 1024).
_BYTES_RE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([kmgt]i?)?b?\s*$", re.IGNORECASE)
_BYTE_UNITS = {"": 1, "k": 1000, "m": 1000**2, "g": 1000**3, "t": 1000**4}
_BYTE_UNITS |= {"ki": 1024, "mi": 1024**2, "gi": 1024**3, "ti": 1024**4}


def _parse_bytes(value: object) -> object:
    """A string with a unit as a whole number of bytes; anything else is left to the int check."""
    if not isinstance(value, str):
        return value
    match = _BYTES_RE.match(value)
    if match is None:
        raise _problem(
            "bytes",
            "'{value}' is not a byte count",
            "write bytes (2700000000) or a size with a unit: 2.7GB or 2.7G (powers of 1000), 2.5GiB (1024)",
            value=value,
        )
    number, unit = match.group(1), (match.group(2) or "").lower()
    return round(float(number) * _BYTE_UNITS[unit])


def _check_text(value: str) -> str:
    if len(value) > MAX_TEXT or any(not char.isprintable() for char in value):
        raise _problem(
            "text",
            "the value is longer than {limit} characters or holds a control character",
            "shorten it and remove line breaks, tabs and other control characters",
            limit=MAX_TEXT,
        )
    return value


def _check_size(value: str) -> str:
    lowered = value.lower()
    units = {"k": 1024, "m": 1024**2, "g": GIB}  # Docker's units are powers of 1024
    if not re.match(_SIZE_RE, lowered) or int(lowered.rstrip("bkmg")) * units.get(lowered[-1], 1) > 128 * GIB:
        raise _problem("size", "'{value}' is not a size up to 128g", "write e.g. 32g, 512m or 1073741824", value=value)
    return value


def names_api_key(arg: str) -> bool:
    """Whether a `vllm serve` argument sets the API key, in any spelling vLLM accepts.

    vLLM's parser turns '_' into '-' in a flag's name (up to a '.'), takes `--flag=value`, and
    argparse accepts an unambiguous prefix (`--api-k`).
    """
    if not arg.startswith("--"):
        return False
    name = arg[2:].split("=", 1)[0].split(".", 1)[0].replace("_", "-").lower()
    return name == "api-key" or (len(name) >= len("api-k") and "api-key".startswith(name))


Name = Annotated[
    str,
    _pattern(
        r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$",
        "name",
        "'{value}' is not a valid name",
        "use 1-63 lowercase letters, digits and '-', starting and ending with a letter or digit",
    ),
]
IfName = Annotated[
    str,
    _pattern(
        r"^[A-Za-z0-9_.:-]{1,15}$",
        "ifname",
        "'{value}' is not a network interface name",
        "use the name `ip -br link` prints, e.g. enp1s0f1np1 (at most 15 characters)",
    ),
]
HcaName = Annotated[
    str,
    _pattern(
        r"^[A-Za-z0-9_]{1,64}$",
        "hca",
        "'{value}' is not an RDMA device name",
        "use the names `rdma link` prints before '/', e.g. rocep1s0f1",
    ),
]
EnvName = Annotated[
    str,
    _pattern(
        r"^[A-Za-z_][A-Za-z0-9_]*$",
        "env_name",
        "'{value}' is not an environment variable name",
        "use letters, digits and '_', not starting with a digit",
    ),
]
HostName = Annotated[
    str,
    _pattern(
        r"^[A-Za-z0-9]([A-Za-z0-9.-]{0,252})$",
        "host",
        "'{value}' is not a host name or IPv4 address",
        "write the worker's fabric address (e.g. 10.10.10.11) or a resolvable name; "
        "put the user in `user:`, not in `host:`",
        refuse=lambda value: ".." in value,
    ),
]
UserName = Annotated[
    str,
    _pattern(
        r"^[A-Za-z_][A-Za-z0-9_.-]{0,31}$",
        "user",
        "'{value}' is not a user name",
        "write the login name alone (letters, digits, '_', '.', '-'; up to 32); the host goes in host:",
    ),
]
# A plain file name inside the model dir: never a path that could lead out of it.
FileName = Annotated[
    str,
    _pattern(
        r"^[A-Za-z0-9][A-Za-z0-9._-]{0,254}$",
        "file_name",
        "'{value}' is not a plain file name",
        "write the file's name alone (letters, digits, '.', '_', '-'), e.g. J268-ho-v31-K5n.json; "
        "it is looked up inside the model dir",
        refuse=lambda value: value in {".", ".."},
    ),
]
Revision = Annotated[
    str,
    _pattern(
        r"^[A-Za-z0-9._/-]{1,255}$",
        "revision",
        "'{value}' is not a branch, tag or commit",
        "write a 40-hex commit (best), or a branch or tag name such as main",
        refuse=lambda value: value.startswith("-") or ".." in value or value.endswith("/"),
    ),
]
ImageRef = Annotated[
    str,
    Field(min_length=1),
    _pattern(
        r"^[a-z0-9][A-Za-z0-9._/:@-]{0,511}$",
        "image_ref",
        "'{value}' is not an image reference",
        "write registry/name@sha256:<digest>, e.g. the default ghcr.io/0xsero/...@sha256:...",
    ),
]
Url = Annotated[
    str,
    _pattern(
        r"^https?://[^\s/]+",
        "url",
        "'{value}' is not an http(s) URL",
        "write the mirror's base URL, e.g. https://hf-mirror.example.org",
        refuse=lambda value: len(value) > 2048 or any(c.isspace() for c in value),
    ),
]
Size = Annotated[str, AfterValidator(_check_size)]
EnvValue = Annotated[str, AfterValidator(_check_text)]
ExtraArg = Annotated[str, Field(min_length=1), AfterValidator(_check_text)]
# One word of a command's argv (loop.notify): printable, no line breaks.
NotifyWord = Annotated[str, Field(min_length=1), AfterValidator(_check_text)]
HostPath = Annotated[str, AfterValidator(_check_host_path)]
ArgValue = Annotated[str, AfterValidator(_check_arg_value)]
FabricIPv4 = Annotated[str, AfterValidator(_check_fabric_ip)]
BindIPv4 = Annotated[str, AfterValidator(_check_bind_ip)]
Listen = Annotated[str, AfterValidator(_check_listen)]
# An int in the model; the spec may write it with a unit (see _parse_bytes).
Bytes = Annotated[
    int,
    BeforeValidator(_parse_bytes),
    WithJsonSchema(
        {
            "anyOf": [
                {"type": "integer", "minimum": 1},
                {"type": "string", "pattern": r"^\s*[0-9]+(\.[0-9]+)?\s*([kKmMgGtT][iI]?)?[bB]?\s*$"},
            ]
        }
    ),
]
Port = Annotated[int, Field(ge=1, le=65535)]
PositiveInt = Annotated[int, Field(ge=1)]
Seconds = Annotated[int, Field(ge=1, le=86_400)]
Tokens = Annotated[int, Field(ge=1, le=2**21)]
