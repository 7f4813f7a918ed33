"""The vocabulary of a plan: actions that carry what they will do, blockers and in-sync notes.

An action is a typed step (exactly one executor runs it) plus its payload: everything the
executor needs, decided when the plan was made — the rendered rank container, the exact files
with their sizes and hashes, the commit, the image digest, the guard's settings. The executor
runs that payload; it re-checks that acting still makes sense (facts go stale between plan and
apply), but it never works out again what to do. Payloads are records (reconciler/record.py),
so a plan can be saved to a file and applied later exactly as it was shown; none of them holds a
secret.

Kept apart from plan.py so components can speak it without importing the planner that composes them.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Callable, Mapping
from functools import cache
from typing import TYPE_CHECKING, Annotated, Any, ClassVar, Literal, TypeVar, get_args

from pydantic import Field

from reconciler.front import FrontContainer
from reconciler.record import KeywordRecord, MutableRecord, Record, field, record_fields
from reconciler.repofiles import HubFile
from reconciler.serving import RankContainer

if TYPE_CHECKING:
    from pydantic import TypeAdapter

Verb = Literal["create", "update", "replace", "remove", "stop", "run"]

# Each verb's symbol in a rendered plan and the count it adds to on the plan's summary line,
# in the order the summary shows them.
VERBS: dict[str, tuple[str, str]] = {
    "create": ("+", "add"),
    "update": ("~", "change"),
    "replace": ("-/+", "replace"),
    "remove": ("-", "destroy"),
    "run": (">", "run"),
    "stop": ("-", "stop"),
}


class Component(enum.StrEnum):
    """A part of the deployment that concludes on its own: what a step acts on, what a blocker holds."""

    CHECKPOINT = "checkpoint"
    IMAGE = "image"
    APIKEY = "apikey"
    MEMGUARD = "memguard"
    RANKS = "ranks"
    FRONT = "front"
    PI = "pi"


class Step(enum.StrEnum):
    """One kind of operation, one payload type, one executor; the part before the dot is the component."""

    PIN = "checkpoint.pin"
    LINK = "checkpoint.link"
    DOWNLOAD = "checkpoint.download"
    REASSEMBLE = "checkpoint.reassemble"
    VERIFY = "checkpoint.verify"
    COPY = "checkpoint.copy"
    STAGE_PLAN = "checkpoint.stage-plan"
    PRUNE = "checkpoint.prune"
    SWITCH = "checkpoint.switch"
    PRUNE_REVISIONS = "checkpoint.prune-revisions"
    PULL = "image.pull"
    FETCH_IMAGE = "image.fetch"
    COPY_IMAGE = "image.copy"
    PRUNE_IMAGES = "image.prune"
    CREATE_KEY = "apikey.create"
    CHMOD_KEY = "apikey.chmod"
    START_GUARD = "memguard.start"
    RESTART_GUARD = "memguard.restart"
    STOP_GUARD = "memguard.stop"
    STOP_RANK = "ranks.stop"
    HALT_RANK = "ranks.halt"
    REMOVE_CONTAINER = "ranks.remove"
    START_RANK = "ranks.start"
    WAIT_READY = "ranks.wait-ready"
    SMOKE = "ranks.smoke"
    TRIP_BREAKER = "ranks.hold-crash-loop"
    CREATE_CERT = "front.create-cert"
    START_FRONT = "front.start"
    REMOVE_FRONT = "front.remove"
    DRAIN = "front.drain"
    UNDRAIN = "front.undrain"
    CONFIGURE_PI = "pi.configure"

    @property
    def component(self) -> Component:
        return Component(self.value.split(".", 1)[0])

    @property
    def name_in_id(self) -> str:
        return self.value.split(".", 1)[1]


class Payload(KeywordRecord):
    """What an executor runs. Records, not pydantic models: a plan defines every payload class,
    and pydantic's (or dataclasses') class construction cost `plan` a tenth of its start-up. A
    saved plan's payloads are validated by pydantic all the same (`_payload_adapter`).

    Each concrete payload class is the payload of exactly one step (`STEP`), so an action's step
    follows from its payload and an executor is found by the payload's type."""

    STEP: ClassVar[Step]


class Download(Payload):
    """Fetch exactly these repo files at `commit` into the node's model dir."""

    STEP = Step.DOWNLOAD
    kind: Literal["download"] = "download"
    repo: str
    commit: str
    model_dir: str
    # Every file the plan's listing names that the node lacks (when it had nothing: every file).
    files: list[HubFile]
    # Files whose bytes were found wrong: the client's metadata would call them complete.
    refetch: list[str] = field(default_factory=list)
    # A hub-sourced worker fetches with the node-side fetcher; the head with the Hub client.
    on_node: bool = False
    # The node's hash cache: each file is hashed into it as soon as it lands, so a copy behind
    # this download can send it at once and the verify after it does not hash it again.
    cache: str | None = None


class Pin(Payload):
    """Record on the head what the spec's branch or tag resolved to, so it does not move by itself."""

    STEP = Step.PIN
    kind: Literal["pin"] = "pin"
    record: str
    repo: str
    revision: str
    commit: str


class Link(Payload):
    """Hardlink these files of another revision on the node into the new one: relative name ->
    existing path. The existing files are not changed (a link adds a name, not bytes)."""

    STEP = Step.LINK
    kind: Literal["link"] = "link"
    target_dir: str
    files: dict[str, str]


class Switch(Payload):
    """Point model_dir at the revision the group now serves; record the history of revisions."""

    STEP = Step.SWITCH
    kind: Literal["switch"] = "switch"
    model_dir: str
    target: str
    # Where a model_dir that is a real directory (from before revisions) goes first.
    legacy_to: str | None
    record: str
    repo: str
    history: list[str]


class PruneRevisions(Payload):
    """Remove revision directories no longer kept; `shared_only` trees lose only the files that
    live on in another revision (a pre-revisions model_dir may hold files of its own)."""

    STEP = Step.PRUNE_REVISIONS
    kind: Literal["prune-revisions"] = "prune-revisions"
    model_dir: str
    remove: list[str]
    shared_only: list[str] = field(default_factory=list)


class Shard(KeywordRecord):
    name: str
    # None when only the manifest knows it (the Hub lists the shard's parts, not the shard).
    sha256: str | None = None
    # The parts the download before brings, which a pipelined reassembly waits for.
    parts: list[str] = field(default_factory=list)


class Reassemble(Payload):
    STEP = Step.REASSEMBLE
    kind: Literal["reassemble"] = "reassemble"
    model_dir: str
    shards: list[Shard]
    keep_parts: bool
    # Where a shard's hash comes from when the plan could not know it: the manifest as the
    # download brought it, relative to the model dir.
    manifest: str
    cache: str
    # Runs while the download of the parts does: each shard once its parts have landed.
    pipelined: bool = False


class Verify(Payload):
    """Hash the files (from the cache unless deep) and report those that differ: the next plan
    fetches them again."""

    STEP = Step.VERIFY
    kind: Literal["verify"] = "verify"
    model_dir: str
    # name -> sha256 the plan knew (the Hub's and the manifest's); the manifest's entries as the
    # file is on the node when verifying are added (a fresh node gets it with the download).
    files: dict[str, str | None]
    manifest: str
    cache: str
    deep: bool


class Copy(Payload):
    """rsync from the head to the worker in parallel streams: every file of `sizes`, skipping
    those already complete (None), or exactly `files`, copied again."""

    STEP = Step.COPY
    kind: Literal["copy"] = "copy"
    source_node: str
    source_dir: str
    destination_dir: str
    files: list[str] | None
    bytes: int
    # Every file to copy and its size (0 when the Hub does not say): what the streams split.
    sizes: dict[str, int]
    # The fabric addresses of source and destination: the streams go to an rsync daemon on the
    # destination's; None (a fabric address unknown) sends them over SSH.
    fabric: tuple[str, str] | None
    # Runs while the source still gets the files (its download, or its own copy): each file
    # goes once it is complete and verified there (see reconciler/pipeline.py).
    pipelined: bool = False
    # name -> sha256 and the destination's hash cache: each file is hashed as it lands, so the
    # verify after the copy does not hash it again and a copy behind this one may send it on.
    hashes: dict[str, str] = field(default_factory=dict)
    cache: str | None = None


class StagePlan(Payload):
    STEP = Step.STAGE_PLAN
    kind: Literal["stage-plan"] = "stage-plan"
    source: str
    target: str
    # The rewritten plan when the model's plan was there at plan time; else it is rewritten from
    # the file the download brings.
    content: str | None


class Prune(Payload):
    STEP = Step.PRUNE
    kind: Literal["prune"] = "prune"
    model_dir: str


class Pull(Payload):
    """Docker on the node pulls `ref`: from its registry, or (`from_store`) from the node's own
    image store through a registry relay on the node's loopback."""

    STEP = Step.PULL
    kind: Literal["pull"] = "pull"
    ref: str
    from_store: bool = False


class FetchImage(Payload):
    """Fill the node's image store with `ref` as its registry sends it, for the peers."""

    STEP = Step.FETCH_IMAGE
    kind: Literal["fetch-image"] = "fetch-image"
    ref: str


class CopyImage(Payload):
    """Copy the blobs of `ref` the node's store lacks from `source_node`'s store: over the
    fabric to a one-time rsync daemon (`fabric`: source and destination addresses), else SSH."""

    STEP = Step.COPY_IMAGE
    kind: Literal["copy-image"] = "copy-image"
    ref: str
    source_node: str
    fabric: tuple[str, str] | None


class PruneImages(Payload):
    """Remove the images we pulled that are no longer kept (`remove`: their refs), and the store
    entries of every digest but `keep`."""

    STEP = Step.PRUNE_IMAGES
    kind: Literal["prune-images"] = "prune-images"
    remove: list[str]
    keep: list[str]


class KeyFile(Payload):
    """The head's API key file and the mode it must have."""

    kind: str
    path: str
    mode: int


class CreateKey(KeyFile):
    """Write a new random key at `path` with `mode`, unless a key has appeared there since."""

    STEP = Step.CREATE_KEY
    kind: Literal["create-key"] = "create-key"


class ChmodKey(KeyFile):
    """Set `mode` on the key file; the key itself is kept."""

    STEP = Step.CHMOD_KEY
    kind: Literal["chmod-key"] = "chmod-key"


class GuardConfig(KeywordRecord):
    floor_gib: float
    interval_s: float
    labels: list[str]
    config_hash: str


class GuardStart(Payload):
    """The memory guard with these settings, in the node's state dir."""

    kind: str
    state_dir: str
    config: GuardConfig


class StartGuard(GuardStart):
    STEP = Step.START_GUARD
    kind: Literal["start-guard"] = "start-guard"


class RestartGuard(GuardStart):
    """Stop the running guard and start it with these settings (or this program)."""

    STEP = Step.RESTART_GUARD
    kind: Literal["restart-guard"] = "restart-guard"


class StopGuard(Payload):
    STEP = Step.STOP_GUARD
    kind: Literal["stop-guard"] = "stop-guard"
    state_dir: str


class StopContainer(Payload):
    """Stop a container we own (the one seen when planning), and remove it unless `KEEPS` it."""

    KEEPS: ClassVar[bool] = False
    kind: str
    name: str
    container_id: str | None
    grace_s: int


class StopRank(StopContainer):
    """A rank's container, stopped and removed for a group restart."""

    STEP = Step.STOP_RANK
    kind: Literal["stop-rank"] = "stop-rank"
    # The group restart this stop begins, recorded first so a crash mid-restart resumes it.
    intent: str | None
    # The failure this restart answers, when it is unplanned: counted by the crash-loop breaker.
    unplanned: str | None = None


class HaltRank(StopContainer):
    """A rank's container, stopped and kept for `reconciler logs`: the group is held down."""

    STEP = Step.HALT_RANK
    KEEPS = True
    kind: Literal["halt-rank"] = "halt-rank"


class RemoveContainer(StopContainer):
    """A container we own that is not a rank of the spec."""

    STEP = Step.REMOVE_CONTAINER
    kind: Literal["remove-container"] = "remove-container"


class StartRank(Payload):
    STEP = Step.START_RANK
    kind: Literal["start-rank"] = "start-rank"
    container: RankContainer
    intent: str
    # The failure this restart answers, when it is unplanned: counted by the crash-loop breaker.
    unplanned: str | None = None


class TripBreaker(Payload):
    """Record the crash-loop breaker's trip on the head: the group stays held until the spec
    changes or `reconciler start`. `restarts`: (when, why) of the restarts counted."""

    STEP = Step.TRIP_BREAKER
    kind: Literal["trip-breaker"] = "trip-breaker"
    cause: str
    restarts: list[tuple[str, str]]
    max_restarts: int
    window_s: int


class CreateCert(Payload):
    """A self-signed certificate and its key for the front, made once (like the API key): the key
    0600, the certificate naming `names` (IP addresses and host names the API is reached by)."""

    STEP = Step.CREATE_CERT
    kind: Literal["create-cert"] = "create-cert"
    cert_path: str
    key_path: str
    names: list[str]
    days: int
    # Half a pair of ours was there: both files are written anew.
    remake: bool = False


class StartFront(Payload):
    """Write the front's config on the head, then create and start exactly this container
    (replacing our old one), and wait until it accepts connections on `address`."""

    STEP = Step.START_FRONT
    kind: Literal["start-front"] = "start-front"
    container: FrontContainer
    address: tuple[str, int]


class RemoveFront(StopContainer):
    """A front of ours that is not this spec's (another name)."""

    STEP = Step.REMOVE_FRONT
    kind: Literal["remove-front"] = "remove-front"


class Drain(Payload):
    """Turn the front's drain switch on (new requests: 503 with Retry-After), then wait until
    rank 0 holds no request (its metrics at `metrics_url`, on the head's loopback) or `drain_s`
    passes. `socket`: the front's admin socket on the head; `switch`: the ACL it turns on."""

    STEP = Step.DRAIN
    kind: Literal["drain"] = "drain"
    socket: str
    switch: str
    metrics_url: str
    drain_s: int


class Undrain(Payload):
    """Turn the front's drain switch off: requests pass to rank 0 again."""

    STEP = Step.UNDRAIN
    kind: Literal["undrain"] = "undrain"
    socket: str
    switch: str


class WaitReady(Payload):
    """Poll the keyed `{url}/v1/models` until it answers 200 while watching every rank's container
    (node, name; rank 0 first): any exit fails the group at once."""

    STEP = Step.WAIT_READY
    kind: Literal["wait-ready"] = "wait-ready"
    timeout_s: int
    poll_s: int
    url: str
    ranks: list[tuple[str, str]]


class Smoke(Payload):
    STEP = Step.SMOKE
    kind: Literal["smoke"] = "smoke"
    checks: Literal["all", "protocol"]
    timeout_s: int


class PiTarget(Record):
    """Everything install writes, decided up front from the spec and the command line."""

    provider: str
    base_url: str
    key_env: str
    model_id: str
    context_window: int
    images: bool
    provider_name: str
    model_name: str
    set_default: bool

    @property
    def model_ref(self) -> str:
        """How Pi names the model: `--model dsv41-sparks/deepseek-v4.1-flash`, enabledModels entries."""
        return f"{self.provider}/{self.model_id}"


class ConfigurePi(Payload):
    """Write `target` into the Pi config in `directory`, if what the plan was decided on is still
    there (`seen`: the digest of the Pi facts, which hold no secret); else nothing is written."""

    STEP = Step.CONFIGURE_PI
    kind: Literal["configure-pi"] = "configure-pi"
    target: PiTarget
    directory: str
    seen: str


StepPayload = (
    Pin
    | Link
    | Switch
    | PruneRevisions
    | Download
    | Reassemble
    | Verify
    | Copy
    | StagePlan
    | Prune
    | Pull
    | FetchImage
    | CopyImage
    | PruneImages
    | CreateKey
    | ChmodKey
    | StartGuard
    | RestartGuard
    | StopGuard
    | StopRank
    | HaltRank
    | RemoveContainer
    | StartRank
    | TripBreaker
    | CreateCert
    | StartFront
    | RemoveFront
    | Drain
    | Undrain
    | WaitReady
    | Smoke
    | ConfigurePi
)
AnyPayload = Annotated[StepPayload, Field(discriminator="kind")]


@cache
def _payload_adapter() -> TypeAdapter[AnyPayload]:
    """The validator of any payload by its kind, built when a saved plan is read: making and
    showing a plan never needs it, and it costs start-up (a union of every payload class).
    Every part of a payload is a record, which refuses a key it does not declare."""
    from pydantic import TypeAdapter

    return TypeAdapter[AnyPayload](AnyPayload)


def payload_data(value: object) -> Any:
    """A payload (or a part of one) as JSON data: fields in their declared order, tuples as
    lists, a float that is not finite as null — the form a saved plan has always had."""
    names = record_fields(value)
    if names is not None:
        return {name: payload_data(getattr(value, name)) for name in names}
    if isinstance(value, list | tuple):
        return [payload_data(item) for item in value]
    if isinstance(value, dict):
        return {key: payload_data(item) for key, item in value.items()}
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


class Action(Record):
    """One step: what it does to which thing on which node, why, and the payload it runs."""

    id: str
    verb: Verb
    node: str
    summary: str
    cause: str
    payload: StepPayload
    depends_on: tuple[str, ...] = ()
    # The object acted on when a component manages several per node (a container name).
    target: str = ""

    @property
    def step(self) -> Step:
        return self.payload.STEP

    @property
    def component(self) -> Component:
        return self.step.component

    @property
    def symbol(self) -> str:
        return VERBS[self.verb][0]

    def to_dict(self) -> dict[str, object]:
        return {
            "id": self.id,
            "step": self.step.value,
            "component": self.component,
            "verb": self.verb,
            "node": self.node,
            "summary": self.summary,
            "cause": self.cause,
            "depends_on": list(self.depends_on),
            "target": self.target,
            "payload": payload_data(self.payload),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Action:
        """An action as `to_dict` wrote it (a saved plan); raises ValueError or ValidationError."""
        verb = data["verb"]
        if verb not in get_args(Verb):
            raise ValueError(f"unknown verb {verb!r:.20}")
        payload = _payload_adapter().validate_python(data["payload"])
        if Step(data["step"]) is not payload.STEP:
            raise ValueError(f"step {data['step']!r:.40} does not run a {payload.kind!r} payload")
        return cls(
            id=str(data["id"]),
            verb=verb,
            node=str(data["node"]),
            summary=str(data["summary"]),
            cause=str(data["cause"]),
            payload=payload,
            depends_on=tuple(str(item) for item in data["depends_on"]),
            target=str(data.get("target", "")),
        )


def action(
    payload: StepPayload,
    node: str,
    verb: Verb,
    summary: str,
    cause: str,
    depends_on: tuple[str, ...] = (),
    target: str = "",
) -> Action:
    """An action with its conventional id: `<component>.<step>[-<target>]@<node>`; the step is
    the payload's."""
    step = payload.STEP
    name = f"{step.name_in_id}-{target}" if target else step.name_in_id
    return Action(f"{step.component}.{name}@{node}", verb, node, summary, cause, payload, depends_on, target)


class Blocker(Record):
    """Something that keeps a part of the deployment from being planned at all."""

    node: str
    component: Component
    message: str
    hint: str
    # False when the rest of the deployment may still be planned: a checkpoint that cannot be
    # checked against an unreachable Hub, but whose files on disk match the manifest, must not
    # keep a dead rank from being restarted.
    holds_ranks: bool = True

    def to_dict(self) -> dict[str, object]:
        return dict(payload_data(self))


class InSync(Record):
    """Why a component needs nothing (printed by `plan --verbose`)."""

    node: str
    component: Component
    reason: str

    def to_dict(self) -> dict[str, object]:
        return dict(payload_data(self))


class Outcome(MutableRecord):
    """What one component concluded for the whole deployment."""

    actions: list[Action] = field(default_factory=list)
    blockers: list[Blocker] = field(default_factory=list)
    in_sync: list[InSync] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    # Why the rank group is held down (a `reconciler stop`, a guard trip); also among the notes.
    held: list[str] = field(default_factory=list)

    def extend(self, other: Outcome) -> None:
        """Add the other's items to each list field the two have in common."""
        for name in self._fields:
            mine = getattr(self, name)
            if name in other._fields and isinstance(mine, list):
                mine.extend(getattr(other, name))


def shorten(items: list[str], limit: int = 3) -> str:
    """'a, b, c (+4 more)' — causes stay one line even for hundreds of files."""
    shown = ", ".join(items[:limit])
    return f"{shown} (+{len(items) - limit} more)" if len(items) > limit else shown


def is_pipelined(action: Action) -> bool:
    """Whether the action runs alongside the producers of its files (see reconciler/pipeline.py)."""
    payload = action.payload
    return isinstance(payload, Copy | Reassemble) and payload.pipelined


def source_of(action: Action) -> str:
    """The node whose board a pipelined action takes files from."""
    payload = action.payload
    return payload.source_node if isinstance(payload, Copy) else action.node


def behind(action: Action, nodes: Mapping[str, str]) -> set[str]:
    """The actions a pipelined action runs alongside instead of after: those it depends on
    that run on its source node (`nodes`: action id -> node). Empty for any other action."""
    if not is_pipelined(action):
        return set()
    source = source_of(action)
    return {dep for dep in action.depends_on if nodes.get(dep) == source}


P = TypeVar("P", bound=Payload)
C = TypeVar("C")


def runs(kind: type[P], run: Callable[[C, Action, P], str]) -> tuple[type[Payload], Callable[[C, Action], str]]:
    """Bind an executor to the one payload type it runs: mypy checks that `run` takes a `kind`,
    and `apply` finds the executor by the type of the action's payload. (`C` is the apply
    context, which this module does not know.)"""

    def execute(ctx: C, action: Action) -> str:
        payload = action.payload
        if not isinstance(payload, kind):
            raise TypeError(f"{action.id}: a {type(payload).__name__} sent to the executor of {kind.__name__}")
        return run(ctx, action, payload)

    return kind, execute
