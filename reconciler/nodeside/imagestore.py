"""Runs ON a node (stdlib only): the node's image store, the serving image as its registry sent it.

Docker keeps an image only unpacked, so a node that holds it cannot hand it to a peer in the form
a pull needs. The store keeps that form: manifests, config and compressed layers, each a file
named by its sha256 digest, so a copy between nodes (rsync) needs no trust in the peer beyond a
check of those names. The node's Docker takes the image from the store through a read-only
registry relay on 127.0.0.1, which Docker speaks plain HTTP to without any daemon settings.

Layout (other code relies on it):
    <store>/blobs/sha256/<hex>          a complete, verified blob (manifests and indexes too)
    <store>/blobs/sha256/<hex>.partial  a blob on its way, renamed once its digest matches
    <store>/refs/<hex>.json             one pinned image, written once every blob it lists is in:
        {"ref", "digest", "blobs": {digest: size}, "layers": [digest, ...], "at"}

Calls: fetch (from the image's registry), pull (into the node's Docker), adopt (a record for
blobs a peer copied), survey and prune. A failure is one message on stderr and exit status 1.
"""

from __future__ import annotations

import base64
import contextlib
import datetime
import hashlib
import http.client
import http.server
import json
import os
import re
import socket
import ssl
import stat
import subprocess
import threading
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from http.client import HTTPMessage
from typing import IO, Any, NamedTuple, TypeGuard

from reconciler.nodeside.common import (
    CHUNK,
    MIN_RATE_BPS,
    RATE_WINDOW_S,
    Meter,
    RateFloor,
    content_range_fits,
    docker_problem,
    docker_request,
    docker_socket,
    partial_size,
    progress,
    refused_redirect,
    reply,
    url_origin,
    url_where,
)

OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
MANIFEST_TYPES = (
    OCI_INDEX,
    "application/vnd.docker.distribution.manifest.list.v2+json",
    OCI_MANIFEST,
    "application/vnd.docker.distribution.manifest.v2+json",
)
# Manifests are read whole into memory; real ones are a few KiB, and a layer asked for as a
# manifest must not be.
MAX_MANIFEST_BYTES = 4 * 1024 * 1024
DOCKER_HUB_API = "registry-1.docker.io"
# The key Docker's client config files Docker Hub's credentials under.
DOCKER_HUB_SERVER = "https://index.docker.io/v1/"
# Registries send a blob on to their storage once; a few hops more is a loop.
REDIRECT_LIMIT = 5
# A blob cut this many times in a row, each time without a window's worth of bytes gained, fails.
CUT_RETRIES = 5
REQUEST_TIMEOUT_S = 60.0
# How long https may take to answer an insecure registry's first request before http is tried:
# a server that speaks only http may sit on a TLS greeting until its own timeout.
HTTPS_TRIAL_TIMEOUT_S = 10.0
HELPER_TIMEOUT_S = 30.0
# A pull from the relay streams progress, but unpacking one large layer may say nothing for long.
PULL_READ_TIMEOUT_S = 2 * 3600.0
MAX_PULL_LINE = 1024 * 1024
# The head's prefix for the node's Docker pull messages (one compact JSON object after it).
PULL_PREFIX = "@pull "
# A connection to the relay that says nothing for this long is closed (Docker opens new ones).
RELAY_IDLE_S = 600.0
RELAY_BLOCK = 1024 * 1024
# How often the relay looks whether it is to stop: stopping waits for the next look.
RELAY_POLL_S = 0.05

_DIGEST = re.compile(r"sha256:[0-9a-f]{64}")
_HEX = re.compile(r"[0-9a-f]{64}")
_HOST = re.compile(r"(?:[A-Za-z0-9-]+(?:\.[A-Za-z0-9-]+)*|\[[0-9A-Fa-f:]+\])(?::[0-9]+)?")
_PATH_PART = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_PATH = re.compile(rf"{_PATH_PART}(?:/{_PATH_PART})*")
_ROUTE = re.compile(r"/v2/(?P<name>.+)/(?P<kind>manifests|blobs)/(?P<reference>[^/]+)")
_RANGE = re.compile(r"bytes=(\d+)-(\d*)")
_CHALLENGE_PARAM = re.compile(r'(\w+)\s*=\s*(?:"([^"]*)"|([^,\s]*))')
_HELPER_NAME = re.compile(r"[A-Za-z0-9_.-]+")
_TOKEN = re.compile(r"[\x21-\x7e]+")
_RECORD_KEYS = ("ref", "digest", "blobs", "layers", "at")
# Credentials and tokens this run has seen: no message leaves with one of them in it.
_SECRETS: list[str] = []


# --- names ------------------------------------------------------------------------------------------


class ImageRef(NamedTuple):
    """A pinned image reference: as given, the host its registry's API answers on, the repository
    path there, and the pinned digest."""

    text: str
    host: str
    path: str
    digest: str


class Blob(NamedTuple):
    digest: str
    size: int


def parse_ref(text: str) -> ImageRef:
    name, at, digest = text.rpartition("@")
    if not at or not _DIGEST.fullmatch(digest):
        raise SystemExit(f"{text!r} is not a pinned image reference (name@sha256:<64 hex digits>)")
    host, path = _registry_and_path(_without_tag(name))
    if not _HOST.fullmatch(host) or not _PATH.fullmatch(path):
        raise SystemExit(f"{text!r}: {name!r} is not an image name Docker accepts")
    return ImageRef(text, host, path, digest)


def _without_tag(name: str) -> str:
    """A tag beside the digest changes nothing that is pulled: Docker ignores it too."""
    head, slash, last = name.rpartition("/")
    return f"{head}{slash}{last.split(':', 1)[0]}"


def _registry_and_path(name: str) -> tuple[str, str]:
    """Docker's rule: the first component is the registry when it has a '.' or ':' or is
    localhost; otherwise the name is on Docker Hub, a one-part name under library/."""
    first, slash, rest = name.partition("/")
    host, path = (first, rest) if slash and ("." in first or ":" in first or first == "localhost") else ("", name)
    if host in ("", "docker.io", "index.docker.io"):
        return DOCKER_HUB_API, path if "/" in path else f"library/{path}"
    return host, path


def _is_digest(value: object) -> bool:
    return isinstance(value, str) and _DIGEST.fullmatch(value) is not None


def _hex(digest: str) -> str:
    return digest.removeprefix("sha256:")


# --- the store's files ------------------------------------------------------------------------------


class Store:
    """The files of one store directory (layout: see the module's docstring)."""

    def __init__(self, root: str) -> None:
        self.root = os.path.expanduser(root)
        self.blobs = os.path.join(self.root, "blobs", "sha256")
        self.refs = os.path.join(self.root, "refs")

    def make_dirs(self) -> None:
        os.makedirs(self.blobs, exist_ok=True)
        os.makedirs(self.refs, exist_ok=True)

    def blob(self, digest: str) -> str:
        return os.path.join(self.blobs, _hex(digest))

    def partial(self, digest: str) -> str:
        return self.blob(digest) + ".partial"

    def record_path(self, digest: str) -> str:
        return os.path.join(self.refs, f"{_hex(digest)}.json")

    def size_of(self, digest: str) -> int | None:
        """Bytes of the blob under its final name; None when there is none (anything there but a
        regular file is none: a name in the store is never followed elsewhere)."""
        try:
            status = os.lstat(self.blob(digest))
        except OSError:
            return None
        return status.st_size if stat.S_ISREG(status.st_mode) else None

    def missing(self, blobs: dict[str, int]) -> list[str]:
        return [digest for digest, size in blobs.items() if self.size_of(digest) != size]

    def record(self, digest: str) -> dict[str, Any] | None:
        record = valid_record(_json_file(self.record_path(digest)))
        return record if record is not None and record["digest"] == digest else None

    def records(self) -> dict[str, dict[str, Any]]:
        digests = (_record_digest(name) for name in _names(self.refs))
        found = {digest: self.record(digest) for digest in digests if digest is not None}
        return {digest: record for digest, record in found.items() if record is not None}

    def blob_sizes(self) -> dict[str, int]:
        digests = [f"sha256:{name}" for name in _names(self.blobs) if _HEX.fullmatch(name)]
        sizes = {digest: self.size_of(digest) for digest in digests}
        return {digest: size for digest, size in sizes.items() if size is not None}

    def write_record(self, record: dict[str, Any]) -> None:
        os.makedirs(self.refs, exist_ok=True)
        _write_atomically(self.record_path(record["digest"]), json.dumps(record, indent=1).encode())


def valid_record(value: object) -> dict[str, Any] | None:
    """`value` when it is a ref record with every key in its place; None for anything else."""
    if not isinstance(value, dict) or not all(key in value for key in _RECORD_KEYS):
        return None
    blobs, layers = value["blobs"], value["layers"]
    sound = (
        isinstance(value["ref"], str)
        and isinstance(value["at"], str)
        and isinstance(blobs, dict)
        and all(_is_digest(digest) and _is_size(size) for digest, size in blobs.items())
        and _is_digest(value["digest"])
        and value["digest"] in blobs
        and isinstance(layers, list)
        and all(_is_digest(layer) and layer in blobs for layer in layers)
    )
    return value if sound else None


def _is_size(value: object) -> TypeGuard[int]:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _record_digest(name: str) -> str | None:
    hex_digits = name.removesuffix(".json")
    return f"sha256:{hex_digits}" if name.endswith(".json") and _HEX.fullmatch(hex_digits) else None


def _names(directory: str) -> list[str]:
    try:
        return sorted(os.listdir(directory))
    except FileNotFoundError:
        return []


def _json_file(path: str) -> object:
    try:
        with open(path, "rb") as handle:
            return json.loads(handle.read())
    except (OSError, ValueError):
        return None


def _write_atomically(path: str, data: bytes) -> None:
    """`path` replaced by a file holding `data`: readers see the old file or the new one, whole."""
    temporary = f"{path}.tmp-{os.urandom(6).hex()}"
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(descriptor, "wb") as handle:
        handle.write(data)
    os.replace(temporary, path)


def _write_blob(store: Store, digest: str, data: bytes) -> None:
    """A verified blob held in memory, under its name by way of its partial like any other."""
    partial = store.partial(digest)
    with contextlib.suppress(FileNotFoundError):
        os.unlink(partial)
    descriptor = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    with os.fdopen(descriptor, "wb") as handle:
        handle.write(data)
    os.replace(partial, store.blob(digest))


def file_sha256(path: str, meter: Meter | None = None, name: str | None = None) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while block := handle.read(CHUNK):
            digest.update(block)
            if meter is not None:
                meter.add(len(block), name=name)
    return f"sha256:{digest.hexdigest()}"


def read_manifest(store: Store, digest: str) -> bytes | None:
    """The manifest (or index) `digest` names, when the store holds it whole and true to its name.
    A file that is not is removed: its name promises bytes it does not hold, and the next copy
    from a peer or the registry must be able to take its place."""
    handle = _open_blob(store, digest)
    if handle is None:
        return None
    with handle:
        checked = os.fstat(handle.fileno())
        data = handle.read(MAX_MANIFEST_BYTES + 1) if checked.st_size <= MAX_MANIFEST_BYTES else None
    if data is None or f"sha256:{hashlib.sha256(data).hexdigest()}" == digest:
        return data
    _remove_untrue(store.blob(digest), checked, digest)
    return None


def _remove_untrue(path: str, checked: os.stat_result, digest: str) -> None:
    """Remove the file at `path` that was found not to match `digest`, unless it was replaced since
    it was read (`checked`): a fresh, good copy is never the one removed."""
    with contextlib.suppress(FileNotFoundError):
        now = os.lstat(path)
        if (now.st_dev, now.st_ino) == (checked.st_dev, checked.st_ino):
            os.unlink(path)
            progress(f"image store: {path} does not hold the bytes of {digest}; removed it for the next copy")
    _forget_records_listing(os.path.dirname(os.path.dirname(os.path.dirname(path))), digest)


def _forget_records_listing(root: str, digest: str) -> None:
    """A record lists only blobs that are there and true: one that lists a blob just removed goes,
    so the next plan fetches or copies the image again instead of trusting the store."""
    store = Store(root)
    for held, record in store.records().items():
        if digest in record["blobs"]:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(store.record_path(held))


# --- explaining failures ----------------------------------------------------------------------------


@contextlib.contextmanager
def _explained(store: Store) -> Iterator[None]:
    """Expected failures as one message an owner can act on: never a traceback, never a secret."""
    try:
        yield
    except SystemExit as exc:
        raise SystemExit(_without_secrets(str(exc.code))) from None
    except OSError as exc:
        where = f"{exc.filename}: " if exc.filename else ""
        raise SystemExit(f"image store {store.root}: {where}{exc.strerror or exc}") from None
    except ValueError as exc:  # an address or answer urllib cannot read, from a registry or its redirect
        raise SystemExit(_without_secrets(f"the registry's answer cannot be read: {exc}")) from None


def _without_secrets(text: str) -> str:
    for secret in _SECRETS:
        text = text.replace(secret, "<redacted>")
    return text


def _why(exc: BaseException) -> str:
    """What went wrong with a connection, in a few words."""
    reason = exc.reason if isinstance(exc, urllib.error.URLError) else exc
    if isinstance(reason, ssl.SSLError):
        return f"TLS failed: {reason}"
    if isinstance(reason, OSError) and reason.strerror:
        return reason.strerror
    return str(reason) or type(reason).__name__


def _listed(digests: list[str], limit: int = 3) -> str:
    more = f" and {len(digests) - limit} more" if len(digests) > limit else ""
    return ", ".join(digests[:limit]) + more


# --- the registry -----------------------------------------------------------------------------------


def redirect_refusal(current: str, new: str) -> str | None:
    """Why a redirect from `current` to `new` is not followed; None when it may be."""
    return refused_redirect(current, new, "A proxy may rewrite the registry's redirects")


class _Redirects(urllib.request.HTTPRedirectHandler):
    """A few redirects (a registry sends blobs on to its storage), never from https to http, and
    the registry's authorization only within its origin: storage signs its own URLs."""

    def redirect_request(
        self, req: urllib.request.Request, fp: IO[bytes], code: int, msg: str, headers: HTTPMessage, newurl: str
    ) -> urllib.request.Request | None:
        try:
            refusal = redirect_refusal(req.full_url, newurl)
            url_origin(newurl)
        except ValueError:  # a port out of range, a bracket left open
            raise SystemExit(
                f"{url_where(req.full_url)} redirected the download to an address that cannot be read"
            ) from None
        if refusal is not None:
            raise SystemExit(refusal)
        if sum(getattr(req, "redirect_dict", {}).values()) >= REDIRECT_LIMIT:
            raise SystemExit(f"{url_where(req.full_url)} redirected the download more than {REDIRECT_LIMIT} times")
        new = super().redirect_request(req, fp, code, msg, headers, newurl)
        if new is not None and url_origin(newurl) != url_origin(req.full_url):
            new.remove_header("Authorization")
        return new


def _opener(insecure: bool) -> urllib.request.OpenerDirector:
    context = ssl.create_default_context()
    if insecure:  # Docker's rule for an insecure registry: TLS when it answers so, unchecked
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
    return urllib.request.build_opener(_Redirects, urllib.request.HTTPSHandler(context=context))


class Credentials(NamedTuple):
    user: str
    secret: str
    source: str  # where they came from, for a message: never the values


def parse_challenge(header: str) -> tuple[str, dict[str, str]]:
    """The scheme (lower case) and parameters of a WWW-Authenticate header."""
    scheme, _, rest = header.strip().partition(" ")
    found = _CHALLENGE_PARAM.finditer(rest)
    return scheme.lower(), {match[1].lower(): match[2] if match[2] is not None else match[3] for match in found}


def _basic(credentials: Credentials) -> str:
    return "Basic " + base64.b64encode(f"{credentials.user}:{credentials.secret}".encode()).decode()


class Registry:
    """The conversation with one image's registry: where it answers (https, or http for a registry
    the node's Docker treats as insecure), the authorization it asked for, the bytes it sent."""

    def __init__(self, ref: ImageRef, insecure: bool) -> None:
        self.ref = ref
        self.insecure = insecure
        self.opener = _opener(insecure)
        self.base: str | None = None
        self.authorization: str | None = None
        self.looked_up = False
        self.known_credentials: Credentials | None = None
        self.fetched = 0

    def open(self, path: str, headers: dict[str, str], what: str) -> Any:
        """The registry's answer to a GET of `path`, once authorized; a refusal ends the program."""
        url = self._base() + path
        answer = self._send(url, headers)
        if answer.status == 401:  # the first request, or a token that expired (they last minutes)
            with answer:
                self._authenticate(answer)
            answer = self._send(url, headers)
        if answer.status >= 400:
            with answer:
                raise SystemExit(self._refusal(answer, what))
        return answer

    def manifest(self, digest: str) -> bytes:
        path = f"/v2/{self.ref.path}/manifests/{digest}"
        with self.open(path, {"Accept": ", ".join(MANIFEST_TYPES)}, f"the manifest {digest}") as answer:
            data = self.read(answer, MAX_MANIFEST_BYTES + 1)
        if len(data) > MAX_MANIFEST_BYTES:
            raise SystemExit(f"{self.ref.host} sent more than {MAX_MANIFEST_BYTES} bytes as the manifest {digest}")
        self.fetched += len(data)
        return data

    def read(self, answer: Any, limit: int) -> bytes:
        try:
            return bytes(answer.read(limit))
        except (OSError, http.client.HTTPException) as exc:
            raise SystemExit(f"the connection to {self.ref.host} failed: {_why(exc)}; run fetch again") from None

    def _base(self) -> str:
        if self.base is None:
            self.base = self._ping()
        return self.base

    def _ping(self) -> str:
        """Where the registry answers, and the authorization it wants (Docker asks /v2/ first too)."""
        base = f"https://{self.ref.host}"
        try:
            answer = self._request(f"{base}/v2/", {}, HTTPS_TRIAL_TIMEOUT_S if self.insecure else REQUEST_TIMEOUT_S)
        except (OSError, http.client.HTTPException) as exc:
            if not self.insecure:
                raise SystemExit(self._unreachable(base, exc)) from None
            progress(f"{base} does not answer ({_why(exc)}); trying http, as Docker does for an insecure registry")
            base = f"http://{self.ref.host}"
            answer = self._send(f"{base}/v2/", {})
        with answer:
            if answer.status == 401:
                self._authenticate(answer)
        return base

    def _request(self, url: str, headers: dict[str, str], timeout: float = REQUEST_TIMEOUT_S) -> Any:
        """The answer to a GET, whatever its status; a connection that fails raises."""
        request = urllib.request.Request(url, headers={"User-Agent": "spark-reconciler/imagestore", **headers})
        try:
            return self.opener.open(request, timeout=timeout)
        except urllib.error.HTTPError as answer:
            return answer

    def _send(self, url: str, headers: dict[str, str]) -> Any:
        authorization = {"Authorization": self.authorization} if self.authorization else {}
        try:
            return self._request(url, {**headers, **authorization})
        except (OSError, http.client.HTTPException) as exc:
            raise SystemExit(self._unreachable(url, exc)) from None

    def _unreachable(self, url: str, exc: BaseException) -> str:
        hint = "check the node's network, DNS and proxy settings"
        if url.startswith("https:") and not self.insecure:
            hint += (
                "; a registry that speaks only plain http must be listed in insecure-registries of the node's "
                "Docker (/etc/docker/daemon.json)"
            )
        return f"cannot reach the registry at {url_where(url)}: {_why(exc)}; {hint}"

    def _authenticate(self, answer: Any) -> None:
        scheme, params = parse_challenge(answer.headers.get("WWW-Authenticate", ""))
        if scheme == "bearer":
            self.authorization = f"Bearer {self._token(params)}"
        elif scheme == "basic":
            credentials = self._credentials()
            if credentials is None:
                raise SystemExit(self._refused_credentials(None))
            self.authorization = _basic(credentials)
        else:
            raise SystemExit(f"{self.ref.host} asks for an authentication Docker registries do not use ({scheme!r})")

    def _token(self, params: dict[str, str]) -> str:
        """A pull token for the image's repository from the token service the registry named."""
        realm = params.get("realm", "")
        if urllib.parse.urlsplit(realm).scheme.lower() not in ("http", "https"):
            raise SystemExit(f"{self.ref.host} asks for a token but names no token service it may come from")
        credentials = self._credentials()
        answer = self._token_answer(realm, params.get("service"), credentials)
        with answer:
            if answer.status in (401, 403):
                raise SystemExit(self._refused_credentials(credentials))
            if answer.status >= 400:
                raise SystemExit(f"the token service {url_where(realm)} of {self.ref.host} answered {answer.status}")
            token = _token_from(self.read(answer, 1024 * 1024))
        if token is None:
            raise SystemExit(f"the token service {url_where(realm)} of {self.ref.host} answered without a usable token")
        _SECRETS.append(token)
        return token

    def _token_answer(self, realm: str, service: str | None, credentials: Credentials | None) -> Any:
        query = {"service": service} if service else {}
        query["scope"] = f"repository:{self.ref.path}:pull"
        url = f"{realm}{'&' if '?' in realm else '?'}{urllib.parse.urlencode(query)}"
        try:
            return self._request(url, {"Authorization": _basic(credentials)} if credentials else {})
        except (OSError, http.client.HTTPException) as exc:
            raise SystemExit(
                f"cannot reach the token service {url_where(realm)} of {self.ref.host}: {_why(exc)}"
            ) from None

    def _credentials(self) -> Credentials | None:
        if not self.looked_up:
            self.known_credentials = docker_credentials(self.ref.host)
            self.looked_up = True
        return self.known_credentials

    def _refused_credentials(self, credentials: Credentials | None) -> str:
        login = "docker login" if self.ref.host == DOCKER_HUB_API else f"docker login {self.ref.host}"
        if credentials is not None:
            return (
                f"the registry refused the credentials of {credentials.source} for {self.ref.host}: "
                f"run `{login}` on the node as this user"
            )
        return (
            f"{self.ref.host} wants credentials to pull {self.ref.path} and {_shown(_docker_config())} has none "
            f"for it: run `{login}` on the node as this user (registries also answer so for an image they do not have)"
        )

    def _refusal(self, answer: Any, what: str) -> str:
        status, says, where = answer.status, _registry_says(answer), f"{what} of {self.ref.path}"
        if status == 401:
            return self._refused_credentials(self._credentials())
        if status == 403:
            return f"{self.ref.host} denied access to {where}{says}: check that the node's credentials may pull it"
        if status == 404:
            return f"{self.ref.host} does not have {where}{says}: check the image's name and pinned digest"
        if status == 429:
            return (
                f"{self.ref.host} refuses more pulls for now (429){says}: try again later; "
                "a node logged in to Docker Hub (docker login) gets a higher limit"
            )
        return f"{self.ref.host} answered {status} for {where}{says}: try again later"


def _registry_says(answer: Any) -> str:
    """The registry's own words about an error, from its JSON body, when it sent any."""
    try:
        body = json.loads(answer.read(4096))
        first = body["errors"][0]
        code, message = (_without_secrets(str(first.get(key, ""))) for key in ("code", "message"))
        return f" ({code[:40]}: {message[:160]})"
    except (OSError, http.client.HTTPException, ValueError, TypeError, KeyError, IndexError, AttributeError):
        return ""


def _token_from(body: bytes) -> str | None:
    try:
        answer = json.loads(body)
    except ValueError:
        return None
    token = (answer.get("token") or answer.get("access_token")) if isinstance(answer, dict) else None
    return token if isinstance(token, str) and _TOKEN.fullmatch(token) else None


# --- the node's Docker client credentials -----------------------------------------------------------


def _docker_config() -> str:
    directory = os.environ.get("DOCKER_CONFIG") or os.path.join(os.path.expanduser("~"), ".docker")
    return os.path.join(directory, "config.json")


def _shown(path: str) -> str:
    home = os.path.expanduser("~")
    return "~" + path[len(home) :] if path.startswith(home + os.sep) else path


def docker_credentials(host: str) -> Credentials | None:
    """What `docker pull` on this node would log in to `host` with: a credential helper's answer,
    else the config file's own entry. None when there is nothing for it."""
    path = _docker_config()
    config = _json_file(path)
    if not isinstance(config, dict):
        return None
    server = DOCKER_HUB_SERVER if host == DOCKER_HUB_API else host
    helper = _entry(config.get("credHelpers"), server) or config.get("credsStore")
    found = _helper_credentials(helper, server, _shown(path)) if isinstance(helper, str) and helper else None
    found = found or _file_credentials(_entry(config.get("auths"), server), _shown(path))
    if found is not None:
        _SECRETS.extend([found.secret, _basic(found).removeprefix("Basic ")])
    return found


def _entry(mapping: object, server: str) -> Any:
    """`mapping[server]`, or the entry whose key names the same host (keys may carry a scheme)."""
    if not isinstance(mapping, dict):
        return None
    if server in mapping:
        return mapping[server]
    return next((value for key, value in mapping.items() if _hostname(str(key)) == _hostname(server)), None)


def _hostname(key: str) -> str:
    return key.split("://", 1)[-1].split("/", 1)[0].lower()


def _file_credentials(entry: object, shown: str) -> Credentials | None:
    encoded = entry.get("auth") if isinstance(entry, dict) else None
    if not isinstance(encoded, str) or not encoded:
        return None
    try:
        user, colon, secret = base64.b64decode(encoded, validate=True).decode().partition(":")
    except ValueError:
        return None
    _SECRETS.append(encoded)
    return Credentials(user, secret, shown) if colon and secret else None


def _helper_credentials(helper: str, server: str, shown: str) -> Credentials | None:
    program = f"docker-credential-{helper}"
    if not _HELPER_NAME.fullmatch(helper):
        return None
    try:
        done = subprocess.run(
            [program, "get"], input=server.encode(), capture_output=True, timeout=HELPER_TIMEOUT_S, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        progress(f"{program}, named in {shown}, could not be run; asking {server} without its credentials")
        return None
    try:
        answer = json.loads(done.stdout) if done.returncode == 0 else None
    except ValueError:
        return None
    user, secret = (answer.get("Username"), answer.get("Secret")) if isinstance(answer, dict) else (None, None)
    if isinstance(user, str) and isinstance(secret, str) and secret:
        return Credentials(user, secret, f"{program} (named in {shown})")
    return None


# --- which manifest -----------------------------------------------------------------------------------


def platform_of(machine: str) -> tuple[str, str | None]:
    """The image platform (architecture, variant) for the machine name Docker's /info reports."""
    known: dict[str, tuple[str, str | None]] = {
        "x86_64": ("amd64", None),
        "amd64": ("amd64", None),
        "aarch64": ("arm64", "v8"),
        "arm64": ("arm64", "v8"),
        "armv7l": ("arm", "v7"),
    }
    return known.get(machine, (machine, None))


def choose_manifest(index: dict[str, Any], architecture: str, variant: str | None) -> Blob:
    """The index's manifest for linux/`architecture`: the wanted variant first, then one that names
    none. Entries for unknown/unknown are attestations, never an image to run."""
    listed = index.get("manifests")
    entries = [entry for entry in listed if isinstance(entry, dict)] if isinstance(listed, list) else []
    platforms: list[dict[str, Any]] = [
        entry["platform"] if isinstance(entry.get("platform"), dict) else {} for entry in entries
    ]
    fitting = [
        (0 if platform.get("variant") == variant else 1 if platform.get("variant") is None else 2, number)
        for number, platform in enumerate(platforms)
        if platform.get("os") == "linux" and platform.get("architecture") == architecture
    ]
    if not fitting:
        offered = sorted({_platform_name(platform) for platform in platforms} - {"unknown/unknown"})
        raise SystemExit(
            f"the image offers no manifest for this node's platform linux/{architecture} "
            f"(it offers: {', '.join(offered) or 'none'}); pin an image built for it"
        )
    return _descriptor(entries[min(fitting)[1]], f"the index's entry for linux/{architecture}")


def _platform_name(platform: dict[str, Any]) -> str:
    parts = [platform.get("os"), platform.get("architecture"), platform.get("variant")]
    return "/".join(str(part) for part in parts if part)


def _descriptor(value: object, what: str) -> Blob:
    digest = value.get("digest") if isinstance(value, dict) else None
    size = value.get("size") if isinstance(value, dict) else None
    if not isinstance(digest, str) or not _DIGEST.fullmatch(digest) or not _is_size(size):
        raise SystemExit(f"{what} names no sha256 blob with a size: the image has a form this store cannot keep")
    return Blob(digest, size)


def _node_platform() -> tuple[str, str | None]:
    try:
        status, body = docker_request("GET", "/info")
        info = json.loads(body) if status == 200 else None
    except (OSError, http.client.HTTPException, ValueError) as exc:
        raise SystemExit(f"cannot learn this node's architecture: {docker_problem(exc)}") from None
    machine = info.get("Architecture") if isinstance(info, dict) else None
    if not isinstance(machine, str) or not machine:
        raise SystemExit(f"the node's Docker names no architecture in /info (answer {status}): is it healthy?")
    return platform_of(machine)


def _json_object(data: bytes, what: str) -> dict[str, Any]:
    try:
        document = json.loads(data)
    except ValueError:
        document = None
    if not isinstance(document, dict):
        raise SystemExit(f"{what} is not a JSON object: the image has a form this store cannot keep")
    return document


def _manifest_parts(document: dict[str, Any], digest: str) -> tuple[Blob, list[Blob]]:
    """The config and the layers (in order) of an image manifest."""
    if document.get("schemaVersion") != 2 or not isinstance(document.get("layers"), list):
        raise SystemExit(
            f"{digest} is not an image manifest of schema 2 (Docker's v2 or OCI's): the image has a form this "
            "store cannot keep"
        )
    config = _descriptor(document.get("config"), f"the config of {digest}")
    return config, [_descriptor(layer, f"a layer of {digest}") for layer in document["layers"]]


def _manifest_bytes(registry: Registry, store: Store, digest: str) -> bytes:
    """The manifest `digest` names: the store's copy, else the registry's, checked and then kept."""
    kept = read_manifest(store, digest)
    if kept is not None:
        return kept
    data = registry.manifest(digest)
    if f"sha256:{hashlib.sha256(data).hexdigest()}" != digest:
        raise SystemExit(
            f"{registry.ref.host} sent a manifest that does not match {digest}; nothing was kept. If it persists, "
            "something between the node and the registry alters what it sends"
        )
    _write_blob(store, digest, data)
    return data


def _image_blobs(registry: Registry, store: Store) -> tuple[dict[str, int], list[str]]:
    """Every blob a pull of the pinned ref needs, with its size (the index when it is one, this
    node's manifest, its config, its layers), and the layers in order."""
    digest = registry.ref.digest
    top = _manifest_bytes(registry, store, digest)
    blobs, document = {digest: len(top)}, _json_object(top, f"the manifest {digest}")
    if "manifests" in document:
        chosen = choose_manifest(document, *_node_platform())
        manifest = _manifest_bytes(registry, store, chosen.digest)
        if len(manifest) != chosen.size:
            raise SystemExit(f"the index {digest} gives {chosen.digest} a size other than its own")
        blobs[chosen.digest], digest = chosen.size, chosen.digest
        document = _json_object(manifest, f"the manifest {digest}")
    config, layers = _manifest_parts(document, digest)
    for blob in [config, *layers]:
        blobs[blob.digest] = blob.size
    return blobs, [layer.digest for layer in layers]


# --- blobs from the registry ------------------------------------------------------------------------


class _CutError(Exception):
    """The answer stopped short or stayed under the floor rate for a whole window: asked again."""


def _check_content_range(blob: Blob, header: str | None, start: int) -> None:
    """A 206 must hold the bytes from `start` of a blob of the listed size, or it is not appended."""
    if content_range_fits(header, start, blob.size):
        return
    raise SystemExit(
        f"{blob.digest}: asked from byte {start}, the registry answered Content-Range {header!r:.80} (the blob "
        f"is {blob.size} bytes); nothing was written. Run fetch again; if it persists, a proxy mangles ranges"
    )


def _too_long(blob: Blob, begin: int, what: str) -> str:
    return (
        f"{blob.digest}: asked from byte {begin} for the {blob.size - begin} bytes left, the registry {what}; "
        "nothing of that answer was kept. Run fetch again; if it persists, a proxy answers instead of the registry"
    )


def _open_partial(partial: str, resume: bool, begin: int) -> IO[bytes]:
    flags = os.O_WRONLY | os.O_NOFOLLOW | (os.O_APPEND if resume else os.O_CREAT | os.O_TRUNC)
    if not begin and not os.path.lexists(partial):
        flags |= os.O_CREAT | os.O_EXCL  # new: created here, never an existing file or link
    return os.fdopen(os.open(partial, flags, 0o644), "ab" if resume else "wb")


def _read_block(response: Any, size: int) -> bytes:
    try:
        return bytes(response.read1(size))
    except (OSError, http.client.HTTPException) as exc:
        raise _CutError(f"the connection failed ({_why(exc)})") from None


class _BlobFetch:
    """Blobs from the registry into the store: each resumed from its partial, cut and asked again
    when it trickles or breaks off, checked against its digest before it takes its name."""

    def __init__(self, registry: Registry, store: Store, meter: Meter, args: dict[str, Any]) -> None:
        self.registry, self.store, self.meter = registry, store, meter
        self.floor = float(args.get("min_rate_bps", MIN_RATE_BPS))
        self.window = float(args.get("rate_window_s", RATE_WINDOW_S))
        self.retries = int(args.get("slow_retries", CUT_RETRIES))

    def get(self, blob: Blob) -> None:
        self._download(blob)
        self._place(blob)
        self.meter.file_done()

    def _download(self, blob: Blob) -> None:
        partial = self.store.partial(blob.digest)
        counted = failures = 0
        while True:
            have = partial_size(partial)
            if have == blob.size:  # all in (a run ended before the rename): checked, then placed
                self.meter.add(have - counted, name=blob.digest)
                return
            if have and not counted:
                progress(f"resuming {blob.digest} at byte {have} of {blob.size}")
            try:
                self._fetch_rest(blob, partial, have if have < blob.size else 0, counted)
                return
            except _CutError as cut:
                counted = partial_size(partial)
                failures = 0 if counted - have >= self.floor * self.window else failures + 1
                if failures > self.retries:
                    raise SystemExit(
                        f"{blob.digest}: {cut}, {failures} times in a row without a window's worth of bytes; the "
                        f"network or {self.registry.ref.host} is slow: run fetch again later (it resumes)"
                    ) from None
                progress(f"{blob.digest}: {cut}: asking again from byte {counted}")

    def _fetch_rest(self, blob: Blob, partial: str, start: int, counted: int) -> None:
        """One request for the blob from byte `start`; `counted` of its bytes are in the meter already."""
        headers = {"Accept-Encoding": "identity", **({"Range": f"bytes={start}-"} if start else {})}
        path = f"/v2/{self.registry.ref.path}/blobs/{blob.digest}"
        with self.registry.open(path, headers, f"the blob {blob.digest}") as response:
            # A 200 to a Range request means the server ignored it: start the blob again.
            resume = bool(start) and response.status == 206
            if response.status == 206:
                _check_content_range(blob, response.headers.get("Content-Range"), start)
            begin = start if resume else 0
            self.meter.add(begin - counted, name=blob.digest)
            with _open_partial(partial, resume, begin) as out:
                self._copy(response, out, blob, begin)

    def _copy(self, response: Any, out: IO[bytes], blob: Blob, begin: int) -> None:
        """The answer into the partial, which holds `begin` bytes: never past the blob's size."""
        left = blob.size - begin
        length = response.headers.get("Content-Length")
        if length is not None and length.strip().isdigit() and int(length) > left:
            raise SystemExit(_too_long(blob, begin, f"announced {int(length)} bytes"))
        rate = RateFloor(self.floor, self.window)
        while left and (block := _read_block(response, min(CHUNK, left))):
            out.write(block)
            left -= len(block)
            self.registry.fetched += len(block)
            self.meter.add(len(block), name=blob.digest)
            if rate.too_slow(len(block)):
                raise _CutError(f"under {self.floor:.0f} bytes/s for {self.window:.0f} s")
        if left:
            raise _CutError(f"the answer ended {left} bytes short")
        if _read_block(response, 1):
            out.truncate(begin)  # the answer is not the blob: none of it stays
            raise SystemExit(_too_long(blob, begin, "sent more"))

    def _place(self, blob: Blob) -> None:
        partial = self.store.partial(blob.digest)
        if file_sha256(partial) != blob.digest:
            os.unlink(partial)
            raise SystemExit(
                f"the blob {blob.digest} from {self.registry.ref.host} does not match its digest; nothing of it "
                "was kept. Run fetch again; if it persists, something between the node and the registry alters it"
            )
        os.replace(partial, self.store.blob(blob.digest))


def _held(store: Store, blob: Blob) -> bool:
    """Whether the store holds `blob` already; a file of another size under its name is removed."""
    size = store.size_of(blob.digest)
    if size is not None and size != blob.size:
        progress(f"image store: {store.blob(blob.digest)} has {size} bytes, not {blob.size}; fetching it again")
        os.unlink(store.blob(blob.digest))
    return size == blob.size


def _fetch_missing(registry: Registry, store: Store, blobs: dict[str, int], args: dict[str, Any]) -> None:
    wanted = [Blob(digest, size) for digest, size in blobs.items() if not _held(store, Blob(digest, size))]
    fetcher = _BlobFetch(registry, store, Meter("image", sum(blob.size for blob in wanted), len(wanted)), args)
    for blob in wanted:
        fetcher.get(blob)


def _utc_now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def fetch(args: dict[str, Any]) -> None:
    """Fill the store with the image `ref` pins, as its registry sends it; record it once whole."""
    store = Store(args["store"])
    with _explained(store):
        ref = parse_ref(args["ref"])
        store.make_dirs()
        registry = Registry(ref, bool(args.get("insecure")))
        blobs, layers = _image_blobs(registry, store)
        _fetch_missing(registry, store, blobs, args)
        record = {"ref": ref.text, "digest": ref.digest, "blobs": blobs, "layers": layers, "at": _utc_now()}
        store.write_record(record)
        reply({"record": record, "fetched_bytes": registry.fetched})


# --- the relay ------------------------------------------------------------------------------------


def media_type(data: bytes) -> str | None:
    """The Content-Type a manifest is served with: the type it declares, else the OCI type of its
    shape; None for bytes that are no manifest at all."""
    try:
        document = json.loads(data)
    except ValueError:
        return None
    if not isinstance(document, dict):
        return None
    declared = document.get("mediaType")
    if isinstance(declared, str) and declared:
        return declared
    return OCI_INDEX if "manifests" in document else OCI_MANIFEST


def requested_span(header: str | None, size: int) -> tuple[int, int] | None:
    """The bytes [start, end) a `Range: bytes=N-` or `bytes=N-M` asks of a blob of `size`; None
    for the whole blob (no Range, or one this relay ignores). A start at or past the end is kept
    for the caller to refuse."""
    found = _RANGE.fullmatch((header or "").strip())
    if found is None or not size:
        return None
    start, last = int(found[1]), found[2]
    if last and int(last) < start:
        return None
    return start, min(int(last) + 1, size) if last else size


def _open_blob(store: Store, digest: str) -> IO[bytes] | None:
    try:
        descriptor = os.open(store.blob(digest), os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    handle = os.fdopen(descriptor, "rb")
    if not stat.S_ISREG(os.fstat(descriptor).st_mode):
        handle.close()
        return None
    return handle


class _RelayHandler(http.server.BaseHTTPRequestHandler):
    """The read side of the registry API, from the store: what a pull by digest asks for."""

    protocol_version = "HTTP/1.1"
    timeout = RELAY_IDLE_S
    server: Relay

    def do_GET(self) -> None:
        self._answer(send_body=True)

    def do_HEAD(self) -> None:
        self._answer(send_body=False)

    def do_POST(self) -> None:
        self.close_connection = True  # a body may follow that this relay never reads
        self._error(405, "UNSUPPORTED", "this registry relay is read-only", send_body=True)

    def do_PUT(self) -> None:
        self.do_POST()

    def do_PATCH(self) -> None:
        self.do_POST()

    def do_DELETE(self) -> None:
        self.do_POST()

    def log_message(self, format: str, *args: Any) -> None:
        del format, args  # a pull makes hundreds of requests: none is news

    def _answer(self, send_body: bool) -> None:
        path = urllib.parse.urlsplit(self.path).path
        route = _ROUTE.fullmatch(path)
        reference = route["reference"] if route is not None else ""
        digest = reference if _DIGEST.fullmatch(reference) else None
        if path in ("/v2", "/v2/"):
            self._send(200, b"{}", {"Content-Type": "application/json"}, send_body)
        elif route is None:
            self._error(404, "NAME_UNKNOWN", "this relay serves /v2/<name>/manifests and /blobs only", send_body)
        elif route["kind"] == "manifests":
            self._manifest(digest, send_body)
        else:
            self._blob(digest, send_body)

    def _manifest(self, digest: str | None, send_body: bool) -> None:
        data = read_manifest(self.server.store, digest) if digest else None
        kind = media_type(data) if data is not None else None
        if data is None or kind is None or digest is None:
            self._error(404, "MANIFEST_UNKNOWN", "this relay serves manifests it holds, by digest only", send_body)
            return
        self._send(200, data, {"Content-Type": kind, "Docker-Content-Digest": digest}, send_body)

    def _blob(self, digest: str | None, send_body: bool) -> None:
        handle = _open_blob(self.server.store, digest) if digest else None
        if handle is None or digest is None:
            self._error(404, "BLOB_UNKNOWN", "blob unknown to this relay", send_body)
            return
        with handle:
            size = os.fstat(handle.fileno()).st_size
            span = requested_span(self.headers.get("Range"), size)
            if span is not None and span[0] >= size:
                self._send(416, b"", {"Content-Range": f"bytes */{size}"}, send_body)
                return
            self._send_blob(handle, digest, size, span, send_body)

    def _send_blob(
        self, handle: IO[bytes], digest: str, size: int, span: tuple[int, int] | None, send_body: bool
    ) -> None:
        start, end = span or (0, size)
        headers = {"Content-Type": "application/octet-stream", "Docker-Content-Digest": digest}
        headers |= {"Accept-Ranges": "bytes", "Content-Length": str(end - start)}
        if span is not None:
            headers["Content-Range"] = f"bytes {start}-{end - 1}/{size}"
        self._head(206 if span is not None else 200, headers)
        if send_body:
            self._stream(handle, digest, start, end, check=span is None)

    def _stream(self, handle: IO[bytes], digest: str, start: int, end: int, *, check: bool) -> None:
        """The blob's bytes [start, end); a whole one is hashed on the way, and a file untrue to
        its name is removed (the client's own check fails that pull; the next copy replaces it)."""
        hasher = hashlib.sha256()
        handle.seek(start)
        left = end - start
        try:
            while left and (block := handle.read(min(RELAY_BLOCK, left))):
                self.wfile.write(block)
                hasher.update(block)
                left -= len(block)
        except OSError:  # the client went away, or the disk failed: this connection is done
            self.close_connection = True
            return
        if left:
            self.close_connection = True  # the file shrank under the answer: its length was a lie
        elif check and f"sha256:{hasher.hexdigest()}" != digest:
            _remove_untrue(self.server.store.blob(digest), os.fstat(handle.fileno()), digest)

    def _error(self, status: int, code: str, message: str, send_body: bool) -> None:
        body = json.dumps({"errors": [{"code": code, "message": message}]}).encode()
        self._send(status, body, {"Content-Type": "application/json"}, send_body)

    def _send(self, status: int, body: bytes, headers: dict[str, str], send_body: bool) -> None:
        self._head(status, {**headers, "Content-Length": str(len(body))})
        if send_body:
            self.wfile.write(body)

    def _head(self, status: int, headers: dict[str, str]) -> None:
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Docker-Distribution-API-Version", "registry/2.0")
        self.end_headers()


class Relay(http.server.ThreadingHTTPServer):
    """A read-only registry on 127.0.0.1 serving the store's complete blobs to the node's Docker."""

    daemon_threads = True

    def __init__(self, store: Store) -> None:
        self.store = store
        super().__init__(("127.0.0.1", 0), _RelayHandler)

    @property
    def port(self) -> int:
        return int(self.server_address[1])


def start_relay(store: Store) -> Relay:
    relay = Relay(store)
    threading.Thread(target=relay.serve_forever, args=(RELAY_POLL_S,), daemon=True).start()
    return relay


# --- the node's Docker pulls from the relay -----------------------------------------------------------


def _docker_connection(timeout: float) -> http.client.HTTPConnection:
    connection = http.client.HTTPConnection("localhost", timeout=timeout)
    connection.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    connection.sock.settimeout(timeout)
    try:
        connection.sock.connect(docker_socket())
    except OSError:
        connection.close()
        raise
    return connection


def _docker_says(body: bytes) -> str:
    try:
        message = json.loads(body).get("message")
    except (ValueError, AttributeError):
        message = None
    return str(message) if message else body.decode(errors="replace").strip()[:300]


def _pull_message(line: bytes) -> Any:
    text = line.strip()
    if not text:
        return None
    try:
        return json.loads(text)
    except ValueError:
        raise SystemExit(
            f"the node's Docker answered the pull with something that is not JSON: {text[:80]!r}"
        ) from None


def _follow_pull(answer: http.client.HTTPResponse, local: str) -> None:
    """Docker's pull messages, each passed on as one line; the first error ends the pull."""
    if answer.status != 200:
        raise SystemExit(
            f"the node's Docker refused to pull {local} ({answer.status}): {_docker_says(answer.read(4096))}"
        )
    while line := answer.readline(MAX_PULL_LINE):
        message = _pull_message(line)
        if message is None:
            continue
        progress(PULL_PREFIX + json.dumps(message, separators=(",", ":")))
        if isinstance(message, dict) and message.get("error"):
            raise SystemExit(f"the node's Docker could not pull {local} from the image store: {message['error']}")


def _docker_pull(name: str, digest: str) -> None:
    # The digest goes as the tag, as Docker's own client sends a pinned name.
    query = urllib.parse.urlencode({"fromImage": name, "tag": digest})
    try:
        with contextlib.closing(_docker_connection(PULL_READ_TIMEOUT_S)) as connection:
            connection.request("POST", f"/images/create?{query}")
            _follow_pull(connection.getresponse(), f"{name}@{digest}")
    except (OSError, http.client.HTTPException) as exc:
        raise SystemExit(docker_problem(exc)) from None


def _image_id(local: str) -> str:
    try:
        status, body = docker_request("GET", f"/images/{urllib.parse.quote(local, safe='/:@')}/json")
        image = json.loads(body) if status == 200 else None
    except (OSError, http.client.HTTPException, ValueError) as exc:
        raise SystemExit(docker_problem(exc)) from None
    if not isinstance(image, dict) or not isinstance(image.get("Id"), str):
        raise SystemExit(f"the node's Docker pulled {local} but does not show it (answer {status})")
    return str(image["Id"])


def _require_whole(store: Store, digest: str) -> None:
    record = store.record(digest)
    if record is None:
        raise SystemExit(
            f"the image store {store.root} has no record of {digest}: fetch the image or copy it from a peer first"
        )
    missing = store.missing(record["blobs"])
    if missing:
        raise SystemExit(
            f"the image store {store.root} lacks {len(missing)} blob(s) of {digest} ({_listed(missing)}) though "
            "its record is there: fetch or copy the image again"
        )


def pull(args: dict[str, Any]) -> None:
    """The node's Docker pulls the pinned image from the store, through the relay."""
    store = Store(args["store"])
    with _explained(store):
        ref = parse_ref(args["ref"])
        _require_whole(store, ref.digest)
        relay = start_relay(store)
        name = f"127.0.0.1:{relay.port}/{ref.path}"
        try:
            _docker_pull(name, ref.digest)
            image_id = _image_id(f"{name}@{ref.digest}")
        finally:
            relay.shutdown()
            relay.server_close()
        reply({"local_ref": f"{name}@{ref.digest}", "id": image_id})


# --- records for copied blobs, the survey, pruning ----------------------------------------------------


def _verify(store: Store, record: dict[str, Any], digests: list[Any]) -> None:
    """Hash the listed blobs; those untrue to their names are removed, and named in the failure."""
    strange = [str(digest) for digest in digests if not _is_digest(digest) or digest not in record["blobs"]]
    if strange:
        raise SystemExit(f"asked to verify {_listed(strange)}, which the record of {record['digest']} does not list")
    meter = Meter("verify", sum(record["blobs"][digest] for digest in digests), len(digests))
    untrue = []
    for digest in digests:
        if file_sha256(store.blob(digest), meter, digest) != digest:
            os.unlink(store.blob(digest))
            untrue.append(digest)
        meter.file_done()
    if untrue:
        raise SystemExit(
            f"{len(untrue)} blob(s) copied to {store.root} do not match their digests and were removed: "
            f"{_listed(untrue)}; copy them again"
        )


def adopt(args: dict[str, Any]) -> None:
    """Record an image whose blobs a peer copied here, once each is present (and, as asked, true)."""
    store = Store(args["store"])
    with _explained(store):
        record = valid_record(args.get("record"))
        if record is None:
            raise SystemExit("adopt was given no valid ref record (ref, digest, blobs, layers, at)")
        missing = store.missing(record["blobs"])
        if missing:
            raise SystemExit(
                f"the image store {store.root} lacks {len(missing)} blob(s) of {record['digest']}, or holds them "
                f"at another size: {_listed(missing)}; copy them again"
            )
        _verify(store, record, list(args.get("verify") or []))
        store.write_record(record)
        reply({"ok": True})


def survey(args: dict[str, Any]) -> None:
    """The store's whole images (their records) and its complete blobs with their sizes."""
    store = Store(args["store"])
    with _explained(store):
        reply({"refs": store.records(), "blobs": store.blob_sizes()})


def _prune_refs(store: Store, keep: set[str]) -> list[str]:
    removed = []
    for name in _names(store.refs):
        digest = _record_digest(name)
        if digest is not None and digest not in keep:
            os.unlink(os.path.join(store.refs, name))
            removed.append(digest)
    return removed


def _prune_blobs(store: Store, listed: set[str]) -> int:
    """Blobs and partials no kept record lists, and the temporary files a killed rsync left (a
    dot, the blob's name, a random suffix: the prune runs after the copies, never beside one)."""
    freed = 0
    for name in _names(store.blobs):
        hex_digits = name.removesuffix(".partial")
        leftover = name.startswith(".") and _HEX.fullmatch(name[1:].split(".", 1)[0]) is not None
        if leftover or (_HEX.fullmatch(hex_digits) and f"sha256:{hex_digits}" not in listed):
            path = os.path.join(store.blobs, name)
            freed += os.lstat(path).st_size
            os.unlink(path)
    return freed


def prune(args: dict[str, Any]) -> None:
    """Remove the records of every image not kept, then every blob no kept record lists."""
    store = Store(args["store"])
    with _explained(store):
        keep = {str(digest) for digest in args.get("keep") or []}
        removed = _prune_refs(store, keep)
        listed = {digest for record in store.records().values() for digest in record["blobs"]}
        reply({"removed_refs": removed, "freed_bytes": _prune_blobs(store, listed)})
