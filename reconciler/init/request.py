"""What `reconciler init` was asked for (the nodes' logins, roles and model dirs), checked, and
what the nodes answered, as init keeps it."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from pydantic import TypeAdapter, ValidationError

from reconciler.doctor import doctor_input
from reconciler.errors import ReconcilerError
from reconciler.facts.base import text_or_none
from reconciler.facts.gather import NodeProbe
from reconciler.facts.node import NodeFacts
from reconciler.spec import Deployment, HostPath, Node, SshTarget
from reconciler.transport.sshroute import SshRoute

DEFAULT_MODEL_DIR: str = Node.model_fields["model_dir"].default


DEFAULT_STATE_DIR: str = Deployment.model_fields["state_dir"].default


REVIEW = "REVIEW"


Role = Literal["head", "worker"]


@dataclass(frozen=True)
class InitRequest:
    """The nodes to probe, head first; `None` for the head means the machine running init."""

    head: SshTarget | None
    workers: tuple[SshTarget, ...]
    model_dir: str = DEFAULT_MODEL_DIR

    @property
    def targets(self) -> list[tuple[Role, SshTarget | None]]:
        return [("head", self.head), *(("worker", target) for target in self.workers)]


def ssh_target(
    text: str, option: str, *, port: int | None, identity_file: str | None, known_hosts: str | None
) -> SshTarget:
    """`[user@]host` as given to --head / --worker, checked as the spec would check it.

    Only what the user gave is set: a field set in the spec overrides the ssh config for good,
    so an option left out must stay out and let ~/.ssh/config apply (`model_fields_set`)."""
    user, at, host = text.rpartition("@")
    given = {"port": port, "identity_file": identity_file, "known_hosts": known_hosts}
    fields: dict[str, Any] = {"host": host, **{key: value for key, value in given.items() if value is not None}}
    if at:
        fields["user"] = user
    try:
        return SshTarget.model_validate(fields)
    except ValidationError as exc:
        raise _option_error(option, text, exc) from None


def checked_model_dir(text: str) -> str:
    try:
        return str(TypeAdapter(HostPath).validate_python(text))
    except ValidationError as exc:
        raise _option_error("--model-dir", text, exc) from None


def _option_error(option: str, text: str, exc: ValidationError) -> ReconcilerError:
    error = exc.errors()[0]
    hint = str((error.get("ctx") or {}).get("hint") or "see `reconciler init --help`")
    where = ".".join(str(part) for part in error["loc"])
    return ReconcilerError(f"{option} {text!r}: {where + ': ' if where else ''}{error['msg']}", hint)


def check_distinct(request: InitRequest) -> None:
    seen: set[tuple[str, int]] = set()
    for _, target in request.targets:
        if target is None:
            continue
        key = (target.host, target.port)
        if key in seen:
            raise ReconcilerError(f"{target.login} is given twice", "name each node once (--head or --worker)")
        seen.add(key)


@dataclass(frozen=True)
class Probed:
    """One node's answer: who logged in and the facts built from its probe (the plan's own parsers)."""

    role: Role
    target: SshTarget | None
    user: str | None
    facts: NodeFacts
    route: SshRoute | None = None  # the target through the ssh config, when init resolved it


def provisional(request: InitRequest) -> Deployment:
    """A deployment to probe with: the nodes as given, the spec's defaults for the rest.
    Names are placeholders; the drafted spec names each node after its hostname."""
    nodes: list[dict[str, Any]] = []
    for index, (role, target) in enumerate(request.targets):
        node: dict[str, Any] = {"name": f"node-{index}", "role": role, "model_dir": request.model_dir}
        if target is not None:
            # Unset, not default: an explicit `--ssh-port 22` must still win over the config's Port.
            node["ssh"] = target.model_dump(exclude_unset=True)
        nodes.append(node)
    return Deployment.model_validate({"nodes": nodes})


def probed_from_answers(
    request: InitRequest, answers: dict[str, NodeProbe], routes: list[SshRoute | None] | None = None
) -> list[Probed]:
    """Pure: the probes' raw answers (keyed by the provisional names) -> per-node findings."""
    deployment = provisional(request)
    facts = doctor_input(deployment, answers).facts
    routed = routes if routes is not None else [None] * len(deployment.nodes)
    return [
        Probed(role, target, text_or_none(answers[node.name].host.get("user")), facts.nodes[node.name], route)
        for (role, target), node, route in zip(request.targets, deployment.nodes, routed, strict=True)
    ]
