"""The typed client of a node's file operations (nodeside/ops.py): one method per operation.

Each method builds the operation's declared arguments and returns its declared result, both
TypedDicts of nodeside/ops.py, so mypy checks every call here against the function that runs
on the node. What the node answers is checked against the same declaration before anyone reads
it: a node's output is untrusted, and an answer of the wrong shape is a located error, never a
KeyError three calls later.
"""

from __future__ import annotations

import functools
import types
from collections.abc import Callable
from typing import Any, TypeVar, Union, get_args, get_origin, get_type_hints, is_typeddict

from reconciler.errors import NodeCommandError
from reconciler.nodeside import ops
from reconciler.transport.base import LineSink, Transport, run_program

Arguments = TypeVar("Arguments")
Result = TypeVar("Result")

# The longest a single operation may run: hashing or reassembling a 462 GB checkpoint.
LONGEST_S = 6 * 3600.0
DEFAULT_S = 3600.0
# Walking a 462 GB checkpoint of some hundred files takes seconds; a slow disk, minutes.
FOOTPRINT_S = 1800.0


class NodeOps:
    """One node's file operations, over its transport. With a state dir (as the spec writes it;
    the node expands `~` itself), every call has the node make it private first, before anything
    is written there; a reader that must change nothing passes none. Progress lines go to
    `on_line` as the node writes them. A call may take `timeout` seconds (hashing and
    reassembling a checkpoint may take LONGEST_S)."""

    def __init__(
        self,
        transport: Transport,
        state_dir: str | None,
        on_line: LineSink | None = None,
        *,
        timeout: float = DEFAULT_S,
    ) -> None:
        self.transport = transport
        self.state_dir = state_dir
        self.on_line = on_line
        self.timeout = timeout

    def write_file(self, path: str, content: str, *, mode: int = ops.PRIVATE, keep_existing: bool = False) -> bool:
        """Whether it was written: with `keep_existing`, a non-empty file stays as it is."""
        args: ops.WriteFileArgs = {"path": path, "content": content, "mode": mode, "keep_existing": keep_existing}
        return self._call(ops.write_file, args)["written"]

    def chmod(self, path: str, mode: int) -> None:
        self._call(ops.chmod, ops.ChmodArgs(path=path, mode=mode))

    def read_text(self, path: str, *, limit: int = ops.READ_LIMIT, errors: str = "strict") -> ops.ReadTextResult:
        """The text of a regular file, or None and why."""
        return self._call(ops.read_text, ops.ReadTextArgs(path=path, limit=limit, errors=errors))

    def mkdirs(self, *paths: str) -> None:
        self._call(ops.mkdirs, ops.MkdirsArgs(paths=list(paths)))

    def remove_file(self, path: str) -> None:
        self._call(ops.remove_file, ops.PathArgs(path=path))

    def front_command(self, socket: str, command: str) -> str | None:
        """One command to the front's admin socket; its answer, None when no front answers."""
        return self._call(ops.front_command, ops.FrontCommandArgs(socket=socket, command=command))["answer"]

    def engine_load(self, url: str) -> int | None:
        """Requests rank 0 holds (running and waiting), from its metrics at `url`; None: no answer."""
        return self._call(ops.engine_load, ops.EngineLoadArgs(url=url))["requests"]

    def key_file(self, path: str) -> ops.KeyFileState:
        """The key file's owner and version (never its content); `present` False when missing."""
        return self._call(ops.key_file, ops.PathArgs(path=path))

    def disk_free(self, path: str) -> int | None:
        """Free bytes where `path` is or would be; None when the node cannot say."""
        return self._call(ops.disk_free, ops.PathArgs(path=path))["free"]

    def hash_files(self, model_dir: str, files: list[str], cache: str, *, deep: bool = False) -> dict[str, str | None]:
        """sha256 of each file (None: missing), from the node's hash cache where it still holds."""
        args: ops.HashFilesArgs = {"model_dir": model_dir, "files": files, "cache": cache, "deep": deep}
        return self._call(ops.hash_files, args, timeout=LONGEST_S)

    def reassemble(self, args: ops.ReassembleArgs) -> dict[str, int]:
        """Each shard's bytes, built from its parts."""
        return self._call(ops.reassemble, args, timeout=LONGEST_S)

    def prune_parts(self, model_dir: str) -> list[str]:
        return self._call(ops.prune_parts, ops.ModelDirArgs(model_dir=model_dir))["removed"]

    def guard_start(self, args: ops.GuardStartArgs) -> int:
        """The guard's pid."""
        return self._call(ops.guard_start, args)["pid"]

    def guard_stop(self, state_dir: str) -> bool:
        """Whether a running guard was stopped."""
        return self._call(ops.guard_stop, ops.StateDirArgs(state_dir=state_dir))["stopped"]

    def link_files(self, target_dir: str, files: dict[str, str]) -> int:
        """How many names were linked ({relative name in target_dir: existing path})."""
        return self._call(ops.link_files, ops.LinkFilesArgs(target_dir=target_dir, files=files))["linked"]

    def switch_model_dir(self, args: ops.SwitchArgs) -> None:
        self._call(ops.switch_model_dir, args)

    def remove_revisions(self, args: ops.RemoveRevisionsArgs) -> ops.RevisionsRemoved:
        return self._call(ops.remove_revisions, args)

    def footprint(self, state_dir: str, model_dir: str) -> ops.Footprint:
        """What of ours is on the node (measured: it walks the checkpoint, so it may take a while)."""
        args = ops.FootprintArgs(state_dir=state_dir, model_dir=model_dir)
        return self._call(ops.footprint, args, timeout=FOOTPRINT_S)

    def remove_trees(self, args: ops.RemoveTreesArgs) -> ops.TreesRemoved:
        return self._call(ops.remove_trees, args, timeout=FOOTPRINT_S)

    def _call(
        self, operation: Callable[[Arguments], Result], args: Arguments, *, timeout: float | None = None
    ) -> Result:
        request = {"call": operation.__name__, "args": args, "private_dir": self.state_dir or ""}
        seconds = timeout or self.timeout
        answer = run_program(self.transport, "ops", "run", request, timeout=seconds, on_line=self.on_line)
        if not conforms(answer, _declared_answer(operation)):
            # The answer itself stays out of the message: read_text's would be a file's content.
            raise NodeCommandError(
                f"{self.transport.node}: ops.{operation.__name__} answered a JSON {type(answer).__name__} "
                "that is not the answer that operation gives",
                f"check that python3 on {self.transport.node} runs the program as sent (nothing wraps or rewrites it)",
            )
        checked: Result = answer
        return checked


@functools.cache
def _declared_answer(operation: Callable[..., object]) -> Any:
    """The operation's declared result type (its annotations are strings until resolved)."""
    return get_type_hints(operation)["return"]


def conforms(value: object, hint: Any) -> bool:
    """Whether JSON-decoded `value` is of the declared type: the types the operations declare
    (str, int, bool, None, list, dict, unions, TypedDicts: every key declared, the required
    ones present)."""
    origin = get_origin(hint)
    if hint is Any:
        return True
    if hint is type(None) or hint is None:
        return value is None
    if origin in (Union, types.UnionType):
        return any(conforms(value, option) for option in get_args(hint))
    if origin is list:
        (item,) = get_args(hint)
        return isinstance(value, list) and all(conforms(element, item) for element in value)
    if origin is dict:
        key, item = get_args(hint)
        return isinstance(value, dict) and all(conforms(k, key) and conforms(v, item) for k, v in value.items())
    if is_typeddict(hint):
        return _conforms_to_typeddict(value, hint)
    return _conforms_to_scalar(value, hint)


def _conforms_to_typeddict(value: object, hint: Any) -> bool:
    if not isinstance(value, dict):
        return False
    fields = get_type_hints(hint)
    return hint.__required_keys__ <= value.keys() and all(
        key in fields and conforms(item, fields[key]) for key, item in value.items()
    )


def _conforms_to_scalar(value: object, hint: object) -> bool:
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:  # JSON's true is no count
        return isinstance(value, int) and not isinstance(value, bool)
    return hint is str and isinstance(value, str)
