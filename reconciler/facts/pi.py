"""Pi coding agent facts: the agent on the machine running the reconciler, and our part of its config.

Gathered locally, because the reconciler configures the Pi of the machine it runs on: `pi` on PATH
and which npm package it is, and what models.json, settings.json, the extension and the install
record say about our provider. Facts are printed and saved as snapshots, so they hold no secret: an
apiKey is kept only in our `!printenv NAME` form (a variable's name), anything else and every header
value is redacted. Reading the files is the gatherer; turning them into facts is pure.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from reconciler.errors import PiConfigError
from reconciler.facts.base import FactsModel, text_or_none
from reconciler.pi import config as pi_config
from reconciler.pi import files as pi_files

REDACTED = "<redacted>"


class PiFacts(FactsModel):
    """What Pi looks like on this machine; None where a file or a setting is absent."""

    directory: str
    pi_path: str | None = None
    package: str | None = None
    error: str | None = None
    provider: dict[str, Any] | None = None
    enabled_models: list[str] | None = None
    default_provider: str | None = None
    default_model: str | None = None
    extension_sha256: str | None = None
    manifest: dict[str, Any] | None = None

    def digest(self) -> str:
        """What a plan for Pi is decided on, as one value: our provider entry, the enabled models,
        the defaults, our extension and install record (all as the facts hold them: no secret)."""
        decided_on = self.model_dump(
            include={"provider", "enabled_models", "default_provider", "default_model", "extension_sha256", "manifest"}
        )
        return hashlib.sha256(json.dumps(decided_on, sort_keys=True).encode()).hexdigest()


def gather_pi(provider: str) -> PiFacts:
    """Never raises: a config Pi could not read either is the facts' `error`, for the plan to show."""
    from reconciler.pi.agent import locate_pi  # not loaded by a plan from saved facts

    pi_path, package = locate_pi()
    directory = os.environ.get("PI_CODING_AGENT_DIR") or "~/.pi/agent"
    try:
        directory = str(pi_files.agent_dir())
        files = pi_files.read_files(Path(directory), provider)
    except PiConfigError as exc:
        return PiFacts(directory=directory, pi_path=pi_path, package=package, error=exc.message)
    return pi_facts_from_files(files, provider, pi_path, package)


def pi_facts_from_files(
    files: pi_config.PiFiles, provider: str, pi_path: str | None = None, package: str | None = None
) -> PiFacts:
    """Facts from the files' text; a file Pi could not read either becomes `error`, not an exception."""
    try:
        providers = pi_config.providers_of(files) or {}
        settings = pi_config.load_object(files, pi_config.SETTINGS) or {}
        enabled = pi_config.enabled_models_of(settings, files)
        manifest = pi_config.read_manifest(files, provider)
    except PiConfigError as exc:
        return PiFacts(directory=files.directory, pi_path=pi_path, package=package, error=exc.message)
    extension = files.text(pi_config.extension_file(provider))
    return PiFacts(
        directory=files.directory,
        pi_path=pi_path,
        package=package,
        provider=redacted(providers[provider]) if provider in providers else None,
        enabled_models=None if enabled is None else [str(entry) for entry in enabled],
        default_provider=text_or_none(settings.get("defaultProvider")),
        default_model=text_or_none(settings.get("defaultModel")),
        extension_sha256=None if extension is None else pi_config.sha256(extension),
        manifest=manifest,
    )


def redacted(entry: object) -> dict[str, Any]:
    """A provider entry without secrets: our `!printenv NAME` apiKey stays, other keys and headers go."""
    if not isinstance(entry, dict):
        return {"invalid": REDACTED}
    clean = _without_headers(entry)
    if "apiKey" in clean and pi_config.key_env_of(clean["apiKey"]) is None:
        clean["apiKey"] = REDACTED
    models = clean.get("models")
    if isinstance(models, list):
        clean["models"] = [_without_headers(model) if isinstance(model, dict) else model for model in models]
    return clean


def _without_headers(entry: dict[str, Any]) -> dict[str, Any]:
    headers = entry.get("headers")
    if not isinstance(headers, dict):
        return dict(entry)
    return {**entry, "headers": dict.fromkeys(headers, REDACTED)}


def pi_status(provider: str) -> dict[str, Any]:
    """What is installed and configured here; the key variable's state, never its value."""
    directory = pi_files.agent_dir()
    from reconciler.pi.agent import locate_pi

    path, package = locate_pi()
    facts = pi_facts_from_files(pi_files.read_files(directory, provider), provider, path, package)
    entry = facts.provider or {}
    key_env = pi_config.key_env_of(entry.get("apiKey")) or text_or_none((facts.manifest or {}).get("key_env"))
    expected = (
        pi_config.sha256(pi_config.extension_text(provider, key_env))
        if key_env and pi_config.is_env_name(key_env)
        else None
    )
    extension = "missing" if facts.extension_sha256 is None else "current"
    if facts.extension_sha256 is not None and facts.extension_sha256 != expected:
        extension = "differs from what install writes"
    return {
        "dir": str(directory),
        "pi": {"path": path, "package": package},
        "error": facts.error,
        "provider": provider,
        "configured": facts.provider is not None,
        "base_url": entry.get("baseUrl"),
        "models": [m.get("id") for m in entry.get("models", []) if isinstance(m, dict)],
        "key_env": key_env,
        "key_env_set": bool(key_env and os.environ.get(key_env)),
        "extension": extension,
        "enabled_models": facts.enabled_models,
        "default": [facts.default_provider, facts.default_model],
        "installed_by_reconciler": facts.manifest is not None,
    }
