"""Files on the machine running the reconciler: read without trusting them, written atomically.

Anything a user can point the reconciler at (a spec, a facts snapshot, a key or token file) may
be a FIFO that blocks forever, `/dev/zero` that never ends, or simply huge; `read_bounded`
refuses all of those before reading a byte too many. `read_untrusted_text` adds what a text
loader needs on top (`--spec` and `--facts` can name binary garbage): strict UTF-8 and no NUL
byte, each refusal at its line and column, so that none of these inputs becomes a hang, a
MemoryError or a UnicodeDecodeError escaping as an internal error. Writes go through the node-side
`atomic_write` (it is plain stdlib and runs here as well), so there is one implementation of
"exclusive temporary file, fsync, rename" for every file the program writes.
"""

from __future__ import annotations

import errno
import os
import stat
from pathlib import Path

from reconciler.errors import UntrustedFileError, UntrustedTextError
from reconciler.nodeside.ops import PRIVATE, atomic_write, private_dir

__all__ = ["PRIVATE", "atomic_write", "human_bytes", "private_dir", "read_bounded", "read_untrusted_text"]


def read_bounded(path: str | os.PathLike[str], *, limit: int) -> bytes:
    """The bytes of a regular file of at most `limit` bytes (symlinks to one are fine)."""
    try:
        descriptor = os.open(os.fspath(path), os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        # Opening a unix socket fails with ENXIO, which says "No such device or address".
        reason = "it is a socket, not a regular file" if exc.errno == errno.ENXIO else exc.strerror
        raise UntrustedFileError(reason or type(exc).__name__) from None
    kind = _kind(os.fstat(descriptor).st_mode)
    if kind != "regular file":
        os.close(descriptor)
        raise UntrustedFileError(f"it is a {kind}, not a regular file")
    with os.fdopen(descriptor, "rb") as handle:
        try:
            data = handle.read(limit + 1)
        except OSError as exc:
            raise UntrustedFileError(exc.strerror or type(exc).__name__) from None
    if len(data) > limit:
        raise UntrustedFileError(f"it is larger than {_size(limit)}")
    return data


def _kind(mode: int) -> str:
    kinds = (
        (stat.S_ISREG, "regular file"),
        (stat.S_ISDIR, "directory"),
        (stat.S_ISFIFO, "FIFO (named pipe)"),
        (stat.S_ISCHR, "character device"),
        (stat.S_ISBLK, "block device"),
        (stat.S_ISSOCK, "socket"),
    )
    return next((name for test, name in kinds if test(mode)), "special file")


def _size(count: int) -> str:
    return f"{count // (1024 * 1024)} MiB" if count >= 1024 * 1024 else f"{count} bytes"


def human_bytes(count: float) -> str:
    """A size or a rate in the decimal units the Hub and disks are sold in: '3.0 GB', '512 B'."""
    for unit, size in (("TB", 1000**4), ("GB", 1000**3), ("MB", 1000**2), ("kB", 1000)):
        if count >= size:
            return f"{count / size:.1f} {unit}"
    return f"{count:.0f} B"


def read_untrusted_text(path: str | os.PathLike[str], *, what: str, limit: int) -> str:
    """The text of the regular file at `path` (symlinks followed): strict UTF-8, no NUL, at most `limit` bytes.

    `what` names the file in messages ("spec", "facts file").
    """
    try:
        data = read_bounded(path, limit=limit)
    except UntrustedFileError as exc:
        raise UntrustedTextError(f"cannot read the {what}: {exc.reason}") from None
    except ValueError:
        raise UntrustedTextError(f"cannot read the {what}: the path contains a NUL character") from None
    _refuse_nul(data, what)
    return _decode(data, what)


def _refuse_nul(data: bytes, what: str) -> None:
    offset = data.find(b"\0")
    if offset >= 0:
        hint = f"check that the path names the {what}; a NUL byte never belongs in it"
        raise _error_at(data, offset, f"the {what} contains a NUL byte: it is not a text file", hint)


def _decode(data: bytes, what: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        message = f"the {what} is not valid UTF-8 (byte 0x{data[exc.start]:02x})"
        raise _error_at(data, exc.start, message, "save the file as UTF-8") from None


def _error_at(data: bytes, offset: int, message: str, hint: str) -> UntrustedTextError:
    """The refusal of the byte at `offset`, at its 1-based line and column (in characters, as
    YAML and JSON errors count)."""
    line_start = data.rfind(b"\n", 0, offset) + 1
    column = len(data[line_start:offset].decode("utf-8", errors="replace")) + 1
    return UntrustedTextError(message, data.count(b"\n", 0, offset) + 1, column, hint)


def write_private(path: Path, text: str, *, durable: bool = True) -> None:
    """A small state file of this machine (status, lock holder): 0600, in a 0700 directory."""
    private_dir(str(path.parent))
    atomic_write(str(path), text.encode("utf-8"), PRIVATE, durable=durable)
