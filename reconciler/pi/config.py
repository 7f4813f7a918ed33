"""The Pi coding agent's configuration for this deployment: what install adds, what uninstall removes.

It adds one provider and its model, and gets two things right that a naive install gets wrong:

- apiKey is `!printenv DSV41_API_KEY`. It is the only value that Pi 0.73.1 and 1.6.0 both resolve from
  the environment on every request, and both refuse to send anything when the variable is unset
  (exit 1); a bare name or `$NAME` makes one of the two send the variable's *name* as the key
  (tests/integration/test_pi_real.py runs the unset case on both). So the key never lands under the Pi dir.
- A non-empty `enabledModels` gets the model appended: otherwise Pi starts on the list's first model,
  set-default or not. An empty or missing list already offers every model and stays as it is.

All pure (file texts in, new texts out; reconciler/pi/files.py reads and writes them), editing
through `jsonc`, so comments, other providers and layout survive byte for byte. A manifest next to
the extension records what install added (no secret in it), so uninstall removes exactly that and
restores the defaults it replaced.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from typing import Any
from urllib.parse import urlsplit

from reconciler.actions import PiTarget
from reconciler.constants import PI_KEY_ENV
from reconciler.errors import JsoncError, PiConfigError
from reconciler.record import Record, field
from reconciler.spec import Serving

# reconciler.pi.jsonc is imported by the functions that edit a file: a plan only compares entries.

DEFAULT_KEY_ENV = PI_KEY_ENV
MODELS = "models.json"
SETTINGS = "settings.json"
USER_FILES = (MODELS, SETTINGS)
MANIFEST_VERSION = 1
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_KEY_COMMAND = re.compile(r"^!printenv ([A-Za-z_][A-Za-z0-9_]*)$")
_EMPTY_MODELS = '{\n  "providers": {}\n}\n'
_EMPTY_SETTINGS = "{}\n"
_DEFAULT_KEYS = ("defaultProvider", "defaultModel")
_BROKEN_HINT = "fix the file (Pi cannot read it either), then run the command again; nothing was written"


def extension_file(provider: str) -> str:
    return f"extensions/{provider}.ts"


def manifest_file(provider: str) -> str:
    # Pi loads only extensions/*.ts, *.js and */index.ts, so a .json beside the extension is inert.
    return f"extensions/{provider}.install.json"


def normalise_base_url(url: str) -> str:
    """The API's address as Pi needs it: http(s), no trailing slash, ending in /v1."""
    text = url.strip().rstrip("/")
    try:
        parts = urlsplit(text)
        _ = parts.port  # raises ValueError for a port that is not a number
        valid = parts.scheme in ("http", "https") and bool(parts.netloc) and not parts.query and not parts.fragment
    except ValueError:  # an unclosed IPv6 bracket, a bad port
        valid = False
    if not valid:
        raise PiConfigError(
            f"base URL {url!r} is not an http(s) URL",
            "give the API's address, e.g. http://10.10.10.10:8000 (/v1 is added when missing)",
        )
    return text if text.endswith("/v1") else f"{text}/v1"


def is_env_name(name: object) -> bool:
    return isinstance(name, str) and bool(_ENV_NAME.match(name))


def check_key_env(name: str) -> str:
    """The key variable's name; it ends up in a command Pi runs with /bin/sh, so only a plain name."""
    if not is_env_name(name):
        raise PiConfigError(
            f"{name!r} is not an environment variable name", "use letters, digits and '_', e.g. DSV41_API_KEY"
        )
    return name


def key_command(key_env: str) -> str:
    return f"!printenv {check_key_env(key_env)}"


def key_env_of(api_key: object) -> str | None:
    """The variable an apiKey value reads, when it is our `!printenv NAME` form."""
    match = _KEY_COMMAND.match(api_key) if isinstance(api_key, str) else None
    return match.group(1) if match else None


def model_entry(target: PiTarget) -> dict[str, Any]:
    """Pi's entry for the served model (reasoning; images when the spec allows them), sized from the spec."""
    return {
        "id": target.model_id,
        "name": target.model_name,
        "reasoning": True,
        "input": ["text", "image"] if target.images else ["text"],
        "contextWindow": target.context_window,
        "maxTokens": target.context_window,
        "cost": {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0},
        "compat": {"supportsDeveloperRole": False, "supportsStore": False, "supportsUsageInStreaming": True},
        "thinkingLevelMap": {
            "minimal": "low",
            "low": "low",
            "medium": "high",
            "high": "high",
            "xhigh": "max",
            "max": "max",
        },
    }


def provider_entry(target: PiTarget) -> dict[str, Any]:
    return {
        "name": target.provider_name,
        "baseUrl": target.base_url,
        "api": "openai-completions",
        "apiKey": key_command(target.key_env),
        "models": [model_entry(target)],
    }


_EXTENSION = """\
// Installed by spark-reconciler (`reconciler pi install`); `reconciler pi uninstall` removes it.
// For provider __PROVIDER__ only: drops Pi's output-token cap (max_tokens / max_completion_tokens),
// which models.json cannot lift, and says plainly when __KEY_ENV__ is unset. The key itself is read
// per request by models.json's apiKey "!printenv __KEY_ENV__" and is never written under this
// directory. The type-only import loads unchanged in Pi 0.73.1 and 1.6.0.
import type { ExtensionAPI } from "@mariozechner/pi-coding-agent";

const PROVIDER = __PROVIDER_JSON__;
const KEY_ENV = __KEY_ENV_JSON__;

export default function (pi: ExtensionAPI) {
	pi.on("before_agent_start", (_event, ctx) => {
		if (ctx.model?.provider !== PROVIDER || process.env[KEY_ENV]) return undefined;
		const message =
			`${PROVIDER}: ${KEY_ENV} is not set; ` +
			`export ${KEY_ENV}=<the deployment's API key> and start pi again`;
		if (ctx.hasUI) ctx.ui.notify(message, "error");
		else console.error(message);
		return undefined;
	});

	pi.on("before_provider_request", (event, ctx) => {
		if (ctx.model?.provider !== PROVIDER) return undefined;
		if (typeof event.payload !== "object" || event.payload === null) return undefined;
		const payload = { ...(event.payload as Record<string, unknown>) };
		delete payload.max_tokens;
		delete payload.max_completion_tokens;
		return payload;
	});
}
"""


def extension_text(provider: str, key_env: str) -> str:
    """The extension's source for this provider and key variable (compared byte for byte by the plan)."""
    replacements = {
        "__PROVIDER_JSON__": json.dumps(provider),
        "__KEY_ENV_JSON__": json.dumps(check_key_env(key_env)),
        "__PROVIDER__": provider,
        "__KEY_ENV__": key_env,
    }
    text = _EXTENSION
    for marker, value in replacements.items():
        text = text.replace(marker, value)
    return text


def sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


# --- the files, as text ----------------------------------------------------------------------------


class PiFiles(Record):
    """The files install reads and writes, by path relative to the Pi dir; a missing file is absent."""

    directory: str
    texts: Mapping[str, str] = field(default_factory=dict)

    def text(self, name: str) -> str | None:
        return self.texts.get(name)

    def where(self, name: str) -> str:
        return f"{self.directory.rstrip('/')}/{name}"


class Changes(Record):
    """New texts by relative path (None: delete), in the order to write them, and what they mean."""

    writes: dict[str, str | None] = field(default_factory=dict)
    messages: list[str] = field(default_factory=list)

    @property
    def unchanged(self) -> bool:
        return not self.writes

    def add(self, name: str, text: str | None, *messages: str) -> None:
        self.writes[name] = text
        self.messages.extend(messages)


def load_object(files: PiFiles, name: str) -> dict[str, Any] | None:
    """A config file's top-level object (JSONC-tolerant), None when missing; errors name file and line."""
    from reconciler.pi import jsonc

    text = files.text(name)
    if text is None:
        return None
    try:
        data = jsonc.loads(text)
    except JsoncError as exc:
        raise PiConfigError(f"{files.where(name)}:{exc.line}:{exc.column}: {exc.message}", _BROKEN_HINT) from None
    if not isinstance(data, dict):
        raise PiConfigError(f"{files.where(name)}: the top level is not a JSON object", _BROKEN_HINT)
    return data


def read_manifest(files: PiFiles, provider: str) -> dict[str, Any] | None:
    """What an earlier install added; None when there is no record (never installed, or by another tool)."""
    name = manifest_file(provider)
    hint = "it is spark-reconciler's install record: remove it, then run `reconciler pi install` again"
    try:
        record = load_object(files, name)
    except PiConfigError as exc:
        raise PiConfigError(exc.message, hint) from None
    if record is not None and record.get("version") != MANIFEST_VERSION:
        raise PiConfigError(f"{files.where(name)}: unknown install record version {record.get('version')!r}", hint)
    return record


def providers_of(files: PiFiles) -> dict[str, Any] | None:
    """models.json's `providers`, None when models.json is missing."""
    data = load_object(files, MODELS)
    if data is None:
        return None
    providers = data.get("providers", {})
    if not isinstance(providers, dict):
        raise PiConfigError(f'{files.where(MODELS)}: "providers" is not an object', _BROKEN_HINT)
    return providers


def enabled_models_of(settings: Mapping[str, Any], files: PiFiles) -> list[Any] | None:
    enabled = settings.get("enabledModels")
    if enabled is not None and not isinstance(enabled, list):
        raise PiConfigError(f'{files.where(SETTINGS)}: "enabledModels" is not a list', _BROKEN_HINT)
    return enabled


# --- install ---------------------------------------------------------------------------------------


def install_changes(files: PiFiles, target: PiTarget) -> Changes:
    """What install writes for `target`; empty when everything is already as it would write it."""
    record = read_manifest(files, target.provider) or {}
    changes = Changes()
    _install_models(changes, files, target)
    enabled_model, defaults = _install_settings(changes, files, target, record)
    extension = extension_text(target.provider, target.key_env)
    name = extension_file(target.provider)
    if files.text(name) != extension:
        changes.add(name, extension, f"{name}: {'updated' if files.text(name) is not None else 'installed'}")
    fresh = {name for name in USER_FILES if name in changes.writes and files.text(name) is None}
    created = set(record.get("created", [])) | fresh
    manifest = _manifest_text(target, sorted(created), enabled_model, defaults)
    name = manifest_file(target.provider)
    if files.text(name) == manifest:
        return changes
    if changes.unchanged:
        changes.messages.append(f"{name}: install record written")
    # First: the record of what is about to be added survives a crash halfway through.
    return Changes({name: manifest, **changes.writes}, changes.messages)


def _install_models(changes: Changes, files: PiFiles, target: PiTarget) -> None:
    from reconciler.pi import jsonc

    data = load_object(files, MODELS)
    text = files.text(MODELS)
    desired = provider_entry(target)
    message = f"{MODELS}: provider {target.provider} added"
    if text is None:
        text = jsonc.set_member(_EMPTY_MODELS, ("providers",), target.provider, desired)
    elif "providers" not in (data or {}):
        text = jsonc.set_member(text, (), "providers", {target.provider: desired})
    else:
        current = (providers_of(files) or {}).get(target.provider)
        if current == desired:
            return
        if current is not None:
            message = f"{MODELS}: provider {target.provider} replaced ({describe_change(current, desired)})"
        text = jsonc.set_member(text, ("providers",), target.provider, desired)
    changes.add(MODELS, text, message)


def describe_change(current: object, desired: dict[str, Any]) -> str:
    """Which keys of an entry differ, for causes and messages ("apiKey, baseUrl changed")."""
    if not isinstance(current, dict):
        return "was not an object"
    keys = sorted(key for key in {*current, *desired} if current.get(key) != desired.get(key))
    return ", ".join(keys) + " changed"


def _install_settings(
    changes: Changes, files: PiFiles, target: PiTarget, record: Mapping[str, Any]
) -> tuple[str | None, dict[str, Any] | None]:
    """Adds the settings' changes; returns what the install record keeps of them (enabled model, defaults)."""
    from reconciler.pi import jsonc

    data = load_object(files, SETTINGS) or {}
    original = files.text(SETTINGS) or _EMPTY_SETTINGS
    text, messages, enabled_model = _install_enabled(original, data, files, target, record)
    defaults = record.get("defaults")
    if target.set_default and tuple(data.get(key) for key in _DEFAULT_KEYS) != (target.provider, target.model_id):
        if defaults is None:
            defaults = {"previous": {key: data[key] for key in _DEFAULT_KEYS if key in data}}
        text = jsonc.set_member(text, (), "defaultProvider", target.provider)
        text = jsonc.set_member(text, (), "defaultModel", target.model_id)
        messages.append(f"{SETTINGS}: default model set to {target.model_ref}")
    if messages:
        changes.add(SETTINGS, text, *messages)
    return enabled_model, defaults


def _install_enabled(
    text: str, data: Mapping[str, Any], files: PiFiles, target: PiTarget, record: Mapping[str, Any]
) -> tuple[str, list[str], str | None]:
    """Append to a non-empty enabledModels; drop an entry an earlier install added for another model id."""
    from reconciler.pi import jsonc

    enabled = enabled_models_of(data, files)
    added = record.get("enabled_model")
    ref = target.model_ref
    if enabled is None:
        return text, [], None
    messages: list[str] = []
    if isinstance(added, str) and added != ref and added in enabled:
        text = jsonc.remove_item(text, ("enabledModels",), added)
        enabled = [entry for entry in enabled if entry != added]
        messages.append(f"{SETTINGS}: {added} removed from enabledModels")
    if enabled and ref not in enabled:
        messages.append(f"{SETTINGS}: {ref} appended to enabledModels")
        return jsonc.append_item(text, ("enabledModels",), ref), messages, ref
    return text, messages, ref if added == ref and ref in enabled else None


def _manifest_text(
    target: PiTarget, created: list[str], enabled_model: str | None, defaults: dict[str, Any] | None
) -> str:
    record = {
        "version": MANIFEST_VERSION,
        "written_by": "spark-reconciler `reconciler pi install`; read by `reconciler pi uninstall`; no secret",
        "provider": target.provider,
        "model": target.model_id,
        "base_url": target.base_url,
        "key_env": target.key_env,
        "created": created,
        "enabled_model": enabled_model,
        "defaults": defaults,
    }
    return json.dumps(record, indent=2) + "\n"


# --- uninstall -------------------------------------------------------------------------------------


def uninstall_changes(files: PiFiles, provider: str) -> Changes:
    """Remove exactly what install added: the provider, the extension, and what the record lists."""
    record = read_manifest(files, provider)
    changes = Changes()
    _uninstall_models(changes, files, provider, created=MODELS in (record or {}).get("created", []))
    if record is not None:
        _uninstall_settings(changes, files, provider, record)
    elif files.text(SETTINGS) is not None:
        changes.messages.append(f"{SETTINGS}: left as it is (no install record says what install changed there)")
    if files.text(extension_file(provider)) is not None:
        changes.add(extension_file(provider), None, f"{extension_file(provider)}: removed")
    if record is not None:
        changes.add(manifest_file(provider), None)  # last: the record outlives a crash halfway through
    return changes if changes.writes else Changes()


def _uninstall_models(changes: Changes, files: PiFiles, provider: str, *, created: bool) -> None:
    from reconciler.pi import jsonc

    providers = providers_of(files)
    text = files.text(MODELS)
    if providers is None or text is None or provider not in providers:
        return
    text = jsonc.remove_member(text, ("providers",), provider)
    if created and jsonc.loads(text) == {"providers": {}}:
        changes.add(MODELS, None, f"{MODELS}: removed (install created it for this provider alone)")
    else:
        changes.add(MODELS, text, f"{MODELS}: provider {provider} removed")


def _uninstall_settings(changes: Changes, files: PiFiles, provider: str, record: Mapping[str, Any]) -> None:
    from reconciler.pi import jsonc

    data = load_object(files, SETTINGS)
    text = files.text(SETTINGS)
    if data is None or text is None:
        return
    messages: list[str] = []
    added = record.get("enabled_model")
    enabled = enabled_models_of(data, files) or []
    if isinstance(added, str) and added in enabled:
        text = jsonc.remove_item(text, ("enabledModels",), added)
        messages.append(f"{SETTINGS}: {added} removed from enabledModels")
    defaults = record.get("defaults")
    if defaults is not None and tuple(data.get(key) for key in _DEFAULT_KEYS) == (provider, record.get("model")):
        previous = defaults.get("previous") or {}
        for key in _DEFAULT_KEYS:
            if key in previous:
                text = jsonc.set_member(text, (), key, previous[key])
            else:
                text = jsonc.remove_member(text, (), key)
        restored = "/".join(str(previous.get(key, "?")) for key in _DEFAULT_KEYS)
        done = f"default restored to {restored}" if previous else "default model unset (there was none before install)"
        messages.append(f"{SETTINGS}: {done}")
    if SETTINGS in record.get("created", []) and messages and jsonc.loads(text) == {}:
        changes.add(SETTINGS, None, f"{SETTINGS}: removed (install created it)")
    elif messages:
        changes.add(SETTINGS, text, *messages)


MODEL_NAME = "DeepSeek-V4.1-Flash"


def target_for(
    serving: Serving, provider: str, nodes: int, *, base_url: str, key_env: str, set_default: bool
) -> PiTarget:
    """The provider and model entry the spec implies (id, context window, images from `serving:`)."""
    return PiTarget(
        provider=provider,
        base_url=normalise_base_url(base_url),
        key_env=check_key_env(key_env),
        model_id=serving.served_model_name,
        context_window=serving.max_model_len,
        images=serving.images_per_prompt > 0,
        provider_name=f"{MODEL_NAME} ({nodes}x DGX Spark)",
        model_name=MODEL_NAME,
        set_default=set_default,
    )
