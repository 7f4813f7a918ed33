"""Pi's config files on disk: read exactly, checked before any is written, written atomically.

Only regular UTF-8 files of a sane size are read, their bytes kept exactly (CRLF, a byte-order
mark) for the byte-for-byte edits. Every file a change would write is checked before any is
written; then the user's files are backed up and each one written atomically, so a refusal
leaves the Pi dir exactly as it was.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import stat
from pathlib import Path

from reconciler.clock import utc_stamp
from reconciler.errors import PiConfigError
from reconciler.fsutil import atomic_write
from reconciler.pi.config import USER_FILES, Changes, PiFiles, extension_file, manifest_file

# Far beyond any real models.json; reading more than this would be a mistake, not a config.
MAX_FILE_BYTES = 16 * 1024 * 1024


_FILE_KINDS = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO (named pipe)"),
    (stat.S_ISSOCK, "a socket"),
    (stat.S_ISCHR, "a device"),
    (stat.S_ISBLK, "a device"),
)


_WRITABLE_HINT = (
    "make them writable for this user (a file is replaced through a temporary file beside it, so its directory "
    "must be writable too), or replace a symbolic link into a read-only place with a copy of its file; "
    "then run the command again. Nothing was written"
)


def agent_dir() -> Path:
    """Where Pi keeps its config: $PI_CODING_AGENT_DIR (with ~), else ~/.pi/agent, as Pi resolves it."""
    configured = os.environ.get("PI_CODING_AGENT_DIR")
    try:
        return Path(configured).expanduser() if configured else Path.home() / ".pi" / "agent"
    except RuntimeError:  # `~user` of no user, or no home at all
        where = f"PI_CODING_AGENT_DIR={configured!r}" if configured else "~/.pi/agent"
        raise PiConfigError(
            f"cannot find Pi's config directory: {where} names no home directory",
            "set PI_CODING_AGENT_DIR (or HOME) to an existing directory",
        ) from None


def read_files(directory: Path, provider: str) -> PiFiles:
    """The files' exact text (CRLF and a byte-order mark kept, as the byte-for-byte edits need)."""
    names = (*USER_FILES, extension_file(provider), manifest_file(provider))
    texts = {name: text for name in names if (text := read_text(directory / name)) is not None}
    return PiFiles(str(directory), texts)


def read_text(path: Path) -> str | None:
    """A config file's text, None when there is none; anything but a regular UTF-8 file is refused."""
    data = _read_bytes(path)
    if data is None:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise PiConfigError(
            f"{path}:{line}: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start})",
            "save it as UTF-8 (Pi reads it as UTF-8 too), then run the command again; nothing was written",
        ) from None


def _read_bytes(path: Path) -> bytes | None:
    try:
        _check_regular(path, path.stat())
        # O_NONBLOCK: a FIFO put there after the stat must not hang the open; fstat then refuses it.
        descriptor = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        with os.fdopen(descriptor, "rb") as handle:
            _check_regular(path, os.fstat(handle.fileno()))
            data = handle.read(MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        if path.is_symlink():
            raise _dangling(path) from None
        return None
    except OSError as exc:
        raise PiConfigError(
            f"cannot read {path}: {exc.strerror}", "check the file and its permissions; nothing was written"
        ) from None
    if len(data) > MAX_FILE_BYTES:
        raise _too_big(path)
    return data


def _check_regular(path: Path, info: os.stat_result) -> None:
    if not stat.S_ISREG(info.st_mode):
        kind = next((name for test, name in _FILE_KINDS if test(info.st_mode)), "something else")
        raise PiConfigError(
            f"{path} is {kind}, not a file",
            "move it out of the way (Pi starts without it) or put the file there; nothing was written",
        )
    if info.st_size > MAX_FILE_BYTES:
        raise _too_big(path)


def _too_big(path: Path) -> PiConfigError:
    return PiConfigError(
        f"{path} is larger than {MAX_FILE_BYTES // 2**20} MiB, far more than a Pi config holds",
        "check what the file is (a log or a dump copied over it?) and restore it from a backup; nothing was written",
    )


def _dangling(path: Path) -> PiConfigError:
    return PiConfigError(
        f"{path} is a symbolic link to {os.readlink(path)!r}, which leads nowhere (missing, or a loop)",
        "restore the file it points to, or remove the link (Pi then starts without it); nothing was written",
    )


def check_writable(directory: Path, changes: Changes) -> None:
    """Find what a write would fail on halfway through, before the first byte is written."""
    problems = [problem for name, text in changes.writes.items() for problem in _write_problems(directory / name, text)]
    if any(name in USER_FILES and (directory / name).exists() for name in changes.writes):
        problems += _directory_problems(directory, "the backups go there")
    if problems:
        raise PiConfigError("cannot write Pi's config: " + "; ".join(dict.fromkeys(problems)), _WRITABLE_HINT)


def _write_problems(path: Path, text: str | None) -> list[str]:
    if text is None:  # a removal unlinks the name itself, so only its directory matters
        return _directory_problems(path.parent, f"{path.name} is removed from it") if os.path.lexists(path) else []
    if path.is_symlink() and not path.exists():
        return [_dangling(path).message]
    real = _real(path)
    problems = []
    if real.exists() and not real.is_file():
        problems.append(f"{real} is not a regular file")
    elif real.exists() and not os.access(real, os.W_OK):
        problems.append(f"{real} is read-only")
    return problems + _directory_problems(real.parent, f"{real.name} is written there")


def _directory_problems(directory: Path, why: str) -> list[str]:
    """A directory that is not there yet is created: then its nearest existing parent must be writable."""
    existing = directory
    while not existing.exists():
        if existing.is_symlink():
            return [f"{_dangling(existing).message} ({why})"]
        existing = existing.parent
    if not existing.is_dir():
        return [f"{existing} is not a directory ({why})"]
    if not os.access(existing, os.W_OK | os.X_OK):
        return [f"directory {existing} is not writable ({why})"]
    return []


def write_changes(directory: Path, changes: Changes, provider: str, stamp: str | None = None) -> list[str]:
    """Check every target first, back up the user's files that change (`<file>.bak-<provider>-<YYYYmmdd-HHMMSS>`),
    then write each file atomically (temp file + rename) in the order given. Returns the backups' paths."""
    check_writable(directory, changes)
    stamp = stamp or utc_stamp()
    try:
        backups = [
            _backup(directory / name, provider, stamp)
            for name in changes.writes
            if name in USER_FILES and (directory / name).exists()
        ]
        for name, text in changes.writes.items():
            if text is None:
                (directory / name).unlink(missing_ok=True)
            else:
                _atomic_write(_real(directory / name), text)
    except OSError as exc:  # after the check: a disk filling up, a file changed meanwhile
        raise PiConfigError(
            f"writing Pi's config failed at {exc.filename or directory}: {exc.strerror}",
            f"fix that and run the command again (every file is whole; earlier versions are *.bak-{provider}-{stamp})",
        ) from None
    _remove_empty_extensions(directory / "extensions", changes)
    return backups


def _remove_empty_extensions(extensions: Path, changes: Changes) -> None:
    """Install made the directory for our extension; an empty one has no other owner."""
    if any(text is None for text in changes.writes.values()) and extensions.is_dir() and not extensions.is_symlink():
        with contextlib.suppress(OSError):  # tidying only: an empty directory left behind harms nobody
            if not any(extensions.iterdir()):
                extensions.rmdir()


def _real(path: Path) -> Path:
    """A symlinked config (dotfiles) is edited where it lives, not replaced by a regular file."""
    return path.resolve() if path.is_symlink() else path


def _backup(path: Path, provider: str, stamp: str) -> str:
    target = path.with_name(f"{path.name}.bak-{provider}-{stamp}")
    number = 1
    while target.exists():  # two runs in one second: never overwrite the older backup
        target = path.with_name(f"{path.name}.bak-{provider}-{stamp}-{number}")
        number += 1
    shutil.copy2(_real(path), target)
    return str(target)


def _atomic_write(path: Path, text: str) -> None:
    """The file's own mode is kept (Pi's files are the user's); bytes, so line endings stay."""
    mode = path.stat().st_mode & 0o7777 if path.exists() else 0o644
    atomic_write(str(path), text.encode("utf-8"), mode)
