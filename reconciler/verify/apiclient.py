"""Reaching the OpenAI-compatible API for `smoke` and `bench`: target, key, errors, SSE.

The key comes from `--key-file`, else `$DSV41_API_KEY` (the variable Pi's provider reads by
default), else the spec's key file on the head. It lives only in memory: it is sent in the
Authorization header and nowhere else, never printed, never put in a subprocess's argv, and any
text a server echoes back is passed through `ApiTarget.redact` before it is shown.
"""

from __future__ import annotations

import json
import ssl
import urllib.parse
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from reconciler.errors import ReconcilerError, UntrustedFileError
from reconciler.fsutil import read_bounded
from reconciler.redact import checked_secret
from reconciler.serving import api_base
from reconciler.spec import Deployment, expand_home

KEY_ENV = "DSV41_API_KEY"
# An hour per request: without max_tokens a reasoning answer may take minutes.
REQUEST_TIMEOUT_S = 3600.0
CONNECT_TIMEOUT_S = 10.0
SHOWN_BODY_CHARS = 200

JsonObject = dict[str, Any]
# A streamed request that ends with a usage chunk (choices: [], the token counts) before [DONE].
STREAM_WITH_USAGE: JsonObject = {"stream": True, "stream_options": {"include_usage": True}}


@dataclass(frozen=True)
class ApiTarget:
    """Where the API is, the key it wants, and the model to ask (None: the first listed)."""

    url: str
    key: str = field(repr=False)
    model: str | None = None
    # The certificate to trust for https (the front's self-signed one, PEM); None: the system's CAs.
    ca: str | None = field(default=None, repr=False)

    def redact(self, text: str) -> str:
        return text.replace(self.key, "(redacted)") if self.key else text


def base_url(url: str) -> str:
    """'http://h:8000/v1/' -> 'http://h:8000': requests name their /v1 paths themselves."""
    try:
        parts = urllib.parse.urlsplit(url)
        _ = parts.port  # raises ValueError for a port that is not a number
        valid = parts.scheme in ("http", "https") and bool(parts.hostname)
    except ValueError:  # an unclosed IPv6 bracket, a port that is not a number
        valid = False
    if not valid or any(char.isspace() or not char.isprintable() for char in url):
        raise ReconcilerError(f"{url!r} is not an http(s) URL", "write it like http://127.0.0.1:8000")
    return url.rstrip("/").removesuffix("/v1")


def resolve_target(
    url: str | None,
    key_file: str | None,
    model: str | None,
    env: Mapping[str, str],
    load_deployment: Callable[[], Deployment],
) -> ApiTarget:
    """Flags first; the spec is read only for what they leave open (URL or key), and then also
    names the model. Without a spec the model is the first one /v1/models lists."""
    key_given = key_file is not None or bool(env.get(KEY_ENV, "").strip())
    if url is not None and key_given:
        return ApiTarget(base_url(url), resolve_key(key_file, env, None), model)
    deployment = load_deployment()
    return ApiTarget(
        base_url(url) if url is not None else api_base(deployment),
        resolve_key(key_file, env, None if key_given else local_key_file(deployment)),
        model or deployment.serving.served_model_name,
        local_ca(deployment),
    )


def local_ca(deployment: Deployment) -> str | None:
    """The front's certificate to pin, when this machine is the head (elsewhere: the CAs httpx
    trusts, which SSL_CERT_FILE can extend)."""
    files = deployment.tls_files()
    if files is None or deployment.head.ssh is not None:
        return None
    path = expand_home(files[0], str(Path.home()))
    try:
        return read_bounded(path, limit=CERT_LIMIT).decode("utf-8", "replace")
    except UntrustedFileError as exc:
        raise ReconcilerError(
            f"cannot read the front's certificate {path}: {exc.reason}", "run `reconciler apply` to create it"
        ) from None


CERT_LIMIT = 64 * 1024


def resolve_key(key_file: str | None, env: Mapping[str, str], spec_key_file: str | None) -> str:
    """--key-file, else $DSV41_API_KEY, else the spec's key file."""
    if key_file is not None:
        return read_key_file(key_file)
    if env.get(KEY_ENV, "").strip():
        return checked_secret(env[KEY_ENV], what="the API key", source=f"${KEY_ENV}", hint=_KEY_HINT)
    if spec_key_file is None:
        raise ReconcilerError("no API key", f"pass --key-file PATH or set ${KEY_ENV}")
    return read_key_file(spec_key_file)


_KEY_HINT = "the key is printable ASCII on one line: check the file or the variable for stray bytes"
KEY_FILE_LIMIT = 4096


def read_key_file(path: str) -> str:
    try:
        raw = read_bounded(path, limit=KEY_FILE_LIMIT)
    except UntrustedFileError as exc:
        raise ReconcilerError(
            f"cannot read the API key file {path}: {exc.reason}", f"pass --key-file PATH or set ${KEY_ENV}"
        ) from None
    if not raw.strip():
        raise ReconcilerError(f"the API key file {path} is empty", "run `reconciler apply` to create it")
    return checked_secret(raw.decode("utf-8", "surrogateescape"), what="the API key", source=path, hint=_KEY_HINT)


def local_key_file(deployment: Deployment) -> str:
    """The spec's key file as a path on this machine, which must be the head."""
    head = deployment.head
    if head.ssh is not None:
        raise ReconcilerError(
            f"the API key file is on {head.name}, not on this machine", f"pass --key-file PATH or set ${KEY_ENV}"
        )
    return expand_home(deployment.key_file(), str(Path.home()))


def trust(target: ApiTarget) -> ssl.SSLContext | bool:
    """What https is checked against: exactly the pinned certificate (the front's, whoever
    signed it: the name in it then does not matter, only holding its key does), else the CAs
    httpx trusts."""
    if target.ca is None:
        return True
    try:
        context = ssl.create_default_context(cadata=first_certificate(target.ca))
    except (ssl.SSLError, ValueError) as exc:
        raise ReconcilerError(
            f"the front's certificate cannot be read: {exc}", "remove the TLS pair on the head: `apply` makes a new one"
        ) from None
    # The leaf alone is the trust anchor: a certificate of yours signed for another name, or by a
    # CA this machine does not know, is still the front's.
    context.verify_flags |= ssl.VERIFY_X509_PARTIAL_CHAIN
    context.check_hostname = False
    return context


def first_certificate(pem: str) -> str:
    """The first certificate of a PEM file (the leaf; a chain's CAs must not become anchors)."""
    begin, end = "-----BEGIN CERTIFICATE-----", "-----END CERTIFICATE-----"
    start = pem.find(begin)
    stop = pem.find(end, start)
    if start < 0 or stop < 0:
        raise ValueError("no PEM certificate in it")
    return pem[start : stop + len(end)] + "\n"


def client(target: ApiTarget, *, keyed: bool = True, timeout: float = REQUEST_TIMEOUT_S) -> httpx.Client:
    headers = {"Authorization": f"Bearer {target.key}"} if keyed else {}
    limits = httpx.Timeout(timeout, connect=min(timeout, CONNECT_TIMEOUT_S))
    return httpx.Client(base_url=target.url, headers=headers, timeout=limits, verify=trust(target))


def async_client(target: ApiTarget, *, connections: int, timeout: float = REQUEST_TIMEOUT_S) -> httpx.AsyncClient:
    """The bench's streaming client: keyed, `connections` kept alive, and asking for no
    compression (a compressor hands an event stream on in its own blocks, not chunk by chunk)."""
    headers = {"Authorization": f"Bearer {target.key}", "Accept-Encoding": "identity"}
    return httpx.AsyncClient(
        base_url=target.url,
        headers=headers,
        timeout=httpx.Timeout(timeout, connect=CONNECT_TIMEOUT_S),
        limits=httpx.Limits(max_connections=connections, max_keepalive_connections=connections),
        verify=trust(target),
    )


def listed_models(body: object) -> list[str]:
    """The ids in a /v1/models answer ([] when it has none or is not one)."""
    data = body.get("data") if isinstance(body, dict) else None
    if not isinstance(data, list):
        return []
    return [str(card["id"]) for card in data if isinstance(card, dict) and "id" in card]


def transport_problem(exc: httpx.HTTPError) -> str:
    """Why a request got no answer, in an owner's words: refused, unresolved, TLS, timed out."""
    if isinstance(exc, httpx.ConnectTimeout):
        return "no connection in time (the host may be down or unreachable)"
    if isinstance(exc, httpx.TimeoutException):
        return "no answer in time (the engine may be busy or hung)"
    if isinstance(exc, httpx.ConnectError):
        return _connect_problem(exc)
    if isinstance(exc, httpx.RemoteProtocolError):
        return f"the server broke off the answer: {_last_words(exc)}"
    return _last_words(exc)


def _connect_problem(exc: httpx.ConnectError) -> str:
    cause = exc.__cause__ or exc.__context__
    causes = [cause, getattr(cause, "__cause__", None), getattr(cause, "__context__", None)]
    if any(isinstance(item, ConnectionRefusedError) for item in causes) or "refused" in str(exc).lower():
        return "connection refused: nothing listens there (is the deployment up? `reconciler status`)"
    if any(isinstance(item, ssl.SSLError) for item in causes) or "ssl" in str(exc).lower():
        return f"the TLS handshake failed: {_last_words(exc)}"
    if "name or service not known" in str(exc).lower() or "nodename nor servname" in str(exc).lower():
        return "the host name does not resolve"
    return f"cannot connect: {_last_words(exc)}"


def _last_words(exc: Exception) -> str:
    """An OS error's words without its number: `[Errno 113] No route to host` -> `no route to host`."""
    text = " ".join(str(exc).split())
    if text.startswith("[Errno") and "] " in text:
        text = text.split("] ", 1)[1]
    return text[:1].lower() + text[1:] if text else "no reason given"


def discover_model(http: httpx.Client) -> str:
    """The first model /v1/models lists: the served one, on a server that serves one model."""
    try:
        response = http.get("/v1/models")
    except httpx.HTTPError as exc:
        raise ReconcilerError(
            f"no answer from {http.base_url}: {transport_problem(exc)}", "check the URL and `reconciler status`"
        ) from None
    if response.status_code != 200:
        raise ReconcilerError(f"GET /v1/models: {error_text(response)}", _hint(response.status_code))
    models = listed_models(response.json())
    if not models:
        raise ReconcilerError("GET /v1/models lists no model", "check `reconciler logs r0`")
    return models[0]


def error_text(response: httpx.Response) -> str:
    """'HTTP 400: <the server's message>', short enough for one line."""
    try:
        body = response.json()
    except ValueError:
        body = None
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        message = error["message"]
    elif isinstance(error, str):
        message = error
    else:
        message = response.text
    return f"HTTP {response.status_code}: {shorten(message)}".rstrip(": ")


def _hint(status: int) -> str:
    if status == 401:
        return f"the key was refused: pass the right --key-file or ${KEY_ENV}"
    return "check `reconciler status` and `reconciler logs r0`"


def shorten(text: str, limit: int = SHOWN_BODY_CHARS) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."


def sse_payloads(lines: Iterable[str]) -> Iterator[str]:
    """The data of each `data:` line of a server-sent event stream, in order."""
    for line in lines:
        if line.startswith("data:"):
            yield line[5:].strip()


def chunk_json(payload: str) -> JsonObject:
    """One SSE chunk as an object; anything else is a protocol error."""
    try:
        value = json.loads(payload)
    except ValueError:
        raise ValueError(f"a chunk is not JSON: {shorten(payload, 80)}") from None
    if not isinstance(value, dict):
        raise ValueError(f"a chunk is not a JSON object: {shorten(payload, 80)}")
    return value


def first_choice(answer: object) -> JsonObject | None:
    """The first choice of an answer or a streamed chunk (None when it has none)."""
    choices = answer.get("choices") if isinstance(answer, dict) else None
    first = choices[0] if isinstance(choices, list) and choices else None
    return first if isinstance(first, dict) else None
