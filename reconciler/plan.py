"""`plan(spec, facts) -> Plan`: the pure diff between desired and observed state.

Components each conclude on their own; this module composes them in the order a start needs
them (checkpoint, image, key, memory guard, then the rank group), wires the rank group's
prerequisites, and renders the result Terraform-style or as JSON.
"""

from __future__ import annotations

from typing import Any

from reconciler.actions import (
    VERBS,
    Action,
    Blocker,
    Component,
    Copy,
    Download,
    InSync,
    Outcome,
    Reassemble,
    Step,
    behind,
)
from reconciler.components.apikey import plan_apikey
from reconciler.components.checkpoint import DeepVerify, placements, plan_checkpoint
from reconciler.components.front import plan_front
from reconciler.components.image import FRONT_PULL, plan_image, plan_image_prune
from reconciler.components.memguard import plan_memguard
from reconciler.components.pi import plan_pi
from reconciler.components.ranks import hold_reasons, plan_ranks
from reconciler.errors import FactsError
from reconciler.facts.node import Facts
from reconciler.facts.revisions import desired_commit
from reconciler.fsutil import human_bytes
from reconciler.record import MutableRecord, field, replace
from reconciler.spec import Deployment


class Plan(MutableRecord):
    """Ordered actions (each after its dependencies), plus what blocks and what is in sync."""

    deployment: str
    nodes: list[tuple[int, str, str]]
    actions: list[Action] = field(default_factory=list)
    blockers: list[Blocker] = field(default_factory=list)
    in_sync: list[InSync] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    held: list[str] = field(default_factory=list)

    @property
    def has_changes(self) -> bool:
        return bool(self.actions)

    @property
    def ranks_blocked(self) -> bool:
        """Whether a blocker keeps the rank group from being planned."""
        return any(blocker.holds_ranks for blocker in self.blockers)

    def summary(self) -> dict[str, int]:
        """Terraform-style counts; a stop that precedes a replacement is part of that replace, and
        deleting a shard's parts once it is reassembled and verified is housekeeping, run, not
        destruction (nothing is lost)."""
        counts = dict.fromkeys((kind for _, kind in VERBS.values()), 0)
        replaced = {(a.node, a.target) for a in self.actions if a.verb in {"replace", "create"}}
        for action in self.actions:
            if action.step is Step.PRUNE:
                counts["run"] += 1
            elif action.verb != "stop" or (action.node, action.target) not in replaced:
                counts[VERBS[action.verb][1]] += 1
        return counts

    def totals(self) -> dict[str, Any]:
        """What the plan moves, in bytes: fetched from the Hub, copied over the fabric, and the
        disk each node needs for it at most (split shards are whole beside their parts until
        the parts are deleted)."""
        disk: dict[str, int] = {}
        download = copy = 0
        sizes = {
            (action.node, item.path): item.size
            for action in self.actions
            if isinstance(action.payload, Download)
            for item in action.payload.files
        }
        for action in self.actions:
            size = _bytes_of(action)
            download += size if isinstance(action.payload, Download) else 0
            copy += size if isinstance(action.payload, Copy) else 0
            if isinstance(action.payload, Reassemble):
                parts = [part for shard in action.payload.shards for part in shard.parts]
                size = sum(sizes.get((action.node, part), 0) for part in parts)
            if size:
                disk[action.node] = disk.get(action.node, 0) + size
        return {"download_bytes": download, "copy_bytes": copy, "disk_bytes": disk}

    def to_dict(self) -> dict[str, object]:
        return {
            "deployment": self.deployment,
            "nodes": [{"rank": rank, "name": name, "role": role} for rank, name, role in self.nodes],
            "changes": self.has_changes,
            "summary": self.summary(),
            "totals": self.totals(),
            "actions": [action.to_dict() for action in self.actions],
            "blockers": [blocker.to_dict() for blocker in self.blockers],
            "notes": self.notes,
            "held": self.held,
            "in_sync": [item.to_dict() for item in self.in_sync],
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Plan:
        """A plan as `to_dict` wrote it; raises ValueError, KeyError, TypeError or ValidationError."""
        return cls(
            deployment=str(data["deployment"]),
            nodes=[(int(n["rank"]), str(n["name"]), str(n["role"])) for n in data["nodes"]],
            actions=[Action.from_dict(item) for item in data["actions"]],
            blockers=[Blocker(**{**item, "component": Component(item["component"])}) for item in data["blockers"]],
            in_sync=[InSync(**{**item, "component": Component(item["component"])}) for item in data["in_sync"]],
            notes=[str(note) for note in data["notes"]],
            held=[str(reason) for reason in data["held"]],
        )

    @property
    def bytes_moved(self) -> int:
        """Bytes the plan downloads or copies."""
        return sum(_bytes_of(action) for action in self.actions)


def _bytes_of(action: Action) -> int:
    """The bytes an action fetches or copies (0: it moves none)."""
    if isinstance(action.payload, Download):
        return sum(item.size for item in action.payload.files)
    if isinstance(action.payload, Copy):
        return action.payload.bytes
    return 0


def plan(
    deployment: Deployment,
    facts: Facts,
    *,
    deep_verify: DeepVerify = False,
    update_revision: bool = False,
    accept_memory_risk: bool = False,
    take_upgrade: bool = True,
) -> Plan:
    """Compose every component's conclusion into one ordered plan. `take_upgrade` False (the
    loop's default) leaves a serving group whose config only a reconciler upgrade changed.

    Ranks never start while anything else is blocked (a checkpoint that cannot fit, a node
    that does not answer): the rank blocker names what they wait for. A new revision is staged
    on every node before the group restarts onto it; model_dir links to it, and old revisions
    go, only after the group is ready.
    """
    _check_facts_cover_spec(deployment, facts)
    head = facts.nodes[deployment.head.name].checkpoint
    commit = desired_commit(deployment.model, head, update=update_revision)
    staging = plan_checkpoint(deployment, facts, commit, deep_verify=deep_verify)
    outcome = Outcome()
    outcome.extend(staging)
    for component in (plan_image, plan_apikey, plan_memguard):
        outcome.extend(component(deployment, facts))
    # A front that cannot start holds the ranks too: their readiness is awaited through it.
    outcome.blockers += plan_front(deployment, facts, restarting=True).blockers
    holding = [blocker for blocker in outcome.blockers if blocker.holds_ranks]
    # A hold or a guard trip stops the running ranks whatever else blocks: `stop` must stop.
    if holding and not hold_reasons(deployment, facts):
        first = holding[0]
        message = f"ranks wait for {first.component} on {first.node}"
        outcome.blockers.append(Blocker(deployment.head.name, Component.RANKS, message, first.hint))
    else:
        ranks = plan_ranks(
            deployment,
            facts,
            _rank_prerequisites(deployment, outcome.actions),
            placements(deployment, facts, staging.commit),
            after=[action.id for action in staging.actions],
            restart=staging.restart,
            accept_memory_risk=accept_memory_risk,
            take_upgrade=take_upgrade,
        )
        outcome.extend(ranks)
        outcome.actions += _after_ready(staging.after_ready, ranks)
        starting = {action.node for action in ranks.actions if action.step is Step.START_RANK}
        outcome.actions += _after_ready(plan_image_prune(deployment, facts, starting), ranks)
    after = _front_after(deployment, outcome.actions)
    restarting = any(action.step is Step.START_RANK for action in outcome.actions)
    drained = any(action.step is Step.DRAIN for action in outcome.actions)
    front = plan_front(deployment, facts, after, restarting=restarting, drained=drained)
    outcome.actions = _with_front(outcome.actions, front.actions)
    outcome.in_sync += front.in_sync
    outcome.blockers += [blocker for blocker in front.blockers if blocker not in outcome.blockers]
    outcome.extend(plan_pi(deployment, facts))  # after the ranks, and never one of their prerequisites
    nodes: list[tuple[int, str, str]] = [(rank, node.name, node.role) for rank, node in deployment.ranked_nodes]
    return Plan(deployment.name, nodes, outcome.actions, outcome.blockers, outcome.in_sync, outcome.notes, outcome.held)


def _after_ready(after_ready: list[Action], ranks: Outcome) -> list[Action]:
    """The steps for after the group serves the new revision and image (the checkpoint's link
    and pruning, the image's pruning): after its restart when one is planned, at once when it
    already serves them (or is held down)."""
    group = [action for action in ranks.actions if action.component is Component.RANKS]
    restarting = any(action.step is Step.START_RANK for action in group)
    if not restarting and (group or ranks.blockers) and not ranks.held:
        return []
    if not restarting:
        return after_ready
    return [
        replace(item, depends_on=(*item.depends_on, group[-1].id))
        if item.step in (Step.SWITCH, Step.PRUNE_IMAGES)
        else item
        for item in after_ready
    ]


def _front_after(deployment: Deployment, actions: list[Action]) -> tuple[str, ...]:
    """The front starts after the key and its image are there and, in a group restart, after
    rank 0's start: the old rank 0 may hold the API port until it is stopped."""
    head = deployment.head.name
    before = [
        action.id
        for action in actions
        if action.node == head and (action.component is Component.APIKEY or action.target == FRONT_PULL)
    ]
    starts = [action.id for action in actions if action.step is Step.START_RANK]
    return (*before, *starts[-1:])


def _with_front(actions: list[Action], front: list[Action]) -> list[Action]:
    """The front's actions before the wait for readiness, which goes through the front."""
    wait = next((index for index, action in enumerate(actions) if action.step is Step.WAIT_READY), None)
    if wait is None or not front:
        return actions + front
    ready = replace(actions[wait], depends_on=(*actions[wait].depends_on, front[-1].id))
    return [*actions[:wait], *front, ready, *actions[wait + 1 :]]


def _check_facts_cover_spec(deployment: Deployment, facts: Facts) -> None:
    missing = [node.name for node in deployment.nodes if node.name not in facts.nodes]
    if missing:
        raise FactsError(
            f"facts have no entry for node(s) {', '.join(missing)}",
            f"facts hold {', '.join(facts.nodes) or 'no nodes'}; gather them again for this spec",
        )


def _rank_prerequisites(deployment: Deployment, actions: list[Action]) -> dict[str, list[str]]:
    """A rank starts only after its node's checkpoint, image and guard (and rank 0 after the key)."""
    head = deployment.head.name
    prerequisites: dict[str, list[str]] = {}
    for node in deployment.nodes:
        own = [
            a
            for a in actions
            if a.node == node.name
            and (a.component is not Component.APIKEY or node.name == head)
            and a.target != FRONT_PULL
        ]
        # Each component's last action, in the order the components first act.
        prerequisites[node.name] = list({action.component: action.id for action in own}.values())
    return prerequisites


def render_text(result: Plan, verbose: bool = False) -> str:
    """Terraform-style: one block per action with its cause, then a summary line."""
    header = ", ".join(f"r{rank} {name} ({role})" for rank, name, role in result.nodes)
    lines = [f'Deployment "{result.deployment}": {header}', ""]
    lines += [f"  ! {b.node}: {b.message}\n      hint: {b.hint}" for b in result.blockers]
    lines += [f"  * {note}" for note in result.notes]
    if result.blockers or result.notes:
        lines.append("")
    numbers = {action.id: index for index, action in enumerate(result.actions, start=1)}
    nodes = {action.id: action.node for action in result.actions}
    for action in result.actions:
        lines += _render_action(action, numbers, nodes)
    if verbose and result.in_sync:
        lines.append("  In sync:")
        lines += [f"    = {item.component} on {item.node}: {item.reason}" for item in result.in_sync]
        lines.append("")
    lines.append(summary_line(result))
    lines += totals_lines(result)
    return "\n".join(lines) + "\n"


def totals_lines(result: Plan) -> list[str]:
    """The bytes a plan moves and writes, when it moves any."""
    totals = result.totals()
    if not totals["disk_bytes"]:
        return []
    moved = [
        f"{label} {human_bytes(totals[key])}"
        for key, label in (("download_bytes", "download"), ("copy_bytes", "copy over the fabric"))
        if totals[key]
    ]
    disk = ", ".join(f"{node} {human_bytes(count)}" for node, count in totals["disk_bytes"].items())
    peers = [action.node for action in result.actions if action.step is Step.COPY_IMAGE]
    # An image's size is known only once its registry has sent its manifest: say who gets it.
    image = f"; and the image to {', '.join(peers)} from peers (its layers they lack)" if peers else ""
    return [f"Moves: {', '.join(moved) or 'nothing'}{image}; disk needed at most: {disk}."]


def _render_action(action: Action, numbers: dict[str, int], nodes: dict[str, str]) -> list[str]:
    lines = [
        f"{action.symbol:>3} [{numbers[action.id]}] {action.component} on {action.node}: {action.summary}",
        f"        because {action.cause}",
    ]
    alongside = behind(action, nodes)
    for pipelined, label in (
        (False, "after {}"),
        (True, "alongside {} (pipelined: takes each file as soon as it is ready)"),
    ):
        shown = [str(numbers[dep]) for dep in action.depends_on if dep in numbers and (dep in alongside) == pipelined]
        if shown:
            lines.append("        " + label.format(", ".join(shown)))
    return [*lines, ""]


def ending(result: Plan) -> str:
    """How a plan left after a pass stands, in one word: held, blocked, not_converged, converged."""
    if result.held:
        return "held"
    if result.blockers:
        return "blocked"
    return "not_converged" if result.has_changes else "converged"


def condition(result: Plan) -> str:
    """The same in a line for people (the loop's condition, the event history's pass outcome)."""
    kind = ending(result)
    if kind == "held":
        return "held: " + result.held[0]
    if kind == "blocked":
        return f"blocked: {result.blockers[0].node}: {result.blockers[0].message}"
    return "converging: " + summary_line(result) if kind == "not_converged" else "converged"


def summary_line(result: Plan) -> str:
    blocked = _blocked_text(result)
    if not result.has_changes:
        if blocked:
            return f"Nothing could be planned for {blocked}: the deployment may still differ from the spec."
        return "No changes. The deployment matches the spec."
    counts = result.summary()
    stops = f", {counts['stop']} to stop" if counts["stop"] else ""
    line = (
        f"Plan: {counts['add']} to add, {counts['change']} to change, {counts['replace']} to replace, "
        f"{counts['destroy']} to destroy{stops}, {counts['run']} to run."
    )
    return f"{line} Not planned: {blocked}." if blocked else line


def _blocked_text(result: Plan) -> str:
    """The parts the blockers kept out of the plan: `checkpoint on spark-head, ranks on spark-worker`."""
    parts = dict.fromkeys(f"{blocker.component} on {blocker.node}" for blocker in result.blockers)
    return ", ".join(parts)


# Moving more than this asks first on a terminal: 10 GB is minutes of a Spark's disk and link.
CONFIRM_BYTES = 10 * 1000**3


def needs_confirmation(result: Plan) -> list[str]:
    """What in the plan deserves a question on a terminal: a group restart, anything stopped or
    destroyed, many bytes moved. Empty: go ahead without asking."""
    reasons: list[str] = []
    # Pruning deletes only the parts of shards already reassembled and verified: nothing is lost.
    disruptive = [
        action
        for action in result.actions
        if action.verb in {"replace", "remove", "stop"} and action.step is not Step.PRUNE
    ]
    if any(action.component is Component.RANKS for action in disruptive):
        reasons.append("restarts or stops the rank group (the API goes down until it is back)")
    others = [action for action in disruptive if action.component is not Component.RANKS]
    if others:
        reasons.append("stops or removes " + ", ".join(f"{a.component} on {a.node}" for a in others))
    if result.bytes_moved > CONFIRM_BYTES:
        reasons.append(f"moves {result.bytes_moved / 1000**3:.1f} GB")
    return reasons
