"""Readiness and liveness of the serving group.

`/health` answers 200 while the engine is dead, so readiness is a keyed
`GET /v1/models`, and while waiting every rank's container is watched: any exit — code 0
included — fails the whole group at once, with the last log lines of every rank.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import docker
import httpx

from reconciler.actions import WaitReady
from reconciler.errors import GroupFailedError, ReconcilerError
from reconciler.execution import ApplyContext
from reconciler.progress import Throttle, printable, printable_line
from reconciler.redact import checked_secret
from reconciler.serving import api_base, engine_base
from reconciler.spec import Deployment
from reconciler.transport.base import find_container
from reconciler.verify.apiclient import CONNECT_TIMEOUT_S, ApiTarget, client, transport_problem

LOG_TAIL = 40


def health_code(deployment: Deployment, timeout: float = 5.0, ca: str | None = None) -> int | None:
    """Keyless GET /health (open without the key, for health checks); None when nothing answers."""
    try:
        with client(ApiTarget(api_base(deployment), "", ca=ca), keyed=False, timeout=timeout) as http:
            return http.get("/health").status_code
    except httpx.HTTPError:
        return None


def models_code(url: str, key: str, timeout: float = 5.0, ca: str | None = None) -> int | None:
    """The keyed `GET {url}/v1/models`'s status; None when nothing answers."""
    try:
        with client(ApiTarget(url, key, ca=ca), timeout=timeout) as http:
            return http.get("/v1/models").status_code
    except httpx.HTTPError:
        return None


# How liveness_problem words a probe that waited its whole timeout.
TIMED_OUT = ("no completion within", "no connection to the API within")


def liveness_problem(deployment: Deployment, key: str, ca: str | None = None, url: str | None = None) -> str | None:
    """The liveness probe: keyed /v1/models, then a one-token completion; None when both work.

    /health answers 200 while the engine is dead; only a request that needs
    every rank proves the group alive.
    """
    timeout = deployment.loop.liveness_timeout_s
    body: dict[str, Any] = {"model": deployment.serving.served_model_name, "prompt": "ping", "max_tokens": 1}
    try:
        with client(ApiTarget(url or api_base(deployment), key, ca=ca), keyed=bool(key), timeout=timeout) as http:
            models = http.get("/v1/models", timeout=10)
            if models.status_code != 200:
                return f"GET /v1/models answered {models.status_code}"
            answer = http.post("/v1/completions", json=body)
    except httpx.ConnectTimeout:
        return f"no connection to the API within {min(timeout, CONNECT_TIMEOUT_S):g} s"
    except httpx.TimeoutException:
        return f"no completion within {timeout} s (engine hung?)"
    except httpx.HTTPError as exc:
        return transport_problem(exc)
    return None if answer.status_code == 200 else f"POST /v1/completions answered {answer.status_code}"


KEY_HINT = (
    "the key file must hold the key alone on one line; to replace it, delete the file and run "
    "`reconciler apply` (a new key is created; update every client)"
)


def read_key(ctx: ApplyContext) -> str:
    """The key, for readiness probes only: checked, and never printed, logged or put in an error."""
    head = ctx.deployment.head.name
    path = ctx.path(head, ctx.deployment.key_file())
    result = ctx.ops(head).read_text(path, errors="surrogateescape", limit=4096)
    text = result["text"]
    if text is None:
        reason = result["error"] or "missing"
        raise ReconcilerError(
            f"cannot read the API key file {path} on {head}: {reason}", "run `reconciler apply` to create it"
        )
    return checked_secret(text, what="the API key", source=f"{path} on {head}", hint=KEY_HINT)


def read_ca(ctx: ApplyContext) -> str | None:
    """The front's certificate from the head, to pin (None: plain HTTP). Pinned, a certificate of
    yours for another name (api.example.com) still serves the reconciler's own checks."""
    files = ctx.deployment.tls_files()
    if files is None:
        return None
    head = ctx.deployment.head.name
    path = ctx.path(head, files[0])
    text = ctx.ops(head).read_text(path, limit=64 * 1024)["text"]
    if text is None:
        raise ReconcilerError(f"cannot read the front's certificate {path} on {head}", "run `reconciler apply`")
    return text


def probe_liveness(ctx: ApplyContext) -> str | None:
    """The liveness probe with the key from the head's key file; None when the group works."""
    try:
        key, ca = read_key(ctx), read_ca(ctx)
    except ReconcilerError as exc:
        return exc.message
    problem = liveness_problem(ctx.deployment, key, ca)
    if problem is None or ctx.deployment.head.ssh is not None or problem.startswith(TIMED_OUT):
        # A request the front passed on and the engine never answered is the engine's: asking it
        # again past the front would only wait as long once more.
        return problem
    # On the head, rank 0 answers past the front too: a failure the engine does not share is the
    # front's, which the plan repairs (a group restart would not; it would only take the API down).
    if liveness_problem(ctx.deployment, "", url=engine_base(ctx.deployment)) is None:
        return None
    return problem


def _log_tails(states: dict[str, Any]) -> str:
    lines: list[str] = []
    for name, container in states.items():
        prefix = name.rsplit("-", 1)[-1]
        if container is None:
            lines.append(f"{prefix}| (no container)")
            continue
        text = container.logs(tail=LOG_TAIL).decode("utf-8", errors="replace")
        lines += [f"{prefix}| {printable(line)}" for line in text.splitlines()]
    return "\n".join(lines)


# How often the readiness wait reads each rank's last log line (one short Docker call per rank).
RANK_LOG_EVERY_S = 5.0
RANK_LINE_LIMIT = 160


def last_log_lines(states: dict[str, Any]) -> dict[str, str]:
    """Each rank's last log line ('r0' -> text), printable and redacted: it reaches the journal
    and STATUS=, which every local user may read."""
    lines: dict[str, str] = {}
    for name, container in states.items():
        rank = name.rsplit("-", 1)[-1]
        if container is None:
            lines[rank] = "(no container)"
            continue
        try:
            text = container.logs(tail=1).decode("utf-8", errors="replace")
        except docker.errors.DockerException:  # gone meanwhile: the next poll sees it exit
            text = "(no log)"
        lines[rank] = printable_line(text, RANK_LINE_LIMIT) or "(nothing logged yet)"
    return lines


class RankLines:
    """What the readiness wait shows of the ranks: every few seconds their last log lines in
    STATUS= and the status file, and in the journal each line once, when it changes."""

    def __init__(self, ctx: ApplyContext, clock: Callable[[], float] = time.monotonic) -> None:
        self.ctx = ctx
        self.clock = clock
        self.throttle = Throttle(RANK_LOG_EVERY_S)
        self.printed: dict[str, str] = {}

    def show(self, states: dict[str, Any], url: str, waited_s: float) -> None:
        if not self.throttle.due("ranks", self.clock()):
            return
        lines = last_log_lines(states)
        self.ctx.progress.line(f"    waiting for {url}/v1/models ({waited_s:.0f} s)")
        for rank, text in lines.items():
            if self.printed.get(rank) != text:
                self.printed[rank] = text
                self.ctx.progress.line(f"      {rank}| {text}")
        ranks = " | ".join(f"{rank}| {text}" for rank, text in lines.items())
        self.ctx.progress.note(f"waiting {waited_s:.0f} s for /v1/models; {ranks}")


def wait_ready(ctx: ApplyContext, wait: WaitReady) -> str:
    """Poll the keyed /v1/models every `poll_s` until 200, watching every rank; fail at once
    when one exits, and after `timeout_s`. Meanwhile the ranks' last log lines are shown."""
    key, ca = read_key(ctx), read_ca(ctx)
    started = time.monotonic()
    deadline = started + wait.timeout_s
    shown = RankLines(ctx)
    while True:
        # Each rank container's Docker object (None when missing), by name; fresh each poll: the
        # lookup lists with sparse=False, which inspects every container.
        states = {name: find_container(ctx.transport(node).docker(), name) for node, name in wait.ranks}
        exited = [name for name, container in states.items() if container is None or container.status != "running"]
        if exited:
            summary = ", ".join(f"{name} running={name not in exited}".lower() for name in states)
            raise GroupFailedError(
                f"a rank exited ({summary})\n{_log_tails(states)}",
                "read the rank logs above; the group is restarted as a whole on the next apply",
            )
        if models_code(wait.url, key, ca=ca) == 200:
            return f"ready after {time.monotonic() - started:.0f} s: {wait.url}/v1"
        if time.monotonic() >= deadline:
            raise GroupFailedError(
                f"not ready after {wait.timeout_s // 60} min", "check `reconciler logs r0` and `logs r1`"
            )
        shown.show(states, wait.url, time.monotonic() - started)
        time.sleep(wait.poll_s)
