"""The Hub client's credentials, endpoint and time limits: the token (never printed, never in
argv), HF_ENDPOINT semantics, bounded connect and read timeouts, and a deadline on each question."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

# A private module of the client: the shared HTTP client as the client itself builds it
# (`_bound_client_timeouts`). pyproject.toml bounds huggingface_hub above by the newest minor
# release CI runs; the locked and the lowest lanes both run tests/unit/test_hub_failures.py.
from huggingface_hub import get_token, set_client_factory
from huggingface_hub.utils._http import default_client_factory

from reconciler.errors import HubError, UntrustedFileError
from reconciler.fsutil import read_bounded
from reconciler.redact import checked_secret
from reconciler.spec import Model

TOKEN_HINT = "write the token alone on one line (as the Hub shows it), or fix $HF_TOKEN"


def token(model: Model) -> str | bool:
    """The Hub token (model.token_file, else $HF_TOKEN, else the client's stored login), checked;
    False when there is none, so the client sends no token instead of reading one unchecked."""
    if model.token_file:
        path = Path(os.path.expanduser(model.token_file))
        return checked_secret(_read_token_file(path), what="the Hub token", source=str(path), hint=TOKEN_HINT)
    if os.environ.get("HF_TOKEN"):
        return checked_secret(os.environ["HF_TOKEN"], what="the Hub token", source="$HF_TOKEN", hint=TOKEN_HINT)
    try:
        stored = get_token()
    except Exception:  # the client's own lookup (a token file, OIDC): without it, no token
        return False
    if not stored:
        return False
    return checked_secret(stored, what="the Hub token", source="the Hub client's stored login", hint=TOKEN_HINT)


def _read_token_file(path: Path) -> str:
    try:
        data = read_bounded(path, limit=4096)
    except UntrustedFileError as exc:
        raise HubError(f"cannot read model.token_file {path}: {exc.reason}", "fix the path or remove it") from None
    return data.decode("utf-8", "surrogateescape")


def endpoint(model: Model) -> str | None:
    return model.endpoint or os.environ.get("HF_ENDPOINT") or None


# The Hub client's default HTTP client has no timeout at all: a Hub that accepts the connection
# and never answers would hold a pass (and `status`) forever.
CONNECT_TIMEOUT_S = 10.0
READ_TIMEOUT_S = 60.0
_bounded = False


def _bound_client_timeouts() -> None:
    """Give the client's shared HTTP client timeouts, once: through its factory, because the
    client drops and rebuilds that shared client after a connection error."""
    global _bounded
    if _bounded:
        return
    _bounded = True

    def bounded_client() -> Any:
        client = default_client_factory()
        client.timeout = type(client.timeout)(READ_TIMEOUT_S, connect=CONNECT_TIMEOUT_S)
        return client

    set_client_factory(bounded_client)
