"""Container and image facts, as read back from the Docker API."""

from __future__ import annotations

from typing import Any, Literal, get_args

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
    command: list[str] = Field(default_factory=lambda: [])
    env: dict[str, str] = Field(default_factory=dict)


def container_from_inspect(attrs: dict[str, Any]) -> ContainerFacts:
    """Build facts from `docker inspect` / docker-py `container.attrs`.

    Read defensively: a field of an unexpected type (another engine, another API version) is
    taken as absent, and a state this module does not know counts as dead, so an odd answer
    never stops a pass and never passes for a running rank.
    """
    config = _mapping(attrs.get("Config"))
    state = _mapping(attrs.get("State"))
    env = dict(item.split("=", 1) for item in _strings(config.get("Env")) if "=" in item)
    command = [*_strings(config.get("Entrypoint")), *_strings(config.get("Cmd"))]
    status = state.get("Status", "created")
    status = status if status in get_args(ContainerStatus) else "dead"
    running = status == "running"
    exit_code = state.get("ExitCode")
    finished_at = state.get("FinishedAt")
    labels = {key: value for key, value in _mapping(config.get("Labels")).items() if isinstance(value, str)}
    return ContainerFacts(
        name=str(attrs.get("Name", "")).lstrip("/"),
        id=str(attrs.get("Id", "")),
        image=str(config.get("Image", "")),
        status=status,
        exit_code=exit_code if isinstance(exit_code, int) and not running else None,
        oom_killed=state.get("OOMKilled") is True,
        finished_at=finished_at if isinstance(finished_at, str) and not running else None,
        labels={str(key): value for key, value in labels.items()},
        command=command,
        env=env,
    )


def _mapping(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _strings(value: object) -> list[str]:
    if isinstance(value, str):
        return [value]
    return [item for item in value if isinstance(item, str)] if isinstance(value, list) else []
