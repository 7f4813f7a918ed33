"""YAML loading that remembers where every key and value came from, and trusts nothing.

Pydantic reports problems by field path; users need file:line:column. Building the data
straight from PyYAML's event stream gives each path its source mark, and lets us refuse what
plain YAML loading accepts silently or dies on:

- duplicate keys, which YAML collapses to one;
- YAML 1.1 guesses (`yes` is true, `12:30:00` is 45000, `0777` is 511): plain scalars resolve
  by the YAML 1.2 core schema, so whatever is not plainly a number, a boolean or null stays a
  string and the model refuses it with a located error instead of using a coerced value;
- tags, anchors and aliases: a spec has no use for them, aliases are how a small file expands
  to billions of values, and an error inside aliased data would point at the anchor;
- nesting deeper than MAX_DEPTH and more than MAX_NODES values: PyYAML's composer recurses
  (2000 `[` are a RecursionError), so we never call it, and the budgets bound memory and time;
- keys that are not strings, more than one document, control characters, line breaks and lone
  surrogates in strings (spec values are names, paths and flags that end up in argv, unit
  files and logs), and integers too long to be any setting.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from functools import partial
from typing import Any, Protocol

import yaml

from reconciler.errors import YamlError
from reconciler.record import MutableRecord, Record, field

Path = tuple[str | int, ...]

MAX_DEPTH = 64
MAX_NODES = 10_000
# 64-bit values have at most 20 digits; the cap keeps int() below Python's 4300-digit limit
# and keeps error messages that quote the value short.
MAX_INT_DIGITS = 32

_MALFORMED_HINT = "check indentation and quoting near that position"
_ANCHOR_HINT = "write the value out in full where it is used"
_STANDARD_TAGS = "tag:yaml.org,2002:"

_INT_DECIMAL = re.compile(r"[-+]?[0-9]+")
_INT_OCTAL = re.compile(r"0o[0-7]+")
_INT_HEX = re.compile(r"0x[0-9a-fA-F]+")
_FLOAT = re.compile(r"[-+]?(\.[0-9]+|[0-9]+(\.[0-9]*)?)([eE][-+]?[0-9]+)?")
_INFINITY = re.compile(r"[-+]?\.(inf|Inf|INF)")
_NAN = re.compile(r"\.(nan|NaN|NAN)")
_CONSTANTS: dict[str, Any] = {
    **dict.fromkeys(("", "~", "null", "Null", "NULL")),
    **dict.fromkeys(("true", "True", "TRUE"), True),
    **dict.fromkeys(("false", "False", "FALSE"), False),
}
_LINE_BREAKS = "\n\r\x85\u2028\u2029"
_FORBIDDEN_CHARACTER = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f\u2028\u2029\ud800-\udfff]")


class Mark(Record):
    """1-based position in the source text."""

    line: int
    column: int


class LocatedDocument(MutableRecord):
    """The plain data of a YAML document plus the source position of every path."""

    data: Any
    marks: dict[Path, Mark] = field(default_factory=dict)
    duplicates: list[tuple[Path, Mark]] = field(default_factory=list)

    def mark_for(self, path: Path) -> Mark:
        """Position of `path`, or of its nearest ancestor that exists in the source."""
        probe = tuple(path)
        while probe and probe not in self.marks:
            probe = probe[:-1]
        return self.marks.get(probe, Mark(1, 1))


def load_located(text: str) -> LocatedDocument:
    """Parse one YAML document; raise YamlError with a position for anything malformed or refused."""
    try:
        loader = yaml.SafeLoader(text)
    except yaml.reader.ReaderError as exc:
        raise _unprintable(text, exc) from None
    builder = _Builder()
    try:
        while loader.check_event():
            builder.feed(loader.get_event())  # type: ignore[no-untyped-call]
        return builder.document
    except yaml.MarkedYAMLError as exc:
        problem = exc.problem or str(exc)
        context = f" ({exc.context})" if exc.context else ""
        raise YamlError(f"malformed YAML: {problem}{context}", _to_mark(exc.problem_mark), _MALFORMED_HINT) from None
    except (ValueError, OverflowError):
        # PyYAML's scanner lets int() and chr() fail on `%YAML 1.<5000 digits>` or "\UFFFFFFFF".
        where = Mark(loader.line + 1, loader.column + 1)
        hint = "check the escape sequences and numbers near that position"
        raise YamlError("malformed YAML: a number or escape here is out of range", where, hint) from None
    finally:
        loader.dispose()


def _unprintable(text: str, exc: yaml.reader.ReaderError) -> YamlError:
    before = text[: exc.position]
    mark = Mark(before.count("\n") + 1, exc.position - before.rfind("\n"))
    return YamlError(f"{_describe(chr(exc.character))} is not allowed in YAML text", mark, "remove it")


class _SourceMark(Protocol):
    """An event's mark as the stubs type it (pure-Python or libyaml Mark): 0-based positions."""

    line: int
    column: int


def _to_mark(mark: _SourceMark | None) -> Mark:
    return Mark(1, 1) if mark is None else Mark(mark.line + 1, mark.column + 1)


class _Open(MutableRecord):
    """A mapping or sequence whose end event has not come yet."""

    value: dict[str, Any] | list[Any]
    path: Path
    # False inside the value of a duplicate key, which is dropped (the first one wins): its
    # marks would overwrite the first one's.
    keep: bool
    # Mappings only: the key read last, whose value is the next node.
    key: str | None = None


class _Builder:
    """Plain data and marks from parser events, refusing what the module docstring lists."""

    def __init__(self) -> None:
        self.document = LocatedDocument(data=None)
        self.stack: list[_Open] = []
        self.documents = 0
        self.nodes = 0

    def feed(self, event: yaml.Event) -> None:
        if isinstance(event, yaml.DocumentStartEvent):
            self._start_document(event)
        elif isinstance(event, yaml.CollectionEndEvent):
            self.stack.pop()
        elif isinstance(event, yaml.NodeEvent):
            self._node(event)

    def _start_document(self, event: yaml.DocumentStartEvent) -> None:
        mark = _to_mark(event.start_mark)
        self.documents += 1
        if self.documents > 1:
            raise YamlError(
                "a second YAML document starts here",
                mark,
                "keep one document per file: remove this '---' and what follows, or move it to its own file",
            )
        if event.version is not None or event.tags:
            raise YamlError(
                "YAML directives (%YAML, %TAG) are not supported",
                mark,
                "remove the directive; the file is always read as YAML 1.2 without tags",
            )

    def _node(self, event: yaml.NodeEvent) -> None:
        mark = _to_mark(event.start_mark)
        parent = self.stack[-1] if self.stack else None
        path = parent.path if parent else ()
        _refuse_properties(event, mark, path)
        self.nodes += 1
        if self.nodes > MAX_NODES:
            raise YamlError(
                f"more than {MAX_NODES} keys and values in one document",
                mark,
                "a deployment spec holds a few hundred; check that this is the right file",
            )
        if parent is not None and isinstance(parent.value, dict) and parent.key is None:
            self._key(parent, event, mark)
        else:
            self._value(parent, event, mark)

    def _key(self, mapping: _Open, event: yaml.NodeEvent, mark: Mark) -> None:
        key = _key_text(event, mark, mapping.path)
        child = (*mapping.path, key)
        mapping.key = key
        if not mapping.keep:
            return
        if key in mapping.value:
            self.document.duplicates.append((child, mark))
        else:
            # The key's own line is what a user looks for, also for errors about its value.
            self.document.marks[child] = mark

    def _value(self, parent: _Open | None, event: yaml.NodeEvent, mark: Mark) -> None:
        path, keep, place = self._slot(parent, mark)
        if isinstance(event, yaml.ScalarEvent):
            place(_resolve(event, mark, path))
            return
        if len(self.stack) >= MAX_DEPTH:
            raise YamlError(
                f"nested deeper than {MAX_DEPTH} levels",
                mark,
                "a spec is a few levels deep; check for unbalanced brackets",
            )
        opened = _Open({} if isinstance(event, yaml.MappingStartEvent) else [], path, keep)
        place(opened.value)
        self.stack.append(opened)

    def _slot(self, parent: _Open | None, mark: Mark) -> tuple[Path, bool, Callable[[Any], None]]:
        """Where the next value goes: its path, whether it is kept, and how to put it there."""
        if parent is None:
            self.document.marks.setdefault((), mark)
            return (), True, self._set_root
        if isinstance(parent.value, list):
            path: Path = (*parent.path, len(parent.value))
            if parent.keep:
                self.document.marks.setdefault(path, mark)
            return path, parent.keep, parent.value.append
        key, parent.key = parent.key or "", None
        keep = parent.keep and key not in parent.value
        # A duplicate's value is still built, so problems inside it are found, but never attached.
        return (*parent.path, key), keep, partial((parent.value if keep else {}).__setitem__, key)

    def _set_root(self, value: Any) -> None:
        self.document.data = value


def _refuse_properties(event: yaml.NodeEvent, mark: Mark, path: Path) -> None:
    if isinstance(event, yaml.AliasEvent):
        raise YamlError(f"aliases are not supported (*{_excerpt(event.anchor or '')})", mark, _ANCHOR_HINT, path)
    if event.anchor is not None:
        raise YamlError(f"anchors are not supported (&{_excerpt(event.anchor)})", mark, _ANCHOR_HINT, path)
    tag = event.tag if isinstance(event, (yaml.ScalarEvent, yaml.CollectionStartEvent)) else None
    if tag is not None:
        raise YamlError(
            f"YAML tags are not supported ({_excerpt(_short_tag(tag))})",
            mark,
            "remove the tag; quote a value to make it a string ('5'), leave numbers and true/false unquoted",
            path,
        )


def _short_tag(tag: str) -> str:
    """The tag as the user wrote it: the parser expands `!!x` to the standard prefix."""
    return f"!!{tag.removeprefix(_STANDARD_TAGS)}" if tag.startswith(_STANDARD_TAGS) else tag


def _key_text(event: yaml.NodeEvent, mark: Mark, path: Path) -> str:
    if not isinstance(event, yaml.ScalarEvent):
        raise YamlError(
            "a key must be a name, not a list or a mapping",
            mark,
            "write `name: value`; complex keys (`? [a, b]`) are not supported",
            path,
        )
    key = _resolve(event, mark, path)
    if not isinstance(key, str):
        raise YamlError(
            f"the key '{_excerpt(event.value)}' reads as {_kind(key)}; keys must be strings",
            mark,
            'use a field name, or quote the key if it really is one ("1": ...)',
            path,
        )
    return key


def _kind(value: object) -> str:
    return "null" if value is None else "a boolean" if isinstance(value, bool) else "a number"


def _resolve(event: yaml.ScalarEvent, mark: Mark, path: Path) -> Any:
    """YAML 1.2 core schema: only plain scalars can be anything but a string."""
    text = event.value
    if event.style is None:
        value = _resolve_plain(text, mark, path)
        if not isinstance(value, str):
            return value
    _check_string(text, mark, path)
    return text


def _resolve_plain(text: str, mark: Mark, path: Path) -> Any:
    if text in _CONSTANTS:
        return _CONSTANTS[text]
    for pattern, prefix, base in ((_INT_DECIMAL, 0, 10), (_INT_OCTAL, 2, 8), (_INT_HEX, 2, 16)):
        if not pattern.fullmatch(text):
            continue
        digits = text[prefix:].lstrip("+-")
        if len(digits) > MAX_INT_DIGITS:
            raise YamlError(
                f"an integer of {len(digits)} digits is too large for any setting",
                mark,
                "write the intended number; quote it if it is meant as a string",
                path,
            )
        return int(text[prefix:], base)
    if _FLOAT.fullmatch(text):
        return float(text)
    if _INFINITY.fullmatch(text):
        return float("-inf") if text.startswith("-") else float("inf")
    if _NAN.fullmatch(text):
        return float("nan")
    return text


def _check_string(text: str, mark: Mark, path: Path) -> None:
    found = _FORBIDDEN_CHARACTER.search(text)
    if found is None:
        return
    character = found.group()
    hint = (
        "write the value on one line (a `>-` block folds lines into spaces)"
        if character in _LINE_BREAKS
        else "remove it; spec values are plain text"
    )
    raise YamlError(f"the string contains {_describe(character)}", mark, hint, path)


def _describe(character: str) -> str:
    code = ord(character)
    if character in _LINE_BREAKS:
        return "a line break"
    if 0xD800 <= code <= 0xDFFF:
        return f"a lone surrogate (U+{code:04X}, half of a UTF-16 pair)"
    if code == 0:
        return "a NUL character"
    kind = "the control character" if code < 0x20 or 0x7F <= code <= 0x9F else "the character"
    return f"{kind} U+{code:04X}"


def _excerpt(text: str, limit: int = 40) -> str:
    return text if len(text) <= limit else f"{text[:limit]}..."
