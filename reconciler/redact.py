"""Secrets as the program holds them: checked when read, and scrubbed from everything it prints.

The API key and the Hub token travel in HTTP `Authorization` headers. A byte there that is not
printable ASCII, or whitespace inside the value, makes the HTTP library raise an exception whose
text quotes the whole header, secret included, and that text then reaches the terminal, the
journal and status files. So a secret is checked the moment it is read (`checked_secret`): the
error names where it came from and what is wrong with it, never the value.

Every secret read is also registered here, and every sink (the CLI's streams, the loop's status
file and STATUS=, node files that hold causes) passes its text through `redact`, which knows the
forms a secret takes inside an exception's text or a JSON document: as is, escaped by `repr` (of
str and of bytes), JSON-escaped, percent-encoded and base64-encoded. A truncated form (an error
message cut at 200 characters) is caught too: any run of eight or more leading characters of a
form is replaced.
"""

from __future__ import annotations

import base64
import io
import json
import threading
import urllib.parse
from typing import TextIO

from reconciler.errors import SecretError

REDACTED = "(redacted)"
# Shorter runs of a secret's leading characters are too likely to be ordinary text.
_MIN_PREFIX = 8

_lock = threading.Lock()
_forms: set[str] = set()


def checked_secret(raw: str, *, what: str, source: str, hint: str) -> str:
    """The secret without one trailing newline (LF or CRLF), or SecretError saying what is wrong.

    A secret is printable ASCII without spaces: what HTTP header values and tokens allow.
    """
    value = raw.removesuffix("\n").removesuffix("\r") if raw.endswith("\n") else raw
    if not value:
        raise SecretError(f"{what} in {source} is empty", hint)
    for index, char in enumerate(value):
        if not "\x21" <= char <= "\x7e":
            register(value)  # it may still be echoed by whoever else reads it; never by us
            raise SecretError(
                f"{what} in {source} holds {_describe(char)} at character {index + 1} of {len(value)}; "
                "a key or token is printable ASCII without spaces",
                hint,
            )
    register(value)
    return value


_NAMED = {"\r": "a line break", "\n": "a line break", "\t": "a tab", " ": "a space"}


def _describe(char: str) -> str:
    if char in _NAMED:
        return _NAMED[char]
    if ord(char) < 0x20 or ord(char) == 0x7F:
        return f"a control character (U+{ord(char):04X})"
    if 0xD800 <= ord(char) <= 0xDFFF:
        return "a byte that is not UTF-8"
    return "a non-ASCII character"


def register(secret: str) -> None:
    """Remember a secret so that `redact` removes it, in every form, from all output."""
    if not secret:
        return
    found = forms(secret)
    with _lock:
        _forms.update(found)


def forms(secret: str) -> set[str]:
    """The spellings of a secret that exceptions, JSON and URLs produce."""
    raw = secret.encode("utf-8", "surrogateescape")
    spelled = {
        secret,
        repr(secret)[1:-1],
        repr(raw)[2:-1],
        json.dumps(secret)[1:-1],
        json.dumps(secret, ensure_ascii=False)[1:-1],
        urllib.parse.quote(raw, safe=""),
        urllib.parse.quote_plus(raw, safe=""),
        base64.b64encode(raw).decode().rstrip("="),
        base64.urlsafe_b64encode(raw).decode().rstrip("="),
    }
    return {form for form in spelled if form}


def redact(text: str) -> str:
    """`text` with every registered secret, in any known form or cut short, replaced."""
    with _lock:
        known = sorted(_forms, key=len, reverse=True)
    for form in known:
        if form in text:
            text = text.replace(form, REDACTED)
    for form in known:
        text = _redact_prefixes(text, form)
    return text


def _redact_prefixes(text: str, form: str) -> str:
    """Replace runs of at least eight leading characters of `form` (a message cut mid-secret)."""
    head = form[: min(_MIN_PREFIX, len(form))]
    start = text.find(head)
    while start != -1:
        length = len(head)
        while length < len(form) and start + length < len(text) and text[start + length] == form[length]:
            length += 1
        text = text[:start] + REDACTED + text[start + length :]
        start = text.find(head, start + len(REDACTED))
    return text


def clear() -> None:
    """Forget every secret (tests only: a process keeps what it read for its whole life)."""
    with _lock:
        _forms.clear()


class RedactingStream(io.TextIOBase):
    """A text stream that redacts every write before passing it on (stdout and stderr of the CLI)."""

    def __init__(self, inner: TextIO) -> None:
        super().__init__()
        self.inner = inner

    def write(self, text: str) -> int:
        self.inner.write(redact(text))
        return len(text)

    def flush(self) -> None:
        self.inner.flush()

    def isatty(self) -> bool:
        return self.inner.isatty()

    def fileno(self) -> int:
        return self.inner.fileno()

    @property
    def encoding(self) -> str:  # type: ignore[override]
        return self.inner.encoding
