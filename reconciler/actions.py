"""The vocabulary of a plan: actions, blockers and in-sync notes.

Components produce these; `plan` orders and renders them; `apply` executes them. Kept apart
from plan.py so components can speak it without importing the planner that composes them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

Verb = Literal["create", "update", "replace", "remove", "stop", "run"]

SYMBOLS: dict[str, str] = {
    "create": "+",
    "update": "~",
    "replace": "-/+",
    "remove": "-",
    "stop": "-",
    "run": ">",
}


@dataclass(frozen=True)
class Action:
    """One step: what it does to which thing on which node, and why."""

    id: str
    component: str
    verb: Verb
    node: str
    summary: str
    cause: str
    depends_on: tuple[str, ...] = ()
    # The object acted on when a component manages several per node (a container name).
    target: str = ""

    @property
    def symbol(self) -> str:
        return SYMBOLS[self.verb]

    @property
    def step(self) -> str:
        """The component's step, e.g. 'download' or 'start' ('start-dsv41-r1' without its target)."""
        step = self.id.split("@", 1)[0].split(".", 1)[1]
        return step.removesuffix(f"-{self.target}") if self.target else step

    def to_dict(self) -> dict[str, object]:
        return {
            "id": self.id,
            "component": self.component,
            "verb": self.verb,
            "node": self.node,
            "summary": self.summary,
            "cause": self.cause,
            "depends_on": list(self.depends_on),
            "target": self.target,
        }


@dataclass(frozen=True)
class Blocker:
    """Something that keeps a part of the deployment from being planned at all."""

    node: str
    component: str
    message: str
    hint: str
    # False when the rest of the deployment may still be planned: a checkpoint that cannot be
    # checked against an unreachable Hub, but whose files on disk match the manifest, must not
    # keep a dead rank from being restarted.
    holds_ranks: bool = True

    def to_dict(self) -> dict[str, object]:
        return {
            "node": self.node,
            "component": self.component,
            "message": self.message,
            "hint": self.hint,
            "holds_ranks": self.holds_ranks,
        }


@dataclass(frozen=True)
class InSync:
    """Why a component needs nothing (printed by `plan --verbose`)."""

    node: str
    component: str
    reason: str

    def to_dict(self) -> dict[str, object]:
        return {"node": self.node, "component": self.component, "reason": self.reason}


@dataclass
class Outcome:
    """What one component concluded for the whole deployment."""

    actions: list[Action] = field(default_factory=list)
    blockers: list[Blocker] = field(default_factory=list)
    in_sync: list[InSync] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # Why the rank group is held down (a `reconciler stop`, a guard trip); also among the notes.
    held: list[str] = field(default_factory=list)

    def extend(self, other: Outcome) -> None:
        self.actions += other.actions
        self.blockers += other.blockers
        self.in_sync += other.in_sync
        self.notes += other.notes
        self.held += other.held


def action_id(component: str, step: str, node: str) -> str:
    return f"{component}.{step}@{node}"


def shorten(items: list[str], limit: int = 3) -> str:
    """'a, b, c (+4 more)' — causes stay one line even for hundreds of files."""
    shown = ", ".join(items[:limit])
    return f"{shown} (+{len(items) - limit} more)" if len(items) > limit else shown
