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
import shutil
from pathlib import Path
from typing import Any

from reconciler.errors import PiConfigError
from reconciler.facts.base import FactsModel
from reconciler.pi import config as pi_config

REDACTED = "<redacted>"
PI_PACKAGES = ("@earendil-works/pi-coding-agent", "@mariozechner/pi-coding-agent")


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


def locate_pi(search_path: str | None = None) -> tuple[str | None, str | None]:
    """`pi` on PATH and the package behind it ("name@version"), without running it (node starts slowly)."""
    found = shutil.which("pi", path=search_path)
    return (found, package_of(Path(found))) if found else (None, None)


def package_of(executable: Path) -> str | None:
    """npm links bin/pi to <package>/dist/cli.js; the nearest package.json above it names the package."""
    try:
        manifest = _nearest_manifest(executable)
        data = json.loads(manifest.read_text(encoding="utf-8")) if manifest else None
    except (OSError, RuntimeError, ValueError, RecursionError):  # unreadable, a symlink loop, not JSON
        return None
    name = data.get("name") if isinstance(data, dict) else None
    return f"{name}@{data.get('version')}" if isinstance(data, dict) and name in PI_PACKAGES else None


def _nearest_manifest(executable: Path) -> Path | None:
    candidates = (parent / "package.json" for parent in list(executable.resolve().parents)[:4])
    return next((candidate for candidate in candidates if candidate.is_file()), None)


def gather_pi(provider: str) -> PiFacts:
    """Never raises: a config Pi could not read either is the facts' `error`, for the plan to show."""
    pi_path, package = locate_pi()
    directory = os.environ.get("PI_CODING_AGENT_DIR") or "~/.pi/agent"
    try:
        directory = str(pi_config.agent_dir())
        files = pi_config.read_files(Path(directory), provider)
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
        default_provider=_text(settings.get("defaultProvider")),
        default_model=_text(settings.get("defaultModel")),
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


def _text(value: object) -> str | None:
    return value if isinstance(value, str) else None
