"""The front on the head: the API's one door (reconciler/front.py says why and how).

It is managed apart from the rank group: a new config, image or key replaces the front alone,
in a second, and never restarts a rank; a missing or exited front is started again by the
next pass (Docker also restarts it unless it was stopped). When the group restarts, the front
starts after rank 0 (whose old container may still hold the API port, on an upgrade from a
reconciler without a front) and before the wait for readiness, which goes through it.
"""

from __future__ import annotations

import re
import time
from typing import TYPE_CHECKING, Any

from reconciler.actions import (
    Action,
    Blocker,
    Component,
    CreateCert,
    Drain,
    InSync,
    Outcome,
    RemoveFront,
    StartFront,
    Undrain,
    Verb,
    action,
    runs,
)
from reconciler.components.ranks import owned_containers, remove_our_old, stop_container
from reconciler.errors import ReconcilerError
from reconciler.facts.containers import ContainerFacts
from reconciler.facts.node import Facts, NodeFacts
from reconciler.front import (
    CONTROL_MOUNT,
    DRAIN_MOUNT,
    DRAIN_ON,
    GRACE_S,
    LABEL_KEY_VERSION,
    SECRET_MOUNTS,
    FrontContainer,
    drain_switch,
    files_version,
    front_name,
    render_front,
)
from reconciler.redact import redact
from reconciler.serving import LABEL_CONFIG_HASH, LABEL_OWNER, OWNER, ROLE_FRONT, api_base
from reconciler.spec import Deployment, expand_home

if TYPE_CHECKING:
    from reconciler.execution import ApplyContext
    from reconciler.nodeops import NodeOps

COMPONENT = Component.FRONT
# How long a started front may take to accept connections (HAProxy needs well under a second).
LISTEN_WAIT_S = 15.0
# HAProxy that cannot bind its port exits within milliseconds: still running after this, it listens.
SETTLE_S = 0.5
# The front logs a line per request, refused ones included: its log must not fill the disk.
LOG_CONFIG = {"type": "json-file", "config": {"max-size": "10m", "max-file": "3"}}


def plan_front(
    deployment: Deployment,
    facts: Facts,
    after: tuple[str, ...] = (),
    *,
    restarting: bool = False,
    drained: bool = False,
) -> Outcome:
    """Start or replace the front when it is missing, stopped, or not what the spec renders;
    remove fronts of ours with another name; end a drain. `after`: what the front's start (and a
    drain's end) waits for; `restarting`: the rank group restarts in this plan (rank 0 leaves the
    API port then); `drained`: the plan drains the front before that restart."""
    outcome = _plan_front(deployment, facts, after, restarting=restarting)
    observed = facts.nodes[deployment.head.name]
    if observed.reachable and (drained or observed.front_draining) and not outcome.blockers:
        outcome.actions.append(_undrain_action(deployment, observed, after, outcome.actions, restarting=restarting))
    return outcome


def _undrain_action(
    deployment: Deployment, observed: NodeFacts, after: tuple[str, ...], before: list[Action], *, restarting: bool
) -> Action:
    """The drain's end: after rank 0's start in a restart (before the wait for readiness, which
    goes through the front); at once for a drain left on (a reconciler stopped mid-restart)."""
    socket, switch = drain_switch(deployment)
    summary = "end the drain: the front passes requests to rank 0 again"
    if restarting:
        cause = "the group restart the drain was for has started"
    else:
        cause = "the front still answers 503 from a drain nobody ended (a restart cut short)"
    del observed
    depends = (*after, *(action.id for action in before[-1:]))
    return action(Undrain(socket=socket, switch=switch), deployment.head.name, "run", summary, cause, depends)


def _plan_front(deployment: Deployment, facts: Facts, after: tuple[str, ...], *, restarting: bool) -> Outcome:
    head = deployment.head
    observed = facts.nodes[head.name]
    if not observed.reachable or observed.home is None:
        return Outcome()
    tls = _tls_pair(deployment, observed)
    if isinstance(tls, Blocker):
        return Outcome(blockers=[tls])
    squatter = _name_taken(deployment, observed)
    if squatter is not None:
        return Outcome(blockers=[squatter])
    if not restarting and _rank0_holds_the_port(deployment, facts):
        message = f"rank 0 of a reconciler from before the front holds :{deployment.serving.port}"
        hint = "the front starts with the group's restart onto 127.0.0.1 (what holds that restart is listed)"
        return Outcome(blockers=[Blocker(head.name, COMPONENT, message, hint, holds_ranks=False)])
    desired = render_front(deployment, observed.home)
    fronts = owned_containers(deployment, facts, head.name, ROLE_FRONT)
    current = next((c for c in fronts if c.name == desired.name), None)
    removals = [
        action(_removal(c), head.name, "remove", f"stop and remove {c.name}", _stray(c), (), c.name)
        for c in fronts
        if c is not current
    ]
    problem = "a new TLS pair" if tls else _problem(desired, current, _versions(deployment, observed))
    if not problem:
        return Outcome(
            actions=removals, in_sync=[InSync(head.name, COMPONENT, f"{desired.name} running, config current")]
        )
    verb: Verb = "create" if current is None else "replace"
    bind, port = deployment.api.bind, deployment.serving.port
    scheme = "HTTPS" if deployment.api.tls is not None else "HTTP"
    summary = f"start {desired.name} (HAProxy, {scheme} on {bind}:{port}: the key or GET /health; rank 0 behind it)"
    depends = (*after, *(a.id for a in [*removals, *tls]))
    start = StartFront(container=desired, address=_address(deployment))
    started = action(start, head.name, verb, summary, problem, depends, desired.name)
    return Outcome(actions=[*removals, *tls, started])


def _name_taken(deployment: Deployment, observed: NodeFacts) -> Blocker | None:
    """A container with the front's name that is not ours: never touched, so the owner decides."""
    name = front_name(deployment)
    ours = {c.id for c in observed.containers if c.labels.get(LABEL_OWNER) == OWNER}
    squatter = next((c for c in observed.containers if c.name == name and c.id not in ours), None)
    if squatter is None:
        return None
    message = f"a container named {name} is not the reconciler's ({squatter.status}): the front cannot be created"
    hint = f"remove or rename it (`docker rm -f {name}`) if it is not needed, or give the deployment another `name:`"
    return Blocker(deployment.head.name, COMPONENT, message, hint)


def _rank0_holds_the_port(deployment: Deployment, facts: Facts) -> bool:
    """Whether a running rank 0 of ours still serves the API port itself (rendered before the front)."""
    port = str(deployment.serving.port)
    for container in owned_containers(deployment, facts, deployment.head.name):
        argv = container.command
        if container.status == "running" and "--port" in argv[:-1] and argv[argv.index("--port") + 1] == port:
            return True
    return False


def _tls_pair(deployment: Deployment, observed: NodeFacts) -> list[Action] | Blocker:
    """The front's TLS pair: there (nothing to do), made now (self-signed: missing, or half of
    one), or a blocker (a file of yours missing)."""
    files = deployment.tls_files()
    tls, head = observed.tls, deployment.head.name
    if files is None or (tls is not None and tls.cert.present and tls.key.present):
        return []
    cert, key = files
    have = {"certificate": tls is not None and tls.cert.present, "key": tls is not None and tls.key.present}
    absent = [what for what, present in have.items() if not present]
    missing = " and ".join(absent)
    spec = deployment.api.tls
    if spec is not None and spec.cert_file is not None:
        hint = "put them there (PEM, the key 0600), or remove api.tls.cert_file and key_file for a self-signed pair"
        verb = "are" if len(absent) > 1 else "is"
        return Blocker(head, COMPONENT, f"api.tls: the {missing} {verb} missing on {head} ({cert}, {key})", hint)
    assert observed.home is not None
    names = _cert_names(deployment, observed)
    # Half a pair of ours (a start cut between its two writes) is of no use: it is made again.
    payload = CreateCert(
        cert_path=expand_home(cert, observed.home),
        key_path=expand_home(key, observed.home),
        names=names,
        days=3650,
        remake=any(have.values()),
    )
    summary = f"create a self-signed TLS pair {cert} (for {', '.join(names)}; the key 0600)"
    cause = f"half of the self-signed pair is there (no {missing})" if payload.remake else "api.tls, and no pair yet"
    return [action(payload, head, "create", summary, cause)]


def _cert_names(deployment: Deployment, observed: NodeFacts) -> list[str]:
    """What clients reach the API by: loopback, the bind address, the SSH host, the host name and
    the head's addresses now (a head whose address changes gets a new pair when its files go)."""
    head = deployment.head
    names = ["127.0.0.1", "localhost"]
    if deployment.api.bind != "0.0.0.0":
        names.append(deployment.api.bind)
    if head.ssh is not None:
        names.append(head.ssh.host)
    if observed.hostname:
        names.append(observed.hostname)
    names += [str(address) for address in observed.tls.addresses] if observed.tls is not None else []
    return [name for name in dict.fromkeys(names) if _CERT_NAME.fullmatch(name)]


# What a certificate may name: an address or an ASCII host name (a host name in another script
# would need IDNA, which a Spark's default host name never does).
_CERT_NAME = re.compile(r"[0-9A-Za-z](?:[0-9A-Za-z.-]{0,251}[0-9A-Za-z])?|[0-9.]+")


def _versions(deployment: Deployment, observed: NodeFacts) -> str | None:
    """The versions of the files the front reads, as facts give them; None when one is unknown."""
    versions = [observed.api_key.version if observed.api_key is not None else None]
    if deployment.api.tls is not None:
        tls = observed.tls
        versions += [tls.cert.version, tls.key.version] if tls is not None else [None, None]
    return None if None in versions else files_version(versions)


def _removal(container: ContainerFacts) -> RemoveFront:
    return RemoveFront(name=container.name, container_id=container.id, grace_s=GRACE_S)


def _stray(container: ContainerFacts) -> str:
    return f"a front of this deployment under another name ({container.name})"


def _problem(desired: FrontContainer, observed: ContainerFacts | None, versions: str | None) -> str:
    if observed is None:
        return "no front: the API must have one door, with the key"
    if observed.status != "running":
        return f"the front is {observed.status}" + (f" (exit code {observed.exit_code})" if observed.exit_code else "")
    if observed.labels.get(LABEL_CONFIG_HASH) != desired.labels[LABEL_CONFIG_HASH]:
        return "front settings changed (config, image or mounts)"
    if versions is not None and observed.labels.get(LABEL_KEY_VERSION) != versions:
        return "the key file (or the TLS pair) changed since the front read it"
    return ""


def _address(deployment: Deployment) -> tuple[str, int]:
    """Where the reconciler checks that the front listens: the API's own address."""
    host = api_base(deployment).split("//", 1)[1].rsplit(":", 1)[0]
    return host, deployment.serving.port


def _start(ctx: ApplyContext, action: Action, start: StartFront) -> str:
    """Write the config, read the key file's owner and version (the front runs as its owner,
    to read the 0600 file), replace our old front with the rendered one, and wait for it."""
    desired = start.container
    ops = ctx.ops(action.node)
    read = [mount.source for target in SECRET_MOUNTS for mount in desired.mounts if mount.target == target]
    files = [ops.key_file(path) for path in read]
    for path, state in zip(read, files, strict=True):
        if not state.get("present") or not state.get("size"):
            raise ReconcilerError(f"{action.node}: {path} is missing or empty", "run `reconciler apply`")
    key = files[0]
    _check_key_for_haproxy(ctx)
    ops.write_file(desired.config_path, desired.config, mode=0o644)
    _prepare_drain_switch(ops, desired)
    client = ctx.transport(action.node).docker()
    remove_our_old(client, action.node, desired.name)
    labels = {**desired.labels, LABEL_KEY_VERSION: files_version([state.get("version") for state in files])}
    created = client.api.create_container(
        **_create_args(client.api, desired, labels, f"{key.get('uid', 0)}:{key.get('gid', 0)}")
    )
    client.api.start(created["Id"])
    _wait_listening(ctx, action, created["Id"], start.address)
    return f"started {desired.name} ({created['Id'][:12]}), listening on {start.address[0]}:{start.address[1]}"


def _prepare_drain_switch(ops: NodeOps, desired: FrontContainer) -> None:
    """The directory HAProxy makes its admin socket in, and the drain switch's pattern file,
    empty: a new front never starts draining."""
    for mount in desired.mounts:
        if mount.target == CONTROL_MOUNT:
            ops.mkdirs(mount.source)
        elif mount.target == DRAIN_MOUNT:
            ops.write_file(mount.source, "", mode=0o644)


def _create_args(api: Any, desired: FrontContainer, labels: dict[str, str], user: str) -> dict[str, object]:
    """Low-level Docker API arguments: a read-only root, no capabilities, as the key's owner."""
    host_config = api.create_host_config(
        binds={m.source: {"bind": m.target, "mode": "ro" if m.read_only else "rw"} for m in desired.mounts},
        network_mode=desired.network_mode,
        restart_policy={"Name": desired.restart_policy},
        cap_drop=["ALL"],
        security_opt=["no-new-privileges"],
        read_only=True,
        log_config=LOG_CONFIG,
    )
    return {
        "image": desired.image,
        "name": desired.name,
        "entrypoint": list(desired.entrypoint),
        "command": list(desired.command),
        "user": user,
        "labels": labels,
        "stop_timeout": desired.stop_timeout_s,
        "host_config": host_config,
    }


def _check_key_for_haproxy(ctx: ApplyContext) -> None:
    """The key as HAProxy reads its pattern file: one line (checked_secret refuses more, and any
    space), and not a comment (a line starting with '#' is skipped: the front would refuse all)."""
    from reconciler import health  # executors only

    if health.read_key(ctx).startswith("#"):
        raise ReconcilerError(
            "the API key starts with '#', which the front's key file format reads as a comment",
            "write a key that starts with another character (the keys `apply` makes never start with '#')",
        )


def _wait_listening(ctx: ApplyContext, action: Action, container_id: str, address: tuple[str, int]) -> None:
    """Until the front accepts a connection and still runs a moment later: a front that could not
    bind exits at once, while whatever holds the port would take the connection."""
    import socket

    deadline = time.monotonic() + LISTEN_WAIT_S
    while True:
        _still_running(ctx, action, container_id, address)
        try:
            with socket.create_connection(address, timeout=1.0):
                break
        except OSError:
            if time.monotonic() > deadline:
                raise ReconcilerError(
                    f"{action.node}: the front runs but {address[0]}:{address[1]} accepts no connection",
                    f"see `docker logs {action.target}` on {action.node}",
                ) from None
            time.sleep(0.2)
    time.sleep(SETTLE_S)
    _still_running(ctx, action, container_id, address)


def _still_running(ctx: ApplyContext, action: Action, container_id: str, address: tuple[str, int]) -> None:
    """Fail with the front's last log lines when it exited (a port taken, a bad key file)."""
    client = ctx.transport(action.node).docker()
    state = client.api.inspect_container(container_id)["State"]
    if not state.get("Running") or state.get("Restarting"):
        logs = client.api.logs(container_id, tail=5).decode("utf-8", "replace").strip()
        raise ReconcilerError(
            f"{action.node}: the front exited (code {state.get('ExitCode')}): {redact(logs)[-600:]}",
            f"is another program listening on {address[0]}:{address[1]}? (`ss -ltnp`)",
        )


def _create_cert(ctx: ApplyContext, action: Action, create: CreateCert) -> str:
    """The pair, made here and written on the head: the key first (0600, never over one that
    appeared meanwhile), then the certificate."""
    from reconciler.tlspair import self_signed  # only to make a pair: planning never needs it

    key_pem, cert_pem = self_signed(create.names, create.days)
    ops = ctx.ops(action.node)
    if not ops.write_file(create.key_path, key_pem, mode=0o600, keep_existing=not create.remake):
        raise ReconcilerError(
            f"{action.node}: a TLS key appeared at {create.key_path} meanwhile; it is kept",
            "run `reconciler apply` again: it plans with what is there now",
        )
    ops.write_file(create.cert_path, cert_pem, mode=0o644)
    return "created"


# How often a drain asks rank 0 how many requests it holds, and says so while it waits.
DRAIN_POLL_S = 1.0
DRAIN_SAY_EVERY_S = 5.0


def _drain(ctx: ApplyContext, action: Action, drain: Drain) -> str:
    """Switch new requests to 503, then wait for the ones in flight (or drain_s)."""
    ops = ctx.ops(action.node)
    if ops.front_command(drain.socket, f"add acl {drain.switch} {DRAIN_ON}") is None:
        return "no front answers on its admin socket: nothing to drain"
    started = said = time.monotonic()
    while True:
        held = ops.engine_load(drain.metrics_url)
        waited = time.monotonic() - started
        if not held:
            return f"drained in {waited:.0f} s (rank 0 {'holds no request' if held == 0 else 'does not answer'})"
        if waited >= drain.drain_s:
            return f"{held} request(s) still in flight after serving.drain_s ({drain.drain_s} s): restarting anyway"
        if time.monotonic() - said >= DRAIN_SAY_EVERY_S:
            said = time.monotonic()
            ctx.progress.line(f"      draining: {held} request(s) in flight, {waited:.0f} s of {drain.drain_s} s")
        time.sleep(DRAIN_POLL_S)


def _end_drain(ctx: ApplyContext, action: Action, undrain: Undrain) -> str:
    answer = ctx.ops(action.node).front_command(undrain.socket, f"clear acl {undrain.switch}")
    return "no front answers: nothing to end" if answer is None else "the front passes requests again"


EXECUTORS = (
    runs(CreateCert, _create_cert),
    runs(StartFront, _start),
    runs(RemoveFront, stop_container),
    runs(Drain, _drain),
    runs(Undrain, _end_drain),
)
