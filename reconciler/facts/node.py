"""All facts of one node, and the snapshot of every node in one pass.

A node's facts are gathered in one round trip; this module holds the shape they take, and
loads and saves snapshots (JSON), which is how `plan --facts FILE` works offline.
"""

from __future__ import annotations

import json
import re
import sys
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, NoReturn

from pydantic import Field, ValidationError

from reconciler.errors import FactsError, RefusedJsonError, UntrustedTextError
from reconciler.facts.base import FactsModel
from reconciler.facts.containers import ContainerFacts
from reconciler.facts.fabric import FabricFacts
from reconciler.facts.files import CheckpointFacts, KeyFileFacts, TlsFacts
from reconciler.facts.host import HostFacts
from reconciler.facts.memory import GuardFacts, MemoryFacts
from reconciler.facts.pi import PiFacts
from reconciler.fsutil import read_untrusted_text

if TYPE_CHECKING:
    from reconciler.spec import Node


class Hold(FactsModel):
    """`reconciler stop` persisted on the head: ranks stay down until `start`."""

    since: str
    reason: str = "reconciler stop"


class RestartIntent(FactsModel):
    """A group restart recorded on the head before its first stop; resumed if we crashed mid-way."""

    since: str
    cause: str


class GroupRestart(FactsModel):
    """An unplanned group restart (a rank exited, liveness failed), recorded on the head as it began."""

    at: str
    cause: str


class BreakerTrip(FactsModel):
    """The crash-loop breaker's trip, recorded on the head: the ranks stay down until the spec
    changes or `start`."""

    since: str
    cause: str
    restarts: list[GroupRestart] = Field(default_factory=lambda: [])
    max_restarts: int = 0
    window_s: int = 0


class PulledImage(FactsModel):
    """An image the reconciler pulled on a node (its record), whether it is still there and the
    containers (anyone's) made from it; `role` front: the front's image, no serving image."""

    ref: str = Field(max_length=600)
    id: str = Field(max_length=100)
    at: str = Field(default="", max_length=40)
    # None: a record from before roles were written (the front's image or a serving one).
    role: Literal["serving", "front"] | None = None
    present: bool = False
    # Why Docker refused to remove it (a child image, a container made since): not asked again.
    refused: str = Field(default="", max_length=600)
    users: list[str] = Field(default_factory=lambda: [], max_length=1000)


class RegistryReach(FactsModel):
    """Whether a node missing the image could connect to its registry: `error` says why not."""

    address: str = Field(max_length=300)
    error: str | None = Field(default=None, max_length=300)


class NodeFacts(FactsModel):
    """What one node looks like right now."""

    reachable: bool = True
    error: str | None = None
    hostname: str | None = None
    home: str | None = None
    memory: MemoryFacts | None = None
    fabric: FabricFacts = FabricFacts()
    checkpoint: CheckpointFacts = CheckpointFacts()
    images: list[str] = Field(default_factory=lambda: [])
    # Pinned digest -> bytes of the images this node's store holds whole (to pass on to a peer).
    image_store: dict[str, int] = Field(default_factory=lambda: {})
    # Asked only while the node lacks the image and pulls it from the registry itself.
    registry: RegistryReach | None = None
    pulled: list[PulledImage] = Field(default_factory=lambda: [])
    containers: list[ContainerFacts] = Field(default_factory=lambda: [])
    guard: GuardFacts = GuardFacts()
    api_key: KeyFileFacts | None = None
    tls: TlsFacts | None = None
    hold: Hold | None = None
    restart_intent: RestartIntent | None = None
    # The head's record of unplanned group restarts (oldest first) and the breaker's trip.
    restarts: list[GroupRestart] = Field(default_factory=lambda: [])
    breaker: BreakerTrip | None = None
    # The front answers 503 to every request: a drain was begun and not ended.
    front_draining: bool = False
    host: HostFacts = HostFacts()


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

    def answering(self, ranked: Iterable[tuple[int, Node]]) -> list[tuple[int, Node, NodeFacts]]:
        """The nodes that answered, each with what it said, in the order given."""
        return [(rank, node, self.nodes[node.name]) for rank, node in ranked if self.nodes[node.name].reachable]


def hold_reasons(facts: Facts, head: str) -> list[str]:
    """Why the rank group is held, as codes: `stopped` (`reconciler stop`), `crash_loop` (the
    breaker), `guard_trip` (a memory guard tripped on any node)."""
    observed = facts.nodes.get(head)
    answering = observed is not None and observed.reachable
    reasons = []
    if answering and observed is not None and observed.hold is not None:
        reasons.append("stopped")
    if answering and observed is not None and observed.breaker is not None:
        reasons.append("crash_loop")
    if any(node.reachable and node.guard.trip is not None for node in facts.nodes.values()):
        reasons.append("guard_trip")
    return reasons


# A snapshot of two nodes is about 16 KB. The cap bounds what parsing builds: small JSON values
# grow some 25-fold into Python objects, so 8 MiB of `{},` peaks near 250 MB and 2 s.
MAX_FACTS_BYTES = 8 * 1024 * 1024

_REGENERATE = "facts files are written by the reconciler; regenerate it"
# A lone surrogate can only come from a \uD800-\uDFFF escape: the text itself is strict UTF-8.
_SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
_SURROGATE = re.compile(r"[\ud800-\udfff]")


def load_facts(path: str | Path) -> Facts:
    """Read a facts snapshot; errors name the file and the field, and are only ever FactsError."""
    raw = _parse_json(_read_facts_text(path), path)
    try:
        return Facts.model_validate(raw)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "the top level"
        raise FactsError(
            f"{path}: {where}: {first['msg']} ({exc.error_count()} problem(s))",
            "compare it with tests/fixtures/facts/*.json",
        ) from None


def _read_facts_text(path: str | Path) -> str:
    try:
        return read_untrusted_text(path, what="facts file", limit=MAX_FACTS_BYTES)
    except UntrustedTextError as exc:
        hint = exc.hint or "check the path given to --facts"
        raise FactsError(f"{path}:{exc.line}:{exc.column}: {exc.message}", hint) from None


def _parse_json(text: str, path: str | Path) -> Any:
    try:
        raw = json.loads(text, object_pairs_hook=_unique_keys, parse_constant=_no_constant)
    except json.JSONDecodeError as exc:
        raise FactsError(f"{path}:{exc.lineno}:{exc.colno}: malformed JSON: {exc.msg}", _REGENERATE) from None
    except RefusedJsonError as exc:
        raise FactsError(f"{path}: {exc}", _REGENERATE) from None
    except ValueError:
        # int() refuses to convert more digits than this; the json module gives no position.
        limit = sys.get_int_max_str_digits()
        raise FactsError(f"{path}: a number has more than {limit} digits", _REGENERATE) from None
    except RecursionError:
        raise FactsError(f"{path}: JSON nested too deeply to read", _REGENERATE) from None
    if _SURROGATE_ESCAPE.search(text):
        _refuse_surrogates(raw, path)
    return raw


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result = dict(pairs)
    if len(result) < len(pairs):
        counts = Counter(key for key, _ in pairs)
        duplicate = next(key for key, count in counts.items() if count > 1)
        raise RefusedJsonError(f"duplicate key {duplicate!r:.60} in a JSON object")
    return result


def _no_constant(name: str) -> NoReturn:
    raise RefusedJsonError(f"{name} is not a number JSON allows")


def _refuse_surrogates(raw: Any, path: str | Path) -> None:
    """Refuse strings a UTF-8 terminal or log cannot show (walked without recursion: depth is untrusted)."""
    pending = [raw]
    while pending:
        item = pending.pop()
        if isinstance(item, dict):
            pending += [*item, *item.values()]
        elif isinstance(item, list):
            pending += item
        elif isinstance(item, str) and _SURROGATE.search(item):
            raise FactsError(
                f"{path}: the string {item!r:.60} holds a lone surrogate (\\uD800-\\uDFFF), which is not a character",
                _REGENERATE,
            )
