"""What executors share while `apply` runs: the spec, the facts, the transports, progress, hooks.

Executors live beside the planning code of their component (as pyinfra pairs facts and
operations); this module is the seam between them and `apply`, which only dispatches. An
executor gets the action with its payload and runs that; the facts are here only for what a
node is (its home, its transport), never to decide again what to do.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TextIO, TypeVar

from reconciler.actions import Action, Payload, Smoke
from reconciler.errors import FactsError, ReconcilerError
from reconciler.facts.node import Facts
from reconciler.spec import Deployment, Node, expand_home
from reconciler.transport.base import Transport, run_program


class Progress:
    """Plain progress lines on stderr (a terminal or the journal alike), rate-limited."""

    def __init__(self, stream: TextIO | None = None, min_interval_s: float = 2.0) -> None:
        self.stream = stream or sys.stderr
        self.min_interval_s = min_interval_s
        self._last: dict[str, float] = {}

    def line(self, message: str) -> None:
        self.stream.write(message + "\n")
        self.stream.flush()

    def throttled(self, key: str, message: str) -> None:
        now = time.monotonic()
        if now - self._last.get(key, 0.0) >= self.min_interval_s:
            self._last[key] = now
            self.line(message)


# The post-start smoke: a tool beside the chain (reconciler.verify), handed in by whoever
# converges, so the rank component runs it as a step without importing it.
SmokeRunner = Callable[["ApplyContext", Smoke], str]


@dataclass
class ApplyContext:
    deployment: Deployment
    facts: Facts
    transports: dict[str, Transport]
    progress: Progress = field(default_factory=Progress)
    smoke: SmokeRunner | None = None

    def node(self, name: str) -> Node:
        return self.deployment.node(name)

    def transport(self, name: str) -> Transport:
        return self.transports[name]

    def home(self, name: str) -> str:
        home = self.facts.nodes[name].home if name in self.facts.nodes else None
        if home is None:
            raise FactsError(f"{name}: home directory unknown", "gather facts again; the node may be unreachable")
        return home

    def path(self, name: str, path: str) -> str:
        """A spec path as it is on that node."""
        return expand_home(path, self.home(name))

    def state_path(self, name: str, *parts: str) -> str:
        return "/".join([self.path(name, self.deployment.state_dir).rstrip("/"), *parts])

    def ops(self, name: str, call: str, args: dict[str, Any], timeout: float = 3600.0) -> Any:
        """Run a node-side file operation; its progress lines appear as they are written.

        Every call names the state dir (as the spec writes it; the node expands `~` itself), so
        the node makes it private before anything is written there.
        """
        request = {"call": call, "args": args, "private_dir": self.deployment.state_dir}
        return run_program(self.transport(name), "ops", "run", request, timeout=timeout, on_line=self.node_lines(name))

    def node_lines(self, name: str) -> Callable[[str], None]:
        return lambda line: self.progress.throttled(f"{name}:{line.split(':')[0]}", f"    {name}: {line}")


Executor = Callable[[ApplyContext, Action], str]
P = TypeVar("P", bound=Payload)


def payload_of(action: Action, kind: type[P]) -> P:
    """The action's payload as the type its executor runs (a saved plan may have been edited)."""
    if not isinstance(action.payload, kind):
        raise ReconcilerError(
            f"{action.id}: the payload is a {type(action.payload).__name__}, not a {kind.__name__}",
            "the plan file was edited or written by another version: run `reconciler plan --out FILE` again",
        )
    return action.payload
