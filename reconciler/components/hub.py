"""The Hugging Face Hub client, as the checkpoint component uses it.

The real `huggingface_hub` client with the spec's endpoint (HF_ENDPOINT semantics), pinned
revision and token (from $HF_TOKEN or model.token_file; never printed, never in argv).
"""

from __future__ import annotations

import os
from pathlib import Path

from huggingface_hub import snapshot_download
from huggingface_hub.errors import HfHubHTTPError, RepositoryNotFoundError, RevisionNotFoundError

from reconciler.errors import ReconcilerError
from reconciler.spec import Model


class HubError(ReconcilerError):
    """The Hub refused or failed a request."""


def token(model: Model) -> str | None:
    if model.token_file:
        path = Path(os.path.expanduser(model.token_file))
        try:
            return path.read_text(encoding="utf-8").strip() or None
        except OSError as exc:
            raise HubError(
                f"cannot read model.token_file {path}: {exc.strerror}", "fix the path or remove it"
            ) from None
    return os.environ.get("HF_TOKEN") or None


def endpoint(model: Model) -> str | None:
    return model.endpoint or os.environ.get("HF_ENDPOINT") or None


def download_snapshot(model: Model, local_dir: str, *, exclude_parts: bool) -> str:
    """Fetch what is missing into local_dir; return the local dir."""
    try:
        return snapshot_download(
            repo_id=model.repo,
            revision=model.revision,
            local_dir=local_dir,
            endpoint=endpoint(model),
            token=token(model),
            ignore_patterns=["*.safetensors.part[0-9][0-9]"] if exclude_parts else None,
        )
    except RepositoryNotFoundError:
        raise HubError(
            f"repository {model.repo} not found or not accessible at {endpoint(model) or 'the Hub'}",
            "check model.repo, and set $HF_TOKEN or model.token_file if the repo is gated",
        ) from None
    except RevisionNotFoundError:
        raise HubError(f"revision {model.revision} not found in {model.repo}", "check model.revision") from None
    except HfHubHTTPError as exc:
        raise HubError(f"Hub request failed: {exc}", "retry; check the endpoint and your token") from None
