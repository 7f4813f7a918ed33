"""The API key file on the head: created once, never rotated silently, never printed.

Reference: `secrets.token_urlsafe(32)` (43 characters) written with umask 077 when the file
is missing or empty.
"""

from __future__ import annotations

from reconciler.actions import Action, InSync, Outcome, Verb, action_id
from reconciler.facts.node import Facts
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
