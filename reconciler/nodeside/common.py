"""What several node-side programs need (stdlib only): answer, progress, Docker, private files, pids.

Like statedir.py it has no `from __future__` line and imports no sibling, because
`nodeside.source` ships it inside the programs that import it. Each name here lands in their
namespace, so none may be one of theirs. Modules only some callers need (http.client, signal)
are imported where they are used: every call on a node pays for what its program imports.
"""

import contextlib
import json
import os
import sys
import threading
import time
from typing import Any

CHUNK = 8 * 1024 * 1024
DOCKER_SOCKET = "/var/run/docker.sock"
# The head's reconciler.progress.PREFIX (this program cannot import it; a unit test keeps them equal).
PROGRESS_PREFIX = "@progress "
REPORT_EVERY_S = 1.0
# What a child keeps: where programs are, the locale and time zone it prints in, and the Docker
# socket (the memory guard's way to the ranks).
CHILD_VARIABLES = ("PATH", "HOME", "LANG", "LC_ALL", "LC_CTYPE", "TZ", "DOCKER_HOST")


def reply(value: Any) -> None:
    """The program's answer: one line of JSON on stdout."""
    json.dump(value, sys.stdout)
    sys.stdout.write("\n")


def progress(message: str) -> None:
    sys.stderr.write(message + "\n")
    sys.stderr.flush()


class Meter:
    """Bytes and files of one operation, for the head: a structured line (PREFIX + JSON) at most
    once a second. The head measures the rate and shows a bar or a journal line; the node sends
    only counts. Threads may add at once (hashing runs in parallel)."""

    def __init__(self, what: str, total: int, files: int) -> None:
        self.counts: dict[str, Any] = {"what": what, "done": 0, "total": total, "files_done": 0, "files": files}
        self.lock = threading.Lock()
        self.last = 0.0

    def add(self, count: int, *, name: str | None = None) -> None:
        with self.lock:
            self.counts["done"] += count
            if name is not None:
                self.counts["name"] = name
            if time.monotonic() - self.last >= REPORT_EVERY_S:
                self._report()

    def file_done(self) -> None:
        with self.lock:
            self.counts["files_done"] += 1
            self._report()

    def _report(self) -> None:
        self.last = time.monotonic()
        progress(PROGRESS_PREFIX + json.dumps(self.counts, separators=(",", ":")))


# A transfer under this rate for a whole window is cut (and resumed): a server that sends a byte
# now and then never trips a read timeout, yet would hold a download forever. 16 KiB/s per stream
# is 128 KiB/s (about 1 Mbit/s) for eight streams, a link that would take some 40 days for a
# 460 GB checkpoint: no download that is meant to finish runs below it, while a trickle runs
# thousands of times below. A minute evens out the link's own pauses.
MIN_RATE_BPS = 16 * 1024
RATE_WINDOW_S = 60.0


class RateFloor:
    """Tells when a transfer has stayed under `floor` bytes/s for a whole window of `window_s`."""

    def __init__(self, floor: float, window_s: float) -> None:
        self.floor = floor
        self.window_s = window_s
        self.began = time.monotonic()
        self.count = 0

    def too_slow(self, count: int) -> bool:
        """Count `count` bytes just received; True when the window that ends now fell short."""
        self.count += count
        elapsed = time.monotonic() - self.began
        if elapsed < self.window_s:
            return False
        slow = self.count < self.floor * elapsed
        self.began, self.count = time.monotonic(), 0
        return slow


def url_origin(url: str) -> tuple[str, str, int | None]:
    """(scheme, host, port) with the default port filled in: what a credential may be sent to."""
    import urllib.parse

    parts = urllib.parse.urlsplit(url)
    scheme = parts.scheme.lower()
    return scheme, (parts.hostname or "").lower(), parts.port or {"http": 80, "https": 443}.get(scheme)


def url_where(url: str) -> str:
    """The scheme and host of a URL, for a message (a CDN's signed query stays out of it)."""
    import urllib.parse

    parts = urllib.parse.urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


def refused_redirect(current: str, new: str, advice: str) -> str | None:
    """Why a download's redirect from `current` to `new` is not followed (another scheme than
    HTTP(S), or from https to plain http); None when it may be. `advice` ends the refusal."""
    import urllib.parse

    scheme = urllib.parse.urlsplit(new).scheme.lower()
    if scheme not in ("http", "https"):
        return f"{url_where(current)} redirected the download to {url_where(new)}, which is not HTTP(S)"
    if url_origin(current)[0] == "https" and scheme == "http":
        return (
            f"{url_where(current)} redirected the download to plain http ({url_where(new)}); refused: the bytes "
            f"would travel unencrypted. {advice}"
        )
    return None


def partial_size(partial: str) -> int:
    """Bytes of a download's own partial file; anything else at its name (a symbolic link, say)
    is removed, never followed: the name is the program's own, and the file starts afresh."""
    import stat

    try:
        status = os.lstat(partial)
    except FileNotFoundError:
        return 0
    if stat.S_ISREG(status.st_mode):
        return status.st_size
    os.unlink(partial)
    return 0


def content_range_fits(header: str | None, start: int, size: int) -> bool:
    """A 206's Content-Range holds the bytes from `start` of a file of `size` bytes: only then
    are they appended to the partial."""
    unit, _, rest = (header or "").strip().partition(" ")
    span, _, total = rest.partition("/")
    first, _, last = span.partition("-")
    numbers = first.isascii() and first.isdigit() and last.isascii() and last.isdigit()
    return unit == "bytes" and numbers and int(first) == start and total in ("*", str(size))


def docker_request(method: str, path: str, timeout: float = 10.0) -> tuple[int, bytes]:
    """HTTP status and body of one Docker API request over its unix socket (no docker SDK on nodes)."""
    import http.client
    import socket

    connection = http.client.HTTPConnection("localhost", timeout=timeout)
    connection.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        connection.sock.settimeout(timeout)
        connection.sock.connect(docker_socket())
        connection.request(method, path)
        response = connection.getresponse()
        return response.status, response.read()
    finally:
        connection.close()


def docker_socket() -> str:
    host = os.environ.get("DOCKER_HOST", "")
    return host[len("unix://") :] if host.startswith("unix://") else DOCKER_SOCKET


def docker_problem(exc: Exception) -> str:
    """Why Docker could not be asked, in words an owner acts on (not an exception's name)."""
    where = docker_socket()
    if isinstance(exc, FileNotFoundError):
        return f"no Docker socket at {where}: is Docker installed and running?"
    if isinstance(exc, PermissionError):
        return f"no permission to use {where}: add the user to the docker group and log in again"
    if isinstance(exc, ConnectionRefusedError):
        return f"Docker does not answer on {where}: start it (systemctl start docker)"
    if isinstance(exc, TimeoutError):
        return f"Docker did not answer on {where} in time: it may be overloaded or hung"
    if isinstance(exc, OSError):
        return f"cannot ask Docker on {where}: {exc.strerror or exc}"
    return f"Docker's answer on {where} cannot be read: {exc}"


def child_environment() -> dict[str, str]:
    """The environment a program started here gets: the few variables it needs, never all of
    this one's. An SSH session may carry the operator's tokens, and a detached child would keep
    them readable in /proc/<pid>/environ for as long as it runs."""
    return {name: os.environ[name] for name in CHILD_VARIABLES if name in os.environ}


def write_private(path: str, text: str) -> None:
    """`path` replaced by a 0600 file holding `text`, never written through a symlink."""
    temporary = f"{path}.tmp-{os.urandom(6).hex()}"
    descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
        handle.write(text)
    os.replace(temporary, path)


def pid_of(pid_file: str) -> int | None:
    """The process a pid file names; None when there is no file or no pid in it (0 and 1 are never
    a program of ours: signalling them would reach this session's group or init)."""
    try:
        with open(pid_file, encoding="utf-8") as handle:
            pid = int(handle.read().strip())
    except (OSError, ValueError):
        return None
    return pid if pid > 1 else None


def runs_command(pid: int, command: list[str]) -> bool:
    """Whether process `pid` is running `command`: its command line holds these words in a row."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as handle:
            words = [word.decode(errors="replace") for word in handle.read().rstrip(b"\0").split(b"\0")]
    except OSError:
        return False
    width = len(command)
    return width > 0 and any(words[start : start + width] == command for start in range(len(words) - width + 1))


def stop_pid(pid_file: str, command: list[str], *, group: bool = False) -> bool:
    """Stop the process (with `group`, the process group) a pid file names, if it still runs
    `command` (words of the command line it was started with): SIGTERM, SIGKILL after five
    seconds. A pid file outlives its process, and the kernel hands the pid to the next program
    that starts: a process running anything else is left alone. Whether one was running that
    this user may stop."""
    import signal

    pid = pid_of(pid_file)
    if pid is None or not runs_command(pid, command):
        return False
    kill = os.killpg if group else os.kill
    try:
        kill(pid, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        return False
    for _ in range(50):
        try:
            kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    # A group keeps its id while any member lives, so only a lone process may have been replaced.
    if group or runs_command(pid, command):
        with contextlib.suppress(ProcessLookupError):
            kill(pid, signal.SIGKILL)
    return True


def is_commit(text: str) -> bool:
    """A full git commit id as the Hub spells it: 40 lowercase hex digits."""
    return len(text) == 40 and all(char in "0123456789abcdef" for char in text)


def free_bytes(path: str) -> int | None:
    """Free bytes on the filesystem that holds `path`, or would hold it once created."""
    probe = path
    while probe and not os.path.exists(probe):
        probe = os.path.dirname(probe.rstrip("/")) or "/"
    try:
        info = os.statvfs(probe or "/")
    except OSError:
        return None
    return info.f_bavail * info.f_frsize


def key_file_state(path: str) -> dict[str, Any]:
    """The key file described without its content: its owner (the front runs as that user to
    read the 0600 file) and a version that changes when the file is rewritten or replaced."""
    try:
        info = os.stat(path)
    except OSError:
        return {"present": False}
    version = f"{info.st_mtime_ns}:{info.st_ino}:{info.st_size}"
    return {
        "present": True,
        "size": info.st_size,
        "mode": info.st_mode & 0o7777,
        "uid": info.st_uid,
        "gid": info.st_gid,
        "version": version,
    }


# HAProxy's admin socket answers a command and closes; an answer is a few lines.
ADMIN_TIMEOUT_S = 5.0
ADMIN_ANSWER_LIMIT = 64 * 1024


def admin_command(socket_path: str, command: str) -> str | None:
    """Send one command to the front's admin socket; its answer, or None when nothing listens."""
    import socket

    if not os.path.exists(socket_path):
        return None
    with contextlib.closing(socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)) as connection:
        connection.settimeout(ADMIN_TIMEOUT_S)
        try:
            connection.connect(socket_path)
            connection.sendall(command.encode() + b"\n")
            answer = b""
            while len(answer) < ADMIN_ANSWER_LIMIT:
                chunk = connection.recv(4096)
                if not chunk:
                    break
                answer += chunk
        except OSError:
            return None
    return answer.decode("utf-8", "replace")
