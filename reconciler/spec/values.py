"""The spec's value types: each constrained string, number and path a field may hold, checked
with a located problem and a hint (never a traceback), and the limits they share."""

from __future__ import annotations

import ipaddress
import re
from typing import Annotated

from pydantic import (
    AfterValidator,
    Field,
)
from pydantic_core import PydanticCustomError

# Pattern strings, not compiled objects: `re` compiles each on first use (and caches it), so a
# command that never validates that field never pays for it.
_NAME_RE = r"^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$"


_IFNAME_RE = r"^[A-Za-z0-9_.:-]{1,15}$"


_HCA_RE = r"^[A-Za-z0-9_]{1,64}$"


_ENV_RE = r"^[A-Za-z_][A-Za-z0-9_]*$"


_REPO_RE = r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$"


_HOST_RE = r"^[A-Za-z0-9]([A-Za-z0-9.-]{0,252})$"


_DIGEST_RE = r"@sha256:[0-9a-f]{64}$"


_COMMIT_RE = r"^[0-9a-f]{40}$"


_SIZE_RE = r"^[1-9][0-9]{0,15}[bkmg]?$"


_FILE_NAME_RE = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,254}$"


_USER_RE = r"^[A-Za-z_][A-Za-z0-9_.-]{0,31}$"


_REVISION_RE = r"^[A-Za-z0-9._/-]{1,255}$"


_IMAGE_RE = r"^[a-z0-9][A-Za-z0-9._/:@-]{0,511}$"


MAX_PATH = 1024


MAX_ARG = 256


MAX_TEXT = 4096


# Sizes that make sense on a Spark: one node has 128 GB of memory; nobody runs 64 of them.
MAX_NODES = 64


GIB = 1024**3


def _problem(kind: str, message: str, hint: str, **context: object) -> PydanticCustomError:
    return PydanticCustomError(kind, message, {"hint": hint.format(**context), **context})


def _check_name(value: str) -> str:
    if not re.match(_NAME_RE, value):
        raise _problem(
            "name",
            "'{value}' is not a valid name",
            "use 1-63 lowercase letters, digits and '-', starting and ending with a letter or digit",
            value=value,
        )
    return value


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


def _check_file_name(value: str) -> str:
    """A plain file name inside the model dir: never a path that could lead out of it."""
    if not re.match(_FILE_NAME_RE, value) or value in {".", ".."}:
        raise _problem(
            "file_name",
            "'{value}' is not a plain file name",
            "write the file's name alone (letters, digits, '.', '_', '-'), e.g. J268-ho-v31-K5n.json; "
            "it is looked up inside the model dir",
            value=value,
        )
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


def _check_user(value: str) -> str:
    if not re.match(_USER_RE, value):
        raise _problem(
            "user",
            "'{value}' is not a user name",
            "write the login name alone (letters, digits, '_', '.', '-'; up to 32); the host goes in host:",
            value=value,
        )
    return value


def _check_revision(value: str) -> str:
    if not re.match(_REVISION_RE, value) or value.startswith("-") or ".." in value or value.endswith("/"):
        raise _problem(
            "revision",
            "'{value}' is not a branch, tag or commit",
            "write a 40-hex commit (best), or a branch or tag name such as main",
            value=value,
        )
    return value


def _check_fabric_ip(value: str) -> str:
    try:
        address = ipaddress.IPv4Address(value)
    except ValueError:
        raise _problem(
            "ipv4",
            "'{value}' is not an IPv4 address",
            "write the fabric address as four numbers, e.g. 10.10.10.11 (see `ip -br addr`)",
            value=value,
        ) from None
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
    try:
        ipaddress.IPv4Address(value)
    except ValueError:
        raise _problem(
            "ipv4",
            "'{value}' is not an IPv4 address",
            "use 0.0.0.0 for every interface, or one address of the head",
            value=value,
        ) from None
    return value


def _check_ifname(value: str) -> str:
    if not re.match(_IFNAME_RE, value):
        raise _problem(
            "ifname",
            "'{value}' is not a network interface name",
            "use the name `ip -br link` prints, e.g. enp1s0f1np1 (at most 15 characters)",
            value=value,
        )
    return value


def _check_hca(value: str) -> str:
    if not re.match(_HCA_RE, value):
        raise _problem(
            "hca",
            "'{value}' is not an RDMA device name",
            "use the names `rdma link` prints before '/', e.g. rocep1s0f1",
            value=value,
        )
    return value


def _check_env_name(value: str) -> str:
    if not re.match(_ENV_RE, value):
        raise _problem(
            "env_name",
            "'{value}' is not an environment variable name",
            "use letters, digits and '_', not starting with a digit",
            value=value,
        )
    return value


def _check_host(value: str) -> str:
    if not re.match(_HOST_RE, value) or ".." in value:
        raise _problem(
            "host",
            "'{value}' is not a host name or IPv4 address",
            "write the worker's fabric address (e.g. 10.10.10.11) or a resolvable name; "
            "put the user in `user:`, not in `host:`",
            value=value,
        )
    return value


def _check_text(value: str) -> str:
    if len(value) > MAX_TEXT or any(not char.isprintable() for char in value):
        raise _problem(
            "text",
            "the value is longer than {limit} characters or holds a control character",
            "shorten it and remove line breaks, tabs and other control characters",
            limit=MAX_TEXT,
        )
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


def size_bytes(text: str) -> int:
    """'32g' -> bytes (Docker's units are powers of 1024)."""
    units = {"b": 1, "k": 1024, "m": 1024**2, "g": 1024**3}
    lowered = text.lower()
    if lowered[-1:] in units:
        return int(lowered[:-1]) * units[lowered[-1]]
    return int(lowered)


Name = Annotated[str, AfterValidator(_check_name)]


EnvValue = Annotated[str, AfterValidator(_check_text)]


ExtraArg = Annotated[str, Field(min_length=1), AfterValidator(_check_text)]


HostPath = Annotated[str, AfterValidator(_check_host_path)]


FileName = Annotated[str, AfterValidator(_check_file_name)]


ArgValue = Annotated[str, AfterValidator(_check_arg_value)]


UserName = Annotated[str, AfterValidator(_check_user)]


Revision = Annotated[str, AfterValidator(_check_revision)]


FabricIPv4 = Annotated[str, AfterValidator(_check_fabric_ip)]


BindIPv4 = Annotated[str, AfterValidator(_check_bind_ip)]


IfName = Annotated[str, AfterValidator(_check_ifname)]


HcaName = Annotated[str, AfterValidator(_check_hca)]


EnvName = Annotated[str, AfterValidator(_check_env_name)]


HostName = Annotated[str, AfterValidator(_check_host)]


Port = Annotated[int, Field(ge=1, le=65535)]


PositiveInt = Annotated[int, Field(ge=1)]


Seconds = Annotated[int, Field(ge=1, le=86_400)]


Tokens = Annotated[int, Field(ge=1, le=2**21)]
