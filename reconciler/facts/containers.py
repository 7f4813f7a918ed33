"""Container and image facts, as read back from the Docker API."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from reconciler.facts.base import FactsModel

ContainerStatus = Literal["created", "running", "paused", "restarting", "removing", "exited", "dead"]


class ContainerFacts(FactsModel):
    """One container we own (found by its owner label)."""

    name: str
    id: str
    image: str
    status: ContainerStatus
    exit_code: int | None = None
    oom_killed: bool = False
    finished_at: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    command: list[str] = Field(default_factory=list)
    env: dict[str, str] = Field(default_factory=dict)


def container_from_inspect(attrs: dict[str, Any]) -> ContainerFacts:
    """Build facts from `docker inspect` / docker-py `container.attrs`."""
    config = attrs.get("Config") or {}
    state = attrs.get("State") or {}
    env = dict(item.split("=", 1) for item in config.get("Env") or [] if "=" in item)
    command = [*(config.get("Entrypoint") or []), *(config.get("Cmd") or [])]
    running = state.get("Status") == "running"
    return ContainerFacts(
        name=str(attrs.get("Name", "")).lstrip("/"),
        id=str(attrs.get("Id", "")),
        image=str(config.get("Image", "")),
        status=state.get("Status", "created"),
        exit_code=None if running else state.get("ExitCode"),
        oom_killed=bool(state.get("OOMKilled", False)),
        finished_at=None if running else state.get("FinishedAt"),
        labels=dict(config.get("Labels") or {}),
        command=command,
        env=env,
    )
