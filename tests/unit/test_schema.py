"""The JSON Schema and the spec reference stay in step with the spec model, describe every
field (what it is, and what a change does to a running deployment), and ship in the package."""

from __future__ import annotations

import fnmatch
import json
import re
import tomllib
from collections.abc import Iterator
from typing import Any

import pytest
from pydantic import BaseModel

from reconciler.components.fabric import node_contexts
from reconciler.constants import SCHEMA_PATH, SPEC_DOC_PATH
from reconciler.serving import LABEL_CONFIG_HASH, render_group
from reconciler.spec import Deployment, schema_text
from reconciler.spec.model import GROUP_RESTART, REFERENCE_PROFILE_ONLY_FIELDS, REFERENCE_RESTART, Serving
from reconciler.spec.reference import reference_markdown
from reconciler.spec.schema import SHIPPED_SCHEMA, shipped_schema
from tests.scenarios import ROOT, SPEC_PATH, converged_facts, reference_deployment, with_serving

Schema = dict[str, Any]
REGENERATE = "run `make schema` (or `.venv/bin/reconciler schema`, `--out reconciler/data/deployment.schema.json`, "
REGENERATE += "`--markdown`) and commit the result"
SHIPPED_PATH = "reconciler/" + "/".join(SHIPPED_SCHEMA)
# A sentence that starts "A change": what changing the field does to a running deployment.
SAYS_WHAT_A_CHANGE_DOES = re.compile(r"(?:^|[.;:!?)] )A change\b")


@pytest.mark.parametrize("path", [SCHEMA_PATH, SHIPPED_PATH])
def test_both_committed_schemas_are_current(path: str) -> None:
    committed = (ROOT / path).read_text(encoding="utf-8")
    assert committed == schema_text(), f"stale {path}: {REGENERATE}"


def test_the_spec_reference_is_current() -> None:
    committed = (ROOT / SPEC_DOC_PATH).read_text(encoding="utf-8")
    assert committed == reference_markdown(), f"stale {SPEC_DOC_PATH}: {REGENERATE}"


def test_schema_is_strict_and_documents_defaults() -> None:
    schema = json.loads(schema_text())
    assert schema["additionalProperties"] is False
    serving = schema["$defs"]["Serving"]["properties"]
    assert serving["kv_bytes"]["default"] == 2_700_000_000
    assert serving["port"]["maximum"] == 65535
    assert serving["env"]["default"]["CUDA_VISIBLE_DEVICES"] == "0", "a collection's default reaches the schema too"


def test_shipped_spec_carries_the_schema_modeline() -> None:
    first_line = SPEC_PATH.read_text(encoding="utf-8").splitlines()[0]
    assert first_line == "# yaml-language-server: $schema=../schemas/deployment.schema.json"


# ---------------------------------------------------------------- every field described


def resolve(schema: Schema, node: Schema) -> Schema:
    """`node` with its $ref's target merged under it: what an editor shows for the property."""
    ref = node.get("$ref")
    if not isinstance(ref, str):
        return node
    target = schema["$defs"][ref.rsplit("/", 1)[-1]]
    return {**target, **{key: value for key, value in node.items() if key != "$ref"}}


def section_of(schema: Schema, node: Schema) -> Schema | None:
    """The object with properties a property holds (itself, a list's items, an anyOf's choice)."""
    node = resolve(schema, node)
    candidates = [node, *(resolve(schema, alt) for alt in node.get("anyOf", []))]
    candidates += [resolve(schema, node["items"])] if isinstance(node.get("items"), dict) else []
    return next((candidate for candidate in candidates if "properties" in candidate), None)


def properties(schema: Schema, node: Schema, path: str = "") -> Iterator[tuple[str, Schema, bool]]:
    """(dotted path, the property as an editor resolves it, whether it is a leaf) for every
    property under `node`, sections included."""
    for name, prop in node["properties"].items():
        where = f"{path}.{name}" if path else name
        section = section_of(schema, prop)
        yield where, resolve(schema, prop), section is None
        if section is not None:
            yield from properties(schema, section, where)


def undescribed(schema: Schema) -> list[str]:
    """What fails the convention, one line each.

    Every property has a description (a section's may be its model's docstring, which the
    schema holds as its definition's description). Every leaf, a property that does not open a
    section of its own fields, says in a sentence starting "A change" what changing it does to a
    running deployment: what restarts and for how long, or that nothing does and when it takes
    effect. A section says it per field, so it needs no such sentence of its own."""
    problems = []
    for path, prop, leaf in properties(schema, schema):
        description = prop.get("description", "")
        if not description:
            problems.append(f"{path}: no description")
        elif leaf and not SAYS_WHAT_A_CHANGE_DOES.search(description):
            problems.append(f"{path}: no sentence starting 'A change' says what changing it does")
    return problems


def test_every_property_says_what_it_is_and_what_a_change_does() -> None:
    schema = json.loads(schema_text())
    assert undescribed(schema) == [], "describe each in reconciler/spec/model.py (Field(description=...))"
    assert len(list(properties(schema, schema))) > 100


def test_the_convention_check_names_what_breaks_it() -> None:
    schema = {
        "properties": {
            "plain": {"type": "string"},
            "vague": {"type": "integer", "description": "A number. Changes apply."},
            "good": {"type": "integer", "description": "Seconds. A change restarts nothing."},
            "section": {"$ref": "#/$defs/Inner"},
        },
        "$defs": {"Inner": {"description": "A part.", "properties": {"deep": {"type": "boolean"}}}},
    }
    assert undescribed(schema) == [
        "plain: no description",
        "vague: no sentence starting 'A change' says what changing it does",
        "section.deep: no description",
    ]


def test_the_fields_only_the_reference_profile_renders_say_so() -> None:
    """REFERENCE_PROFILE_ONLY_FIELDS is what the upstream profile leaves out: those fields, and
    no other, say that profile upstream does not render them."""
    schema = json.loads(schema_text())
    saying = {path for path, prop, _ in properties(schema, schema) if REFERENCE_RESTART in prop.get("description", "")}
    sections = [name for name in REFERENCE_PROFILE_ONLY_FIELDS if isinstance(getattr(Serving(), name), BaseModel)]
    expected = {f"serving.{name}" for name in REFERENCE_PROFILE_ONLY_FIELDS if name not in sections}
    expected |= {
        f"serving.{name}.{field}" for name in sections for field in type(getattr(Serving(), name)).model_fields
    }
    assert saying == expected


def other_value(deployment: Deployment, name: str) -> Deployment:
    """`deployment` with serving.`name` set to another valid value than it has."""
    current = getattr(deployment.serving, name)
    candidates: list[object]
    if isinstance(current, bool):
        candidates = [not current]
    elif isinstance(current, int | float):
        candidates = [current + 1, current / 2]
    elif isinstance(current, dict):
        candidates = [{**current, "SOME_VARIABLE": "1"}]
    elif isinstance(current, list):
        candidates = [[*current, "--some-flag"]]
    else:
        candidates = ["upstream", "none", f"{current}x", "16g"]
    owner_set = deployment.serving.model_dump(exclude_unset=True)
    for candidate in candidates:
        try:
            serving = Serving.model_validate({**owner_set, name: candidate})
        except ValueError:
            continue
        return deployment.model_copy(update={"serving": serving})
    raise AssertionError(f"no other value for serving.{name}")


@pytest.mark.parametrize(
    "name", [name for name in Serving.model_fields if not isinstance(getattr(Serving(), name), BaseModel)]
)
def test_a_serving_field_says_it_restarts_the_group_exactly_when_it_changes_a_rank(name: str) -> None:
    """The descriptions are held to the renderer: a field that says a change restarts the serving
    group changes a rank's config hash (what makes the group restart), and one that does not
    leaves every rank as it is."""
    # Parsers both profiles accept, so that the profile too can change alone.
    deployment = with_serving(reference_deployment(), tokenizer_mode="auto", tool_call_parser="hermes")
    deployment = with_serving(deployment, reasoning_parser="deepseek_r1")
    changed = other_value(deployment, name)
    contexts, blockers = node_contexts(deployment, converged_facts(deployment))
    assert not blockers
    before = [rank.labels[LABEL_CONFIG_HASH] for rank in render_group(deployment, contexts)]
    after = [rank.labels[LABEL_CONFIG_HASH] for rank in render_group(changed, contexts)]
    description = Serving.model_fields[name].description or ""
    says_restart = GROUP_RESTART in description or REFERENCE_RESTART in description
    assert (before != after) == says_restart, description


# ---------------------------------------------------------------- the package ships it


def test_the_package_ships_the_schema_beside_its_code() -> None:
    """Package data (pyproject.toml) covers the file, and the installed package finds it: a
    wheel, a pip or pipx install carries the schema `init`'s modeline points editors at."""
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    patterns = pyproject["tool"]["setuptools"]["package-data"]["reconciler"]
    assert any(fnmatch.fnmatch("/".join(SHIPPED_SCHEMA), pattern) for pattern in patterns)
    shipped = shipped_schema()
    assert shipped is not None
    assert shipped.read_text(encoding="utf-8") == schema_text()
