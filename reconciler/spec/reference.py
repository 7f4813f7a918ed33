"""docs/spec.md, the spec's reference: every section and field with its type, default and
description, written from the JSON schema, so it says exactly what an editor shows."""

from __future__ import annotations

import json
import re
from typing import Any

from reconciler.spec.schema import schema_text

Schema = dict[str, Any]

HEADER = """# The deployment spec

<!-- Written by `reconciler schema --markdown` from reconciler/spec/model.py: edit the model, not this file. -->

{description}

Each field below says what it is, its unit where it has one, and what a change does to a running
deployment. A key left out takes its default. Editors with the YAML language server show the same
text as you type: `reconciler init` writes a modeline pointing at the schema the reconciler ships.
"""

TOP = "(top level)"


class Reference:
    """The schema walked section by section: each section's table, in the order the fields come."""

    def __init__(self, schema: Schema) -> None:
        self.defs: dict[str, Schema] = schema.get("$defs", {})
        self.parts: list[str] = []

    def resolve(self, node: Schema) -> Schema:
        """`node` with its $ref's target merged under it (the property's own keys win)."""
        ref = node.get("$ref")
        if not isinstance(ref, str):
            return node
        target = self.defs[ref.rsplit("/", 1)[-1]]
        return {**target, **{key: value for key, value in node.items() if key != "$ref"}}

    def section_of(self, node: Schema) -> Schema | None:
        """The object with fields that `node` holds (itself, or one of its anyOf), if any."""
        node = self.resolve(node)
        for candidate in [node, *(self.resolve(alt) for alt in node.get("anyOf", []))]:
            if "properties" in candidate:
                return candidate
        return None

    def section(self, path: str, node: Schema) -> None:
        """One section: its description and table (long defaults below it), then the sections
        inside it, in the order their fields come."""
        rows = ["| Field | Type | Default | Description |", "| --- | --- | --- | --- |"]
        below: list[str] = []
        inner: list[tuple[str, Schema]] = []
        required = set(node.get("required", []))
        for name, prop in node["properties"].items():
            row, block, child = self.row(path, name, prop, required=name in required)
            rows.append(row)
            below += block
            inner += [child] if child is not None else []
        self.parts.append(_heading(path, node) + "\n".join(rows) + "\n" + "".join(below))
        for child_path, child_node in inner:
            self.section(child_path, child_node)

    def row(
        self, path: str, name: str, prop: Schema, *, required: bool
    ) -> tuple[str, list[str], tuple[str, Schema] | None]:
        """A field's table row, the block its long default needs, and the section it opens."""
        where = name if path == TOP else f"{path}.{name}"
        kind, child = self.kind(where, prop)
        default, block = self.default(where, prop, required=required, section=child is not None)
        description = _text(self.resolve(prop).get("description", ""))
        return f"| `{name}` | {kind} | {default} | {description} |", block, child

    def kind(self, where: str, prop: Schema) -> tuple[str, tuple[str, Schema] | None]:
        """The field's type in words, and the section it opens (a link to it), if any."""
        resolved = self.resolve(prop)
        section = self.section_of(prop)
        if section is not None:
            nullable = any(alt.get("type") == "null" for alt in resolved.get("anyOf", []))
            return _link(where) + (" or null" if nullable else ""), (where, section)
        items = resolved.get("items")
        item_section = self.section_of(items) if resolved.get("type") == "array" and isinstance(items, dict) else None
        if item_section is not None:
            path = f"{where}[]"
            return f"list of {_link(path)}{_count(resolved)}", (path, item_section)
        return _type(self, resolved), None

    def default(self, where: str, prop: Schema, *, required: bool, section: bool) -> tuple[str, list[str]]:
        """The default in the table, and a block below it for a long collection."""
        if "default" not in prop:
            return ("required" if required else ""), []
        value = prop["default"]
        if section and value is not None:
            return "its fields' defaults", []
        shown = _value(value)
        if isinstance(value, dict | list) and len(shown) > 60:
            block = [f"\nDefault of `{where}`:\n\n```json\n{json.dumps(value, indent=2)}\n```\n"]
            return "below", block
        return f"`{shown}`", []

    def markdown(self, schema: Schema) -> str:
        self.section(TOP, schema)
        return HEADER.format(description=_text(schema.get("description", ""))) + "\n" + "\n".join(self.parts)


def reference_markdown() -> str:
    """docs/spec.md as the current model writes it."""
    schema = json.loads(schema_text())
    return Reference(schema).markdown(schema).rstrip("\n") + "\n"


def _heading(path: str, node: Schema) -> str:
    """A section's heading and description (the top level's description opens the page)."""
    if path == TOP:
        return f"## {TOP}\n\n"
    return f"## `{path}`\n\n{_text(node.get('description', ''))}\n\n"


def _type(reference: Reference, node: Schema) -> str:
    """A leaf's type: its JSON type, enum values, bounds, item and value types, in words."""
    node = reference.resolve(node)
    if "enum" in node:
        return "one of " + ", ".join(f"`{_value(value)}`" for value in node["enum"])
    if "anyOf" in node:
        return " or ".join(_type(reference, alt) for alt in node["anyOf"])
    kind = str(node.get("type", "any"))
    if kind == "array":
        return f"list of {_type(reference, node.get('items', {}))}{_count(node)}"
    if kind == "object":
        values = node.get("additionalProperties")
        return f"map of names to {_type(reference, values)}" if isinstance(values, dict) else "map"
    if kind in ("integer", "number"):
        return kind + _bounds(node)
    return kind


BOUNDS = (("exclusiveMinimum", ">"), ("minimum", ">="), ("exclusiveMaximum", "<"), ("maximum", "<="))


def _bounds(node: Schema) -> str:
    if "minimum" in node and "maximum" in node:
        return f", {node['minimum']} to {node['maximum']}"
    limits = [f"{sign} {node[key]}" for key, sign in BOUNDS if key in node]
    return ", " + ", ".join(limits) if limits else ""


def _count(node: Schema) -> str:
    low, high = node.get("minItems"), node.get("maxItems")
    if low is None and high is None:
        return ""
    return f" ({low or 0} to {high})" if high is not None else f" (at least {low})"


def _value(value: object) -> str:
    """A value as a spec writes it: strings bare, the rest as JSON (null, true, [..], {..})."""
    return value if isinstance(value, str) else json.dumps(value, separators=(", ", ": "))


def _link(path: str) -> str:
    """A link to the section's heading, by the anchor GitHub gives it (punctuation dropped)."""
    anchor = re.sub(r"[^a-z0-9 _-]", "", f"`{path}`".lower()).replace(" ", "-")
    return f"[`{path}`](#{anchor})"


def _text(text: str) -> str:
    """Prose for a table cell or paragraph: one line, and nothing Markdown would read as markup
    (`<name>` as an HTML tag, `|` as a column, `*` as emphasis)."""
    flat = " ".join(text.split())
    return flat.replace("|", "\\|").replace("<", "&lt;").replace("*", "\\*")
