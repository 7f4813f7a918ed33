"""Runs ON a node (stdlib only): everything the reconciler needs to know, in one round trip.

The reconciler sends this file's source to `python3 -` over SSH (or runs it locally) with a
trailing call `print_probe(ARGS)`; it prints one JSON document. It reports raw observations
only — sizes, stats, file texts, Docker's own JSON — and leaves every judgement to the pure
parsers on the reconciler side, so the logic is tested there, not here.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import socket
import stat
import subprocess
import sys
import time
import urllib.parse
from typing import Any

from reconciler.nodeside.common import (
    admin_command,
    docker_problem,
    docker_request,
    free_bytes,
    is_commit,
    key_file_state,
    pid_of,
    reply,
    runs_command,
)
from reconciler.nodeside.statedir import StateDir

MAX_PLAN_BYTES = 4 * 1024 * 1024
# A read of a /proc/sys file allocates the whole count in the kernel: 4 MiB fails with ENOMEM.
KERNEL_FILE_BYTES = 64 * 1024
# The testbed has no RDMA devices (and no Soft-RoCE): it points this at a Spark-shaped fixture
# tree, and `rdma -j link` output is then read from rdma-link.json next to that tree.
SYSFS_ROOT_ENV = "RECONCILER_SYSFS_ROOT"
# `ip` and `rdma` live in sbin, which a non-root PATH on Debian lacks.
TOOL_DIRS = ("/usr/sbin", "/sbin", "/usr/bin", "/bin")


def docker_get(path: str) -> Any:
    status, body = docker_request("GET", path)
    if status >= 400:
        raise OSError(f"docker {path}: HTTP {status}: {body[:200].decode(errors='replace')}")
    return json.loads(body)


def read_text(path: str, limit: int = MAX_PLAN_BYTES) -> str | None:
    """A regular file's text, or None: a FIFO or a device at the path is never read (it would hang
    the probe), whoever placed it."""
    try:
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    with os.fdopen(descriptor, "rb") as handle:
        try:
            if not stat.S_ISREG(os.fstat(descriptor).st_mode):
                return None
            return handle.read(limit).decode("utf-8", errors="replace")
        except OSError:
            return None


def kernel_file(path: str) -> str | None:
    """A /proc or /sys file's text (a small read: see KERNEL_FILE_BYTES)."""
    return read_text(path, KERNEL_FILE_BYTES)


def read_json(path: str) -> Any:
    text = read_text(path)
    try:
        return None if text is None else json.loads(text)
    except ValueError:
        return None


def list_files(root: str) -> dict[str, list[int]]:
    """relative path -> [size, mtime_ns, inode]; the hash cache key without the path."""
    files: dict[str, list[int]] = {}
    for directory, subdirs, names in os.walk(root):
        subdirs[:] = [name for name in subdirs if name != ".cache"]
        for name in names:
            full = os.path.join(directory, name)
            try:
                info = os.stat(full)
            except OSError:
                continue
            if stat.S_ISREG(info.st_mode):
                files[os.path.relpath(full, root)] = [info.st_size, info.st_mtime_ns, info.st_ino]
    return files


def tls_state(cert: str, key: str) -> dict[str, Any]:
    """The front's certificate (its SHA-256 fingerprint) and key file, never the key's content."""
    cert_path = os.path.expanduser(cert)
    described = key_file_state(cert_path)
    text = read_text(cert_path) if described.get("present") else None
    described["fingerprint"] = cert_fingerprint(text) if text else None
    return {"cert": described, "key": key_file_state(os.path.expanduser(key))}


def cert_fingerprint(pem: str) -> str | None:
    """SHA-256 of the first certificate's DER bytes, as AA:BB:..; None when there is none."""
    import base64
    import binascii
    import hashlib

    begin, end = "-----BEGIN CERTIFICATE-----", "-----END CERTIFICATE-----"
    start = pem.find(begin)
    stop = pem.find(end, start)
    if start < 0 or stop < 0:
        return None
    try:
        der = base64.b64decode("".join(pem[start + len(begin) : stop].split()), validate=True)
    except (binascii.Error, ValueError):
        return None
    return ":".join(f"{byte:02X}" for byte in hashlib.sha256(der).digest())


def process_alive(pid_file: str, command: list[str]) -> bool:
    """Whether the pid file's process still runs `command`: after a reboot the pid file is
    still there and its pid may belong to anything, sshd or dockerd included."""
    pid = pid_of(pid_file)
    return pid is not None and runs_command(pid, command)


def docker_state(label: str) -> dict[str, Any]:
    filters = urllib.parse.quote(json.dumps({"label": [label]}))
    try:
        listed = docker_get(f"/containers/json?all=1&filters={filters}")
        containers = [docker_get(f"/containers/{item['Id']}/json") for item in listed]
        images = docker_get("/images/json")
    except (OSError, ValueError) as exc:
        return {"error": docker_problem(exc)}
    refs = sorted({ref for image in images for ref in (image.get("RepoDigests") or []) + (image.get("RepoTags") or [])})
    ids = sorted({image["Id"] for image in images if isinstance(image.get("Id"), str)})
    return {"containers": containers, "images": refs, "image_ids": ids}


def pulled_images(directory: str, docker: dict[str, Any]) -> list[dict[str, Any]]:
    """The reconciler's records of its pulls here, each with whether its image is still there
    and the containers (anyone's) made from it."""
    records = [read_json(os.path.join(directory, name)) for name in list_dir(directory) if name.endswith(".json")]
    records = [record for record in records if isinstance(record, dict) and isinstance(record.get("id"), str)]
    if not records or "error" in docker:
        return []
    try:
        listed = docker_get("/containers/json?all=1")
    except (OSError, ValueError):
        return []
    users: dict[str, list[str]] = {}
    for item in listed:
        names = [name.lstrip("/") for name in item.get("Names") or []]
        users.setdefault(item.get("ImageID"), []).extend(names[:1] or [str(item.get("Id", ""))[:12]])
    ids = set(docker.get("image_ids") or [])
    return [{**record, "present": record["id"] in ids, "users": users.get(record["id"], [])} for record in records]


def image_store_state(store: str) -> dict[str, int]:
    """The images this node's store holds whole: pinned digest -> bytes of their blobs. A record
    is written once every blob it lists is there and verified, but a blob may go since (a disk
    error, a hand): a record counts only while each of its blobs is there at its size."""
    held: dict[str, int] = {}
    directory = os.path.join(store, "refs")
    for name in list_dir(directory):
        record = read_json(os.path.join(directory, name)) if name.endswith(".json") else None
        blobs = record.get("blobs") if isinstance(record, dict) else None
        digest = record.get("digest") if isinstance(record, dict) else None
        if isinstance(digest, str) and isinstance(blobs, dict) and blobs_present(store, blobs):
            held[digest] = sum(blobs.values())
    return held


def blobs_present(store: str, blobs: dict[Any, Any]) -> bool:
    for digest, size in blobs.items():
        hex_digits = digest.removeprefix("sha256:") if isinstance(digest, str) else ""
        if not isinstance(size, int) or len(hex_digits) != 64 or not hex_digits.isalnum():
            return False
        try:
            found = os.lstat(os.path.join(store, "blobs", "sha256", hex_digits))
        except OSError:
            return False
        if not stat.S_ISREG(found.st_mode) or found.st_size != size:
            return False
    return True


def registry_reach(check: dict[str, Any], refs: list[str]) -> dict[str, Any] | None:
    """Whether this node can open a connection to the image's registry; asked only while the
    image is missing here (a node that has it needs no registry)."""
    digest, address = check.get("digest"), (check["host"], int(check["port"]))
    if any(ref == check.get("ref") or (digest and ref.endswith("@" + digest)) for ref in refs):
        return None
    if docker_goes_another_way(address[0]):
        return None
    try:
        socket.create_connection(address, timeout=3.0).close()
    except OSError as exc:
        return {"address": f"{address[0]}:{address[1]}", "error": exc.strerror or type(exc).__name__}
    return {"address": f"{address[0]}:{address[1]}", "error": None}


def docker_goes_another_way(host: str) -> bool:
    """Docker pulls through a proxy, or from a mirror (Docker Hub's only): a direct connection
    proves nothing either way."""
    try:
        info = docker_get("/info")
    except (OSError, ValueError):
        return False
    if not isinstance(info, dict):
        return False
    mirrors = (info.get("RegistryConfig") or {}).get("Mirrors") if host == "registry-1.docker.io" else None
    return bool(info.get("HttpProxy") or info.get("HttpsProxy") or mirrors)


def list_dir(path: str) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except OSError:
        return []


def find_tool(name: str) -> str | None:
    return shutil.which(name) or next(
        (path for d in TOOL_DIRS if os.access(path := os.path.join(d, name), os.X_OK)), None
    )


def run_tool(argv: list[str]) -> tuple[str | None, str | None]:
    """(stdout, None) or (None, why it failed)."""
    path = find_tool(argv[0])
    if path is None:
        return None, f"{argv[0]} not found on PATH or in {', '.join(TOOL_DIRS)}"
    try:
        done = subprocess.run([path, *argv[1:]], capture_output=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return None, f"{' '.join(argv)}: {exc}"
    if done.returncode != 0:
        return None, f"{' '.join(argv)} exited {done.returncode}: {done.stderr.decode(errors='replace').strip()[:200]}"
    return done.stdout.decode("utf-8", errors="replace"), None


# The GID table's first entries: where a RoCE v2 GID moved when it left the configured index
# (a firmware update moved one from 3 to 4). A real table has 256 mostly empty entries.
GID_SCAN = 16


def infiniband(root: str, gid_index: int) -> dict[str, Any] | None:
    """Per RDMA device: its firmware; each port's state, rate, GID and GID type at `gid_index`
    and the other GIDs in use; its netdevs and their negotiated link speeds (Mb/s)."""
    base = os.path.join(root, "class", "infiniband")
    if not os.path.isdir(base):
        return None
    devices: dict[str, Any] = {}
    for hca in list_dir(base):
        ports: dict[str, Any] = {}
        for number in list_dir(os.path.join(base, hca, "ports")):
            port = os.path.join(base, hca, "ports", number)
            ports[number] = {
                "state": kernel_file(os.path.join(port, "state")),
                "rate": kernel_file(os.path.join(port, "rate")),
                "gid": kernel_file(os.path.join(port, "gids", str(gid_index))),
                "gid_type": kernel_file(os.path.join(port, "gid_attrs", "types", str(gid_index))),
                "gids": gids_in_use(port),
            }
        netdevs = list_dir(os.path.join(base, hca, "device", "net"))
        devices[hca] = {
            "ports": ports,
            "netdevs": netdevs,
            "firmware": kernel_file(os.path.join(base, hca, "fw_ver")),
            "speeds": {netdev: kernel_file(os.path.join(root, "class", "net", netdev, "speed")) for netdev in netdevs},
        }
    return devices


def gids_in_use(port: str) -> dict[str, list[str | None]]:
    """index -> [GID, type] for the entries of the table's head that hold an address."""
    found: dict[str, list[str | None]] = {}
    for index in range(GID_SCAN):
        gid = kernel_file(os.path.join(port, "gids", str(index)))
        if gid is not None and gid.strip().replace("0", "").replace(":", ""):
            found[str(index)] = [gid, kernel_file(os.path.join(port, "gid_attrs", "types", str(index)))]
    return found


def rdma_link(injected_root: str | None) -> tuple[str | None, str | None]:
    if injected_root is None:
        return run_tool(["rdma", "-j", "link"])
    path = os.path.join(os.path.dirname(injected_root.rstrip("/")), "rdma-link.json")
    text = read_text(path)
    return (text, None) if text is not None else (None, f"{path} not found")


def fabric_state(gid_index: int) -> dict[str, Any]:
    injected = os.environ.get(SYSFS_ROOT_ENV) or None
    root = injected or "/sys"
    ip_addr, ip_error = run_tool(["ip", "-j", "addr", "show"])
    rdma, rdma_error = rdma_link(injected)
    return {
        "sysfs_root": root,
        "infiniband": infiniband(root, gid_index),
        "ip_addr": ip_addr,
        "ip_error": ip_error,
        "rdma_link": rdma,
        "rdma_error": rdma_error,
    }


def docker_info() -> dict[str, Any]:
    try:
        info = docker_get("/info")
    except (OSError, ValueError) as exc:
        return {"error": docker_problem(exc)}
    return {
        "runtimes": sorted(info.get("Runtimes") or {}),
        "default_runtime": info.get("DefaultRuntime"),
        "server_version": info.get("ServerVersion"),
    }


def host_facts() -> dict[str, Any]:
    """What the ranks run on: kernel, boot, NVIDIA driver, Docker and the container toolkit.
    Read on every pass, so an update that lands under a running group is seen."""
    toolkit = run_tool(["nvidia-ctk", "--version"])[0] if find_tool("nvidia-ctk") else None
    try:
        docker_version = docker_get("/version").get("Version")
    except (OSError, ValueError, AttributeError):
        docker_version = None
    return {
        "kernel": kernel_file("/proc/sys/kernel/osrelease"),
        "boot_id": kernel_file("/proc/sys/kernel/random/boot_id"),
        "nvidia_driver": kernel_file("/proc/driver/nvidia/version"),
        "docker": docker_version,
        "toolkit": toolkit,
    }


def host_state() -> dict[str, Any]:
    """What only `reconciler doctor` asks for: clock, tools, Docker runtimes, the NVIDIA driver."""
    tools = ("python3", "rsync", "nvidia-ctk", "nvidia-container-runtime-hook")
    return {
        "time": time.time(),
        "python": sys.version.split()[0],
        "user": pwd.getpwuid(os.getuid()).pw_name,
        "tools": {name: find_tool(name) for name in tools},
        "docker_info": docker_info(),
        "nvidia_driver": kernel_file("/proc/driver/nvidia/version"),
        "listeners": listeners(),
    }


def listeners() -> list[list[Any]]:
    """Every listening TCP socket: [address, port, program or None] (the program when this user
    may see its file descriptors; root sees all)."""
    owners = _socket_owners()
    found = []
    for table, width in (("/proc/net/tcp", 4), ("/proc/net/tcp6", 16)):
        for line in (read_text(table) or "").splitlines()[1:]:
            fields = line.split()
            if len(fields) < 10 or fields[3] != "0A":  # 0A: LISTEN
                continue
            address, port = fields[1].split(":")
            found.append([_address(address, width), int(port, 16), owners.get(fields[9])])
    return found


def _address(hex_address: str, width: int) -> str:
    """/proc/net/tcp writes each 32-bit word of the address in the host's byte order."""
    raw = bytes.fromhex(hex_address)
    words = b"".join(raw[i : i + 4][::-1] if sys.byteorder == "little" else raw[i : i + 4] for i in range(0, width, 4))
    return socket.inet_ntop(socket.AF_INET if width == 4 else socket.AF_INET6, words)


def _socket_owners() -> dict[str, str]:
    """Socket inode -> the name of a process holding it."""
    owners: dict[str, str] = {}
    for pid in filter(str.isdigit, list_dir("/proc")):
        try:
            names = os.listdir(f"/proc/{pid}/fd")
            with open(f"/proc/{pid}/comm", encoding="utf-8", errors="replace") as handle:
                program = handle.read().strip()
        except OSError:
            continue
        for name in names:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{name}")
            except OSError:
                continue
            if target.startswith("socket:["):
                owners.setdefault(target[8:-1], program)
    return owners


def tree(path: str, manifest: str, plan: str, staged: str | None) -> dict[str, Any]:
    """One checkpoint tree: its files, manifest and EXL3 plan texts, and its staged plan."""
    return {
        "path": path,
        "files": list_files(path),
        "manifest": read_text(os.path.join(path, manifest)),
        "exl3_plan": read_text(os.path.join(path, "exl3", "plan", plan)),
        "staged_plan": read_text(staged) if staged else None,
    }


def legacy_commit(model_dir: str, state_dir: str) -> str | None:
    """The commit a pre-revisions model dir holds: the old cached listing says, or the Hub
    client's download metadata (its first line is the commit)."""
    listing = read_json(StateDir(state_dir).legacy_listing)
    if isinstance(listing, dict) and isinstance(listing.get("commit"), str) and is_commit(listing["commit"]):
        return str(listing["commit"])
    metadata = read_text(os.path.join(model_dir, ".cache", "huggingface", "download", "config.json.metadata"))
    first = (metadata or "").split("\n", 1)[0].strip()
    return first if is_commit(first) else None


def checkpoint_state(model_dir: str, state_dir: str, manifest: str, plan: str) -> dict[str, Any]:
    """model_dir (a link to a revision, a real directory from before revisions, or absent) and
    every revision directory beside it, `<model_dir>@<commit>`."""
    base = model_dir.rstrip("/")
    parent, name = os.path.split(base)
    revisions = {}
    for entry in list_dir(parent):
        head, at, commit = entry.partition("@")
        path = os.path.join(parent, entry)
        if head == name and at and is_commit(commit) and os.path.isdir(path) and not os.path.islink(path):
            revisions[commit] = tree(path, manifest, plan, StateDir(state_dir).staged_plan(commit, plan))
    link = os.readlink(base) if os.path.islink(base) else None
    legacy = os.path.isdir(base) and link is None
    return {
        "link": link,
        "legacy": tree(base, manifest, plan, None) if legacy else None,
        "legacy_commit": legacy_commit(base, state_dir) if legacy else None,
        "revisions": revisions,
        "record": read_json(StateDir(state_dir).checkpoint_record),
    }


def hub_listings(state_dir: str) -> list[Any]:
    """The head's cached Hub listings, one file per commit (STATE_DIR/hub/)."""
    directory = StateDir(state_dir).hub_listings
    return [read_json(os.path.join(directory, name)) for name in list_dir(directory) if name.endswith(".json")]


def probe(args: dict[str, Any]) -> dict[str, Any]:
    state_dir = os.path.expanduser(args["state_dir"])
    layout = StateDir(state_dir)
    model_dir = os.path.expanduser(args["model_dir"])
    return {
        "hostname": socket.gethostname(),
        "home": os.path.expanduser("~"),
        "meminfo": read_text("/proc/meminfo"),
        "checkpoint": checkpoint_state(model_dir, state_dir, args["manifest"], args["exl3_plan"]),
        "hash_cache": read_json(layout.hash_cache) or {},
        "hub_listings": hub_listings(state_dir) if args.get("head") else [],
        "disk_free": free_bytes(model_dir),
        "key_file": key_file_state(os.path.expanduser(args["key_file"])) if args.get("key_file") else None,
        "tls": tls_state(*args["tls_files"]) if len(args.get("tls_files") or []) == 2 else None,
        "guard_running": process_alive(layout.guard_pid, [layout.guard_program]),
        "guard_config": read_json(layout.guard_config),
        "guard_trip": read_json(layout.guard_trip),
        "guard_record": read_json(layout.guard_record),
        "hold": read_json(layout.hold),
        "restart_intent": read_json(layout.restart_intent),
        "restarts": read_json(layout.restarts) if args.get("head") else None,
        "breaker": read_json(layout.breaker) if args.get("head") else None,
        "front_draining": front_draining(layout, args["front_drain"]) if args.get("front_drain") else None,
        "docker": (docker := docker_state(args["label"])),
        "image_store": image_store_state(layout.image_store),
        "pulled": pulled_images(layout.pulled_images, docker),
        "registry": registry_reach(args["registry"], docker.get("images") or []) if args.get("registry") else None,
        "fabric": fabric_state(int(args.get("gid_index", 3))),
        "host_facts": host_facts(),
        "host": host_state() if args.get("doctor") else None,
    }


def front_draining(layout: StateDir, drain_acl: str) -> bool | None:
    """Whether the front's drain switch is on (a drain a reconciler began and never ended);
    None when no front answers on its admin socket."""
    answer = admin_command(layout.front_admin_socket, f"show acl {drain_acl}")
    if answer is None:
        return None
    return any(line.split()[-1:] == ["on"] for line in answer.splitlines())


def print_probe(args: dict[str, Any]) -> None:
    reply(probe(args))
