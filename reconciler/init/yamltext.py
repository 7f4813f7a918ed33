"""Writing YAML text line by line with comments: scalars quoted exactly when YAML would read them
as something else, and no text from a node that could end a line or start a key."""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass, field

from reconciler.errors import YamlError
from reconciler.init.request import REVIEW
from reconciler.yamlpos import load_located


@dataclass
class Lines:
    """Spec text under construction; every comment is made safe to hold node-supplied text."""

    lines: list[str] = field(default_factory=list)
    notes: list[Note] = field(default_factory=list)

    def comment(self, indent: int, text: str, *, width: int = 100) -> None:
        pad = " " * indent + "# "
        for line in textwrap.wrap(single_line(text), width=max(40, width - len(pad))) or [""]:
            self.lines.append((pad + line).rstrip())

    def review(self, indent: int, where: str, text: str) -> None:
        self.notes.append(Note(where, single_line(text)))
        self.comment(indent, f"{REVIEW}: {text}")

    def key(self, indent: int, name: str, value: str | int | None = None) -> None:
        rendered = "" if value is None else f" {value}" if isinstance(value, int) else f" {scalar(value)}"
        self.lines.append(f"{' ' * indent}{name}:{rendered}")

    def raw(self, *lines: str) -> None:
        self.lines.extend(lines)


def single_line(text: str) -> str:
    """One line of printable text: a hostname or message from a node can never end the comment."""
    return "".join(char if char.isprintable() else " " for char in text)


def scalar(value: str) -> str:
    """`value` as a block-context YAML value: plain when the spec loader reads it back as this very
    string, else double-quoted."""
    try:
        plain = load_located(f"k: {value}\n").data
    except YamlError:
        plain = None
    if isinstance(plain, dict) and plain.get("k") == value and "#" not in value and value.isprintable():
        return value
    return quoted(value)


def flow_scalar(value: str) -> str:
    """`value` as an item of a `[a, b]` list: there `,` `[` `]` `{` `}` `:` end or nest a plain
    value, so only names of the plainest characters stay plain."""
    return value if re.fullmatch(r"[A-Za-z0-9_.-]+", value) and scalar(value) == value else quoted(value)


def flow_value(value: object) -> str:
    """A JSON-shaped value (a default) as one line of YAML: scalars as a block value reads them,
    lists and mappings in flow style."""
    if isinstance(value, bool) or value is None:
        return {True: "true", False: "false", None: "null"}[value]
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, str):
        return scalar(value)
    if isinstance(value, list):
        return "[" + ", ".join(_flow_item(item) for item in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{flow_scalar(str(key))}: {_flow_item(item)}" for key, item in value.items()) + "}"
    raise TypeError(f"no YAML form for {type(value).__name__}")


def _flow_item(value: object) -> str:
    """An item inside [..] or {..}: there a string needs flow_scalar's stricter quoting."""
    return flow_scalar(value) if isinstance(value, str) else flow_value(value)


def quoted(value: str) -> str:
    """A YAML double-quoted string holding exactly `value`, on one line of printable ASCII:
    everything else is escaped (a raw line break would be folded into a space, and U+2028 or NEL
    would end the line for some readers)."""
    parts = ['"']
    for char in value:
        code = ord(char)
        if char in '"\\':
            parts.append("\\" + char)
        elif 0x20 <= code < 0x7F:
            parts.append(char)
        elif code <= 0xFF:
            parts.append(f"\\x{code:02x}")
        elif code <= 0xFFFF:
            parts.append(f"\\u{code:04x}")
        else:
            parts.append(f"\\U{code:08x}")
    return "".join(parts) + '"'


@dataclass(frozen=True)
class Note:
    """Something init could not decide: where in the spec, and what to do."""

    where: str
    message: str

    def to_dict(self) -> dict[str, str]:
        return {"where": self.where, "message": self.message}
