"""Reading a text file the user named, without trusting what it is.

`--spec` and `--facts` can name a FIFO, /dev/zero, a directory, a huge file or binary garbage.
`fsutil.read_bounded` refuses whatever is not a small regular file without blocking; this adds
what a text loader needs on top, strict UTF-8 and no NUL byte, each refusal at its line and
column, so that none of these inputs becomes a hang, a MemoryError or a UnicodeDecodeError
escaping as an internal error.
"""

from __future__ import annotations

import os

from reconciler.errors import UntrustedFileError, UntrustedTextError
from reconciler.fsutil import read_bounded


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
        line, column = _position(data, offset)
        raise UntrustedTextError(
            f"the {what} contains a NUL byte: it is not a text file",
            line,
            column,
            f"check that the path names the {what}; a NUL byte never belongs in it",
        )


def _decode(data: bytes, what: str) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line, column = _position(data, exc.start)
        raise UntrustedTextError(
            f"the {what} is not valid UTF-8 (byte 0x{data[exc.start]:02x})",
            line,
            column,
            "save the file as UTF-8",
        ) from None


def _position(data: bytes, offset: int) -> tuple[int, int]:
    """1-based line and column (in characters, as YAML and JSON errors count) of a byte offset."""
    line_start = data.rfind(b"\n", 0, offset) + 1
    column = len(data[line_start:offset].decode("utf-8", errors="replace")) + 1
    return data.count(b"\n", 0, offset) + 1, column
