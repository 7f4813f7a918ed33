"""Probing for init (the only I/O): every node once, over the same transports as every pass.

SSH host keys are checked as everywhere: each node's route through the user's ssh config is
resolved as the transport resolves it, and a hop whose key is not in the route's known_hosts
stops init with the commands that add it after the fingerprint is verified; init never adds one
itself.
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Callable
from dataclasses import replace

import paramiko

from reconciler.errors import NodeUnreachableError, SshConfigError
from reconciler.facts.gather import probe_every_node
from reconciler.init.request import InitRequest, Probed, probed_from_answers, provisional
from reconciler.spec import Node
from reconciler.transport.base import Transport
from reconciler.transport.connect import transport_for
from reconciler.transport.sshconnect import known_host_keys
from reconciler.transport.sshroute import SshRoute, openssh_command, route_for


def probe_nodes(request: InitRequest, transport_of: Callable[[Node], Transport] = transport_for) -> list[Probed]:
    """One doctor probe per node, in parallel; any node that does not answer stops init, every
    such node named (a spec drafted without a node's fabric would only move the failure later)."""
    # Each node's route through the user's ssh config, resolved as the transport resolves it
    # (aliases, HostName, Port, UserKnownHostsFile, ProxyJump); None for this machine.
    routes = [None if target is None else route_for(target.login, target) for _, target in request.targets]
    missing = [problem for route in routes if route is not None for problem in unknown_host_keys(route)]
    if missing:
        raise NodeUnreachableError(
            "; ".join(message for message, _ in missing),
            "; ".join(dict.fromkeys(hint for _, hint in missing)) + "; then run init again",
        )
    deployment = provisional(request)
    transports = {node.name: transport_of(node) for node in deployment.nodes}
    try:
        answers = probe_every_node(deployment, transports, doctor=True)
    finally:
        for transport in transports.values():
            transport.close()
    failed = [
        (target, name, answer)
        for (_, target), (name, answer) in zip(request.targets, answers.items(), strict=True)
        if answer.raw is None
    ]
    if failed:
        # The probe's error names the node as init named it; the message names the login.
        errors = [
            f"{'this machine' if target is None else target.login}: {(answer.error or '').removeprefix(f'{name}: ')}"
            for target, name, answer in failed
        ]
        raise NodeUnreachableError(
            "; ".join(errors),
            "; ".join(dict.fromkeys(answer.hint for _, _, answer in failed if answer.hint)) or "check the nodes",
        )
    return probed_from_answers(request, answers, routes)


def unknown_host_keys(route: SshRoute) -> list[tuple[str, str]]:
    """(message, hint) for each hop of the route, jump hosts included, whose key none of the
    route's known_hosts files holds under the name the transport looks it up by; each hint the
    exact commands that add it once its fingerprint is checked. A key that is present but wrong
    is the transport's to refuse."""
    files = ", ".join(route.known_hosts)
    keys: paramiko.HostKeys | None = None
    if not any(os.path.exists(path) for path in route.known_hosts):
        held = (
            f"{files} does not exist, so it holds no host key"
            if len(route.known_hosts) == 1
            else f"none of {files} exists, so none holds a host key"
        )
    else:
        try:
            keys = known_host_keys(route)
        except SshConfigError as exc:
            return [(exc.message, "check that file (--known-hosts, or UserKnownHostsFile in the ssh config)")]
        held = f"{files} holds no host key" if len(route.known_hosts) == 1 else f"none of {files} holds a host key"
    problems = []
    for index, hop in enumerate(route.hops):
        if keys is not None and keys.lookup(hop.host_key_name) is not None:
            continue
        message = f"{route.node}: {held} for {hop.host_key_name}{_hop_text(route, index)}"
        problems.append((f"{message}; init never trusts an unseen host key", _add_key_hint(route, index)))
    return problems


def _hop_text(route: SshRoute, index: int) -> str:
    hop = route.hops[index]
    if hop is not route.target:
        return f" (jump host {hop.describe()} on the way to {route.target.name})"
    if hop.name != hop.hostname or hop.host_key_alias or route.jumps or route.proxy_command:
        return f" ({hop.name} is {leads_to(route)} by the ssh config)"
    return ""


def leads_to(route: SshRoute) -> str:
    """Where the route's name leads, and how it is reached."""
    via = f" via {', '.join(jump.describe() for jump in route.jumps)}" if route.jumps else ""
    return f"{route.target.address}{via}{' over its ProxyCommand' if route.proxy_command else ''}"


def _add_key_hint(route: SshRoute, index: int) -> str:
    """Scan the hop's key from where the route reaches it, show its fingerprint, and file it in
    the first known_hosts file under the name the transport looks up (HostKeyAlias, if set)."""
    hop = route.hops[index]
    scan = ["ssh-keyscan", "-p", str(hop.port), hop.hostname]
    if index:
        # Behind a jump host the hop is reachable only from there: scan over the route to it.
        previous = route.hops[index - 1]
        scan = [*openssh_command(replace(route, target=previous, jumps=route.hops[: index - 1])), previous.name, *scan]
    shown = shlex.join(scan)
    filed = shown + (f" | sed {shlex.quote(f's|^[^ ]*|{hop.host_key_alias}|')}" if hop.host_key_alias else "")
    add = f"`{filed} >> {shlex.quote(route.known_hosts[0])}`"
    if index == 0 and route.proxy_command:
        return (
            f"{hop.hostname} is reached through the ProxyCommand, which ssh-keyscan cannot use: run "
            f"`{shlex.join(scan)}` where {hop.hostname} is reachable, check the fingerprint against "
            f"`ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub` on {hop.hostname} itself, and append the line to "
            f"{route.known_hosts[0]}" + (f" under the name {hop.host_key_alias}" if hop.host_key_alias else "")
        )
    return (
        f"check {hop.hostname}'s host key, then add it: `{shown} | ssh-keygen -lf -` shows the fingerprints it "
        "offers; compare them with `ssh-keygen -lf /etc/ssh/ssh_host_ed25519_key.pub` run on that host itself, "
        f"and only if they match: {add}"
    )
