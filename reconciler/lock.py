"""One actor at a time: the reconcile loop and a manual `apply` never act at once.

An flock on a file in the deployment's state dir on this machine (the head). The holder
writes its pid and what it is doing, so a waiting `apply` can say who it is waiting for.
The kernel drops the lock when the holder dies, so a crash never leaves it stuck.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from reconciler.errors import LockBusyError
from reconciler.fsutil import private_dir
from reconciler.nodeside.statedir import StateDir
from reconciler.spec import Deployment


def lock_path(deployment: Deployment) -> Path:
    return Path(StateDir(deployment.state_dir).expanded().lock)


def _holder(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8").strip() or "another reconciler process"
    except OSError:
        return "another reconciler process"


@contextlib.contextmanager
def deployment_lock(
    deployment: Deployment,
    doing: str,
    *,
    wait_s: float = 0.0,
    on_wait: Callable[[str], None] | None = None,
) -> Iterator[None]:
    """Hold the lock while acting; wait up to `wait_s` for it, then explain who holds it."""
    path = lock_path(deployment)
    private_dir(str(path.parent))
    descriptor = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    handle = os.fdopen(descriptor, "a+", encoding="utf-8")  # held for the whole block
    try:
        _acquire(handle, path, wait_s, on_wait)
        handle.seek(0)
        handle.truncate()
        handle.write(f"pid {os.getpid()}: {doing}\n")
        handle.flush()
        yield
    finally:
        handle.close()


def _acquire(handle: object, path: Path, wait_s: float, on_wait: Callable[[str], None] | None) -> None:
    deadline = time.monotonic() + wait_s
    announced = False
    while True:
        try:
            fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)  # type: ignore[attr-defined]
            return
        except BlockingIOError:
            holder = _holder(path)
            if time.monotonic() >= deadline:
                raise LockBusyError(
                    f"the deployment is busy: {holder}",
                    "wait for it to finish (apply --wait SECONDS), or stop the loop: systemctl stop spark-reconciler",
                ) from None
            if on_wait is not None and not announced:
                on_wait(f"waiting for {holder}")
                announced = True
            time.sleep(0.5)
