"""The API key file on the head: created once, never rotated silently, never printed.

The key is `secrets.token_urlsafe(32)` (43 characters, 256 random bits), mode 0600, written
only when the file is missing or empty, so clients holding the key keep working.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from reconciler.actions import Action, ChmodKey, Component, CreateKey, InSync, Outcome, action, runs
from reconciler.facts.node import Facts
from reconciler.spec import Deployment, expand_home

if TYPE_CHECKING:
    from reconciler.execution import ApplyContext

COMPONENT = Component.APIKEY
KEY_MODE = 0o600


def plan_apikey(deployment: Deployment, facts: Facts) -> Outcome:
    head = deployment.head
    observed = facts.nodes[head.name]
    if not observed.reachable or observed.home is None:
        return Outcome()
    key = observed.api_key
    path = deployment.key_file()
    on_head = expand_home(path, observed.home)
    if key is None or not key.present or key.empty:
        cause = "key file missing" if key is None or not key.present else "key file is empty"
        summary = f"create {path} (random 43-character key, mode 0600)"
        return Outcome(actions=[action(CreateKey(path=on_head, mode=KEY_MODE), head.name, "create", summary, cause)])
    if key.mode != KEY_MODE:
        mode = "unknown" if key.mode is None else oct(key.mode)[2:].zfill(4)
        summary = f"set mode 0600 on {path} (the key itself is kept)"
        cause = f"mode {mode} lets other local users read the key"
        return Outcome(actions=[action(ChmodKey(path=on_head, mode=KEY_MODE), head.name, "update", summary, cause)])
    return Outcome(in_sync=[InSync(head.name, COMPONENT, f"{path} present with mode 0600")])


def _create(ctx: ApplyContext, action: Action, target: CreateKey) -> str:
    import secrets  # only to make a key: planning never needs it

    # keep_existing: a key that appeared since the facts were gathered is never replaced.
    key = secrets.token_urlsafe(32) + "\n"
    written = ctx.ops(action.node).write_file(target.path, key, mode=target.mode, keep_existing=True)
    return "created" if written else "kept the key that exists now"


def _chmod(ctx: ApplyContext, action: Action, target: ChmodKey) -> str:
    ctx.ops(action.node).chmod(target.path, target.mode)
    return f"mode {target.mode:04o}"


EXECUTORS = (runs(CreateKey, _create), runs(ChmodKey, _chmod))
