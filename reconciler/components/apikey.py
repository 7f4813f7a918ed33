"""The API key file on the head: created once, never rotated silently, never printed.

Reference: `secrets.token_urlsafe(32)` (43 characters) written with umask 077 when the file
is missing or empty.
"""

from __future__ import annotations

import secrets

from reconciler.actions import Action, InSync, Outcome, Verb, action_id
from reconciler.errors import ReconcilerError
from reconciler.execution import ApplyContext, Executor
from reconciler.facts.node import Facts
from reconciler.redact import checked_secret
from reconciler.spec import Deployment

COMPONENT = "apikey"
KEY_MODE = 0o600


def plan_apikey(deployment: Deployment, facts: Facts) -> Outcome:
    head = deployment.head
    observed = facts.nodes[head.name]
    if not observed.reachable:
        return Outcome()
    key = observed.api_key
    path = deployment.key_file()
    if key is None or not key.present or key.empty:
        cause = "key file missing" if key is None or not key.present else "key file is empty"
        return _one(
            head.name,
            "create",
            "create",
            f"create {path} (random 43-character key, mode 0600)",
            cause,
        )
    if key.mode != KEY_MODE:
        mode = "unknown" if key.mode is None else oct(key.mode)[2:].zfill(4)
        return _one(
            head.name,
            "chmod",
            "update",
            f"set mode 0600 on {path} (the key itself is kept)",
            f"mode {mode} lets other local users read the key",
        )
    return Outcome(in_sync=[InSync(head.name, COMPONENT, f"{path} present with mode 0600")])


def _one(node: str, step: str, verb: Verb, summary: str, cause: str) -> Outcome:
    action = Action(action_id(COMPONENT, step, node), COMPONENT, verb, node, summary, cause)
    return Outcome(actions=[action])


def _create(ctx: ApplyContext, action: Action) -> str:
    path = ctx.path(action.node, ctx.deployment.key_file())
    # keep_existing: a key that appeared since the facts were gathered is never replaced.
    key = secrets.token_urlsafe(32) + "\n"
    result = ctx.ops(action.node, "write_file", {"path": path, "content": key, "mode": KEY_MODE, "keep_existing": True})
    return "created" if result["written"] else "kept the key that exists now"


def _chmod(ctx: ApplyContext, action: Action) -> str:
    ctx.ops(action.node, "chmod", {"path": ctx.path(action.node, ctx.deployment.key_file()), "mode": KEY_MODE})
    return "mode 0600"


KEY_HINT = (
    "the key file must hold the key alone on one line; to replace it, delete the file and run "
    "`reconciler apply` (a new key is created; update every client)"
)


def read_key(ctx: ApplyContext) -> str:
    """The key, for readiness probes only: checked, and never printed, logged or put in an error."""
    head = ctx.deployment.head.name
    path = ctx.path(head, ctx.deployment.key_file())
    result = ctx.ops(head, "read_text", {"path": path, "errors": "surrogateescape", "limit": 4096})
    text = result.get("text")
    if not isinstance(text, str):
        reason = result.get("error") or "missing"
        raise ReconcilerError(
            f"cannot read the API key file {path} on {head}: {reason}", "run `reconciler apply` to create it"
        )
    return checked_secret(text, what="the API key", source=f"{path} on {head}", hint=KEY_HINT)


EXECUTORS: dict[str, Executor] = {"create": _create, "chmod": _chmod}
