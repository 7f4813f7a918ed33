"""The Pi coding agent provider on the machine running the reconciler (the spec's `pi:` section).

`apply` configures a Pi that is already installed and never installs one: npm fetching software
as a side effect of converging a deployment would surprise, and it needs a node version check and
the network. When `pi` is not on PATH the plan says "run `reconciler pi install`" as an in-sync
note. `pi.enabled: false` leaves Pi's config alone (`reconciler pi uninstall` removes it).

The base URL is the reconciler's own view of the API (reconciler.serving.api_base): on the head
itself http://127.0.0.1:<port>/v1. The key variable is the one the last install chose (its
install record), else DSV41_API_KEY. Pi's config is written after the rank group is ready, and is
never a prerequisite of it.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from reconciler.actions import Action, Component, ConfigurePi, InSync, Outcome, PiTarget, Verb, action, runs
from reconciler.errors import FactsChangedError
from reconciler.facts.node import Facts
from reconciler.facts.pi import PiFacts, pi_facts_from_files
from reconciler.pi import config as picfg
from reconciler.pi import files as pi_files
from reconciler.serving import api_base
from reconciler.spec import Deployment

if TYPE_CHECKING:
    from reconciler.execution import ApplyContext

COMPONENT = Component.PI


def desired_target(deployment: Deployment, manifest: Mapping[str, Any] | None) -> PiTarget:
    """What `apply` keeps Pi at: the spec, the local API address, the installed key variable."""
    installed = (manifest or {}).get("key_env")
    key_env = installed if isinstance(installed, str) and picfg.is_env_name(installed) else None
    return picfg.target_for(
        deployment.serving,
        deployment.pi.provider,
        len(deployment.nodes),
        base_url=api_base(deployment),
        key_env=key_env or picfg.DEFAULT_KEY_ENV,
        set_default=deployment.pi.set_default,
    )


def plan_pi(deployment: Deployment, facts: Facts) -> Outcome:
    # Pi is configured on this machine: the spec's node without ssh:, else "local".
    node = next((node.name for node in deployment.nodes if node.ssh is None), "local")
    observed = facts.pi
    if not deployment.pi.enabled:
        return _in_sync(node, "pi.enabled is false: Pi's config is left as it is")
    if observed is None:
        return _in_sync(node, "no Pi facts in this snapshot")
    if observed.pi_path is None:
        return _in_sync(node, "Pi not installed: run `reconciler pi install`")
    if observed.error is not None:
        return Outcome(notes=[f"Pi config left alone: {observed.error} (Pi cannot read it either; fix it)"])
    target = desired_target(deployment, observed.manifest)
    causes = differences(observed, target)
    if not causes:
        return _in_sync(node, f"provider {target.provider} in {observed.directory} points at {target.base_url}")
    summary = f"configure Pi in {observed.directory}: provider {target.provider} -> {target.base_url}"
    verb: Verb = "create" if observed.provider is None else "update"
    payload = ConfigurePi(target=target, directory=observed.directory, seen=observed.digest())
    return Outcome(actions=[action(payload, node, verb, summary, "; ".join(causes))])


def differences(observed: PiFacts, target: PiTarget) -> list[str]:
    """Why the Pi config differs from what install would write (empty: in sync)."""
    causes: list[str] = []
    desired = picfg.provider_entry(target)
    if observed.provider is None:
        causes.append(f"provider {target.provider} missing from models.json")
    elif observed.provider != desired:
        causes.append(f"provider {target.provider} differs: {picfg.describe_change(observed.provider, desired)}")
    extension = picfg.extension_text(target.provider, target.key_env)
    if observed.extension_sha256 != picfg.sha256(extension):
        state = "missing" if observed.extension_sha256 is None else "outdated"
        causes.append(f"extension {picfg.extension_file(target.provider)} {state}")
    enabled = observed.enabled_models
    if enabled and target.model_ref not in enabled:
        causes.append(f"{target.model_ref} not in enabledModels (Pi would start on {enabled[0]})")
    defaults = (observed.default_provider, observed.default_model)
    if target.set_default and defaults != (target.provider, target.model_id):
        causes.append(f"pi.set_default: default model is {'/'.join(d or '-' for d in defaults)}")
    return causes


def _in_sync(node: str, reason: str) -> Outcome:
    return Outcome(in_sync=[InSync(node, COMPONENT, reason)])


def _configure(ctx: ApplyContext, action: Action, configure: ConfigurePi) -> str:
    """Write the planned target, backups first, into files that still say what the plan was
    decided on; a config changed since (by hand, by `pi install`) is reported and left alone,
    and the next plan decides again."""
    del ctx
    target, directory = configure.target, Path(configure.directory)
    files = pi_files.read_files(directory, target.provider)
    now = pi_facts_from_files(files, target.provider)
    if now.error is not None or now.digest() != configure.seen:
        raise FactsChangedError(
            f"Pi's config in {directory} changed since the plan was made: nothing was written",
            "the next plan decides what it needs now: `reconciler apply` (it plans again by itself)",
            node=action.node,
            files=sorted(files.texts),
        )
    changes = picfg.install_changes(files, target)
    pi_files.write_changes(directory, changes, target.provider)
    return "; ".join(changes.messages) or "unchanged"


EXECUTORS = (runs(ConfigurePi, _configure),)
