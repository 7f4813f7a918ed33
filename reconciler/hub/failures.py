"""Every failure of the Hub client translated into a `HubError` that says what happened in the
user's terms (not found, refused, the network, the local disk, a malformed answer) and what to do."""

from __future__ import annotations

import contextlib
import errno
import socket
import threading
from collections.abc import Callable, Iterator
from typing import TypeVar

from huggingface_hub.errors import (
    EntryNotFoundError,
    HfHubHTTPError,
    LocalEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

from reconciler.errors import HubError, ReconcilerError
from reconciler.hub.client import _bound_client_timeouts, endpoint
from reconciler.redact import redact
from reconciler.spec import Model


def translate(exc: BaseException, model: Model, doing: str) -> HubError:
    where = endpoint(model) or "https://huggingface.co"
    for kind, check in _CLASSIFIERS:
        error = check(exc, model, where, doing)
        if error is not None:
            return HubError(redact(error[0]), error[1], kind=kind)
    return HubError(
        redact(f"{doing} at {where} failed: {type(exc).__name__}: {_first_line(exc)}"),
        "retry later; if it persists, check model.endpoint and the Hub's status",
        kind="unknown",
    )


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:300] if text else "no detail"


def _not_found(exc: BaseException, model: Model, where: str, doing: str) -> Classified:
    del doing
    if isinstance(exc, RevisionNotFoundError):
        return f"revision {model.revision} not found in {model.repo} at {where}", "check model.revision"
    if isinstance(exc, RepositoryNotFoundError):
        return (
            f"repository {model.repo} not found or not accessible at {where}",
            "check model.repo, and set $HF_TOKEN or model.token_file if the repo is gated or private",
        )
    if isinstance(exc, LocalEntryNotFoundError):  # before its base class, EntryNotFoundError
        return (
            f"{where} does not answer like a Hugging Face Hub: {_first_line(exc)}",
            "check model.endpoint (a mirror must serve the Hub's API and headers)",
        )
    if isinstance(exc, EntryNotFoundError):
        return f"a file of {model.repo} is not at {where}: {_first_line(exc)}", "check model.revision"
    return None


def _http_status(exc: BaseException, model: Model, where: str, doing: str) -> Classified:
    del model
    if not isinstance(exc, HfHubHTTPError):
        return None
    response = getattr(exc, "response", None)
    status = getattr(response, "status_code", None)
    if status in (401, 403):
        return (
            f"{doing} at {where} was refused (HTTP {status})",
            "check the token ($HF_TOKEN or model.token_file) and that it may read the repo (gated repos "
            "need access granted on the Hub)",
        )
    if status == 429:
        retry = _header(response, "Retry-After")
        later = f"retry after {retry} s" if retry else "retry in a few minutes"
        return f"{doing} at {where} was rate-limited (HTTP 429)", f"{later}; a token raises the Hub's limits"
    if isinstance(status, int) and status >= 500:
        return f"{doing} at {where} failed: the Hub answered HTTP {status}", "the Hub has trouble: retry later"
    return f"{doing} at {where} failed: {_first_line(exc)}", "check model.repo, model.revision and the token"


def _header(response: object, name: str) -> str | None:
    headers = getattr(response, "headers", None)
    try:
        value = headers.get(name) if headers is not None else None
    except Exception:  # a header mapping we do not know: no advice from it
        return None
    return str(value) if value else None


def _network(exc: BaseException, model: Model, where: str, doing: str) -> Classified:
    del model
    if not _is_network_error(exc):
        return None
    names = {cls.__name__ for cls in _chain_types(exc)}
    detail = _first_line(exc)
    if any("Timeout" in name for name in names):
        return f"{doing} at {where} timed out", "the Hub is slow or unreachable: retry later, check the network"
    if any("SSL" in name or "Certificate" in name for name in names) or "CERTIFICATE" in detail.upper():
        return f"{doing} at {where} failed: TLS: {detail}", "check the system clock and CA certificates, or the mirror"
    if socket.gaierror in _chain_types(exc) or "name resolution" in detail.lower() or "not known" in detail:
        return f"{doing}: cannot resolve the host of {where}", "check DNS and model.endpoint"
    return (
        f"{doing}: cannot reach {where}: {detail}",
        "check the network and model.endpoint; commands that do not need the Hub keep working",
    )


def _is_network_error(exc: BaseException) -> bool:
    for cls in _chain_types(exc):
        module = cls.__module__.split(".")[0]
        if module in _HTTP_STACKS or issubclass(cls, ConnectionError | TimeoutError | socket.gaierror):
            return True
    return False


_HTTP_STACKS = {"httpx", "httpx2", "httpcore", "requests", "urllib3", "h11", "h2"}


def _chain_types(exc: BaseException) -> list[type[BaseException]]:
    """Every class of the exception and of its causes (the client wraps transport errors)."""
    found: list[type[BaseException]] = []
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        found += [cls for cls in type(current).__mro__ if issubclass(cls, BaseException)]
        current = current.__cause__ or current.__context__
    return found


def _local(exc: BaseException, model: Model, where: str, doing: str) -> Classified:
    del model, where
    if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
        return (
            f"the disk filled up while {doing.lower()}",
            "free space (or point model_dir at a larger disk) and run apply again: the download resumes",
        )
    if isinstance(exc, OSError) and exc.filename is not None:
        return f"{doing} failed: {exc.strerror or exc} ({exc.filename})", "check the model dir's permissions and disk"
    return None


def _malformed(exc: BaseException, model: Model, where: str, doing: str) -> Classified:
    del model
    if isinstance(exc, ValueError | KeyError | TypeError | AttributeError | IndexError):
        return (
            f"{doing} at {where}: the answer is not what a Hub sends ({type(exc).__name__}: {_first_line(exc)})",
            "check model.endpoint: a proxy or captive portal may answer instead of the Hub",
        )
    return None


Classified = tuple[str, str] | None


_CLASSIFIERS: tuple[tuple[str, Callable[[BaseException, Model, str, str], Classified]], ...] = (
    ("not-found", _not_found),
    ("http", _http_status),
    ("network", _network),
    ("local", _local),
    ("malformed", _malformed),
)
# A whole question to the Hub (resolve a branch, list a commit and read its manifest) must end:
# read timeouts alone never fire on a server that trickles a byte now and then.
QUESTION_DEADLINE_S = 180.0


T = TypeVar("T")


def within_deadline(model: Model, doing: str, ask: Callable[[], T], deadline_s: float | None = None) -> T:
    """Run `ask` (Hub requests) and give up after the deadline with a HubError; the abandoned
    request finishes or fails in the background, on a daemon thread, holding nothing."""
    limit = QUESTION_DEADLINE_S if deadline_s is None else deadline_s
    outcome: list[T] = []
    failure: list[BaseException] = []

    def run() -> None:
        try:
            outcome.append(ask())
        except BaseException as exc:  # handed to the caller's thread below
            failure.append(exc)

    worker = threading.Thread(target=run, name="hub question", daemon=True)
    worker.start()
    worker.join(limit)
    if worker.is_alive():
        where = endpoint(model) or "https://huggingface.co"
        raise HubError(
            f"{doing} at {where} took longer than {limit:.0f} s",
            "the Hub is slow or stalled: retry later",
            kind="network",
        )
    if failure:
        raise failure[0]
    return outcome[0]


@contextlib.contextmanager
def hub_call(model: Model, doing: str) -> Iterator[None]:
    """Any failure of the Hub client inside becomes a HubError saying what failed and what to do.

    The client is a library over an HTTP stack whose exceptions differ by version (requests,
    httpx, httpx2), and the Hub (or a mirror) can be down, slow or wrong at any time; none of
    that may end as an internal error, or keep commands that do not need the Hub from working.
    """
    _bound_client_timeouts()
    try:
        yield
    except ReconcilerError:  # already says what failed (a bad token file, a refused listing)
        raise
    except Exception as exc:
        raise translate(exc, model, doing) from None
