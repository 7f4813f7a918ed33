"""All facts of one node, and the snapshot of every node in one pass.

A node's facts are gathered in one round trip; this module holds the shape they take, and
loads and saves snapshots (JSON), which is how `plan --facts FILE` works offline.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Literal

from pydantic import Field, ValidationError

from reconciler.errors import FactsError
from reconciler.facts.base import FactsModel
from reconciler.facts.containers import ContainerFacts
from reconciler.facts.fabric import FabricFacts
from reconciler.facts.files import CheckpointFacts, KeyFileFacts
from reconciler.facts.memory import GuardFacts, MemoryFacts
from reconciler.facts.pi import PiFacts


class Hold(FactsModel):
    """`reconciler stop` persisted on the head: ranks stay down until `start`."""

    since: str
    reason: str = "reconciler stop"


class RestartIntent(FactsModel):
    """A group restart recorded on the head before its first stop; resumed if we crashed mid-way."""

    since: str
    cause: str


class NodeFacts(FactsModel):
    """What one node looks like right now."""

    reachable: bool = True
    error: str | None = None
    hostname: str | None = None
    home: str | None = None
    memory: MemoryFacts | None = None
    fabric: FabricFacts = FabricFacts()
    checkpoint: CheckpointFacts = CheckpointFacts()
    images: list[str] = Field(default_factory=list)
    containers: list[ContainerFacts] = Field(default_factory=list)
    guard: GuardFacts = GuardFacts()
    api_key: KeyFileFacts | None = None
    hold: Hold | None = None
    restart_intent: RestartIntent | None = None


class Liveness(FactsModel):
    """What `reconciler run` saw of the API: consecutive failed one-token completions."""

    failures: int = 0
    detail: str = ""


class Facts(FactsModel):
    """One observed snapshot of every node, keyed by the spec's node names."""

    version: Literal[1] = 1
    taken_at: str | None = None
    nodes: dict[str, NodeFacts]
    liveness: Liveness | None = None
    # The Pi coding agent on the machine running the reconciler (None: not gathered, or pi disabled).
    pi: PiFacts | None = None

    def to_json(self) -> str:
        return self.model_dump_json(indent=2, exclude_defaults=True) + "\n"


def load_facts(path: str | Path) -> Facts:
    """Read a facts snapshot; errors name the file and the field."""
    try:
        raw = json.loads(Path(path).read_text(encoding="utf-8"))
    except OSError as exc:
        raise FactsError(f"cannot read facts {path}: {exc.strerror}", "check the path given to --facts") from None
    except json.JSONDecodeError as exc:
        raise FactsError(
            f"{path}:{exc.lineno}:{exc.colno}: malformed JSON: {exc.msg}",
            "facts files are written by the reconciler; regenerate it",
        ) from None
    try:
        return Facts.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"])
        raise FactsError(
            f"{path}: {where}: {first['msg']} ({exc.error_count()} problem(s))",
            "compare it with tests/fixtures/facts/*.json",
        ) from None
