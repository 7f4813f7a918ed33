"""Deterministic node images, written as layer tarballs here and pushed with the Registry HTTP API v2.

`tb/pybase` is the "hostpy" rootfs: static busybox with its applet
links, Debian's python3.11 with its stdlib (minus the listed dirs), the ldd closure, and
a minimal /etc. `tb/engine` adds one layer: the engine stand-in under /opt/engine and a
`vllm` launcher. No `docker import`: the tar is written with `tarfile` (sorted entries,
mtime 0, uid/gid 0, GNU format so no pax timestamps), gzipped with mtime 0, and the image
config has a fixed `created`, so the same inputs always give the same manifest digest.

Files get mtime 0, so Debian's timestamp-based .pyc files would never match their
sources and every import would recompile; their recorded source mtime is zeroed too
(only when the .pyc was fresh for its source; stale ones are dropped).
"""

from __future__ import annotations

import gzip
import hashlib
import http.client
import io
import json
import os
import platform
import struct
import subprocess
import tarfile
import urllib.parse
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import BinaryIO

from tests.testbed.config import PACKAGE_DIR, REGISTRY, TestbedError
from tests.testbed.web import docker_api

FORMAT = "hostpy-1"  # part of the base layer cache key: bump when the rootfs recipe changes
PYTHON = Path("/usr/bin/python3.11")
STDLIB = Path("/usr/lib/python3.11")
BUSYBOX = Path("/bin/busybox")
HAPROXY = Path("/usr/sbin/haproxy")
STDLIB_EXCLUDE = {"idlelib", "tkinter", "turtledemo", "ensurepip", "lib2to3", "test", "pydoc_data"}
STDLIB_EXCLUDE_FILES = {"EXTERNALLY-MANAGED"}
ENGINE_DIR = PACKAGE_DIR / "engine"
CREATED = "1970-01-01T00:00:00Z"
GZIP_LEVEL = 6
CONFIG = {
    "Env": ["PATH=/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin", "PYTHONDONTWRITEBYTECODE=1"],
    "WorkingDir": "/srv",
    "Cmd": ["/usr/bin/python3"],
}
VLLM_LAUNCHER = (
    b"#!/usr/bin/python3\n"
    b'import sys; sys.path.insert(0, "/opt/engine"); from engine import main; raise SystemExit(main(sys.argv[1:]))\n'
)
MANIFEST_TYPE = "application/vnd.docker.distribution.manifest.v2+json"
CONFIG_TYPE = "application/vnd.docker.container.image.v1+json"
LAYER_TYPE = "application/vnd.docker.image.rootfs.diff.tar.gzip"
ETC_FILES = {
    "etc/passwd": b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/bin/false\n",
    "etc/group": b"root:x:0:\nnogroup:x:65534:\n",
    "etc/nsswitch.conf": b"passwd: files\ngroup: files\nhosts: files dns\n",
}
BASE_DIRS = {"bin": 0o755, "dev": 0o755, "etc": 0o755, "proc": 0o755, "root": 0o700, "sbin": 0o755}
BASE_DIRS |= {"srv": 0o755, "sys": 0o755, "tmp": 0o1777, "usr/local/bin": 0o755, "var/tmp": 0o1777}


# ---------------------------------------------------------------- rootfs entries


@dataclass(frozen=True)
class Entry:
    """One tar member: a directory, a symlink, or a file copied from the host or given literally."""

    path: str  # relative to the image root, no leading slash
    kind: str  # "dir" | "file" | "symlink"
    mode: int = 0o755
    source: Path | None = None
    data: bytes | None = None
    target: str = ""
    pyc: bool = False  # zero the recorded source mtime on the way in

    def fingerprint(self) -> str:
        """Changes whenever the member's bytes could change; the cache key of the base layer."""
        stat = ""
        if self.source is not None:
            st = self.source.stat()
            stat = f"{self.source}:{st.st_size}:{st.st_mtime_ns}"
        digest = hashlib.sha256(self.data).hexdigest() if self.data is not None else ""
        return f"{self.path}|{self.kind}|{self.mode:o}|{self.target}|{stat}|{digest}|{self.pyc}"

    def content(self) -> bytes:
        if self.data is not None:
            return self.data
        assert self.source is not None
        raw = self.source.read_bytes()
        return raw[:8] + b"\0\0\0\0" + raw[12:] if self.pyc else raw


def _dir(path: str, mode: int = 0o755) -> Entry:
    return Entry(path, "dir", mode)


def _file(path: str, source: Path, *, pyc: bool = False) -> Entry:
    return Entry(path, "file", source.stat().st_mode & 0o755, source=source, pyc=pyc)


def base_entries() -> list[Entry]:
    """Every member of the hostpy base layer, parents included, sorted by path."""
    entries: dict[str, Entry] = {p: _dir(p, m) for p, m in BASE_DIRS.items()}
    entries["bin/busybox"] = _file("bin/busybox", BUSYBOX)
    for applet in _busybox_applets():
        entries.setdefault(applet, Entry(applet, "symlink", 0o777, target="/bin/busybox"))
    entries["usr/bin/python3.11"] = _file("usr/bin/python3.11", PYTHON)
    entries["usr/bin/python3"] = Entry("usr/bin/python3", "symlink", 0o777, target="python3.11")
    entries["usr/bin/python"] = Entry("usr/bin/python", "symlink", 0o777, target="python3")
    stdlib = _stdlib_entries()
    entries.update({e.path: e for e in stdlib})
    dynload = [STDLIB / e.path[len("usr/lib/python3.11/") :] for e in stdlib if e.path.endswith(".so")]
    for lib in _ldd_closure([PYTHON, *dynload]):
        entries[lib.lstrip("/")] = _file(lib.lstrip("/"), Path(lib).resolve())
    for path, data in ETC_FILES.items():
        entries[path] = Entry(path, "file", 0o644, data=data)
    return _with_parents(entries)


def _with_parents(entries: dict[str, Entry]) -> list[Entry]:
    for path in list(entries):
        parts = path.split("/")[:-1]
        for i in range(1, len(parts) + 1):
            entries.setdefault("/".join(parts[:i]), _dir("/".join(parts[:i])))
    return [entries[p] for p in sorted(entries)]


def _busybox_applets() -> list[str]:
    out = subprocess.run([str(BUSYBOX), "--list-full"], capture_output=True, text=True, check=True).stdout
    return [line.strip().lstrip("/") for line in out.splitlines() if line.strip()]


def _stdlib_entries() -> list[Entry]:
    found: list[Entry] = []
    for dirpath, dirnames, filenames in os.walk(STDLIB):
        here = Path(dirpath)
        rel = "usr/lib/python3.11" if here == STDLIB else f"usr/lib/python3.11/{here.relative_to(STDLIB)}"
        if here == STDLIB:
            dirnames[:] = [d for d in dirnames if d not in STDLIB_EXCLUDE and not d.startswith("config-")]
            filenames = [f for f in filenames if f not in STDLIB_EXCLUDE_FILES]
        found.append(_dir(rel))
        for name in sorted(dirnames + filenames):
            entry = _stdlib_member(here / name, f"{rel}/{name}")
            if entry is not None:
                found.append(entry)
        dirnames[:] = [d for d in dirnames if not (here / d).is_symlink()]
    return found


def _stdlib_member(path: Path, rel: str) -> Entry | None:
    if path.is_symlink():
        target = path.resolve()
        if target.is_relative_to(STDLIB) and target.exists():
            return Entry(rel, "symlink", 0o777, target=os.readlink(path))
        # e.g. Debian's sitecustomize.py -> /etc/python3.11/...: copy the content in.
        return _file(rel, target) if target.is_file() else None
    if path.is_dir():
        return None  # walked separately
    if path.suffix == ".pyc":
        return _file(rel, path, pyc=True) if _fresh_pyc(path) else None
    return _file(rel, path)


def _fresh_pyc(pyc: Path) -> bool:
    """A timestamp-based .pyc that records exactly its source's mtime and size."""
    source = pyc.parent.parent / (pyc.name.split(".", 1)[0] + ".py")
    try:
        header = pyc.read_bytes()[:16]
        st = source.stat()
    except OSError:
        return False
    if len(header) < 16:
        return False
    flags, mtime, size = struct.unpack("<III", header[4:16])
    return bool(flags == 0 and mtime == int(st.st_mtime) & 0xFFFFFFFF and size == st.st_size & 0xFFFFFFFF)


def _ldd_closure(binaries: list[Path]) -> list[str]:
    """Absolute paths (as the loader names them) of every shared library the binaries need."""
    out = subprocess.run(["ldd", *map(str, binaries)], capture_output=True, text=True, check=False).stdout
    libs: set[str] = set()
    for line in out.splitlines():
        if not line.startswith("\t"):
            continue
        if "not found" in line:
            raise TestbedError(f"ldd: missing library: {line.strip()}")
        words = line.split("=>")[-1].split()
        if words and words[0].startswith("/"):
            libs.add(words[0])
    return sorted(libs)


def engine_entries(engine_dir: Path) -> list[Entry]:
    """/opt/engine/*.py from the engine stand-in (whatever is there) and /usr/local/bin/vllm."""
    entries: dict[str, Entry] = {"opt/engine": _dir("opt/engine")}
    for src in sorted(engine_dir.glob("*.py")) if engine_dir.is_dir() else []:
        entries[f"opt/engine/{src.name}"] = Entry(f"opt/engine/{src.name}", "file", 0o644, data=src.read_bytes())
    entries["usr/local/bin/vllm"] = Entry("usr/local/bin/vllm", "file", 0o755, data=VLLM_LAUNCHER)
    return _with_parents(entries)


def front_entries() -> list[Entry]:
    """The front's layer: Debian's haproxy and the libraries it needs, on the hostpy base."""
    entries = {"usr/sbin/haproxy": _file("usr/sbin/haproxy", HAPROXY)}
    for lib in _ldd_closure([HAPROXY]):
        entries[lib.lstrip("/")] = _file(lib.lstrip("/"), Path(lib).resolve())
    return _with_parents(entries)


# ---------------------------------------------------------------- layers


@dataclass(frozen=True)
class Layer:
    path: Path  # the gzipped tar
    digest: str  # sha256 of the gzipped bytes (the blob)
    diff_id: str  # sha256 of the uncompressed tar
    size: int


class _Digesting:
    """Write-through file wrapper that hashes and counts what passes (tarfile needs tell())."""

    def __init__(self, sink: BinaryIO | gzip.GzipFile) -> None:
        self.sink = sink
        self.sha = hashlib.sha256()
        self.size = 0

    def write(self, data: bytes) -> int:
        self.sha.update(data)
        self.size += len(data)
        self.sink.write(data)
        return len(data)

    def tell(self) -> int:
        return self.size

    def flush(self) -> None:
        self.sink.flush()


def _tarinfo(entry: Entry, size: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(entry.path)
    info.mode, info.mtime, info.uid, info.gid, info.uname, info.gname = entry.mode, 0, 0, 0, "", ""
    info.type = {"dir": tarfile.DIRTYPE, "file": tarfile.REGTYPE, "symlink": tarfile.SYMTYPE}[entry.kind]
    info.linkname = entry.target
    info.size = size
    return info


def write_layer(entries: Iterable[Entry], out: Path) -> Layer:
    """Write a deterministic gzipped layer tar; return its blob digest, diff ID and size."""
    out.parent.mkdir(parents=True, exist_ok=True)
    # A name of this process's own: two builds of the same layer at once (the e2e bring-up and
    # the real-engine prepare) each write theirs, and the same bytes replace the same file.
    tmp = out.with_name(f"{out.name}.{os.getpid()}.tmp")
    with open(tmp, "wb") as raw:
        blob = _Digesting(raw)
        with gzip.GzipFile(filename="", mode="wb", fileobj=blob, mtime=0, compresslevel=GZIP_LEVEL) as gz:
            tar_stream = _Digesting(gz)
            with tarfile.open(fileobj=tar_stream, mode="w:", format=tarfile.GNU_FORMAT) as tar:  # type: ignore[call-overload]
                for entry in entries:
                    data = entry.content() if entry.kind == "file" else b""
                    tar.addfile(_tarinfo(entry, len(data)), io.BytesIO(data) if data else None)
    os.replace(tmp, out)
    return Layer(out, f"sha256:{blob.sha.hexdigest()}", f"sha256:{tar_stream.sha.hexdigest()}", blob.size)


def base_layer(cache: Path) -> Layer:
    """The hostpy layer, rebuilt only when any input file (path, size, mtime) or the recipe changed."""
    entries = base_entries()
    key = hashlib.sha256("\n".join([FORMAT, *(e.fingerprint() for e in entries)]).encode()).hexdigest()
    meta_path, tar_path = cache / "pybase" / "layer.json", cache / "pybase" / "layer.tar.gz"
    try:
        meta = json.loads(meta_path.read_text())
        if meta["key"] == key and tar_path.stat().st_size == meta["size"]:
            return Layer(tar_path, meta["digest"], meta["diff_id"], meta["size"])
    except (OSError, ValueError, KeyError):
        pass
    layer = write_layer(entries, tar_path)
    meta = {"key": key, "digest": layer.digest, "diff_id": layer.diff_id, "size": layer.size}
    meta_tmp = meta_path.with_name(f"{meta_path.name}.{os.getpid()}.tmp")
    meta_tmp.write_text(json.dumps(meta, indent=1) + "\n")
    os.replace(meta_tmp, meta_path)
    return layer


# ---------------------------------------------------------------- images


def _canonical(obj: object) -> bytes:
    return json.dumps(obj, sort_keys=True, separators=(",", ":")).encode()


def _arch() -> str:
    machine = platform.machine()
    return {"x86_64": "amd64", "aarch64": "arm64"}.get(machine, machine)


@dataclass(frozen=True)
class Image:
    repo: str  # e.g. tb/pybase
    layers: tuple[Layer, ...]
    config: bytes = field(init=False)
    manifest: bytes = field(init=False)

    def __post_init__(self) -> None:
        history = [
            {"created": CREATED, "created_by": f"tests.testbed.images {self.repo} layer {i}"}
            for i in range(len(self.layers))
        ]
        config = {
            "architecture": _arch(),
            "os": "linux",
            "created": CREATED,
            "config": CONFIG,
            "rootfs": {"type": "layers", "diff_ids": [layer.diff_id for layer in self.layers]},
            "history": history,
        }
        object.__setattr__(self, "config", _canonical(config))
        manifest = {
            "schemaVersion": 2,
            "mediaType": MANIFEST_TYPE,
            "config": {"mediaType": CONFIG_TYPE, "size": len(self.config), "digest": self.config_digest},
            "layers": [{"mediaType": LAYER_TYPE, "size": layer.size, "digest": layer.digest} for layer in self.layers],
        }
        object.__setattr__(self, "manifest", _canonical(manifest))

    @property
    def config_digest(self) -> str:
        return f"sha256:{hashlib.sha256(self.config).hexdigest()}"

    @property
    def digest(self) -> str:
        return f"sha256:{hashlib.sha256(self.manifest).hexdigest()}"

    @property
    def name(self) -> str:
        return f"{REGISTRY}/{self.repo}"

    @property
    def ref(self) -> str:
        return f"{self.name}@{self.digest}"


@dataclass(frozen=True)
class Images:
    pybase: Image
    engine: Image
    front: Image

    def refs(self) -> dict[str, str]:
        return {"pybase": self.pybase.ref, "engine": self.engine.ref, "front": self.front.ref}


def build(cache: Path, engine_dir: Path = ENGINE_DIR) -> Images:
    """Build (or reuse) the base layer and build the engine and front layers; nothing is pushed."""
    base = base_layer(cache)
    engine = write_layer(engine_entries(engine_dir), cache / "engine" / "layer.tar.gz")
    front = write_layer(front_entries(), cache / "front" / "layer.tar.gz")
    return Images(Image("tb/pybase", (base,)), Image("tb/engine", (base, engine)), Image("tb/front", (base, front)))


# ---------------------------------------------------------------- registry (HTTP API v2)


class Registry:
    """Just enough of the Docker Registry HTTP API v2 to push an image: blobs, mounts, a manifest."""

    def __init__(self, address: str = REGISTRY) -> None:
        host, port = address.rsplit(":", 1)
        self.host, self.port = host, int(port)

    def _request(
        self, method: str, path: str, body: bytes | BinaryIO | None = None, headers: dict[str, str] | None = None
    ) -> tuple[int, dict[str, str], bytes]:
        conn = http.client.HTTPConnection(self.host, self.port, timeout=120)
        try:
            conn.request(method, path, body=body, headers=headers or {})
            resp = conn.getresponse()
            return resp.status, {k.lower(): v for k, v in resp.getheaders()}, resp.read()
        finally:
            conn.close()

    def has_blob(self, repo: str, digest: str) -> bool:
        return self._request("HEAD", f"/v2/{repo}/blobs/{digest}")[0] == 200

    def push_blob(
        self, repo: str, digest: str, path: Path | None = None, data: bytes | None = None, mount_from: str = ""
    ) -> None:
        """Upload one blob unless the repo has it; a cross-repo mount avoids re-sending shared layers."""
        if self.has_blob(repo, digest):
            return
        query = f"?mount={digest}&from={mount_from}" if mount_from else ""
        status, headers, body = self._request("POST", f"/v2/{repo}/blobs/uploads/{query}")
        if status == 201:
            return
        if status != 202:
            raise TestbedError(f"registry: start upload to {repo}: {status} {body[:200]!r}")
        url = urllib.parse.urlsplit(headers["location"])
        put = f"{url.path}?{url.query}&digest={digest}" if url.query else f"{url.path}?digest={digest}"
        size = path.stat().st_size if path is not None else len(data or b"")
        hdrs = {"Content-Type": "application/octet-stream", "Content-Length": str(size)}
        if path is not None:
            with open(path, "rb") as fh:
                status, _, body = self._request("PUT", put, fh, hdrs)
        else:
            status, _, body = self._request("PUT", put, data, hdrs)
        if status != 201:
            raise TestbedError(f"registry: upload {digest} to {repo}: {status} {body[:200]!r}")

    def push(self, image: Image, mount_from: str = "") -> None:
        for layer in image.layers:
            self.push_blob(image.repo, layer.digest, path=layer.path, mount_from=mount_from)
        self.push_blob(image.repo, image.config_digest, data=image.config)
        headers = {"Content-Type": MANIFEST_TYPE}
        status, hdrs, body = self._request("PUT", f"/v2/{image.repo}/manifests/latest", image.manifest, headers)
        if status != 201:
            raise TestbedError(f"registry: manifest {image.repo}: {status} {body[:300]!r}")
        if hdrs.get("docker-content-digest") != image.digest:
            raise TestbedError(
                f"registry: {image.repo} stored as {hdrs.get('docker-content-digest')}, expected {image.digest}"
            )


# ---------------------------------------------------------------- pulls through the nodes' dockerd


def pull(sock: str, image: Image, tag: str) -> None:
    """`docker pull <name>@<digest>` through one dockerd (Engine API), then tag it `tag`."""
    pull_ref(sock, image.ref, tag)


def pull_ref(sock: str, ref: str, tag: str) -> None:
    """Pull `ref` (<name>@<digest>) through one dockerd, then tag it `tag`."""
    name, _, digest = ref.partition("@")
    query = urllib.parse.urlencode({"fromImage": name, "tag": digest})
    status, body = docker_api(sock, "POST", f"/images/create?{query}", timeout=300)
    errors = [json.loads(line).get("error") for line in body.splitlines() if b'"error"' in line]
    if status != 200 or errors:
        raise TestbedError(f"pull {ref}: {status} {errors or body[:300]!r}")
    repo, _, version = tag.partition(":")
    query = urllib.parse.urlencode({"repo": repo, "tag": version or "latest"})
    status, body = docker_api(sock, "POST", f"/images/{ref}/tag?{query}")
    if status != 201:
        raise TestbedError(f"tag {ref} as {tag}: {status} {body[:300]!r}")


def present(sock: str, ref: str) -> bool:
    """Whether the dockerd behind `sock` holds `ref`."""
    status, _ = docker_api(sock, "GET", f"/images/{ref}/json")
    return status == 200


def pull_everywhere(socks: list[str], pulls: list[tuple[Image, str]]) -> None:
    """All nodes in parallel; within a node in order (later images then reuse the shared base layer)."""

    def one_node(sock: str) -> None:
        for image, tag in pulls:
            pull(sock, image, tag)

    with ThreadPoolExecutor(max_workers=len(socks) or 1) as pool:
        for future in [pool.submit(one_node, s) for s in socks]:
            future.result()
