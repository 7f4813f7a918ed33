"""The spec's JSON schema, as `reconciler schema` writes it, and the copy the package ships."""

from __future__ import annotations

import json
from pathlib import Path

from reconciler.spec.model import Deployment

# Where the package carries the schema (package data): an installed reconciler, a wheel's or a
# checkout's, always has the schema of its own model beside it, for editors to read.
SHIPPED_SCHEMA = ("data", "deployment.schema.json")


def schema_text() -> str:
    """The JSON Schema editors use to validate specs (yaml-language-server modeline)."""
    schema = Deployment.model_json_schema()
    schema = {**schema, "title": "spark-reconciler deployment"}
    schema = {"$schema": "https://json-schema.org/draft/2020-12/schema", **schema}
    return json.dumps(schema, indent=2, sort_keys=False) + "\n"


def shipped_schema() -> Path | None:
    """The schema file inside the installed package; None when the package is not a directory on
    disk (imported from a zip, say) or was built without the file, so no editor could read it."""
    from importlib import resources  # only for init and the tests: loading a spec never needs it

    directory, name = SHIPPED_SCHEMA
    location = resources.files("reconciler") / directory / name
    if not isinstance(location, Path) or not location.is_file():
        return None
    return location
