"""The node's image store (reconciler/nodeside/imagestore.py): fetch shipped through `python3 -` as
on a node, against a stand-in registry (a token service that wants the node's Docker credentials,
an index with two platforms and an attestation, blobs sent on to a storage origin of their own)
and a stand-in Docker on a unix socket; the relay, adopt, survey and prune against real files."""

from __future__ import annotations

import base64
import hashlib
import http.client
import json
import os
import re
import shutil
import socket
import socketserver
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest

from reconciler.errors import NodeCommandError
from reconciler.nodeside import imagestore, program
from reconciler.transport.base import CommandResult, run_program
from reconciler.transport.local import LocalTransport

NODE = LocalTransport("local")
REPO = "team/vllm"
USER, PASSWORD = "puller", "imagestore-test-password-value"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"


def digest_of(data: bytes) -> str:
    return f"sha256:{hashlib.sha256(data).hexdigest()}"


def descriptor(media_type: str, data: bytes, **extra: Any) -> dict[str, Any]:
    return {"mediaType": media_type, "digest": digest_of(data), "size": len(data), **extra}


def filler(seed: str, size: int) -> bytes:
    return (hashlib.sha256(seed.encode()).digest() * (size // 32 + 1))[:size]


@dataclass
class Image:
    """An image as its registry holds it: every manifest and blob by digest, the index's digest,
    and per architecture its manifest, config and layers."""

    blobs: dict[str, bytes] = field(default_factory=dict)
    index: str = ""
    manifest: dict[str, str] = field(default_factory=dict)
    config: dict[str, str] = field(default_factory=dict)
    layers: dict[str, list[str]] = field(default_factory=dict)

    def add(self, data: bytes) -> str:
        self.blobs[digest_of(data)] = data
        return digest_of(data)

    def needs(self, arch: str) -> dict[str, int]:
        """Every blob a pull for `arch` needs, with its size."""
        digests = [self.index, self.manifest[arch], self.config[arch], *self.layers[arch]]
        return {digest: len(self.blobs[digest]) for digest in digests}


def make_image(seed: str = "one") -> Image:
    """Two platforms that share a base layer, and an attestation whose platform is unknown/unknown."""
    image = Image()
    entries = []
    for arch, platform in (("amd64", {}), ("arm64", {"variant": "v8"})):
        config = json.dumps({"architecture": arch, "os": "linux", "seed": seed}).encode()
        layers = [filler("base", 70_000), filler(f"{seed}-{arch}", 50_000)]
        manifest = json.dumps(
            {
                "schemaVersion": 2,
                "mediaType": OCI_MANIFEST,
                "config": descriptor("application/vnd.oci.image.config.v1+json", config),
                "layers": [descriptor("application/vnd.oci.image.layer.v1.tar+gzip", layer) for layer in layers],
            }
        ).encode()
        image.config[arch], image.layers[arch] = image.add(config), [image.add(layer) for layer in layers]
        image.manifest[arch] = image.add(manifest)
        entries.append(descriptor(OCI_MANIFEST, manifest, platform={"os": "linux", "architecture": arch, **platform}))
    statement = b'{"predicateType": "https://slsa.dev/provenance/v1"}'
    attestation = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "config": descriptor("application/vnd.oci.image.config.v1+json", b"{}"),
            "layers": [descriptor("application/vnd.in-toto+json", statement)],
        }
    ).encode()
    image.add(statement)
    image.add(attestation)
    entries.append(descriptor(OCI_MANIFEST, attestation, platform={"os": "unknown", "architecture": "unknown"}))
    image.index = image.add(json.dumps({"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": entries}).encode())
    return image


# --- stand-in servers ---------------------------------------------------------------------------------


class _Handler(BaseHTTPRequestHandler):
    server: _Server

    def handle(self) -> None:
        # The fetch tries https first on a registry marked insecure: this plain-http server turns a
        # TLS greeting away at once (a real one may sit on it until its own timeout).
        if self.connection.recv(1, socket.MSG_PEEK) != b"\x16":
            super().handle()

    def do_GET(self) -> None:
        self.server.seen.append((self.path, dict(self.headers.items())))
        self.server.answer(self)

    def log_message(self, format: str, *args: Any) -> None:
        del format, args


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    answer: Callable[[BaseHTTPRequestHandler], None]
    seen: list[tuple[str, dict[str, str]]]

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


def send(handler: BaseHTTPRequestHandler, status: int, body: bytes = b"", **headers: str) -> None:
    handler.send_response(status)
    for name, value in headers.items():
        handler.send_header(name.replace("_", "-"), value)
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


def registry_error(handler: BaseHTTPRequestHandler, status: int, code: str, message: str, **headers: str) -> None:
    body = json.dumps({"errors": [{"code": code, "message": message}]}).encode()
    send(handler, status, body, Content_Type="application/json", **headers)


@dataclass
class RegistryStandIn:
    """A v2 registry: a token service that wants Basic credentials, manifests by digest, blobs sent
    on to `storage` (another origin), which honours Range unless told not to."""

    image: Image
    server: _Server
    storage: _Server
    token_uses: int = 1000  # a token stops working after this many requests
    issued: dict[str, int] = field(default_factory=dict)
    corrupt: set[str] = field(default_factory=set)
    ranges: bool = True
    trickle_once: set[str] = field(default_factory=set)
    echo_secrets_in: str | None = None  # a blob whose answer is a 403 quoting what the request carried

    @property
    def host(self) -> str:
        return self.server.url.removeprefix("http://")

    def ref(self, image: Image | None = None) -> str:
        return f"{self.host}/{REPO}@{(image or self.image).index}"

    def answer(self, handler: BaseHTTPRequestHandler) -> None:
        path = urllib.parse.urlsplit(handler.path).path
        if path == "/token":
            self.token(handler)
        elif not self.authorized(handler.headers.get("Authorization", "")):
            challenge = f'Bearer realm="{self.server.url}/token",service="stand-in"'
            registry_error(handler, 401, "UNAUTHORIZED", "authentication required", WWW_Authenticate=challenge)
        elif path == "/v2/":
            send(handler, 200, b"{}", Content_Type="application/json")
        else:
            self.content(handler, path)

    def token(self, handler: BaseHTTPRequestHandler) -> None:
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(handler.path).query)
        expected = "Basic " + base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode()
        if handler.headers.get("Authorization") != expected or query.get("scope") != [f"repository:{REPO}:pull"]:
            registry_error(handler, 401, "UNAUTHORIZED", "bad credentials")
            return
        token = f"token-{len(self.issued)}-{os.urandom(8).hex()}"
        self.issued[token] = 0
        send(handler, 200, json.dumps({"token": token}).encode(), Content_Type="application/json")

    def authorized(self, header: str) -> bool:
        token = header.removeprefix("Bearer ")
        if token not in self.issued or self.issued[token] >= self.token_uses:
            return False
        self.issued[token] += 1
        return True

    def content(self, handler: BaseHTTPRequestHandler, path: str) -> None:
        found = re.fullmatch(rf"/v2/{REPO}/(manifests|blobs)/(sha256:[0-9a-f]{{64}})", path)
        if found is None or found[2] not in self.image.blobs:
            registry_error(handler, 404, "BLOB_UNKNOWN", "unknown")
        elif found[2] == self.echo_secrets_in:
            registry_error(handler, 403, "DENIED", f"you sent {handler.headers.get('Authorization')}, {PASSWORD}")
        elif found[1] == "manifests":
            data = self.image.blobs[found[2]]
            send(handler, 200, data, Content_Type=json.loads(data)["mediaType"], Docker_Content_Digest=found[2])
        else:
            send(handler, 307, Location=f"{self.storage.url}/store/{found[2]}")

    def store_answer(self, handler: BaseHTTPRequestHandler) -> None:
        digest = handler.path.removeprefix("/store/")
        data = self.image.blobs[digest]
        if digest in self.corrupt:
            data = bytes([data[0] ^ 1]) + data[1:]
        asked = handler.headers.get("Range")
        start = int(asked.removeprefix("bytes=").rstrip("-")) if asked and self.ranges else 0
        if digest in self.trickle_once:
            self.trickle_once.discard(digest)
            trickle(handler, data)
            return
        if start:
            send(handler, 206, data[start:], Content_Range=f"bytes {start}-{len(data) - 1}/{len(data)}")
        else:
            send(handler, 200, data)


def trickle(handler: BaseHTTPRequestHandler, data: bytes) -> None:
    """A byte every 20 ms, for at most five seconds."""
    handler.send_response(200)
    handler.send_header("Content-Length", str(len(data)))
    handler.end_headers()
    deadline = time.monotonic() + 5
    try:
        for offset in range(len(data)):
            if time.monotonic() > deadline:
                return
            handler.wfile.write(data[offset : offset + 1])
            handler.wfile.flush()
            time.sleep(0.02)
    except OSError:  # the fetch cut it: what the test wants
        return


@pytest.fixture
def servers() -> Iterator[Callable[[], _Server]]:
    started: list[_Server] = []

    def start() -> _Server:
        server = _Server(("127.0.0.1", 0), _Handler)
        server.seen = []
        threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True).start()
        started.append(server)
        return server

    yield start
    for server in started:
        server.shutdown()
        server.server_close()


@pytest.fixture
def home() -> Path:
    """The test's own HOME (tests/unit/conftest.py), where the node's Docker client config lives."""
    return Path(os.environ["HOME"])


@pytest.fixture
def registry(servers: Callable[[], _Server], home: Path) -> RegistryStandIn:
    """The stand-in registry, and the node's Docker client config with its credentials."""
    stand_in = RegistryStandIn(make_image(), servers(), servers())
    stand_in.server.answer = stand_in.answer
    stand_in.storage.answer = stand_in.store_answer
    write_docker_config(home, stand_in.host, PASSWORD)
    return stand_in


def write_docker_config(home: Path, host: str, password: str) -> None:
    auth = base64.b64encode(f"{USER}:{password}".encode()).decode()
    (home / ".docker").mkdir(exist_ok=True)
    (home / ".docker" / "config.json").write_text(json.dumps({"auths": {host: {"auth": auth}}}))


# --- the stand-in Docker ----------------------------------------------------------------------------


@dataclass
class Docker:
    """The node's Docker as far as the store asks it: /info, and a pull that really fetches every
    manifest and blob from the relay and checks them, as Docker does."""

    machine: str = "x86_64"
    images: dict[str, dict[str, Any]] = field(default_factory=dict)
    asked: list[str] = field(default_factory=list)
    fail_with: str | None = None

    def pull(self, name: str, digest: str) -> Iterator[dict[str, Any]]:
        host, _, path = name.partition("/")
        try:
            config = self.fetch_image(host, path, digest)
        except AssertionError as failure:
            yield {"errorDetail": {"message": str(failure)}, "error": str(failure)}
            return
        if self.fail_with:
            yield {"errorDetail": {"message": self.fail_with}, "error": self.fail_with}
            return
        self.images[f"{name}@{digest}"] = {"Id": config, "RepoDigests": [f"{name}@{digest}"]}
        yield {"status": f"Digest: {digest}"}

    def fetch_image(self, host: str, path: str, digest: str) -> str:
        index = json.loads(get(host, f"/v2/{path}/manifests/{digest}", digest))
        arch = {"x86_64": "amd64", "aarch64": "arm64"}[self.machine]
        chosen = next(entry for entry in index["manifests"] if entry["platform"]["architecture"] == arch)
        manifest = json.loads(get(host, f"/v2/{path}/manifests/{chosen['digest']}", chosen["digest"]))
        for blob in [manifest["config"], *manifest["layers"]]:
            get(host, f"/v2/{path}/blobs/{blob['digest']}", blob["digest"])
        return str(manifest["config"]["digest"])


def get(host: str, path: str, digest: str) -> bytes:
    connection = http.client.HTTPConnection(host, timeout=5)
    try:
        connection.request("GET", path)
        answer = connection.getresponse()
        data = answer.read()
    finally:
        connection.close()
    assert answer.status == 200, f"{path}: {answer.status}"
    assert answer.headers["Docker-Content-Digest"] == digest
    assert digest_of(data) == digest, f"{path}: digest mismatch"
    return data


class _DockerHandler(BaseHTTPRequestHandler):
    server: _DockerServer

    def do_GET(self) -> None:
        docker = self.server.docker
        docker.asked.append(f"GET {self.path}")
        name = urllib.parse.unquote(self.path.removeprefix("/images/").removesuffix("/json"))
        if self.path == "/info":
            send(self, 200, json.dumps({"Architecture": docker.machine}).encode())
        elif name in docker.images:
            send(self, 200, json.dumps(docker.images[name]).encode())
        else:
            send(self, 404, json.dumps({"message": f"No such image: {name}"}).encode())

    def do_POST(self) -> None:
        docker = self.server.docker
        docker.asked.append(f"POST {self.path}")
        query = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.end_headers()  # no length: the answer ends when the connection does, as a stream may
        self.wfile.write(b'{"status":"Pulling from team/vllm","id":"sha256"}\r\n')
        for message in docker.pull(query["fromImage"][0], query["tag"][0]):
            self.wfile.write(json.dumps(message).encode() + b"\r\n")

    def log_message(self, format: str, *args: Any) -> None:
        del format, args


class _DockerServer(socketserver.ThreadingUnixStreamServer):
    daemon_threads = True
    docker: Docker


@pytest.fixture
def docker(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Docker]:
    stand_in = Docker()
    server = _DockerServer(str(tmp_path / "docker.sock"), _DockerHandler)
    server.docker = stand_in
    threading.Thread(target=server.serve_forever, args=(0.02,), daemon=True).start()
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/docker.sock")
    yield stand_in
    server.shutdown()
    server.server_close()


# --- running the program ------------------------------------------------------------------------------


def call(name: str, **args: Any) -> Any:
    return run_program(NODE, "imagestore", name, args, timeout=60)


def raw_call(name: str, **args: Any) -> CommandResult:
    return NODE.run(["python3", "-"], stdin=program("imagestore", name, args), timeout=60)


def local_call(capsys: pytest.CaptureFixture[str], name: str, **args: Any) -> Any:
    """A call run in this process (those that only read and write files need no shipping to test)."""
    getattr(imagestore, name)(args)
    return json.loads(capsys.readouterr().out)


def failure(name: str, **args: Any) -> str:
    """The message of a call run in this process that fails."""
    with pytest.raises(SystemExit) as failed:
        getattr(imagestore, name)(args)
    return str(failed.value)


def fetch(registry: RegistryStandIn, store: Path, **extra: Any) -> dict[str, Any]:
    answer: dict[str, Any] = call("fetch", store=str(store), ref=registry.ref(), insecure=True, **extra)
    return answer


def store_files(store: Path) -> set[str]:
    return {path.name for path in (store / "blobs" / "sha256").iterdir()}


def hexes(digests: Any) -> set[str]:
    return {digest.removeprefix("sha256:") for digest in digests}


# --- fetch ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("machine", "arch"), [("x86_64", "amd64"), ("aarch64", "arm64")])
def test_fetch_keeps_exactly_the_blobs_of_the_nodes_platform_and_fetches_them_once(
    registry: RegistryStandIn, docker: Docker, tmp_path: Path, machine: str, arch: str
) -> None:
    docker.machine = machine
    store = tmp_path / "store"
    answer = fetch(registry, store)
    record = answer["record"]
    image = registry.image
    assert record["blobs"] == image.needs(arch)
    assert list(record["blobs"]) == [image.index, image.manifest[arch], image.config[arch], *image.layers[arch]]
    assert record["layers"] == image.layers[arch]
    assert (record["ref"], record["digest"]) == (registry.ref(), image.index)
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", record["at"])
    assert answer["fetched_bytes"] == sum(image.needs(arch).values())
    assert store_files(store) == hexes(record["blobs"]), "another platform's blob, or a partial, was left"
    for digest in record["blobs"]:
        assert (store / "blobs" / "sha256" / digest.removeprefix("sha256:")).read_bytes() == image.blobs[digest]
    assert json.loads((store / "refs" / f"{image.index.removeprefix('sha256:')}.json").read_text()) == record
    storage_headers = [headers for _, headers in registry.storage.seen]
    assert len(storage_headers) == 1 + len(image.layers[arch])
    assert all("Authorization" not in headers for headers in storage_headers), "the token went to storage"

    seen = len(registry.server.seen), len(registry.storage.seen)
    again = fetch(registry, store)
    assert again["fetched_bytes"] == 0
    assert again["record"]["blobs"] == record["blobs"]
    assert (len(registry.server.seen), len(registry.storage.seen)) == seen, "a whole store asked the registry"


def test_a_ref_pinned_to_one_platforms_manifest_needs_no_platform_choice(
    registry: RegistryStandIn, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No index, so no question to the node's Docker (there is none here to answer one)."""
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-docker.sock")
    image = registry.image
    ref = f"{registry.host}/{REPO}:v1@{image.manifest['arm64']}"
    answer = call("fetch", store=str(tmp_path / "store"), ref=ref, insecure=True)
    assert answer["record"]["blobs"] == {
        digest: image.needs("arm64")[digest] for digest in list(image.needs("arm64"))[1:]
    }
    assert answer["record"]["ref"] == ref


@pytest.mark.parametrize("ranges", [True, False], ids=["resumed", "restarted"])
def test_fetch_resumes_a_partial_blob_with_a_range(
    registry: RegistryStandIn, docker: Docker, tmp_path: Path, ranges: bool
) -> None:
    """A `.partial` continues from its last byte on a 206; a 200 (Range ignored) starts it afresh."""
    del docker
    registry.ranges = ranges
    layer = registry.image.layers["amd64"][1]
    blobs = tmp_path / "store" / "blobs" / "sha256"
    blobs.mkdir(parents=True)
    (blobs / f"{layer.removeprefix('sha256:')}.partial").write_bytes(registry.image.blobs[layer][:1000])
    answer = fetch(registry, tmp_path / "store")
    assert (blobs / layer.removeprefix("sha256:")).read_bytes() == registry.image.blobs[layer]
    asked = [headers.get("Range") for path, headers in registry.storage.seen if path.endswith(layer)]
    assert asked == ["bytes=1000-"]
    total = sum(registry.image.needs("amd64").values())
    assert answer["fetched_bytes"] == (total - 1000 if ranges else total)
    assert not list(blobs.glob("*.partial"))


def test_a_blob_untrue_to_its_digest_fails_and_nothing_takes_its_name(
    registry: RegistryStandIn, docker: Docker, tmp_path: Path
) -> None:
    del docker
    layer = registry.image.layers["amd64"][1]
    registry.corrupt.add(layer)
    result = raw_call("fetch", store=str(tmp_path / "store"), ref=registry.ref(), insecure=True)
    assert result.returncode == 1
    message = result.stderr.decode().splitlines()[-1]
    assert message.startswith(f"the blob {layer} from {registry.host} does not match its digest")
    names = store_files(tmp_path / "store")
    assert layer.removeprefix("sha256:") not in names
    assert not [name for name in names if name.endswith(".partial")]
    assert not list((tmp_path / "store" / "refs").iterdir()), "a record for an image not whole"


def test_fetch_cuts_a_trickling_blob_and_resumes_it(registry: RegistryStandIn, docker: Docker, tmp_path: Path) -> None:
    del docker
    layer = registry.image.layers["amd64"][0]
    registry.trickle_once.add(layer)
    began = time.monotonic()
    fetch(registry, tmp_path / "store", min_rate_bps=100_000, rate_window_s=0.3)
    assert time.monotonic() - began < 5
    asked = [headers.get("Range") for path, headers in registry.storage.seen if path.endswith(layer)]
    assert len(asked) == 2
    assert asked[0] is None
    assert asked[1] is not None
    assert int(asked[1].removeprefix("bytes=").rstrip("-")) > 0, "resumed from the bytes that came"
    blob = tmp_path / "store" / "blobs" / "sha256" / layer.removeprefix("sha256:")
    assert blob.read_bytes() == registry.image.blobs[layer]


def test_an_expired_token_is_asked_for_again(registry: RegistryStandIn, docker: Docker, tmp_path: Path) -> None:
    del docker
    registry.token_uses = 2
    answer = fetch(registry, tmp_path / "store")
    assert answer["record"]["blobs"] == registry.image.needs("amd64")
    assert len(registry.issued) > 2


@pytest.mark.parametrize("case", ["refused", "echoed"])
def test_credentials_and_tokens_never_reach_the_output(
    registry: RegistryStandIn, docker: Docker, tmp_path: Path, home: Path, case: str
) -> None:
    """A registry that refuses the credentials, or one whose error quotes what the request carried:
    the message names where the credentials came from, never them."""
    del docker
    if case == "refused":
        write_docker_config(home, registry.host, "not-" + PASSWORD)
    else:
        registry.echo_secrets_in = registry.image.layers["amd64"][0]
    result = raw_call("fetch", store=str(tmp_path / "store"), ref=registry.ref(), insecure=True)
    output = (result.stdout + result.stderr).decode()
    assert result.returncode == 1
    if case == "refused":
        assert f"refused the credentials of ~/.docker/config.json for {registry.host}" in output
    else:
        assert f"{registry.host} denied access to the blob" in output
        assert "<redacted>" in output
    secrets = [PASSWORD, base64.b64encode(f"{USER}:{PASSWORD}".encode()).decode(), *registry.issued]
    assert not [secret for secret in secrets if secret in output]
    assert "Traceback" not in output


def test_a_registry_that_wants_credentials_the_node_lacks_says_how_to_log_in(
    registry: RegistryStandIn, docker: Docker, tmp_path: Path, home: Path
) -> None:
    del docker
    (home / ".docker" / "config.json").unlink()
    with pytest.raises(NodeCommandError) as failed:
        fetch(registry, tmp_path / "store")
    assert f"run `docker login {registry.host}` on the node" in failed.value.message


def test_a_registry_not_marked_insecure_is_asked_over_https_only(
    registry: RegistryStandIn, docker: Docker, tmp_path: Path
) -> None:
    del docker
    with pytest.raises(NodeCommandError) as failed:
        call("fetch", store=str(tmp_path / "store"), ref=registry.ref(), insecure=False)
    assert f"cannot reach the registry at https://{registry.host}" in failed.value.message
    assert "insecure-registries" in failed.value.message
    assert registry.server.seen == [], "asked over plain http"


def test_fetch_reports_its_bytes_as_progress_lines(registry: RegistryStandIn, docker: Docker, tmp_path: Path) -> None:
    del docker
    result = raw_call("fetch", store=str(tmp_path / "store"), ref=registry.ref(), insecure=True)
    lines = [line for line in result.stderr.decode().splitlines() if line.startswith("@progress ")]
    last = json.loads(lines[-1].removeprefix("@progress "))
    blobs = [registry.image.config["amd64"], *registry.image.layers["amd64"]]
    total = sum(len(registry.image.blobs[digest]) for digest in blobs)
    assert last == {"what": "image", "done": total, "total": total, "files_done": 3, "files": 3, "name": blobs[-1]}


# --- which manifest, which registry ---------------------------------------------------------------------


def test_the_manifest_follows_the_architecture_and_is_never_an_attestation() -> None:
    image = make_image()
    index = json.loads(image.blobs[image.index])
    for machine, arch in [("x86_64", "amd64"), ("aarch64", "arm64"), ("arm64", "arm64")]:
        chosen = imagestore.choose_manifest(index, *imagestore.platform_of(machine))
        assert chosen == (image.manifest[arch], len(image.blobs[image.manifest[arch]]))
    plain_arm = {"digest": "sha256:" + "a" * 64, "size": 1, "platform": {"os": "linux", "architecture": "arm64"}}
    index["manifests"].insert(0, plain_arm)
    assert imagestore.choose_manifest(index, "arm64", "v8").digest == image.manifest["arm64"], "the variant first"
    assert imagestore.choose_manifest(index, "arm64", None).digest == plain_arm["digest"]
    with pytest.raises(SystemExit) as refused:
        imagestore.choose_manifest(index, "riscv64", None)
    assert "it offers: linux/amd64, linux/arm64, linux/arm64/v8)" in str(refused.value)


@pytest.mark.parametrize(
    ("ref", "host", "path"),
    [
        ("ubuntu@sha256:" + "1" * 64, "registry-1.docker.io", "library/ubuntu"),
        ("docker.io/ubuntu:24.04@sha256:" + "1" * 64, "registry-1.docker.io", "library/ubuntu"),
        ("vllm/vllm-openai:v0.9@sha256:" + "1" * 64, "registry-1.docker.io", "vllm/vllm-openai"),
        ("nvcr.io/nvidia/vllm:25.09-py3@sha256:" + "1" * 64, "nvcr.io", "nvidia/vllm"),
        ("localhost:5000/a/b@sha256:" + "1" * 64, "localhost:5000", "a/b"),
        ("localhost/a@sha256:" + "1" * 64, "localhost", "a"),
    ],
)
def test_a_ref_names_its_registry_as_docker_reads_it(ref: str, host: str, path: str) -> None:
    assert imagestore.parse_ref(ref) == (ref, host, path, "sha256:" + "1" * 64)


@pytest.mark.parametrize(
    "ref", ["ubuntu:24.04", "ubuntu@sha256:abc", "Team/X@sha256:" + "1" * 64, "a/../b@sha256:" + "1" * 64]
)
def test_a_ref_that_is_not_pinned_or_not_a_name_is_refused(ref: str) -> None:
    with pytest.raises(SystemExit):
        imagestore.parse_ref(ref)


def test_credentials_come_from_docker_config_or_its_credential_helper(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path))
    hub = base64.b64encode(b"hubuser:hubsecret").decode()
    config = {"auths": {"https://index.docker.io/v1/": {"auth": hub}}, "credHelpers": {"ghcr.io": "standin"}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    helper = tmp_path / "bin" / "docker-credential-standin"
    helper.parent.mkdir()
    helper.write_text(
        "#!/bin/sh\nread server\n"
        'printf \'{"ServerURL":"%s","Username":"bot","Secret":"helper-secret-for-%s"}\' "$server" "$server"\n'
    )
    helper.chmod(0o755)
    monkeypatch.setenv("PATH", f"{helper.parent}{os.pathsep}{os.environ['PATH']}")
    found = imagestore.docker_credentials("registry-1.docker.io")
    assert found == ("hubuser", "hubsecret", f"{tmp_path}/config.json")
    found = imagestore.docker_credentials("ghcr.io")
    assert found == ("bot", "helper-secret-for-ghcr.io", f"docker-credential-standin (named in {tmp_path}/config.json)")
    assert imagestore.docker_credentials("quay.io") is None


# --- the relay ----------------------------------------------------------------------------------------


def fill_store(root: Path, image: Image, arch: str) -> dict[str, Any]:
    """The store as a fetch for `arch` leaves it, made directly."""
    (root / "blobs" / "sha256").mkdir(parents=True, exist_ok=True)
    (root / "refs").mkdir(exist_ok=True)
    for digest in image.needs(arch):
        (root / "blobs" / "sha256" / digest.removeprefix("sha256:")).write_bytes(image.blobs[digest])
    record = {"ref": f"example.com/{REPO}@{image.index}", "digest": image.index, "blobs": image.needs(arch)}
    record |= {"layers": image.layers[arch], "at": "2025-01-01T00:00:00Z"}
    (root / "refs" / f"{image.index.removeprefix('sha256:')}.json").write_text(json.dumps(record))
    return record


@pytest.fixture
def relay(tmp_path: Path) -> Iterator[tuple[imagestore.Relay, Image]]:
    image = make_image()
    fill_store(tmp_path / "store", image, "amd64")
    server = imagestore.start_relay(imagestore.Store(str(tmp_path / "store")))
    yield server, image
    server.shutdown()
    server.server_close()


def ask(relay: imagestore.Relay, path: str, method: str = "GET", **headers: str) -> tuple[int, Any, bytes]:
    connection = http.client.HTTPConnection("127.0.0.1", relay.port, timeout=5)
    try:
        connection.request(method, path, headers=headers)
        answer = connection.getresponse()
        return answer.status, answer.headers, answer.read()
    finally:
        connection.close()


def test_the_relay_answers_manifests_by_digest_with_their_type(relay: tuple[imagestore.Relay, Image]) -> None:
    server, image = relay
    assert ask(server, "/v2/")[::2] == (200, b"{}")
    for digest in (image.index, image.manifest["amd64"]):
        status, headers, body = ask(server, f"/v2/{REPO}/manifests/{digest}")
        assert (status, body) == (200, image.blobs[digest])
        assert headers["Content-Type"] == json.loads(body)["mediaType"]
        assert headers["Docker-Content-Digest"] == digest
        assert headers["Docker-Distribution-API-Version"] == "registry/2.0"
        status, headers, body = ask(server, f"/v2/{REPO}/manifests/{digest}", "HEAD")
        assert (status, body, headers["Content-Length"]) == (200, b"", str(len(image.blobs[digest])))
    status, headers, body = ask(server, f"/v2/{REPO}/manifests/latest")
    assert status == 404
    assert json.loads(body)["errors"][0]["code"] == "MANIFEST_UNKNOWN"
    layer = image.layers["amd64"][0]
    assert ask(server, f"/v2/{REPO}/manifests/{layer}")[0] == 404, "a layer is no manifest"


def test_the_relay_types_a_manifest_without_a_media_type_by_its_shape(tmp_path: Path) -> None:
    store = imagestore.Store(str(tmp_path))
    store.make_dirs()
    shapes: dict[str, Any] = {OCI_INDEX: {"manifests": []}, OCI_MANIFEST: {"layers": []}}
    documents = {kind: json.dumps({"schemaVersion": 2, **shape}).encode() for kind, shape in shapes.items()}
    for data in documents.values():
        Path(store.blob(digest_of(data))).write_bytes(data)
    server = imagestore.start_relay(store)
    try:
        for kind, data in documents.items():
            assert ask(server, f"/v2/x/manifests/{digest_of(data)}")[1]["Content-Type"] == kind
    finally:
        server.shutdown()
        server.server_close()


def test_the_relay_serves_blobs_whole_and_from_a_byte(relay: tuple[imagestore.Relay, Image]) -> None:
    server, image = relay
    layer = image.layers["amd64"][1]
    data = image.blobs[layer]
    status, headers, body = ask(server, f"/v2/{REPO}/blobs/{layer}")
    assert (status, body) == (200, data)
    assert (headers["Content-Type"], headers["Docker-Content-Digest"]) == ("application/octet-stream", layer)
    status, headers, body = ask(server, f"/v2/{REPO}/blobs/{layer}", Range="bytes=1000-")
    assert (status, body) == (206, data[1000:])
    assert headers["Content-Range"] == f"bytes 1000-{len(data) - 1}/{len(data)}"
    status, headers, body = ask(server, f"/v2/{REPO}/blobs/{layer}", Range="bytes=10-19")
    assert (status, body, headers["Content-Range"]) == (206, data[10:20], f"bytes 10-19/{len(data)}")
    assert ask(server, f"/v2/{REPO}/blobs/{layer}", Range=f"bytes={len(data)}-")[0] == 416
    status, headers, body = ask(server, f"/v2/{REPO}/blobs/{layer}", "HEAD")
    assert (status, body, headers["Content-Length"]) == (200, b"", str(len(data)))
    missing = image.layers["arm64"][1]
    status, _, body = ask(server, f"/v2/{REPO}/blobs/{missing}")
    assert status == 404
    assert json.loads(body)["errors"][0]["code"] == "BLOB_UNKNOWN"


def test_the_relay_keeps_a_connection_for_the_next_request(relay: tuple[imagestore.Relay, Image]) -> None:
    server, image = relay
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=5)
    try:
        for digest in image.needs("amd64"):
            kind = "manifests" if digest in (image.index, image.manifest["amd64"]) else "blobs"
            connection.request("GET", f"/v2/{REPO}/{kind}/{digest}")
            assert connection.getresponse().read() == image.blobs[digest]
    finally:
        connection.close()


@pytest.mark.parametrize(
    "path",
    [
        "/v2/x/blobs/sha256:../../etc",
        "/v2/x/blobs/sha256:..%2F..%2F..%2Frefs",
        "/v2/x/blobs/../../../etc/passwd",
        "/v2/x/manifests/sha256:" + "A" * 64,
        "/v2/x/blobs/" + "0" * 64,
        "/etc/passwd",
        "/v2/x/tags/list",
    ],
)
def test_the_relay_serves_nothing_but_blobs_named_by_digest(relay: tuple[imagestore.Relay, Image], path: str) -> None:
    server, _ = relay
    assert ask(server, path)[0] == 404


def test_the_relay_never_follows_a_link_out_of_the_store(relay: tuple[imagestore.Relay, Image], tmp_path: Path) -> None:
    server, _ = relay
    secret = tmp_path / "secret"
    secret.write_bytes(b"not for docker")
    (tmp_path / "store" / "blobs" / "sha256" / hashlib.sha256(b"not for docker").hexdigest()).symlink_to(secret)
    assert ask(server, f"/v2/x/blobs/{digest_of(b'not for docker')}")[0] == 404
    assert ask(server, f"/v2/x/manifests/{digest_of(b'not for docker')}")[0] == 404


def test_the_relay_is_read_only(relay: tuple[imagestore.Relay, Image]) -> None:
    server, image = relay
    for method in ("POST", "PUT", "PATCH", "DELETE"):
        assert ask(server, f"/v2/{REPO}/blobs/{image.layers['amd64'][0]}", method)[0] == 405
    assert (Path(server.store.blob(image.layers["amd64"][0]))).exists()


def test_the_relay_removes_a_blob_it_finds_untrue_while_sending_it(relay: tuple[imagestore.Relay, Image]) -> None:
    server, image = relay
    layer = image.layers["amd64"][0]
    path = Path(server.store.blob(layer))
    bad = bytes([image.blobs[layer][0] ^ 1]) + image.blobs[layer][1:]
    path.write_bytes(bad)
    assert ask(server, f"/v2/{REPO}/blobs/{layer}", Range="bytes=5-")[2] == bad[5:]
    assert path.exists(), "a range cannot be checked: the file stays"
    assert ask(server, f"/v2/{REPO}/blobs/{layer}")[2] == bad
    deadline = time.monotonic() + 2
    while path.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not path.exists()
    assert ask(server, f"/v2/{REPO}/blobs/{layer}")[0] == 404


# --- pull ---------------------------------------------------------------------------------------------


def test_pull_passes_dockers_messages_on_and_answers_the_local_ref(tmp_path: Path, docker: Docker) -> None:
    image = make_image()
    record = fill_store(tmp_path / "store", image, "amd64")
    result = raw_call("pull", store=str(tmp_path / "store"), ref=record["ref"])
    assert result.returncode == 0, result.stderr
    answer = json.loads(result.stdout)
    assert re.fullmatch(rf"127\.0\.0\.1:\d+/{REPO}@{image.index}", answer["local_ref"])
    assert answer["id"] == image.config["amd64"]
    messages = [line for line in result.stderr.decode().splitlines() if line.startswith("@pull ")]
    assert [json.loads(line.removeprefix("@pull ")) for line in messages][-1] == {"status": f"Digest: {image.index}"}
    asked = next(line for line in docker.asked if line.startswith("POST"))
    name = answer["local_ref"].split("@")[0]
    assert asked == f"POST /images/create?{urllib.parse.urlencode({'fromImage': name, 'tag': image.index})}"


def test_pull_fails_with_dockers_error(tmp_path: Path, docker: Docker) -> None:
    record = fill_store(tmp_path / "store", make_image(), "amd64")
    docker.fail_with = "failed to register layer: no space left on device"
    with pytest.raises(NodeCommandError) as failed:
        call("pull", store=str(tmp_path / "store"), ref=record["ref"])
    assert "could not pull" in failed.value.message
    assert "no space left on device" in failed.value.message


def test_pull_needs_the_image_whole_in_the_store(tmp_path: Path, docker: Docker) -> None:
    image = make_image()
    record = fill_store(tmp_path / "store", image, "amd64")
    os.unlink(tmp_path / "store" / "blobs" / "sha256" / image.layers["amd64"][1].removeprefix("sha256:"))
    with pytest.raises(NodeCommandError) as failed:
        call("pull", store=str(tmp_path / "store"), ref=record["ref"])
    assert f"lacks 1 blob(s) of {image.index} ({image.layers['amd64'][1]})" in failed.value.message
    with pytest.raises(NodeCommandError) as failed:
        call("pull", store=str(tmp_path / "empty"), ref=record["ref"])
    assert f"has no record of {image.index}" in failed.value.message
    assert not [line for line in docker.asked if line.startswith("POST")]


# --- adopt, survey, prune ---------------------------------------------------------------------------


def copied_store(tmp_path: Path, image: Image) -> tuple[Path, dict[str, Any]]:
    """A peer's whole store, and this node's store with the peer's blobs but no record yet."""
    record = fill_store(tmp_path / "peer", image, "amd64")
    shutil.copytree(tmp_path / "peer" / "blobs", tmp_path / "here" / "blobs")
    return tmp_path / "here", record


def test_adopt_records_copied_blobs_once_they_are_checked(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    image = make_image()
    here, record = copied_store(tmp_path, image)
    message = failure("adopt", store=str(here), record=record, verify=[image.layers["arm64"][1]])
    assert f"asked to verify {image.layers['arm64'][1]}, which the record of {image.index} does not list" in message
    assert not (here / "refs").exists()
    assert local_call(capsys, "adopt", store=str(here), record=record, verify=image.layers["amd64"]) == {"ok": True}
    assert json.loads((here / "refs" / f"{image.index.removeprefix('sha256:')}.json").read_text()) == record


def test_adopt_removes_and_names_a_corrupted_blob(tmp_path: Path) -> None:
    image = make_image()
    here, record = copied_store(tmp_path, image)
    layer = image.layers["amd64"][1]
    blob = here / "blobs" / "sha256" / layer.removeprefix("sha256:")
    blob.write_bytes(b"x" * blob.stat().st_size)
    message = failure("adopt", store=str(here), record=record, verify=image.layers["amd64"])
    assert f"do not match their digests and were removed: {layer}; copy them again" in message
    assert not blob.exists()
    assert not (here / "refs").exists()


def test_adopt_names_the_blobs_that_are_missing(tmp_path: Path) -> None:
    image = make_image()
    here, record = copied_store(tmp_path, image)
    config = image.config["amd64"]
    (here / "blobs" / "sha256" / config.removeprefix("sha256:")).unlink()
    message = failure("adopt", store=str(here), record=record, verify=[])
    assert f"lacks 1 blob(s) of {image.index}, or holds them at another size: {config}" in message
    assert "no valid ref record" in failure("adopt", store=str(here), record={**record, "blobs": "many"}, verify=[])


def test_survey_lists_whole_images_and_complete_blobs_only(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    image = make_image()
    record = fill_store(tmp_path, image, "amd64")
    (tmp_path / "refs" / f"{'b' * 64}.json").write_text('{"ref": "x"}')
    (tmp_path / "refs" / f"{'c' * 64}.json").write_text("not json")
    (tmp_path / "blobs" / "sha256" / f"{'d' * 64}.partial").write_bytes(b"half")
    answer = local_call(capsys, "survey", store=str(tmp_path))
    assert answer == {"refs": {image.index: record}, "blobs": image.needs("amd64")}
    assert local_call(capsys, "survey", store=str(tmp_path / "none")) == {"refs": {}, "blobs": {}}


def test_prune_keeps_the_kept_images_blobs_and_removes_the_rest(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    one, two = make_image("one"), make_image("two")
    kept = fill_store(tmp_path, one, "amd64")
    fill_store(tmp_path, two, "amd64")
    blobs = tmp_path / "blobs" / "sha256"
    (blobs / f"{'e' * 64}.partial").write_bytes(b"stale")
    (blobs / f"{one.layers['amd64'][1].removeprefix('sha256:')}.partial").write_bytes(b"kept's")
    (blobs / "not-a-blob").write_bytes(b"someone else's")
    shared = one.layers["amd64"][0]
    assert shared == two.layers["amd64"][0]
    gone = set(two.needs("amd64")) - {shared}
    answer = local_call(capsys, "prune", store=str(tmp_path), keep=[one.index])
    assert answer == {"removed_refs": [two.index], "freed_bytes": sum(len(two.blobs[d]) for d in gone) + 5}
    assert store_files(tmp_path) == hexes(kept["blobs"]) | {
        "not-a-blob",
        f"{one.layers['amd64'][1].removeprefix('sha256:')}.partial",
    }
    assert [path.name for path in (tmp_path / "refs").iterdir()] == [f"{one.index.removeprefix('sha256:')}.json"]


def test_the_pull_prefix_is_the_one_the_head_reads() -> None:
    """The node cannot import the head's constant: this keeps the two spellings equal."""
    from reconciler.components.image_run import PULL_PREFIX

    assert imagestore.PULL_PREFIX == PULL_PREFIX
