"""JSON with `//` comments and trailing commas (what Pi reads), parsed and edited in place.

Pi strips `//` comments and trailing commas from models.json before JSON.parse, so Python's `json`
fails on it, and writing it back through `json.dumps` would drop the user's comments and layout. So
edits here are surgical: the parser records where every value sits in the text, and an edit inserts,
replaces or deletes only those characters. Everything else (comments, key order, indentation, line
endings, other providers) stays byte for byte, and an insertion followed by the matching removal
gives back the original text. Inserted text takes the file's line ending, so a CRLF file stays CRLF.

Block comments (`/* */`) are rejected: neither Pi 0.73.1 nor 1.6.0 accepts them. A leading UTF-8
byte-order mark is skipped and kept, as Pi 1.6.0 does. Input that would trip Python where JSON.parse
copes (nesting deep enough to exhaust the stack, integers past Python's digit limit) is a located
JsoncError too, never a RecursionError or a bare ValueError.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from reconciler.errors import JsoncError

_STRING = re.compile(r'"(?:[^"\\\x00-\x1f]|\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4}))*"')
_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
_LITERALS: dict[str, Any] = {"true": True, "false": False, "null": None}
_WHITESPACE = " \t\r\n"
_BOM = "\ufeff"
# Far beyond any real config, and far below the recursion limit the parser's two frames per level meet.
MAX_DEPTH = 200


@dataclass
class Member:
    """One `"key": value` of an object; `start` is the key's opening quote."""

    key: str
    start: int
    value: Node


@dataclass
class Node:
    """A value and where it sits in the text (`text[start:end]`)."""

    start: int
    end: int
    data: Any
    members: list[Member] = field(default_factory=list)
    items: list[Node] = field(default_factory=list)

    def member(self, key: str) -> Member | None:
        """The last member named `key`: JSON.parse keeps the last of duplicate keys."""
        found = [member for member in self.members if member.key == key]
        return found[-1] if found else None


def parse(text: str) -> Node:
    """The document's root value with positions; raises JsoncError naming line and column."""
    parser = _Parser(text)
    nul = text.find("\x00")
    if nul >= 0:
        parser.pos = nul
        raise parser.error("a NUL byte: this is not a text file (a binary, or damaged by a crash?)")
    root = parser.value()
    parser.skip()
    if parser.pos != len(text):
        raise parser.error("unexpected text after the JSON value")
    return root


def loads(text: str) -> Any:
    return parse(text).data


class _Parser:
    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 1 if text.startswith(_BOM) else 0
        self.depth = 0

    def error(self, message: str) -> JsoncError:
        line = self.text.count("\n", 0, self.pos) + 1
        line_start = self.text.rfind("\n", 0, self.pos) + 1
        if line_start == 0 and self.text.startswith(_BOM):
            line_start = 1  # editors do not count the byte-order mark as a column
        return JsoncError(message, line, self.pos - line_start + 1)

    def peek(self) -> str:
        return self.text[self.pos : self.pos + 1]

    def skip(self) -> None:
        """Whitespace and `//` comments; a string's `//` (a URL) never gets here."""
        while self.pos < len(self.text):
            if self.text[self.pos] in _WHITESPACE:
                self.pos += 1
            elif self.text.startswith("//", self.pos):
                newline = self.text.find("\n", self.pos)
                self.pos = len(self.text) if newline < 0 else newline
            elif self.text.startswith("/*", self.pos):
                raise self.error("block comments (/* */) are not JSONC as Pi reads it; use // comments")
            else:
                return

    def value(self) -> Node:
        self.skip()
        char = self.peek()
        if char in ("{", "["):
            return self.container(char)
        if char == '"':
            start = self.pos
            data = self.string()
            return Node(start, self.pos, data)
        return self.scalar()

    def container(self, opening: str) -> Node:
        if self.depth >= MAX_DEPTH:
            raise self.error(f"nested more than {MAX_DEPTH} levels deep")
        self.depth += 1
        node = Node(self.pos, self.pos, {} if opening == "{" else [])
        self.pos += 1
        for _ in self._elements("}" if opening == "{" else "]"):
            if opening == "{":
                self.member(node)
            else:
                item = self.value()
                node.items.append(item)
                node.data.append(item.data)
        node.end = self.pos
        self.depth -= 1
        return node

    def scalar(self) -> Node:
        start = self.pos
        for word, data in _LITERALS.items():
            if self.text.startswith(word, start):
                self.pos += len(word)
                return Node(start, self.pos, data)
        match = _NUMBER.match(self.text, start)
        if not match:
            raise self.error("expected a value" if self.peek() else "unexpected end of the file")
        self.pos = match.end()
        return Node(start, self.pos, self.number(match.group(), start))

    def number(self, number: str, start: int) -> float | int:
        if any(c in number for c in ".eE"):
            return float(number)
        try:
            return int(number)
        except ValueError:  # past sys.get_int_max_str_digits(), where JSON.parse would round to a float
            self.pos = start
            raise self.error(f"an integer of {len(number)} digits; no config needs one") from None

    def string(self) -> str:
        match = _STRING.match(self.text, self.pos)
        if not match:
            raise self.error("invalid or unterminated string")
        self.pos = match.end()
        decoded: str = json.loads(match.group())
        return decoded

    def member(self, node: Node) -> None:
        self.skip()
        if self.peek() != '"':
            raise self.error("expected a key in double quotes")
        start = self.pos
        key = self.string()
        self.skip()
        if self.peek() != ":":
            raise self.error("expected ':' after the key")
        self.pos += 1
        value = self.value()
        node.members.append(Member(key, start, value))
        node.data[key] = value.data

    def _elements(self, close: str) -> Iterator[None]:
        """Yield once per element; consume commas (a trailing one included) and the closing bracket."""
        self.skip()
        if self.peek() == close:
            self.pos += 1
            return
        while True:
            yield
            self.skip()
            char = self.peek()
            if char == ",":
                self.pos += 1
                self.skip()
                if self.peek() == close:
                    self.pos += 1
                    return
            elif char == close:
                self.pos += 1
                return
            else:
                raise self.error(f"expected ',' or '{close}'")


# --- edits: each returns the new text; only the edited value's characters change -------------------


def set_member(text: str, path: Sequence[str], key: str, value: Any) -> str:
    """Set `key` of the object at `path`: replaced where it stands, else added after the last member."""
    container = _container(text, path, dict)
    existing = container.member(key)
    if existing is not None:
        rendered = _render(value, text, _line_indent(text, existing.start))
        return _cut(text, existing.value.start, existing.value.end, rendered)
    return _insert(text, container, f"{json.dumps(key)}: ", value)


def remove_member(text: str, path: Sequence[str], key: str) -> str:
    """Remove every member named `key` (with its comma) from the object at `path`."""
    while (container := _container(text, path, dict)).member(key) is not None:
        index = max(i for i, member in enumerate(container.members) if member.key == key)
        text = _remove(text, container, index)
    return text


def append_item(text: str, path: Sequence[str], value: Any) -> str:
    """Append `value` to the array at `path`, in the array's own layout."""
    return _insert(text, _container(text, path, list), "", value)


def remove_item(text: str, path: Sequence[str], value: Any) -> str:
    """Remove every item equal to `value` (with its comma) from the array at `path`."""
    while value in (container := _container(text, path, list)).data:
        index = max(i for i, item in enumerate(container.items) if item.data == value)
        text = _remove(text, container, index)
    return text


def _container(text: str, path: Sequence[str], kind: type) -> Node:
    node = parse(text)
    for key in path:
        member = node.member(key) if isinstance(node.data, dict) else None
        if member is None:
            raise ValueError(f"no object member {key!r} on the way to {'.'.join(path)}")
        node = member.value
    if not isinstance(node.data, kind):
        raise ValueError(f"{'.'.join(path) or 'the root'} is not a JSON {kind.__name__}")
    return node


def _insert(text: str, container: Node, prefix: str, value: Any) -> str:
    """After the last element, in the container's layout: one line per element, trailing comma kept."""
    spans = _spans(container)
    if not spans:
        return _insert_first(text, container, prefix, value)
    last_start, last_end = spans[-1]
    if "\n" not in text[container.start : container.end]:
        return _cut(text, last_end, last_end, f", {prefix}{_compact(value)}")
    indent = _line_indent(text, last_start)
    element = f"{_newline(text)}{indent}{prefix}{_render(value, text, indent)}"
    trailing = _comma_after(text, last_end)
    if trailing is not None:
        line_end = _line_end(text, trailing + 1)
        at = trailing + 1 if line_end is None else line_end
        return _cut(text, at, at, element + ",")
    line_end = _line_end(text, last_end)
    if line_end is None:
        return _cut(text, last_end, last_end, "," + element)
    # The comma goes right after the value, the element after that line's comment.
    return _cut(_cut(text, line_end, line_end, element), last_end, last_end, ",")


def _insert_first(text: str, container: Node, prefix: str, value: Any) -> str:
    opening = container.start + 1
    if "\n" not in text or isinstance(container.data, list):
        return _cut(text, opening, opening, f"{prefix}{_compact(value)}")
    closing = container.end - 1
    line_start = text.rfind("\n", 0, closing) + 1
    if line_start > opening and not text[line_start:closing].strip(" \t"):
        # The closing bracket has a line of its own (comments may come before it): go just above it.
        indent = _line_indent(text, closing) + _unit(text)
        rendered = f"{indent}{prefix}{_render(value, text, indent)}{_newline(text)}"
        return _cut(text, line_start, line_start, rendered)
    outer = _line_indent(text, container.start)
    indent = outer + _unit(text)
    newline = _newline(text)
    return _cut(text, opening, opening, f"{newline}{indent}{prefix}{_render(value, text, indent)}{newline}{outer}")


def _remove(text: str, container: Node, index: int) -> str:
    """Remove element `index` and one comma; comments around it stay where they are."""
    spans = _spans(container)
    start, end = spans[index]
    comma = _comma_after(text, end)
    if len(spans) == 1:
        inside = text[container.start + 1 : start] + text[end : container.end - 1]
        if not inside.strip(_WHITESPACE + ","):
            return _cut(text, container.start + 1, container.end - 1)
        return _cut_element(text, start, end if comma is None else comma + 1)
    if comma is not None:
        return _cut_element(text, start, comma + 1)
    previous = _comma_after(text, spans[index - 1][1])
    assert previous is not None, "elements are separated by commas"
    if not text[previous + 1 : start].strip(_WHITESPACE):
        return _cut(text, previous, end)
    return _cut(_cut_element(text, start, end), previous, previous + 1)


def _spans(container: Node) -> list[tuple[int, int]]:
    if isinstance(container.data, dict):
        return [(member.start, member.value.end) for member in container.members]
    return [(item.start, item.end) for item in container.items]


def _line_end(text: str, position: int) -> int | None:
    """Where the line's break starts if only blanks and a `//` comment follow `position`, else None."""
    while text[position : position + 1] in (" ", "\t"):
        position += 1
    if text.startswith("//", position):
        newline = text.find("\n", position)
        return _break_start(text, len(text) if newline < 0 else newline)
    return position if text.startswith("\r\n", position) or text[position : position + 1] in ("\n", "") else None


def _break_start(text: str, newline: int) -> int:
    """The start of the line break whose `\n` is at `newline`: its `\r` in a CRLF line."""
    return newline - 1 if newline > 0 and text[newline - 1] == "\r" else newline


def _comma_after(text: str, position: int) -> int | None:
    scanner = _Parser(text)
    scanner.pos = position
    scanner.skip()
    return scanner.pos if scanner.peek() == "," else None


def _cut(text: str, start: int, end: int, replacement: str = "") -> str:
    return text[:start] + replacement + text[end:]


def _cut_element(text: str, start: int, end: int) -> str:
    """Cut [start, end): with the line break before it when it starts its line, else with the blanks after."""
    line_start = text.rfind("\n", 0, start)
    if line_start >= 0 and not text[line_start + 1 : start].strip(" \t"):
        return _cut(text, _break_start(text, line_start), end)
    while text[end : end + 1] in (" ", "\t"):
        end += 1
    return _cut(text, start, end)


def _line_indent(text: str, position: int) -> str:
    line = text[text.rfind("\n", 0, position) + 1 : position]
    return line[: len(line) - len(line.lstrip(" \t"))]


def _unit(text: str) -> str:
    """The file's indentation step: a tab, or the smallest run of leading spaces (default 2)."""
    indents = re.findall(r"\n([ \t]+)\S", text)
    if any(indent.startswith("\t") for indent in indents):
        return "\t"
    return " " * min((len(indent) for indent in indents), default=2)


def _newline(text: str) -> str:
    """The file's line ending: CRLF when most of its line breaks are, else LF."""
    return "\r\n" if text.count("\r\n") * 2 > text.count("\n") else "\n"


def _render(value: Any, text: str, indent: str) -> str:
    if "\n" not in text:
        return _compact(value)
    return json.dumps(value, indent=_unit(text), ensure_ascii=False).replace("\n", _newline(text) + indent)


def _compact(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(", ", ": "))
