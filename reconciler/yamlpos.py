"""YAML loading that remembers where every key and value came from.

Pydantic reports problems by field path; users need file:line:column. Loading through
the composed node tree (instead of `yaml.safe_load`) gives each path its source mark,
and lets us reject duplicate keys, which plain YAML loading silently collapses.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import yaml

Path = tuple[str | int, ...]


@dataclass(frozen=True)
class Mark:
    """1-based position in the source text."""

    line: int
    column: int


@dataclass
class LocatedDocument:
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


class YamlSyntaxError(Exception):
    """Malformed YAML, with the position the parser stopped at."""

    def __init__(self, message: str, mark: Mark) -> None:
        super().__init__(message)
        self.message = message
        self.mark = mark


def _to_mark(mark: yaml.Mark | None) -> Mark:
    if mark is None:
        return Mark(1, 1)
    return Mark(mark.line + 1, mark.column + 1)


def load_located(text: str) -> LocatedDocument:
    """Parse one YAML document; raise YamlSyntaxError with a position if malformed."""
    loader = yaml.SafeLoader(text)
    try:
        root = loader.get_single_node()
        document = LocatedDocument(data=None)
        if root is not None:
            document.data = _construct(loader, root, (), document)
        return document
    except yaml.MarkedYAMLError as exc:
        problem = exc.problem or str(exc)
        context = f" ({exc.context})" if exc.context else ""
        raise YamlSyntaxError(f"malformed YAML: {problem}{context}", _to_mark(exc.problem_mark)) from exc
    finally:
        loader.dispose()


def _construct(loader: yaml.SafeLoader, node: yaml.Node, path: Path, doc: LocatedDocument) -> Any:
    doc.marks.setdefault(path, _to_mark(node.start_mark))
    if isinstance(node, yaml.MappingNode):
        return _construct_mapping(loader, node, path, doc)
    if isinstance(node, yaml.SequenceNode):
        return [_construct(loader, item, (*path, index), doc) for index, item in enumerate(node.value)]
    return loader.construct_object(node, deep=True)


def _construct_mapping(
    loader: yaml.SafeLoader, node: yaml.MappingNode, path: Path, doc: LocatedDocument
) -> dict[Any, Any]:
    result: dict[Any, Any] = {}
    for key_node, value_node in node.value:
        key = loader.construct_object(key_node, deep=True)
        child: Path = (*path, str(key))
        if key in result:
            doc.duplicates.append((child, _to_mark(key_node.start_mark)))
            continue
        # The key's own line is what a user looks for, also for errors about its value.
        doc.marks[child] = _to_mark(key_node.start_mark)
        result[key] = _construct(loader, value_node, child, doc)
    return result
